#!/usr/bin/env bash
# ckptd against its peers (DCP save/async_save/load, torch_checkpointing,
# torch.save, fio) on the same machine, state and run; see
# bench/peers/README.md. After the README's setup (scripts/setup-debian.sh):
#
#   bench/peers/run.sh            # the full matrix; updates docs/ and README.md
#   bench/peers/run.sh --quick    # development: 64 MiB states, 1 rep, docs untouched
#   bench/peers/run.sh --help     # sizes, reps, methods, --dir, --bin-dir, ...
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv/bin/python ]; then
  echo "no .venv: run scripts/setup-debian.sh first" >&2
  exit 1
fi
# torch (the version the DCP test pins), the peers and matplotlib.
.venv/bin/python -m pip install -q --disable-pip-version-check \
  -r scripts/requirements-dcp.txt -r scripts/requirements-bench.txt
command -v fio >/dev/null || { echo "fio missing: run scripts/setup-debian.sh" >&2; exit 1; }
exec .venv/bin/python bench/peers/driver.py "$@"
