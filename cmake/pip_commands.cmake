# ckptd and ckptctl in pip's build (CKPT_PYTHON_ONLY): installed with the
# Python package, as the `python` component, into the wheel's scripts
# directory (SKBUILD_SCRIPTS_DIR), which pip puts in the environment's bin
# directory: after `pip install`, `ckptd` and `ckptctl` are on the PATH of
# an activated venv, and a user with no root and no apt-get has a daemon.
#
# What they link travels as in the full build: our own libraries
# statically; gRPC, protobuf, abseil, liburing, libsystemd, libcurl,
# OpenSSL, expat and xxHash as the Debian libraries scripts/setup-debian.sh
# installs (a source install builds against them, so they are on the host;
# they are found in the system's library directories, with no run path).
# The one library outside those is the CUDA runtime of torch's wheels, when
# the package has CUDA (cmake/torch_wheel_cuda.cmake): it is found by a run
# path relative to the installed binary, as ckptd._ckpt finds it from
# site-packages, so the daemon and the trainer use the same libcudart.so.13.
if(DEFINED SKBUILD_SCRIPTS_DIR)
  set(scripts_destination ${SKBUILD_SCRIPTS_DIR})
else()  # a plain `cmake --install --component python` of this build
  include(GNUInstallDirs)
  set(scripts_destination ${CMAKE_INSTALL_BINDIR})
endif()
install(TARGETS ckptd ckptctl RUNTIME DESTINATION ${scripts_destination}
        COMPONENT python EXCLUDE_FROM_ALL)

if(CKPT_TORCH_WHEEL_CUDA)
  # Where pip puts scripts for this interpreter (its default scheme: the
  # venv's bin), the same scheme whose site-packages holds torch's wheels.
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_path('scripts'), end='')"
    OUTPUT_VARIABLE scripts_dir ERROR_VARIABLE why RESULT_VARIABLE failed)
  if(failed OR NOT IS_ABSOLUTE "${scripts_dir}")
    message(FATAL_ERROR "ckptd: ${Python3_EXECUTABLE} did not say where its scripts go "
      "(sysconfig.get_path('scripts')): ${why}")
  endif()
  cmake_path(RELATIVE_PATH CKPT_TORCH_WHEEL_CUDA_LIB BASE_DIRECTORY ${scripts_dir}
             OUTPUT_VARIABLE cudart_from_bin)
  set_target_properties(ckptd ckptctl PROPERTIES
    BUILD_RPATH ${CKPT_TORCH_WHEEL_CUDA_LIB}
    INSTALL_RPATH "$ORIGIN/${cudart_from_bin}")
  message(STATUS "ckptd: ckptd and ckptctl into ${scripts_dir}, "
    "libcudart from $ORIGIN/${cudart_from_bin}")
endif()
