#!/usr/bin/env bash
# The installed systemd unit, sysusers and tmpfiles entries as systemd reads
# them: `systemd-analyze verify` (directives, the binary it runs),
# `systemd-analyze security` (the unit's exposure may not grow past
# MAX_EXPOSURE, in tenths: docs/OPERATIONS.md, "Hardening", gives today's
# figure and why each remaining exposure is needed), and systemd-sysusers on
# an empty root (the user and the two groups of the trust model).
#
# Usage: check_unit.sh PREFIX MAX_EXPOSURE   (PREFIX: a `cmake --install`)
# Exits 77 (reported skipped by ctest) where systemd's tools are absent.
set -euo pipefail
prefix="$1"
max_exposure="$2"
unit="$prefix/lib/systemd/system/ckptd.service"
for tool in systemd-analyze systemd-sysusers; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (Debian package systemd)"
    exit 77
  fi
done
test -f "$unit"
# The unit runs the installed binary with the installed config file.
grep -qx "ExecStart=$prefix/bin/ckptd --config $prefix/etc/ckptd/ckptd.conf" "$unit"
test -f "$prefix/etc/ckptd/ckptd.conf"

# verify prints nothing and exits 0 for a clean unit; anything it prints is
# a finding (an unknown directive is only a warning to it).
out=$(systemd-analyze verify --man=no "$unit" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify $unit:"
  echo "$out"
  exit 1
fi

systemd-analyze security --offline=yes "$unit" | tail -1
if ! systemd-analyze security --offline=yes --threshold="$max_exposure" "$unit" >/dev/null; then
  echo "the unit's exposure grew past $max_exposure/10:"
  systemd-analyze security --offline=yes "$unit" | grep -v '✓'
  exit 1
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$prefix/lib/sysusers.d/ckptd.conf" >/dev/null 2>&1
grep -q '^ckptd:' "$root/etc/passwd"
grep -q '^ckpt-users:' "$root/etc/group"
grep -q '^ckpt-ops:' "$root/etc/group"
# The storage root the unit may write is the one tmpfiles makes.
grep -q '^ReadWritePaths=/var/lib/ckptd$' "$unit"
grep -q '^d /var/lib/ckptd 0711 ckptd ckptd -$' "$prefix/lib/tmpfiles.d/ckptd.conf"
echo "unit, sysusers and tmpfiles entries check out"
