#!/usr/bin/env bash
# The GPU benchmark (docs/BENCHMARKS.md, "GPU path"): starts ckptd with the
# CUDA device, a staging pool that holds the state and a memory tier, and
# runs ckpt-gpu-bench against it; prints the daemon's `part written` lines
# (the enqueue's time per save), its log tail and the benchmark's JSON line
# last. Binaries from build/ or $CKPT_BIN_DIR.
#
#   bench/run_gpu_benchmarks.sh [BYTES [SAVES]]   (default 4 GiB, 10 saves)
#
# GPU_KIND=simulated runs it on the simulated device (gpu/: the daemon's
# and the trainer's own work on the path is real, the copies are memcpy)
# where no GPU is.
#
# With $BENCH_LOG_DIR set, the daemon's log and the benchmark's output are
# written there as they happen (they survive a timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CKPT_BIN_DIR:-}"
ckptd="${bin:+$bin/ckptd}"; ckptd="${ckptd:-build/daemon/ckptd}"
bench="${bin:+$bin/ckpt-gpu-bench}"; bench="${bench:-build/bench/ckpt-gpu-bench}"
bytes="${1:-$((4 << 30))}"
saves="${2:-10}"
kind="${GPU_KIND:-cuda}"
# O_DIRECT needs a disk-backed directory: $TMPDIR if set, else /tmp.
dir="$(mktemp -d -t ckpt-gpu-bench.XXXXXX)"
logs="${BENCH_LOG_DIR:-$dir}"
mkdir -p "$logs"
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; rm -rf "$dir"' EXIT
"$ckptd" --socket "$dir/ckptd.sock" --root "$dir/root" --gpu="$kind" \
  --pool_bytes $((bytes + (256 << 20))) --keep_in_memory_bytes $((2 * bytes + (1 << 30))) \
  --keep_last 2 > "$logs/ckptd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$dir/ckptd.sock" ] && break; sleep 0.1; done
rc=0
"$bench" --socket "$dir/ckptd.sock" --bytes "$bytes" --tensors 1000 --allocations 4 \
  --saves "$saves" --restores 5 --device "$kind" > "$logs/bench.out" 2> "$logs/bench.err" || rc=$?
# The daemon's own GPU memory (its contexts), while it still runs.
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader |
    awk -v pid="$daemon" -F', ' '$1 == pid {print "daemon GPU memory: " $2}'
fi
# Each save's own enqueue time in the daemon (enqueued_us: from the part's
# turn on a worker to its last copy enqueued), beside the trainer's CPU
# blocked figure, which adds the call, the worker's pickup and the reply.
grep 'part written' "$logs/ckptd.log" || true
tail -20 "$logs/ckptd.log"
cat "$logs/bench.err"
tail -1 "$logs/bench.out"
exit $rc
