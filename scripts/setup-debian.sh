#!/usr/bin/env bash
# Installs everything ckptd needs to build, test and benchmark on Debian 12:
# the toolchain and libraries from Debian's packages, and a project virtual
# environment (.venv) with the Python packages the format checks use.
# Idempotent; safe to run again. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

packages=(
  build-essential cmake pkg-config git
  clang  # scripts/check-thread-safety.sh: lock annotations checked at compile time
  # The sanitizer and libFuzzer runtimes (only recommended by clang):
  # scripts/check-sanitizers.sh, scripts/run-fuzzers.sh.
  libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev liburing-dev libxxhash-dev catch2
  # The S3 client (storage/s3/): libcurl for HTTP and TLS, OpenSSL for
  # SigV4's SHA-256 and HMAC-SHA256, expat for S3's XML answers.
  libcurl4-openssl-dev libssl-dev libexpat1-dev
  libsystemd-dev  # sd_notify: Type=notify readiness, STOPPING and STATUS (daemon/service_notifier.h)
  fio python3 python3-venv python3-dev pybind11-dev
  # A trainer's prctl(PR_SET_PTRACER) watched (tests/integration/ordinary_user_test.cc).
  strace
  # The wheel for machines without these libraries: their copies' run paths
  # (scripts/portable-wheel.py).
  patchelf
  # systemd-analyze and systemd-sysusers check the unit (tests/deploy/check_unit.sh).
  systemd
  # The unit booted under a real systemd in a debootstrapped Debian tree
  # (tests/system/systemd_unit_test.sh; skipped without them).
  systemd-container debootstrap
  # Ceph RGW, the second real S3 server of the S3 tests (tests/s3/start-rgw.sh:
  # one monitor, one OSD on a file, radosgw on 127.0.0.1; skipped without
  # them). ceph-common brings ceph, radosgw-admin and ceph-authtool,
  # ceph-base (a dependency) monmaptool. About 40 s to install here. Their
  # services must not start: see policy-rc.d below.
  ceph-mon ceph-osd radosgw ceph-common
)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # No package may start a system service here (Ceph's would start cluster
  # daemons): where no policy-rc.d denies them (Debian's container images
  # ship one that exits 101), one is written for the install and removed
  # after it.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# Written by ckptd scripts/setup-debian.sh for one install.\nexit 101\n' |
      $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    trap '$SUDO rm -f "$policy"' EXIT
  else
    rc=0
    "$policy" ceph-mon start >/dev/null 2>&1 || rc=$?
    if [ "$rc" -ne 101 ]; then
      echo "setup-debian: $policy allows service starts (exit $rc, not 101); refusing to" \
        "install packages that would start Ceph daemons" >&2
      exit 1
    fi
  fi
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  -r scripts/requirements-test.txt
