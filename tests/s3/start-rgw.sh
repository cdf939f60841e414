#!/usr/bin/env bash
# A throwaway Ceph RGW for the S3 tests: one monitor, one OSD (bluestore on
# a sparse file it makes itself), radosgw on 127.0.0.1, all as the current
# user in a fresh directory, with no cephx, systemd or containers.
#
#   start-rgw.sh start ENV_FILE   starts it, creates the S3 user, waits
#                                 (bounded) until a signed S3 write works,
#                                 and writes ENV_FILE (KEY=VALUE lines:
#                                 CKPT_RGW_ENDPOINT, _ACCESS_KEY,
#                                 _SECRET_KEY, _DIR, _PIDS, _START_SECONDS).
#                                 Exit 77, with CKPT_RGW_SKIP=reason in
#                                 ENV_FILE, where Ceph is not installed.
#   start-rgw.sh stop ENV_FILE    kills the daemons it started (only those:
#                                 each pid checked to be a ceph daemon of
#                                 this directory), removes the directory
#                                 and ENV_FILE.
#
# Nothing outlives its bound: a start first stops what an earlier,
# interrupted run left described in ENV_FILE, and a watchdog stops the
# cluster after CKPT_RGW_MAX_SECONDS (1 h) where no stop came.
#
# Packages: ceph-mon ceph-osd radosgw ceph-common (scripts/setup-debian.sh).
# Every wait is bounded; a failed start prints the daemons' log tails,
# stops what it started and exits 1.
set -euo pipefail

# How long each phase may take: here the monitor is up in ~1 s, the OSD in
# ~5 s, radosgw's first answer and its first write (it creates its pools
# then) in ~10 s; 10 times that is allowed for a loaded machine.
readonly MON_BOUND=60 OSD_BOUND=90 RGW_BOUND=90

readonly ACCESS_KEY=CKPTRGWACCESSKEY
readonly SECRET_KEY=ckpt-rgw-secret-key-0123456789

usage() { echo "usage: $0 start|stop ENV_FILE" >&2; exit 2; }
[ $# -eq 2 ] || usage
readonly action=$1
env_file=$(realpath -m -- "$2")
readonly env_file
self=$(realpath -- "$0")
readonly self

log() { echo "start-rgw: $*" >&2; }

# stop_dir DIR PIDS: SIGTERM, a bounded wait, SIGKILL, each to the process
# group the pid leads (every one was started under setsid); only processes
# whose command line names DIR's ceph.conf (a pid reused by another process
# is left alone), never this script itself (the watchdog's stop).
stop_dir() {
  local dir=$1 pids=$2 pid alive
  local conf="$dir/ceph.conf"
  ours() {
    [ "$1" != $$ ] && tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF -- "$conf"
  }
  for pid in $pids; do
    if ours "$pid"; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
  done
  for _ in $(seq 100); do  # 10 s
    alive=""
    for pid in $pids; do ours "$pid" && alive="$alive $pid"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for pid in $pids; do
    if ours "$pid"; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
  done
  case "$dir" in
    */ckpt-rgw.*) rm -rf -- "$dir" ;;
    *) log "not removing $dir: not a directory this script made" ;;
  esac
}

if [ "$action" = stop ]; then
  [ -f "$env_file" ] || { log "no $env_file: nothing to stop"; exit 0; }
  dir=$(sed -n 's/^CKPT_RGW_DIR=//p' "$env_file")
  pids=$(sed -n 's/^CKPT_RGW_PIDS=//p' "$env_file")
  [ -n "$dir" ] && stop_dir "$dir" "$pids"
  rm -f -- "$env_file"
  log "stopped"
  exit 0
fi
[ "$action" = start ] || usage

# A run that was interrupted before its stop (ctest killed) left its
# daemons described here: stopped first.
if [ -f "$env_file" ]; then
  log "stopping what $env_file describes (an earlier run's)"
  "$self" stop "$env_file" || true
fi
rm -f -- "$env_file"
missing=""
for tool in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool ceph-authtool; do
  command -v "$tool" >/dev/null || missing="$missing $tool"
done
if [ -n "$missing" ]; then
  reason="Ceph is not installed (missing:$missing; scripts/setup-debian.sh installs ceph-mon ceph-osd radosgw ceph-common)"
  echo "CKPT_RGW_SKIP=$reason" >"$env_file"
  log "$reason"
  exit 77
fi
command -v python3 >/dev/null || { log "python3 is needed (free ports, the S3 probe)"; exit 1; }

t0=$(date +%s.%N)
dir=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-rgw.XXXXXX")
conf="$dir/ceph.conf"
pids=""
mkdir -p "$dir"/{mon/ceph-a,osd/ceph-0,run,log,rgw}

fail() {
  log "$*"
  for f in "$dir"/log/*.log "$dir"/*.out; do
    [ -f "$f" ] || continue
    echo "---- tail of $f" >&2
    tail -n 30 "$f" >&2
  done
  stop_dir "$dir" "$pids"
  rm -f -- "$env_file"
  exit 1
}
trap 'fail "interrupted"' INT TERM

# Free loopback ports: bound to port 0 and released (a race with another
# process taking one is possible but rare; the daemons then fail to bind
# and the start fails with their logs).
read -r mon_v2 mon_v1 rgw_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
)
fsid=$(python3 -c 'import uuid; print(uuid.uuid4())')
osd_uuid=$(python3 -c 'import uuid; print(uuid.uuid4())')
mon_addr="[v2:127.0.0.1:$mon_v2,v1:127.0.0.1:$mon_v1]"

cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = $mon_addr
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
# No cephx: a private, loopback-only cluster. radosgw then needs crc (or
# secure) for its monitor session, or it hangs at start.
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$cluster-\$name.asok
pid file = $dir/run/\$cluster-\$name.pid
log file = $dir/log/\$cluster-\$name.log
log to stderr = false
err to stderr = true
crash dir = $dir/crash
mon data = $dir/mon/\$cluster-\$id
osd data = $dir/osd/\$cluster-\$id
rgw data = $dir/rgw
# One OSD: every pool has one copy, few placement groups, no autoscaler.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
# A test's disk: a sparse 8 GiB block file, a small memory target (the
# machine is shared), no health fuss about free space.
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 8589934592
osd memory target = 1073741824
bluestore cache autotune = false
bluestore cache size = 268435456
mon data avail warn = 1
mon data avail crit = 0
osd max object name len = 460
osd max object namespace len = 64

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw dns name = 127.0.0.1
rgw enable usage log = false
rgw thread pool size = 64
EOF

# A monitor's keyring is still expected by --mkfs with cephx off.
ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' \
  >"$dir/authtool.out" 2>&1 || fail "ceph-authtool failed"
monmaptool --create --fsid "$fsid" --addv a "$mon_addr" "$dir/monmap" \
  >"$dir/monmaptool.out" 2>&1 || fail "monmaptool failed"
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" \
  >"$dir/mon-mkfs.out" 2>&1 || fail "ceph-mon --mkfs failed"
setsid ceph-mon -c "$conf" -i a -f </dev/null >"$dir/mon.out" 2>&1 &
pids="$pids $!"

# Every ceph CLI call bounded.
cephcli() { timeout 30 ceph -c "$conf" --connect-timeout 10 "$@"; }

deadline=$(( $(date +%s) + MON_BOUND ))
until cephcli mon stat >/dev/null 2>&1; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the monitor did not answer within ${MON_BOUND}s"
  sleep 0.5
done

osd_id=$(cephcli osd create "$osd_uuid" 2>"$dir/osd-create.out") || fail "ceph osd create failed"
[ "$osd_id" = 0 ] || fail "ceph osd create gave id '$osd_id', expected 0"
timeout 120 ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" \
  >"$dir/osd-mkfs.out" 2>&1 || fail "ceph-osd --mkfs failed"
setsid ceph-osd -c "$conf" -i 0 -f </dev/null >"$dir/osd.out" 2>&1 &
pids="$pids $!"

deadline=$(( $(date +%s) + OSD_BOUND ))
until [ "$(cephcli osd stat -f json 2>/dev/null | python3 -c \
  'import json,sys; print(json.load(sys.stdin).get("num_up_osds", 0))' 2>/dev/null)" = 1 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the OSD was not up within ${OSD_BOUND}s"
  sleep 0.5
done

# The S3 user with the known key (radosgw-admin talks to RADOS directly).
timeout 120 radosgw-admin -c "$conf" user create --uid=ckpt --display-name=ckpt \
  --access-key="$ACCESS_KEY" --secret="$SECRET_KEY" >"$dir/user-create.out" 2>&1 \
  || fail "radosgw-admin user create failed"

setsid radosgw -c "$conf" -n client.rgw.a -f </dev/null >"$dir/rgw.out" 2>&1 &
pids="$pids $!"

# Up when a signed request creates a bucket and writes an object to it: the
# first write makes RGW create its data pool (slow), so it is paid here and
# not by the first test.
endpoint="127.0.0.1:$rgw_port"
# s3 METHOD PATH [BODY]: one SigV4-signed request (curl 7.88's --aws-sigv4
# does not send x-amz-content-sha256, which RGW requires); prints the HTTP
# status, 000 on no answer within 20 s.
s3() {
  python3 - "$endpoint" "$ACCESS_KEY" "$SECRET_KEY" "$@" <<'PY'
import datetime, hashlib, hmac, http.client, sys
endpoint, access, secret, method, path = sys.argv[1:6]
body = sys.argv[6].encode() if len(sys.argv) > 6 else b""
now = datetime.datetime.now(datetime.timezone.utc)
amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
payload = hashlib.sha256(body).hexdigest()
headers = {"host": endpoint, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
signed = ";".join(sorted(headers))
canonical = "\n".join([method, path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "",
                       signed, payload])
scope = f"{day}/us-east-1/s3/aws4_request"
to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                     hashlib.sha256(canonical.encode()).hexdigest()])
key = ("AWS4" + secret).encode()
for part in (day, "us-east-1", "s3", "aws4_request"):
    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access}/{scope}, "
                            f"SignedHeaders={signed}, Signature={signature}")
try:
    conn = http.client.HTTPConnection(endpoint, timeout=20)
    conn.request(method, path, body=body, headers=headers)
    print(conn.getresponse().status)
except Exception:
    print("000")
PY
}
deadline=$(( $(date +%s) + RGW_BOUND ))
until [ "$(s3 PUT /ckpt-rgw-probe)" = 200 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "RGW did not create a bucket within ${RGW_BOUND}s"
  sleep 0.5
done
first_write=$(date +%s.%N)
until [ "$(s3 PUT /ckpt-rgw-probe/probe probe)" = 200 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "RGW did not store an object within ${RGW_BOUND}s"
  sleep 0.5
done
first_write=$(python3 -c "import time; print(f'{time.time() - $first_write:.1f}')")

# A watchdog: where nothing stops the cluster (the ctest run interrupted
# between its start and stop tests), it is stopped after
# CKPT_RGW_MAX_SECONDS (1 h). Its command line names the ceph.conf, so the
# stop path ends it too, with its sleep (its process group).
# shellcheck disable=SC2016  # expanded by the watchdog's bash
setsid bash -c 'sleep "$1" && exec "$2" stop "$3"' ckpt-rgw-watchdog \
  "${CKPT_RGW_MAX_SECONDS:-3600}" "$self" "$env_file" "$conf" </dev/null >/dev/null 2>&1 &
pids="$pids $!"

took=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
cat >"$env_file.tmp" <<EOF
CKPT_RGW_ENDPOINT=$endpoint
CKPT_RGW_ACCESS_KEY=$ACCESS_KEY
CKPT_RGW_SECRET_KEY=$SECRET_KEY
CKPT_RGW_DIR=$dir
CKPT_RGW_PIDS=${pids# }
CKPT_RGW_START_SECONDS=$took
CKPT_RGW_FIRST_WRITE_SECONDS=$first_write
EOF
mv "$env_file.tmp" "$env_file"
trap - INT TERM
log "Ceph RGW up at http://$endpoint in ${took}s, its first write ${first_write}s (mon, osd, radosgw, watchdog: pids${pids}; dir $dir)"
