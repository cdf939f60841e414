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
  # systemd-analyze and systemd-sysusers check the unit (tests/deploy/check_unit.sh).
  systemd
  # The unit booted under a real systemd in a debootstrapped Debian tree
  # (tests/system/systemd_unit_test.sh; skipped without them).
  systemd-container debootstrap
)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  -r scripts/requirements-test.txt
