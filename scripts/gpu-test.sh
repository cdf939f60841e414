#!/usr/bin/env bash
# Runs the GPU tests and the GPU benchmark on a GPU machine, from the bundle
# scripts/gpu-bundle.sh made (carried to the machine as gpu-bundle.tar.gz,
# unpacked here into gpu-bundle/, or as gpu-bundle/ itself): the
# GPU benchmark (bench/run_gpu_benchmarks.sh), the [cuda] unit tests and
# the GPU-path integration tests on the real device (and on the simulated
# one), then the Python package, built here against this machine's Python
# and torch (scripts/gpu-python-build.sh; on torch's CUDA runtime, as pip
# builds it, where torch has CUDA 13 wheels), and its GPU tests: CUDA tensors
# of two processes through ckptd.torch (tests/python/test_torch_cuda.py),
# and the simulated device's. Results go to
# $OUT (default: gpu-results/).
#
#   scripts/gpu-test.sh [--tests-only | --bench-only | --python-only]
#
# All of it can take longer than one 10-minute device call: run
# --bench-only and --tests-only as two calls.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
out=$(realpath "$out")  # the Python tests write to it from tests/python
bundle="$PWD/gpu-bundle"
if [ ! -d "$bundle" ]; then
  [ -f gpu-bundle.tar.gz ] || { echo "gpu-test.sh: no gpu-bundle/ or gpu-bundle.tar.gz (scripts/gpu-bundle.sh makes them)" >&2; exit 1; }
  tar xzf gpu-bundle.tar.gz
fi
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CKPT_TEST_BIN_DIR="$bundle/bin"
# Test daemons write with O_DIRECT, which a tmpfs refuses: where /tmp is
# one, use /var/tmp.
if [ -z "${TMPDIR:-}" ] && [ "$(stat -f -c %T /tmp)" = tmpfs ]; then
  export TMPDIR=/var/tmp/ckptd-gpu-test
  mkdir -p "$TMPDIR"
fi
run_bench=0 run_cxx=0 run_python=0
case "${1:-all}" in
  all) run_bench=1 run_cxx=1 run_python=1 ;;
  --bench-only) run_bench=1 ;;
  --tests-only) run_cxx=1 run_python=1 ;;
  --python-only) run_python=1 ;;
  *) echo "usage: $0 [--tests-only | --bench-only | --python-only]" >&2; exit 2 ;;
esac
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  uname -r
} > "$out/machine.txt" 2>&1
if [ $run_bench = 1 ]; then
  CKPT_BIN_DIR="$bundle/bin" BENCH_LOG_DIR="$out/bench" timeout 300 \
    bench/run_gpu_benchmarks.sh ${GPU_BENCH_BYTES:-} ${GPU_BENCH_SAVES:-} > "$out/bench.txt" 2>&1
  echo "benchmark exit $?" | tee -a "$out/summary.txt"
  tail -1 "$out/bench.txt"
fi
if [ $run_cxx = 1 ]; then
  timeout 150 "$bundle/bin/ckpt_unit_tests" '[cuda],[gpu]' --durations yes > "$out/unit.txt" 2>&1
  echo "unit tests exit $?" | tee -a "$out/summary.txt"
  timeout 240 "$bundle/bin/ckpt_integration_tests" '[gpu]' --durations yes > "$out/integration.txt" 2>&1
  echo "integration tests exit $?" | tee -a "$out/summary.txt"
fi
if [ $run_python = 1 ]; then
  timeout 300 scripts/gpu-python-build.sh "$PWD/gpu-python" > "$out/python-build.txt" 2>&1
  echo "python build exit $?" | tee -a "$out/summary.txt"
  grep -E "is not built|CUDA from torch's wheels|not torch's wheels' CUDA" "$out/python-build.txt" |
    tee -a "$out/summary.txt"
  (
    # The bundle's libraries for its binaries only: this machine's Python
    # and torch load their own (_ckpt finds the bundle's by its RPATH).
    wrappers=$(mktemp -d)
    for b in ckptd ckptctl; do
      printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$LD_LIBRARY_PATH" \
        "$bundle/bin/$b" > "$wrappers/$b"
      chmod +x "$wrappers/$b"
    done
    unset LD_LIBRARY_PATH
    cd tests/python
    export PYTHONPATH="$OLDPWD/gpu-python" CKPTD_BINARY="$wrappers/ckptd" \
      CKPTCTL_BINARY="$wrappers/ckptctl"
    timeout 300 "${PYTHON:-python3}" test_torch_cuda.py -v
    echo "python cuda tests exit $?" >> "$out/summary.txt"
    timeout 300 "${PYTHON:-python3}" -m unittest -v test_torch_gpu test_gpu
    echo "python simulated-device tests exit $?" >> "$out/summary.txt"
  ) > "$out/python.txt" 2>&1
  grep "python .* tests exit" "$out/summary.txt"
fi
grep -q "exit [^0]" "$out/summary.txt" && status=1
exit $status
