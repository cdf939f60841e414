#!/usr/bin/env bash
# Packs what the GPU tests and the GPU benchmark need into gpu-bundle/, for a
# GPU machine that has the CUDA driver and a C library but none of the
# project's Debian build dependencies (no gRPC, protobuf, abseil, liburing,
# xxHash there, and no network): the stripped binaries of a CUDA build, and
# every shared library they load that is not part of the C/C++ runtime.
# Run it here after scripts/build.sh; then carry gpu-bundle/ (about 40 MiB)
# to the GPU machine and run scripts/gpu-test.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/cuda/libckpt_cuda.a ]; then
  echo "gpu-bundle.sh: build/ has no CUDA build (install the CUDA toolkit, run scripts/build.sh)" >&2
  exit 1
fi
binaries=(
  build/daemon/ckptd
  build/client/ckptctl
  build/bench/ckpt-gpu-bench
  build/tests/ckpt_unit_tests
  build/tests/ckpt_integration_tests
  build/tests/ckpt-gpu-trainer
  build/tests/ckpt-binding-probe
  build/tests/ckpt-access-probe
)
rm -rf gpu-bundle
mkdir -p gpu-bundle/bin gpu-bundle/lib
for b in "${binaries[@]}"; do
  [ -x "$b" ] || { echo "gpu-bundle.sh: $b is missing" >&2; exit 1; }
  strip -o "gpu-bundle/bin/$(basename "$b")" "$b"
done
# The libraries every Linux has (the C runtime, libstdc++, libgcc, the
# dynamic loader) are the machine's own; everything else travels.
for lib in $(ldd "${binaries[@]}" | awk '/=> \//{print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
    *) cp -L "$lib" gpu-bundle/lib/ ;;
  esac
done
du -sh gpu-bundle
