#!/usr/bin/env bash
# The GPU machine's path, rehearsed here: scripts/gpu-bundle.sh packs the
# build given as $1, scripts/gpu-python-build.sh compiles the Python package
# from the repository and that bundle alone (with the interpreter $2), and
# the package it made saves and restores GPU tensors of the simulated device
# through the bundle's daemon (tests/python/test_torch_gpu.py). Where the
# interpreter's torch has CUDA 13 wheels (the test venv's does), the
# package's CUDA side is built as pip builds it, on torch's own runtime, and
# this checks that the trainer then maps that one runtime. Without it,
# a break in the bundle would show only on a GPU machine, whose time is
# scarce.
set -euo pipefail
build=$1
python=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CKPT_BUILD_DIR=$build GPU_BUNDLE_DIR=$tmp/gpu-bundle "$repo/scripts/gpu-bundle.sh"
GPU_BUNDLE_DIR=$tmp/gpu-bundle PYTHON=$python "$repo/scripts/gpu-python-build.sh" "$tmp/gpu-python"
# Every header came from the repository, the bundle, Python, torch or the
# C/C++ runtime: a header found in this machine's /usr/include instead is
# one the GPU machine lacks.
leaks=$(sed -e 's/\\$//' -e 's/^[^:]*://' "$tmp"/gpu-python/*.d "$tmp"/gpu-python/cuda/*.d 2>/dev/null |
        tr ' ' '\n' |
        grep -E '^/usr/(local/)?include/' |
        grep -vE '^/usr/include/([^/]+\.h|x86_64-linux-gnu/|linux/|asm-generic/|c\+\+/|python3)' |
        sort -u || true)
if [ -n "$leaks" ]; then
  echo "gpu_bundle_test.sh: headers the bundle lacks:" >&2
  echo "$leaks" >&2
  exit 1
fi
# And every library _ckpt loads beyond the C/C++ runtime is the bundle's,
# or torch's wheels' CUDA runtime where it is built on that.
wheel_cudart=$("$python" "$repo/cmake/find_torch_wheel_cuda.py" 2>/dev/null) || wheel_cudart=
wheel_cudart=${wheel_cudart%%;*}
linked=$(env -u LD_LIBRARY_PATH ldd "$tmp"/gpu-python/ckptd/_ckpt*.so | awk '/=> \//{print $3}')
if [ -n "$wheel_cudart" ] &&
   [ "$(grep libcudart <<< "$linked" | xargs -r realpath)" != "$(realpath "$wheel_cudart")" ]; then
  echo "gpu_bundle_test.sh: _ckpt does not link torch's wheels' runtime $wheel_cudart:" >&2
  echo "$linked" >&2
  exit 1
fi
outside=$(grep -v "^$tmp/gpu-bundle/lib/" <<< "$linked" |
          grep -vxF "${wheel_cudart:-/}" |
          grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s)\.so' || true)
if [ -n "$outside" ]; then
  echo "gpu_bundle_test.sh: _ckpt loads libraries from outside the bundle:" >&2
  echo "$outside" >&2
  exit 1
fi
cd "$repo/tests/python"
# The package must need nothing from the build tree: no PYTHONPATH to it,
# and the bundle's daemon.
export PYTHONPATH="$tmp/gpu-python" CKPTD_BINARY="$tmp/gpu-bundle/bin/ckptd" \
  CKPTCTL_BINARY="$tmp/gpu-bundle/bin/ckptctl"
"$python" -c "import ckptd._ckpt as m, sys; sys.exit(not m.__file__.startswith('$tmp/'))" ||
  { echo "gpu_bundle_test.sh: ckptd was not imported from the package just built" >&2; exit 1; }
if [ -n "$wheel_cudart" ]; then
  # One CUDA runtime in a trainer that imported both, torch's.
  "$python" - "$wheel_cudart" <<'PY'
import os, sys
import torch  # noqa: F401 (loads torch's runtime first, as a trainer does)
from ckptd import _ckpt
assert _ckpt.HAS_CUDA, "the package has no CUDA side"
with open("/proc/self/maps") as maps:
    mapped = {os.path.realpath(line.split()[-1]) for line in maps if "libcudart" in line}
assert mapped == {os.path.realpath(sys.argv[1])}, f"mapped {mapped}, torch's is {sys.argv[1]}"
print(f"one CUDA runtime mapped, torch's: {sys.argv[1]}")
PY
fi
"$python" -m unittest -v test_torch_gpu
