# The CUDA runtime of the torch wheels, for the pip build (CKPT_PYTHON_ONLY).
#
# A user who installs ckptd with pip has no CUDA toolkit, only the torch
# wheel and NVIDIA's CUDA wheels that come with it (nvidia/cu13/include,
# nvidia/cu13/lib/libcudart.so.13). cuda/ is host code calling the CUDA
# runtime (no kernels, so no nvcc), so it is compiled against those headers
# and linked to that libcudart.so.13: the very runtime torch loads, so a
# trainer holds one copy of it, not a second one that could disagree with
# torch's (the full build links the toolkit's static runtime instead).
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
  COMMAND ${Python3_EXECUTABLE} -c [=[
import glob, os, sys
try:
    import torch
except ImportError:
    sys.exit("torch is not installed")
if not torch.version.cuda:
    sys.exit("torch " + torch.__version__ + " has no CUDA")
if int(torch.version.cuda.split(".")[0]) < 13:
    sys.exit("torch's CUDA " + torch.version.cuda + " is older than 13")
try:
    import nvidia
except ImportError:
    sys.exit("torch's CUDA wheels (nvidia/...) are not installed")
for root in nvidia.__path__:
    for header in sorted(glob.glob(os.path.join(root, "*", "include", "cuda_runtime_api.h"))):
        home = os.path.dirname(os.path.dirname(header))
        runtimes = sorted(glob.glob(os.path.join(home, "lib", "libcudart.so.*")))
        if runtimes:
            print(os.path.dirname(header), runtimes[0], sep=";", end="")
            sys.exit(0)
sys.exit("no CUDA runtime headers and libcudart.so in torch's CUDA wheels")
]=]
  OUTPUT_VARIABLE found ERROR_VARIABLE why RESULT_VARIABLE failed)
if(failed)
  string(STRIP "${why}" CKPT_TORCH_WHEEL_CUDA_WHY)
  return()
endif()
list(GET found 0 include_dir)
list(GET found 1 runtime)
# cuda/ needs CUDA 13's runtime API (cuda/CMakeLists.txt's note).
file(STRINGS "${include_dir}/cuda_runtime_api.h" version_line
     REGEX "^#define CUDART_VERSION +[0-9]+")
string(REGEX REPLACE "^#define CUDART_VERSION +([0-9]+).*" "\\1" cudart_version "${version_line}")
if(NOT cudart_version OR cudart_version LESS 13000)
  set(CKPT_TORCH_WHEEL_CUDA_WHY "${include_dir}: CUDA runtime ${cudart_version}, not 13 or newer")
  return()
endif()
add_library(ckpt_torch_wheel_cudart SHARED IMPORTED GLOBAL)
set_target_properties(ckpt_torch_wheel_cudart PROPERTIES
  IMPORTED_LOCATION "${runtime}"
  INTERFACE_INCLUDE_DIRECTORIES "${include_dir}")
get_filename_component(CKPT_TORCH_WHEEL_CUDA_LIB "${runtime}" DIRECTORY)
set(CKPT_TORCH_WHEEL_CUDA ON)
message(STATUS "ckptd: CUDA from torch's wheels: ${runtime} (runtime ${cudart_version})")
