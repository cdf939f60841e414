#!/usr/bin/env bash
# The demo: starts ckptd with its built-in defaults on a local directory,
# runs four example trainer ranks that save twice and restore, shows
# ckptctl's view, and stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
scripts/build.sh

work="${CKPT_DEMO_DIR:-$(mktemp -d /tmp/ckptd-demo-XXXXXX)}"
socket="$work/ckptd.sock"
echo "== ckptd on $work (socket $socket)"
build/daemon/ckptd --socket "$socket" --root "$work/checkpoints" \
  >"$work/ckptd.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
wait_for_daemon "$socket"

echo "== 4 trainer ranks x 64 MiB, 2 saves, then restore and verify"
build/bench/ckpt-loadgen --socket "$socket" --job demo --ranks 4 \
  --tensors 200 --bytes-per-rank $((64 << 20)) --saves 2 --restore
echo "== ckptctl list"
build/client/ckptctl --socket "$socket" list
echo "== ckptctl status"
build/client/ckptctl --socket "$socket" status
echo "== files of the latest checkpoint"
ls -l "$work/checkpoints/demo/$(cat "$work/checkpoints/demo/LATEST")"
