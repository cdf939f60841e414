#!/usr/bin/env bash
# What RLIMIT_MEMLOCK costs an ordinary user's daemon (docs/OPERATIONS.md,
# "Running as an ordinary user"): the same save, restored, through a daemon
# run as a plain uid, either
#   pinned:   with CAP_IPC_LOCK alone (ambient), which lifts RLIMIT_MEMLOCK
#             for mlock and io_uring alike: the staging pool mlock()ed and
#             every io_uring ring with the pool registered (as with
#             LimitMEMLOCK=infinity; raising the limit itself takes
#             CAP_SYS_RESOURCE, which this machine's root lacks);
#   unpinned: no capability, RLIMIT_MEMLOCK 1 MiB: the pool unpinned and no
#             ring registered (what an ordinary user's default 8 MiB gives
#             a 1 GiB pool too).
# The two alternate, REPS times each, on a fresh daemon and storage root
# every time; the trainer (ckpt-loadgen) runs as the same uid. Prints one
# JSON object per run (with the daemon's CPU seconds over the save and the
# restore) and, last, the medians of each mode and their ratio.
# Needs root (setpriv, prlimit) and a built tree (scripts/build.sh).
#
#   bench/memlock_cost.sh [DIR]   (default: a new directory in /tmp)
#   env: REPS (5), RANKS (2), BYTES_PER_RANK (512 MiB), POOL (1 GiB)
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "memlock_cost.sh: needs root (setpriv, prlimit)" >&2; exit 1; }
reps=${REPS:-5}
ranks=${RANKS:-2}
per_rank=${BYTES_PER_RANK:-$((512 << 20))}
pool=${POOL:-$((1 << 30))}
uid=61050  # a made-up user: nothing else of it holds locked memory
dir="${1:-$(mktemp -d /tmp/ckptd-memlock-XXXXXX)}"
mkdir -p "$dir"
chown $uid:$uid "$dir"
chmod 0755 "$dir"
# The binaries where the uid can run them.
install -m 0755 build/daemon/ckptd build/bench/ckpt-loadgen build/client/ckptctl "$dir/"
as_user() { setpriv --reuid=$uid --regid=$uid --clear-groups -- "$@"; }

daemon=""
stop_daemon() {
  [ -n "$daemon" ] || return 0
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  daemon=""
}
trap stop_daemon EXIT
# utime + stime of a process, in clock ticks (proc(5): fields 14 and 15;
# the command name, field 2, holds no space here).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

results="$dir/results.jsonl"
: >"$results"
for rep in $(seq "$reps"); do
  for mode in pinned unpinned; do
    run="$dir/$mode-$rep"
    as_user mkdir "$run"
    if [ "$mode" = pinned ]; then
      launch=(setpriv --reuid=$uid --regid=$uid --clear-groups
        --inh-caps=-all,+ipc_lock --ambient-caps=-all,+ipc_lock --)
    else
      launch=(prlimit --memlock=$((1 << 20)):$((1 << 20)) --
        setpriv --reuid=$uid --regid=$uid --clear-groups --)
    fi
    "${launch[@]}" "$dir/ckptd" --socket "$run/ckptd.sock" --root "$run/root" \
      --pool_bytes $pool --gpu off >"$run/ckptd.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do
      as_user "$dir/ckptctl" --socket "$run/ckptd.sock" status >/dev/null 2>&1 && break
      sleep 0.1
    done
    # The daemon's CPU time (user + system) over the save and the restore
    # alone: what pinning pages for each unregistered I/O costs shows here
    # even where the wall times drown in the noise of shared cores.
    cpu0=$(cpu_ticks "$daemon")
    out=$(as_user "$dir/ckpt-loadgen" --socket "$run/ckptd.sock" --job memlock \
      --ranks "$ranks" --tensors 64 --bytes-per-rank "$per_rank" --saves 1 --restore |
      tail -n 1)
    cpu1=$(cpu_ticks "$daemon")
    stop_daemon
    cpu_s=$(awk -v a="$cpu0" -v b="$cpu1" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.3f", (b - a) / hz}')
    # What the daemon said about its pool, for the record.
    pool_line=$(grep -c "continuing with an unpinned pool" "$run/ckptd.log" || true)
    echo "{\"mode\": \"$mode\", \"rep\": $rep, \"unpinned_warnings\": $pool_line, \"daemon_cpu_s\": $cpu_s, \"loadgen\": $out}" |
      tee -a "$results"
    rm -rf "$run"
  done
done

python3 - "$results" "$ranks" "$per_rank" "$pool" <<'EOF'
import json, statistics, sys
path, ranks, per_rank, pool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
runs = [json.loads(line) for line in open(path)]
summary = {"ranks": ranks, "bytes": ranks * per_rank, "pool_bytes": pool}
for mode in ("pinned", "unpinned"):
    mine = [r["loadgen"] for r in runs if r["mode"] == mode]
    assert all(m["ok"] and m["verified"] for m in mine), f"{mode}: a run failed"
    assert all(m["staging_pool_unpinned"] == (mode == "unpinned") for m in mine), mode
    summary[mode] = {
        "io_backend": mine[0]["io_backend"],
        "runs": len(mine),
        **{f"{k}_median": round(statistics.median(m[k] for m in mine), 4)
           for k in ("staged_s", "durable_s", "committed_s", "restore_s")},
        **{f"{k}_all": [round(m[k], 4) for m in mine]
           for k in ("staged_s", "durable_s", "restore_s")},
        "daemon_cpu_s_median": round(statistics.median(
            r["daemon_cpu_s"] for r in runs if r["mode"] == mode), 3),
        "daemon_cpu_s_all": [r["daemon_cpu_s"] for r in runs if r["mode"] == mode],
    }
for k in ("staged_s", "durable_s", "committed_s", "restore_s", "daemon_cpu_s"):
    p, u = summary["pinned"][f"{k}_median"], summary["unpinned"][f"{k}_median"]
    summary[f"{k}_unpinned_over_pinned"] = round(u / p, 3) if p else None
print(json.dumps(summary))
EOF
