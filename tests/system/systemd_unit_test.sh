#!/usr/bin/env bash
# The installed unit under a real systemd: boots a Debian tree with
# systemd-nspawn, installs ckptd into it as an operator would, and checks
# READY (Type=notify), a save and a bit-exact restore by a non-root trainer
# in the allowed group, and a drain on stop (systemd_unit_check.sh, which
# runs inside, says how). docs/OPERATIONS.md, "Tested under systemd".
#
# Usage: systemd_unit_test.sh CMAKE BUILD_DIR CKPTD CKPTCTL CKPT_LOADGEN
#
# The tree is debootstrapped once per build directory into
# BUILD_DIR/nspawn-tree-cache (about 2 minutes; reused while its stamp says
# it is complete and holds the packages the binaries need now), then copied
# to a scratch tree per run, so every run boots a system that has never seen
# ckptd. CKPT_DEBIAN_MIRROR overrides the mirror.
#
# Exits 77 (ctest: skipped) with "SKIP: <reason>" where it cannot run: not
# root, systemd-nspawn or debootstrap missing, no route to the mirror, or
# systemd does not boot in a container here.
set -euo pipefail

cmake_bin="$1"
build=$(cd "$2" && pwd)
binaries=("$3" "$4" "$5")
loadgen="$5"
here=$(cd "$(dirname "$0")" && pwd)
cache="$build/nspawn-tree-cache"
mirror="${CKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Longest the booted container may take, boot and checks together (they take
# under a minute); past it nspawn is stopped and the run fails.
boot_timeout=420

skip() {
  echo "SKIP: $*"
  exit 77
}

[ "$(id -u)" -eq 0 ] || skip "needs root (systemd-nspawn boots a container)"
command -v systemd-nspawn >/dev/null ||
  skip "systemd-nspawn is not installed (Debian package systemd-container)"

# The tree must be the release the binaries were built on: their shared
# libraries are that release's.
# shellcheck source=/dev/null
. /etc/os-release
suite="${VERSION_CODENAME:-}"
if [ "${ID:-}" != debian ] || [ -z "$suite" ]; then
  skip "the host is not Debian (${PRETTY_NAME:-unknown}); the tree is debootstrapped from its release"
fi

# Unmounts whatever a killed debootstrap or nspawn left mounted below $1,
# then removes it, never crossing into another file system.
remove_tree() {
  local dir=$1
  [ -e "$dir" ] || return 0
  findmnt -rn -o TARGET | awk -v d="$dir" 'index($0, d "/") == 1' | sort -r |
    while read -r m; do umount -l "$m" || true; done
  rm -rf --one-file-system "$dir"
}

# --- The packages the binaries need ------------------------------------------
# Each shared library ldd names, mapped to the Debian package that owns it
# (merged /usr: dpkg may know it under /lib or /usr/lib). A library no
# package owns is copied into the tree as it is instead.
packages=(systemd systemd-sysv dbus)
unowned=()
mapfile -t libs < <(for b in "${binaries[@]}"; do ldd "$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
candidates() { printf '%s\n' "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; }
# One dpkg query for all of them (each costs a read of dpkg's database):
# "pkg:arch: path" per path some package owns.
declare -A owner_of=()
while IFS= read -r line; do
  case "$line" in diversion*) continue ;; esac
  pkg=${line%%: *}
  pkg=${pkg%%,*}
  owner_of[${line#*: }]=${pkg%%:*}
done < <(for lib in "${libs[@]}"; do candidates "$lib"; done | sort -u |
  xargs dpkg -S 2>/dev/null || true)
for lib in "${libs[@]}"; do
  owner=""
  while read -r path; do
    owner=${owner_of[$path]:-}
    [ -z "$owner" ] || break
  done < <(candidates "$lib")
  if [ -n "$owner" ]; then packages+=("$owner"); else unowned+=("$lib"); fi
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
stamp="suite=$suite mirror=$mirror packages=$(
  IFS=,
  echo "${packages[*]}"
)"

# --- The cached tree -----------------------------------------------------------
# One run at a time builds it; others wait here, then reuse it.
exec 9>"$cache.lock"
flock 9
if [ "$(cat "$cache/.ckpt-stamp" 2>/dev/null || true)" != "$stamp" ]; then
  command -v debootstrap >/dev/null || skip "debootstrap is not installed (Debian package debootstrap)"
  mirror_host=$(echo "$mirror" | sed -E 's#^[a-z]+://([^/:]+).*#\1#')
  mirror_port=80
  case "$mirror" in https://*) mirror_port=443 ;; esac
  timeout 15 bash -c "exec 3<>/dev/tcp/$mirror_host/$mirror_port" 2>/dev/null ||
    skip "no network to $mirror_host for debootstrap, and no tree for this build cached in $cache"
  echo "debootstrapping $suite into $cache (once per build directory; about 2 minutes)"
  remove_tree "$cache"
  remove_tree "$cache.tmp"
  start=$SECONDS
  if ! debootstrap --variant=minbase --include="$(
    IFS=,
    echo "${packages[*]}"
  )" "$suite" "$cache.tmp" "$mirror" >"$build/nspawn-tree-cache.log" 2>&1; then
    tail -n 30 "$build/nspawn-tree-cache.log"
    remove_tree "$cache.tmp"
    echo "FAIL: debootstrap failed (log: $build/nspawn-tree-cache.log)"
    exit 1
  fi
  # Smaller copies per run; nothing here needs apt's downloads again.
  rm -rf "$cache.tmp/var/cache/apt/archives/"*.deb
  echo "$stamp" >"$cache.tmp/.ckpt-stamp"
  mv "$cache.tmp" "$cache"
  echo "debootstrap took $((SECONDS - start)) s"
fi

# --- This run's tree -------------------------------------------------------------
run=$(mktemp -d "$build/systemd-test.XXXXXX")
tree="$run/tree"
trap 'remove_tree "$run"' EXIT
cp -a "$cache" "$tree"
exec 9>&-
rm -f "$tree/.ckpt-stamp"
for lib in "${unowned[@]}"; do
  echo "note: $lib belongs to no Debian package; copied into the tree"
  mkdir -p "$tree$(dirname "$lib")"
  cp -L "$lib" "$tree$lib"
done

# ckptd as `sudo cmake --install build` puts it on a host (default prefix
# /usr/local), and the load generator as the trainer.
DESTDIR="$tree" "$cmake_bin" --install "$build" >/dev/null
install -m 0755 "$loadgen" "$tree/usr/local/bin/ckpt-loadgen"

# The check, run by a oneshot unit once the system is up; the container
# powers off when it ends, whatever it found.
mkdir -p "$tree/ckpt-system-test"
install -m 0755 "$here/systemd_unit_check.sh" "$tree/ckpt-system-test/check.sh"
cat >"$tree/etc/systemd/system/ckpt-system-check.service" <<'EOF'
[Unit]
Description=ckptd system test (tests/system/systemd_unit_check.sh)
After=multi-user.target
SuccessAction=poweroff
FailureAction=poweroff

[Service]
Type=oneshot
ExecStart=/ckpt-system-test/check.sh
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
systemctl --root="$tree" enable ckpt-system-check.service >/dev/null 2>&1

# --- Boot ----------------------------------------------------------------------
# --register=no --keep-unit: no machined or host bus is needed (the host's
# PID 1 need not be systemd). SIGTERM at the timeout asks the container's
# systemd to halt; SIGKILL 15 s later ends it anyway.
echo "booting systemd in $tree"
start=$SECONDS
boot_rc=0
timeout -k 15 "$boot_timeout" systemd-nspawn -D "$tree" -b --register=no --keep-unit \
  --console=pipe -q </dev/null >"$run/console.log" 2>&1 || boot_rc=$?
echo "the container ran $((SECONDS - start)) s (systemd-nspawn exit status $boot_rc)"

results="$tree/ckpt-system-test"
if [ ! -e "$results/started" ]; then
  tail -n 40 "$run/console.log"
  if [ "$boot_rc" -eq 124 ]; then
    echo "FAIL: the container booted but did not reach the check within ${boot_timeout} s"
    exit 1
  fi
  skip "systemd-nspawn could not boot systemd here (exit status $boot_rc; its console above)"
fi
cat "$results/results.txt" 2>/dev/null || true
if [ "$(cat "$results/rc" 2>/dev/null || true)" = 0 ] && [ "$boot_rc" -eq 0 ]; then
  echo "systemd unit test passed"
  exit 0
fi
# The console carries the boot's whole journal (journal.txt holds the same,
# for a run whose console is lost), so it is shown first and in full.
echo "==== console"
cat "$run/console.log"
[ -s "$run/console.log" ] || tail -n 300 "$results/journal.txt" 2>/dev/null || true
for f in ckptd-journal.txt alice.json bob.txt drain.json drain-restore.json; do
  if [ -s "$results/$f" ]; then
    echo "==== $f"
    tail -n 200 "$results/$f"
  fi
done
echo "FAIL: the check inside the container failed (rc $(cat "$results/rc" 2>/dev/null || echo none), nspawn $boot_rc)"
exit 1
