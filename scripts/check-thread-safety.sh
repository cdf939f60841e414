#!/usr/bin/env bash
# Builds every target with clang into build-clang/, where -Wthread-safety
# -Werror turns each lock annotation into a compile-time check (gcc ignores
# them). Only the build matters: the tests run on the gcc build (test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python_flag=()
[ -x .venv/bin/python ] && python_flag=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
CC=clang CXX=clang++ cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Debug \
  "${python_flag[@]}" >/dev/null
cmake --build build-clang -j"${CKPT_JOBS:-2}"
echo "check-thread-safety.sh: clang -Wthread-safety -Werror build passed"
