# Shell helpers shared by the project's scripts (source it).

# wait_for_daemon SOCKET: waits up to 10 s until ckptd answers on SOCKET.
wait_for_daemon() {
  for _ in $(seq 100); do
    build/client/ckptctl --socket "$1" status >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "ckptd on $1 did not answer within 10 s" >&2
  return 1
}
