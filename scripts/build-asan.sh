#!/usr/bin/env bash
# Configures and builds build-asan/: clang, Debug at -O1, AddressSanitizer
# and UndefinedBehaviorSanitizer, and CKPT_FUZZ=ON, so the one tree holds both
# the sanitized test suite (scripts/check-sanitizers.sh) and the libFuzzer
# targets (scripts/run-fuzzers.sh) instead of two full clang builds.
# CKPT_FUZZ adds -fsanitize=fuzzer-no-link (the fuzzer's coverage) to every
# library, which the tests run through too; only the fuzz executables link
# libFuzzer itself (fuzz/CMakeLists.txt).
#
# Arguments go to `cmake --build` (e.g. --target fuzzers); CKPT_JOBS sets the
# parallelism (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# The extension modules are built for the project venv's python, as in
# scripts/build.sh. (-U: an older version of this script turned pybind11 off.)
python_flag=()
[ -x .venv/bin/python ] && python_flag=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug \
  -DCKPT_WITH_CUDA=OFF -DCKPT_FUZZ=ON -UCMAKE_DISABLE_FIND_PACKAGE_pybind11 "${python_flag[@]}" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DCMAKE_C_FLAGS="-O1 $sanitize" -DCMAKE_CXX_FLAGS="-O1 $sanitize" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize" -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" \
  -DCMAKE_MODULE_LINKER_FLAGS="$sanitize" >/dev/null
cmake --build "$build" -j"${CKPT_JOBS:-2}" "$@"
