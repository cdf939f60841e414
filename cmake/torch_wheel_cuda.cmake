# The CUDA runtime of the torch wheels, for the pip build (CKPT_PYTHON_ONLY).
#
# cuda/ is host code calling the CUDA runtime (no kernels, so no nvcc): pip
# compiles it against the headers of torch's CUDA wheels and links it to
# their libcudart.so.13, the very runtime torch loads, so a trainer holds one
# copy of it, not a second one that could disagree with torch's (the full
# build links the toolkit's static runtime instead). find_torch_wheel_cuda.py
# finds them; the GPU machine's build of the package asks it too.
#
# Sets, where torch has CUDA 13 or newer and the wheel's headers and runtime
# are found:
#   CKPT_TORCH_WHEEL_CUDA      ON
#   CKPT_TORCH_WHEEL_CUDA_LIB  the directory of libcudart.so.*
# and defines the imported target ckpt_torch_wheel_cudart (the shared
# runtime, with the headers as its include directory). Otherwise
# CKPT_TORCH_WHEEL_CUDA is OFF and CKPT_TORCH_WHEEL_CUDA_WHY says why.
set(CKPT_TORCH_WHEEL_CUDA OFF)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Python3_FOUND)
  set(CKPT_TORCH_WHEEL_CUDA_WHY "no Python interpreter")
  return()
endif()
execute_process(
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/find_torch_wheel_cuda.py
  OUTPUT_VARIABLE found ERROR_VARIABLE why RESULT_VARIABLE failed)
string(STRIP "${why}" why)
if(failed EQUAL 2)
  # torch has CUDA 13, and a package without CUDA would fail at its first
  # CUDA tensor: the build stops, saying what to install (CKPT_WITH_CUDA=OFF
  # builds without).
  message(FATAL_ERROR "ckptd: ${why}")
elseif(failed)
  set(CKPT_TORCH_WHEEL_CUDA_WHY "${why}")
  return()
endif()
list(GET found 0 runtime)
list(SUBLIST found 1 -1 include_dirs)
add_library(ckpt_torch_wheel_cudart SHARED IMPORTED GLOBAL)
set_target_properties(ckpt_torch_wheel_cudart PROPERTIES
  IMPORTED_LOCATION "${runtime}"
  INTERFACE_INCLUDE_DIRECTORIES "${include_dirs}")
get_filename_component(CKPT_TORCH_WHEEL_CUDA_LIB "${runtime}" DIRECTORY)
set(CKPT_TORCH_WHEEL_CUDA ON)
message(STATUS "ckptd: CUDA from torch's wheels: ${runtime}, headers ${include_dirs}")
