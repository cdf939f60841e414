#!/usr/bin/env bash
# Builds and runs every test (unit, integration, install) with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cd build
ctest --output-on-failure -j1 "$@"
