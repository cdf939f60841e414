#!/usr/bin/env bash
# Builds and runs every test (unit, integration, install) with ctest; then
# the same suite built with ASan + UBSan (scripts/check-sanitizers.sh) and
# each libFuzzer target for a bounded time (scripts/run-fuzzers.sh). Those
# two add about 20 minutes on 2 cores (README, "Tests");
# CKPT_SANITIZERS=0 leaves them out, for a quick local run. Arguments go to
# the first ctest only (e.g. -R pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
# The format tests read checkpoints with the project venv's packages, stock
# PyTorch included (installed here, not by the setup: the demo needs none).
# Before the build: ckptd._state_cache is built against that torch, and
# CMake looks for it when it configures.
if [ ! -x .venv/bin/python ]; then
  echo "test.sh: no .venv here; run scripts/setup-debian.sh first" >&2
  exit 1
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  -r scripts/requirements-test.txt -r scripts/requirements-dcp.txt
scripts/build.sh
# The lock annotations are checked by a second, clang build (gcc ignores them).
scripts/check-thread-safety.sh
(cd build && ctest --output-on-failure -j1 "$@")
if [ "${CKPT_SANITIZERS:-1}" != 0 ]; then
  scripts/check-sanitizers.sh
  scripts/run-fuzzers.sh
fi
