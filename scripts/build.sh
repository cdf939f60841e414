#!/usr/bin/env bash
# Configures and builds ckptd into build/ (Release with debug info).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python module is built for the project venv's interpreter.
python_flag=()
[ -x .venv/bin/python ] && python_flag=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${python_flag[@]}" >/dev/null
cmake --build build -j"${CKPT_JOBS:-2}"
