#!/usr/bin/env bash
# Runs INSIDE the booted container of tests/system/systemd_unit_test.sh, as
# the oneshot unit ckpt-system-check.service, after multi-user.target. The
# host put ckptd there with `cmake --install` (DESTDIR), as `sudo cmake
# --install build` would; from there on this script is the operator and the
# trainer, following docs/OPERATIONS.md ("Install", "Users and groups"):
#
#   1. the install steps: systemd-sysusers and systemd-tmpfiles by the
#      entries' names (so systemd must find them in /usr/local/lib), a
#      trainer user alice in ckpt-users, socket_group in the config file,
#      `systemctl enable --now ckptd`;
#   2. READY: with Type=notify that start returns once the daemon has sent
#      READY=1 (a daemon that never sends it leaves the unit "activating"
#      until TimeoutStartSec and the start fails), and its STATUS line shows;
#   3. alice (not root, in the allowed group) saves and restores bit-exact,
#      and her job's directory is hers, 0700;
#   4. a drain on stop: a save slowed by write_rate_limit is in flight when
#      `systemctl stop ckptd` is issued, still commits, its client sees it
#      commit, and the journal says the daemon drained it; after a restart
#      the drained checkpoint restores bit-exact.
#
# Everything it finds goes to /ckpt-system-test/results.txt; its exit status
# to /ckpt-system-test/rc; on failure the boot's journal to journal.txt. The
# unit powers the container off when this script ends, either way.
set -euo pipefail

out=/ckpt-system-test
results="$out/results.txt"
socket=/run/ckptd/ckptd.sock
root=/var/lib/ckptd
config=/usr/local/etc/ckptd/ckptd.conf
# 16 MiB/s: the 16 MiB save of step 3 takes about a second, the 128 MiB one
# of step 4 about 8 s, long enough to stop the daemon in the middle of it
# and to see the STATUS line it sends every 3 s while it drains.
rate=$((16 << 20))
drain_bytes=$((128 << 20))

# Written first: the host tells "systemd could not boot here" (skip) from
# "the check failed" by this file.
echo "started $(date -u +%FT%TZ)" >"$out/started"
: >"$results"
on_exit() {
  local rc=$?
  echo "$rc" >"$out/rc"
  if [ "$rc" -ne 0 ]; then journalctl -b --no-pager >"$out/journal.txt" 2>&1 || true; fi
}
trap on_exit EXIT

note() { echo "$*" | tee -a "$results"; }
fail() {
  note "FAIL: $*"
  exit 1
}
# expect NAME ACTUAL WANTED
expect() {
  if [ "$2" != "$3" ]; then fail "$1: got '$2', want '$3'"; fi
  note "ok: $1 = $2"
}
prop() { systemctl show -p "$1" --value ckptd; }
# The last line of ckpt-loadgen's output is one JSON object.
json_true() { [[ "$(tail -n 1 "$1")" == *"\"$2\": true"* ]]; }

# --- 1. Install, as docs/OPERATIONS.md tells an operator --------------------
systemd-sysusers ckptd.conf
systemd-tmpfiles --create ckptd.conf
expect "ckptd's user" "$(id -un ckptd 2>/dev/null || true)" ckptd
getent group ckpt-users >/dev/null || fail "systemd-sysusers made no group ckpt-users"
getent group ckpt-ops >/dev/null || fail "systemd-sysusers made no group ckpt-ops"
expect "storage root" "$(stat -c '%a %U:%G' "$root")" "711 ckptd:ckptd"
useradd --create-home alice
usermod -aG ckpt-users alice
# bob is not in ckpt-users: the sockets must keep him out.
useradd --create-home bob

# The operator's edits of the shipped config file. sed must find each key
# as shipped, or the test would run with the defaults and prove nothing.
sed -i -e 's/^socket_group: ""$/socket_group: "ckpt-users"/' \
  -e "s/^write_rate_limit: 0\$/write_rate_limit: $rate/" "$config"
grep -qx 'socket_group: "ckpt-users"' "$config" || fail "no socket_group line to set in $config"
grep -qx "write_rate_limit: $rate" "$config" || fail "no write_rate_limit line to set in $config"

systemctl daemon-reload
# Bounded well under the host's timeout; TimeoutStartSec (90 s by default)
# fails a daemon that never sends READY=1 before this does.
start_s=$SECONDS
timeout 150 systemctl enable --now ckptd ||
  fail "systemctl enable --now ckptd: $(systemctl status --no-pager ckptd 2>&1 | tail -n 20)"
note "ok: systemctl enable --now ckptd returned in $((SECONDS - start_s)) s"

# --- 2. READY and STATUS ------------------------------------------------------
expect "unit file" "$(prop FragmentPath)" /usr/local/lib/systemd/system/ckptd.service
expect "is-enabled" "$(systemctl is-enabled ckptd)" enabled
expect Type "$(prop Type)" notify
# A Type=notify unit is "activating" until READY=1 arrives; start returned
# and it is active: the daemon said READY.
expect ActiveState "$(prop ActiveState)" active
expect SubState "$(prop SubState)" running
expect User "$(prop User)" ckptd
main_pid=$(prop MainPID)
[ "$main_pid" -gt 0 ] || fail "MainPID is $main_pid"
expect "daemon's uid" "$(awk '/^Uid:/ {print $2}' "/proc/$main_pid/status")" "$(id -u ckptd)"
# CAP_DAC_OVERRIDE passes any file's mode, so the unit hides the secrets
# (InaccessiblePaths=): in the daemon's mount namespace (/proc/PID/root),
# read here as root, who passes every mode too, /etc/shadow is empty, while
# the system's holds every user's entry. The
# daemon's own /proc shows only what it may ptrace (ProtectProc=ptraceable),
# which is every process: alice's save below reads her trainer's memory.
[ -s /etc/shadow ] || fail "/etc/shadow of the system is empty: nothing to hide"
expect "/etc/shadow's size as the daemon sees it" \
  "$(stat -c %s "/proc/$main_pid/root/etc/shadow")" 0
expect "/etc/shadow's contents as the daemon sees them" \
  "$(head -c 64 "/proc/$main_pid/root/etc/shadow" | wc -c)" 0
expect "the daemon's /proc mount" \
  "$(awk '$2 == "/proc" {print ($4 ~ /hidepid=(ptraceable|4)/) ? "ptraceable" : $4}' \
    "/proc/$main_pid/mounts" | tail -n 1)" ptraceable
# For the record, not checked: systemd cannot raise LimitMEMLOCK= and
# LimitNOFILE= past the hard limits the container inherits from the host
# (the daemon then logs an unpinned pool and works, slower).
note "daemon's limits: $(grep -E '^Max (locked memory|open files)' "/proc/$main_pid/limits" |
  tr -s ' ' | tr '\n' ';')"
# The daemon sends STATUS= right after READY=1.
status_text=$(prop StatusText)
[[ "$status_text" =~ ^[0-9]+\ saves?\ in\ flight,\ pool\ [0-9]+/[0-9]+\ MiB$ ]] ||
  fail "StatusText '$status_text' is not the daemon's STATUS line"
note "ok: StatusText = $status_text"
note "systemctl show: $(systemctl show -p ActiveState,SubState,StatusText,MainPID,User ckptd | tr '\n' ' ')"
expect "socket" "$(stat -c '%a %U:%G' "$socket")" "660 ckptd:ckpt-users"

# --- 3. A save and a bit-exact restore by alice -------------------------------
# Two ranks, 8 MiB each: one save, then fresh processes load it into zeroed
# memory and check every byte (--restore).
runuser -u alice -- timeout 120 ckpt-loadgen --socket "$socket" --job alice-job \
  --ranks 2 --bytes-per-rank $((8 << 20)) --saves 1 --restore >"$out/alice.json" 2>&1 ||
  fail "alice's save and restore: $(tail -n 20 "$out/alice.json")"
json_true "$out/alice.json" ok || fail "alice's save: $(tail -n 1 "$out/alice.json")"
json_true "$out/alice.json" verified || fail "alice's restore: $(tail -n 1 "$out/alice.json")"
note "ok: alice (uid $(id -u alice), in ckpt-users) saved and restored every byte"
note "loadgen: $(tail -n 1 "$out/alice.json")"
expect "alice's job directory" "$(stat -c '%U %a' "$root/alice-job")" "alice 700"
test -f "$root/alice-job/step-00000001/COMMIT" || fail "alice-job/step-00000001 has no COMMIT"
# A load of a checkpoint alice-job does not have fails, and the daemon logs
# it as a warning (checked in the journal below).
if runuser -u alice -- timeout 60 ckpt-loadgen --socket "$socket" --job alice-job \
  --ranks 1 --bytes-per-rank $((8 << 20)) --saves 0 --restore --first-step 100 \
  >"$out/missing.txt" 2>&1; then
  fail "a load of alice-job/step-00000099, which was never saved, succeeded"
fi
# bob may not even connect (0660 sockets of group ckpt-users).
if runuser -u bob -- timeout 60 ckpt-loadgen --socket "$socket" --job bob-job \
  --ranks 1 --bytes-per-rank 4096 --saves 1 >"$out/bob.txt" 2>&1; then
  fail "bob, not in ckpt-users, could save: $(tail -n 1 "$out/bob.txt")"
fi
test ! -e "$root/bob-job" || fail "bob's refused save made $root/bob-job"
note "ok: bob (not in ckpt-users) was refused"

# --- 4. A drain on stop -------------------------------------------------------
runuser -u alice -- timeout 150 ckpt-loadgen --socket "$socket" --job drain-job \
  --ranks 1 --bytes-per-rank "$drain_bytes" --saves 1 >"$out/drain.json" 2>&1 &
saver=$!
# Stop only once the daemon has the save in flight (ckptctl status lists it).
for _ in $(seq 300); do
  ckptctl --socket "$socket" status >"$out/status-before-stop.txt" 2>&1 || true
  if grep -q '^drain-job/step-00000001 ' "$out/status-before-stop.txt"; then break; fi
  kill -0 "$saver" 2>/dev/null || break
  sleep 0.1
done
grep -q '^drain-job/step-00000001 ' "$out/status-before-stop.txt" ||
  fail "the slow save never showed in ckptctl status: $(cat "$out/status-before-stop.txt")"
test ! -e "$root/drain-job/step-00000001/COMMIT" ||
  fail "the slow save committed before the stop; raise drain_bytes"
note "in flight at stop: $(grep '^drain-job/' "$out/status-before-stop.txt")"

stop_s=$SECONDS
timeout 120 systemctl stop ckptd &
stopper=$!
# While it drains, the unit is deactivating and the daemon's STATUS, sent
# every 3 s, says what it waits for ("stopping: 1 save in flight, ...").
drain_status=""
while kill -0 "$stopper" 2>/dev/null; do
  if [ "$(prop ActiveState)" = deactivating ]; then
    text=$(prop StatusText)
    if [[ "$text" =~ ^stopping:\ [1-9][0-9]*\ saves?\ in\ flight ]]; then drain_status=$text; fi
  fi
  sleep 0.2
done
wait "$stopper" || fail "systemctl stop ckptd failed or took over 120 s"
note "ok: systemctl stop ckptd returned in $((SECONDS - stop_s)) s"
[ -n "$drain_status" ] ||
  fail "no 'stopping: N saves in flight' StatusText seen while the unit was deactivating"
note "ok: StatusText while draining = $drain_status"
expect "Result after stop" "$(prop Result)" success
expect "ExecMainStatus after stop" "$(prop ExecMainStatus)" 0

wait "$saver" || fail "the save in flight at the stop failed: $(tail -n 20 "$out/drain.json")"
json_true "$out/drain.json" ok || fail "the drained save: $(tail -n 1 "$out/drain.json")"
note "ok: the save in flight at the stop committed (its client waited for COMMITTED)"
test -f "$root/drain-job/step-00000001/COMMIT" || fail "drain-job/step-00000001 has no COMMIT"

journalctl -u ckptd --no-pager -o cat >"$out/ckptd-journal.txt"
# Structured lines (docs/OPERATIONS.md, "Logs"), and their levels reach
# journald as syslog priorities: the "<4>" of a warning is taken off the
# line and filed, so -p warning selects the failed load and no info line.
# (_SYSTEMD_UNIT= and _COMM= select the daemon's own lines, not systemd's
# about it, nor those of its service setup before the exec.)
unstructured=$(journalctl _SYSTEMD_UNIT=ckptd.service _COMM=ckptd --no-pager -o cat | grep -v '^ts=' || true)
[ -z "$unstructured" ] || fail "journal lines that are not ckptd's logfmt: $unstructured"
warnings=$(journalctl _SYSTEMD_UNIT=ckptd.service _COMM=ckptd --no-pager -o cat -p warning || true)
[[ "$warnings" == *"job=alice-job checkpoint=step-00000099 "*"msg=\"load failed: "* ]] ||
  fail "journalctl -p warning has no failed load of alice-job/step-00000099: '$warnings'"
[[ "$warnings" != *"level=info"* ]] || fail "journalctl -p warning shows info lines: '$warnings'"
note "ok: journalctl -p warning: $(printf '%s' "$warnings" | tr '\n' '|')"
# (Lines read into variables: `grep | grep -q` under pipefail fails when
# the second grep exits before the first has written everything.)
refusing=$(grep -F 'drain: refusing new saves' "$out/ckptd-journal.txt" || true)
[[ "$refusing" == *drain-job/step-00000001* ]] ||
  fail "the journal has no 'drain: refusing new saves ... drain-job/step-00000001'"
ended=$(grep -F 'ended while draining' "$out/ckptd-journal.txt" || true)
[[ "$ended" == *drain-job/step-00000001*"0 cancelled"* ]] ||
  fail "the journal does not say drain-job/step-00000001 ended while draining: '$ended'"
note "journal: $(grep -F 'drain:' "$out/ckptd-journal.txt" | tr '\n' '|')"

# The checkpoint the drain let finish is whole: restart, restore it into
# fresh zeroed memory, check every byte.
timeout 150 systemctl start ckptd || fail "systemctl start ckptd after the stop"
runuser -u alice -- timeout 120 ckpt-loadgen --socket "$socket" --job drain-job \
  --ranks 1 --bytes-per-rank "$drain_bytes" --saves 0 --restore --first-step 2 \
  >"$out/drain-restore.json" 2>&1 ||
  fail "restoring the drained checkpoint: $(tail -n 20 "$out/drain-restore.json")"
json_true "$out/drain-restore.json" verified ||
  fail "restoring the drained checkpoint: $(tail -n 1 "$out/drain-restore.json")"
note "ok: after a restart the drained checkpoint restored bit-exact"
timeout 120 systemctl stop ckptd
note "PASS"
