#!/usr/bin/env bash
# A rank of ckpt-loadgen killed (SIGKILL) between two saves of a run that
# saves again and again: the run fails within seconds, naming the rank and
# its signal, the other rank is released from the step barrier, and no
# rank is left behind. Before, the killed rank never reached the
# step barrier and the others (and the harness, reading their results in
# order) waited there for ever (issue 33, item 6).
#
#   loadgen_rank_killed_test.sh CKPTD CKPT_LOADGEN
set -euo pipefail
ckptd="$1"
loadgen="$2"
dir="$(mktemp -d -t ckpt-loadgen-killed.XXXXXX)"
daemon=""
run=""
cleanup() {
  # loadgen runs in a process group of its own (setsid): a hung run's ranks
  # go with it.
  if [ -n "$run" ]; then kill -KILL -- "-$run" 2>/dev/null || true; fi
  if [ -n "$daemon" ]; then
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

"$ckptd" --socket "$dir/ckptd.sock" --root "$dir/root" --pool_bytes $((64 << 20)) \
  --buffer_bytes $((4 << 20)) --io_workers 2 --max_sessions 64 \
  --max_connections 256 >"$dir/ckptd.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do
  [ -S "$dir/ckptd.sock" ] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$dir/ckptd.log"; echo "ckptd exited" >&2; exit 1; }
  sleep 0.05
done
[ -S "$dir/ckptd.sock" ] || { cat "$dir/ckptd.log"; echo "ckptd did not listen in 10 s" >&2; exit 1; }

# Saves without end, until a rank dies.
setsid "$loadgen" --socket "$dir/ckptd.sock" --job killed --ranks 2 \
  --bytes-per-rank $((64 << 10)) --saves 1000000 >"$dir/out" 2>"$dir/err" &
run=$!
# Once the first checkpoint committed, the ranks are between or in saves.
for _ in $(seq 600); do
  [ -e "$dir/root/killed/step-00000001/COMMIT" ] && break
  kill -0 "$run" 2>/dev/null || break
  sleep 0.05
done
if [ ! -e "$dir/root/killed/step-00000001/COMMIT" ]; then
  tail -n 20 "$dir/err" "$dir/ckptd.log" >&2
  echo "loadgen_rank_killed_test: no checkpoint committed in 30 s" >&2
  exit 1
fi
read -r -a ranks < "/proc/$run/task/$run/children" || true
if [ "${#ranks[@]}" -ne 2 ]; then
  echo "loadgen_rank_killed_test: ckpt-loadgen has ${#ranks[@]} ranks, not 2" >&2
  exit 1
fi
# Between two saves: rank 1 is stopped where it is, and after the daemon
# had 0.3 s to act on anything it sent, every checkpoint directory is
# committed. Then its last save ended and neither rank has started the
# next, so rank 0 waits at the step barrier. Otherwise it runs on and is
# stopped again a moment later.
between=""
for _ in $(seq 40); do
  kill -STOP "${ranks[1]}"
  sleep 0.3
  started=$(find "$dir/root/killed" -mindepth 1 -maxdepth 1 -name 'step-*' | wc -l)
  committed=$(find "$dir/root/killed" -mindepth 2 -maxdepth 2 -name COMMIT | wc -l)
  if [ "$started" -eq "$committed" ]; then
    between=$committed
    break
  fi
  kill -CONT "${ranks[1]}"
  sleep "0.0$((RANDOM % 9 + 1))"
done
if [ -z "$between" ]; then
  echo "loadgen_rank_killed_test: rank 1 was never stopped between two saves in 40 tries" >&2
  exit 1
fi
kill -KILL "${ranks[1]}"
killed_at=$(date +%s%N)
echo "rank 1 killed after checkpoint $between committed, before the next began"

# The bound: kAbortGraceMs (30 s) for a rank stuck in a call; a rank at the
# barrier or in a save whose other rank died ends at once.
status=""
for _ in $(seq 700); do
  if ! kill -0 "$run" 2>/dev/null; then
    set +e
    wait "$run"
    status=$?
    set -e
    break
  fi
  sleep 0.05
done
ended_ms=$((($(date +%s%N) - killed_at) / 1000000))
if [ -z "$status" ]; then
  cat "$dir/err" >&2
  echo "loadgen_rank_killed_test: ckpt-loadgen still running 35 s after its rank 1 was killed" >&2
  exit 1
fi
run_group="$run"
run=""
cat "$dir/err"
echo "ckpt-loadgen ended ${ended_ms} ms after rank 1 was killed, status $status"
if [ "$status" -eq 0 ]; then
  echo "loadgen_rank_killed_test: the run passed with a rank killed" >&2
  exit 1
fi
grep -qE "^rank 1 \\(pid ${ranks[1]}\\): killed by signal 9" "$dir/err" || {
  echo "loadgen_rank_killed_test: stderr does not name rank 1's death" >&2
  exit 1
}
grep -qE "^rank 0: ABORTED: another rank failed" "$dir/err" || {
  echo "loadgen_rank_killed_test: rank 0 was not released from the step barrier" >&2
  exit 1
}
grep -qF '"ok": false' "$dir/out" || {
  echo "loadgen_rank_killed_test: the result line does not say the run failed" >&2
  exit 1
}
# No rank left behind.
if pgrep -g "$run_group" >/dev/null; then
  echo "loadgen_rank_killed_test: processes of the run are left: $(pgrep -g "$run_group")" >&2
  kill -KILL -- "-$run_group" 2>/dev/null || true
  exit 1
fi
if [ "$ended_ms" -gt 20000 ]; then
  echo "loadgen_rank_killed_test: the run took ${ended_ms} ms to end (a rank at the barrier should end at once)" >&2
  exit 1
fi
