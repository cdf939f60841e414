#!/usr/bin/env bash
# The GPU benchmark's whole path on the simulated device, small: the daemon
# and ckpt-gpu-bench as bench/run_gpu_benchmarks.sh runs them on a GPU
# machine (saves with the GPU-side STAGED, restores from the memory tier
# right after the last commit, every byte checked). A GPU machine is lent
# seldom; this keeps the script and the paths it drives working between
# those runs. (It found restores copying from tier images not pinned yet.)
#
#   gpu_bench_smoke_test.sh CKPTD CKPT_GPU_BENCH
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="$(mktemp -d -t ckpt-gpu-bench-bin.XXXXXX)"
trap 'rm -rf "$bin"' EXIT
ln -s "$1" "$bin/ckptd"
ln -s "$2" "$bin/ckpt-gpu-bench"
out="$(GPU_KIND=simulated CKPT_BIN_DIR="$bin" bench/run_gpu_benchmarks.sh $((16 << 20)) 3)"
echo "$out"
result="$(tail -1 <<< "$out")"
for expected in '"device":"simulated"' '"saves":3' '"restore_source":"memory"' \
    '"verified":true'; do
  if ! grep -qF "$expected" <<< "$result"; then
    echo "gpu_bench_smoke_test: $expected missing from the benchmark's result" >&2
    exit 1
  fi
done
