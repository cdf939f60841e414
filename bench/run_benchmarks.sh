#!/usr/bin/env bash
# Measures ckptd against the disk's own bandwidth, in one run:
#   1. fio: sequential O_DIRECT write and read, 8 MiB blocks, io_uring, QD16,
#      in the storage directory;
#   2. ckpt-loadgen through a fresh ckptd on the same directory: save-call
#      latency with 1,000 tensors per rank, durable throughput and daemon
#      peak RSS for a checkpoint 4x the staging pool, restore throughput;
#   3. four ckptd daemons (nodes) sharing the directory: replica dedupe and
#      per-node write balance for HSDP, DDP and FSDP layouts;
#   4. ckpt-plan-bench: node planning time and index size up to 4,096 nodes;
#   5. bench/python_save_bench.py: the Python save call beside the C++ one.
# Prints one JSON object per measurement and a summary with the ratios.
#
#   bench/run_benchmarks.sh [DIR]        (default: a new directory in /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
scripts/build.sh >/dev/null

dir="${1:-$(mktemp -d /tmp/ckptd-bench-XXXXXX)}"
mkdir -p "$dir"
pool=$((512 << 20))
ranks=4
per_rank=$((pool))            # 4 ranks x pool = a checkpoint 4x the pool
fio_size=4G

fio_bw() {  # $1 = read|write; prints GB/s
  local field=48
  [ "$1" = read ] && field=7
  fio --name=ckptd-bench --directory="$dir" --rw="$1" --bs=8M --size=$fio_size \
    --ioengine=io_uring --iodepth=16 --direct=1 --output-format=terse \
    | awk -F';' -v f=$field '{printf "%.3f", $f * 1024 / 1e9}'
}
fio_write=$(fio_bw write)
fio_read=$(fio_bw read)
rm -f "$dir"/ckptd-bench*
echo "{\"fio_write_gbps\": $fio_write, \"fio_read_gbps\": $fio_read}"

socket="$dir/ckptd.sock"
build/daemon/ckptd --socket "$socket" --root "$dir/root" --pool_bytes $pool \
  >"$dir/ckptd.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
wait_for_daemon "$socket"

latency=$(build/bench/ckpt-loadgen --socket "$socket" --job latency --ranks 1 \
  --tensors 1000 --bytes-per-rank $((256 << 20)) --saves 20 | tail -n 1)
echo "$latency"
big=$(build/bench/ckpt-loadgen --socket "$socket" --job big --ranks $ranks \
  --tensors 1000 --bytes-per-rank $per_rank --saves 3 --restore | tail -n 1)
echo "$big"
# Saved by 4 ranks, restored by 3 (a reshard): bytes read vs checkpoint size.
reshard=$(build/bench/ckpt-loadgen --socket "$socket" --job reshard --ranks $ranks \
  --tensors 64 --bytes-per-rank $((256 << 20)) --restore --load-ranks 3 | tail -n 1)
echo "$reshard"

kill $daemon; wait $daemon 2>/dev/null || true
trap - EXIT

# The in-memory tier: the same 2 GiB checkpoint, restored by fresh rank
# processes (restarted trainers) from the daemon's RAM, five times over
# (this VM's CPU share varies from moment to moment; all five are kept).
build/daemon/ckptd --socket "$socket" --root "$dir/tier-root" --pool_bytes $pool \
  --keep_in_memory_bytes $((3 << 30)) >"$dir/ckptd-tier.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
wait_for_daemon "$socket"
tier=()
for i in 1 2 3 4 5; do
  saves=(--saves 1)
  [ "$i" = 1 ] || saves=(--saves 0 --first-step 2)  # restore step-1 again
  tier+=("$(build/bench/ckpt-loadgen --socket "$socket" --job tier --ranks $ranks \
    --tensors 1000 --bytes-per-rank $per_rank "${saves[@]}" --restore | tail -n 1)")
  echo "${tier[-1]}"
done
kill $daemon; wait $daemon 2>/dev/null || true
trap - EXIT

# Four nodes on one machine: one daemon each, one shared storage root.
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null || true' EXIT
for n in 0 1 2 3; do
  build/daemon/ckptd --socket "$dir/node$n.sock" --root "$dir/shared" \
    --pool_bytes $((256 << 20)) --node_id $n --nodes 4 >"$dir/node$n.log" 2>&1 &
  pids+=($!)
done
for n in 0 1 2 3; do wait_for_daemon "$dir/node$n.sock"; done
multi() {  # job layout ranks-per-node replicas bytes-per-rank
  build/bench/ckpt-loadgen --socket "$dir/node{node}.sock" --job "$1" --nodes 4 \
    --ranks-per-node "$3" --replicas "$4" --layout "$2" --bytes-per-rank "$5" \
    --saves 2 --restore | tail -n 1
}
multi hsdp-8b llama-8b 4 2 $((32 << 20))
multi hsdp-70b llama-70b 4 2 $((32 << 20))
multi ddp uniform 2 8 $((32 << 20))
multi fsdp uniform 2 1 $((32 << 20))
kill "${pids[@]}"; wait 2>/dev/null || true
trap - EXIT

build/bench/ckpt-plan-bench --dir "$dir"
# The Python save call (ckptd.torch, plain tensors and DTensors) beside
# ckpt-loadgen's, through a daemon of its own (needs the project venv).
if [ -x .venv/bin/python ] && [ -d build/python/ckptd ]; then
  .venv/bin/python bench/python_save_bench.py --build build | tail -n 1
fi
# The checkpoints are several GiB; keep only the logs.
rm -rf "$dir/root" "$dir/shared" "$dir/tier-root"

python3 - "$fio_write" "$fio_read" "$latency" "$big" "$reshard" "${tier[@]}" <<'PY'
import json, statistics, sys
fio_w, fio_r = float(sys.argv[1]), float(sys.argv[2])
lat, big, reshard = (json.loads(a) for a in sys.argv[3:6])
tier = [json.loads(a) for a in sys.argv[6:]]
pool = big["staging_pool_bytes"]
print(json.dumps({
  "save_call_ms_p50_1rank_1000_tensors": lat["save_call_ms_p50"],
  "save_call_ms_p99_1rank_1000_tensors": lat["save_call_ms_p99"],
  "save_call_ms_p50_4ranks_1000_tensors": big["save_call_ms_p50"],
  "checkpoint_over_pool": round(big["total_bytes"] / pool, 2),
  "durable_gbps": big["durable_gbps"],
  "durable_over_fio_write": round(big["durable_gbps"] / fio_w, 3),
  "restore_gbps": big["restore_gbps"],
  "restore_over_fio_read": round(big["restore_gbps"] / fio_r, 3),
  "daemon_peak_rss_over_pool_mib": round((big["daemon_peak_rss_bytes"] - pool) / 2**20, 1),
  "verified": big["verified"],
  "reshard_4_to_3_read_over_checkpoint": reshard["read_over_unique"],
  "reshard_4_to_3_restore_over_fio_read": round(reshard["restore_gbps"] / fio_r, 3),
  "reshard_verified": reshard["verified"],
  "memory_tier_restore_gbps_median": statistics.median(t["restore_gbps"] for t in tier),
  "memory_tier_restore_gbps_runs": [t["restore_gbps"] for t in tier],
  "memory_tier_restore_sources": sorted({t["restore_source"] for t in tier}),
  "memory_tier_verified": all(t["verified"] for t in tier),
}))
PY
