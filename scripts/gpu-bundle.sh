#!/usr/bin/env bash
# Packs what the GPU tests and the GPU benchmark need into gpu-bundle/, for a
# GPU machine that has the CUDA driver and a C library but none of the
# project's Debian build dependencies (no gRPC, protobuf, abseil, liburing,
# xxHash there, and no network): the stripped binaries of a CUDA build, and
# every shared library they load that is not part of the C/C++ runtime.
# Run it here after scripts/build.sh; then carry gpu-bundle.tar.gz (about
# 24 MiB; the directory is about 68 MiB, over the 64 MiB a device call
# carries with the checkout) to the GPU machine and run scripts/gpu-test.sh
# there, which unpacks it.
#
# The Python package is compiled there (scripts/gpu-python-build.sh), against
# that machine's Python and torch, which need not be ours: gpu-bundle/python/
# holds what the compiler needs besides the repository's sources: libckpt's
# static archives (and the CUDA runtime's), the headers of gRPC, protobuf,
# abseil and xxHash that they were built with, the generated protobuf
# headers, and link.txt, _ckpt's link line with every library mapped into
# the bundle (@BUNDLE@ stands for its path there).
#
# CKPT_BUILD_DIR (default build) and GPU_BUNDLE_DIR (default gpu-bundle)
# choose the build it packs and where the bundle goes (the test of this
# path, tests/gpu_bundle_test.sh, packs into a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CKPT_BUILD_DIR:-build}
dest=${GPU_BUNDLE_DIR:-gpu-bundle}
if [ ! -f "$build/cuda/libckpt_cuda.a" ]; then
  echo "gpu-bundle.sh: $build/ has no CUDA build (install the CUDA toolkit, run scripts/build.sh)" >&2
  exit 1
fi
binaries=(
  "$build/daemon/ckptd"
  "$build/client/ckptctl"
  "$build/bench/ckpt-gpu-bench"
  "$build/tests/ckpt_unit_tests"
  "$build/tests/ckpt_integration_tests"
  "$build/tests/ckpt-gpu-trainer"
  "$build/tests/ckpt-binding-probe"
  "$build/tests/ckpt-access-probe"
)
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for b in "${binaries[@]}"; do
  [ -x "$b" ] || { echo "gpu-bundle.sh: $b is missing" >&2; exit 1; }
  strip -o "$dest/bin/$(basename "$b")" "$b"
done
# The libraries every Linux has (the C runtime, libstdc++, libgcc, the
# dynamic loader) are the machine's own; everything else travels.
for lib in $(ldd "${binaries[@]}" | awk '/=> \//{print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
    *) cp -L "$lib" "$dest/lib/" ;;
  esac
done

# --- the Python package's inputs (see the top) ---
link_file=$build/client/python/CMakeFiles/_ckpt.dir/link.txt
[ -f "$link_file" ] || { echo "gpu-bundle.sh: $build/ has no ckptd._ckpt (see scripts/build.sh)" >&2; exit 1; }
py=$dest/python
# Not on a non-root user's PATH on Debian.
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
mkdir -p "$py/lib" "$py/include/ckpt/v1"
# A shared library, by its SONAME, into the bundle's lib/ (once); prints
# its path there.
bundle_shared() {
  local soname
  soname=$(objdump -p "$1" | awk '$1 == "SONAME" {print $2}')
  [ -n "$soname" ] || { echo "gpu-bundle.sh: $1 has no SONAME" >&2; exit 1; }
  [ -f "$dest/lib/$soname" ] || cp -L "$1" "$dest/lib/$soname"
  echo "@BUNDLE@/lib/$soname"
}
: > "$py/link.txt"
# The tokens after the object file: archives, shared libraries, flags.
for token in $(sed -e 's/^.* [^ ]*\.o //' "$link_file"); do
  case "$token" in
    */librt.a) echo "-lrt" ;;
    *.a)
      archive=$token
      [ "${archive#/}" = "$archive" ] && archive="$build/client/python/$archive"
      strip --strip-debug -o "$py/lib/$(basename "$archive")" "$archive"
      echo "@BUNDLE@/python/lib/$(basename "$archive")" ;;
    /*.so|/*.so.*) bundle_shared "$token" ;;
    -L*) ;;
    -lm|-lrt|-ldl|-lpthread|-latomic|-pthread|-Wl,*) echo "$token" ;;
    -l*)
      # awk reads to the end: exiting at the match would leave ldconfig
      # writing into a closed pipe, and its SIGPIPE fail this assignment
      # under pipefail (seen on a loaded machine).
      lib=$("$ldconfig" -p | awk -v n="lib${token#-l}.so" '$1 == n && !found {print $NF; found = 1}')
      [ -n "$lib" ] || { echo "gpu-bundle.sh: cannot find $token" >&2; exit 1; }
      bundle_shared "$lib" ;;
    *) echo "gpu-bundle.sh: unexpected link token $token" >&2; exit 1 ;;
  esac
done >> "$py/link.txt"
cp "$build"/proto/ckpt/v1/*.pb.h "$py/include/ckpt/v1/"
for dir in absl google/protobuf grpc grpcpp grpc++; do
  mkdir -p "$py/include/$(dirname "$dir")"
  cp -r "/usr/include/$dir" "$py/include/$dir"
done
cp /usr/include/xxhash.h "$py/include/"
xxhash=$("$ldconfig" -p | awk '$1 == "libxxhash.so.0" && !found {print $NF; found = 1}')
[ -n "$xxhash" ] || { echo "gpu-bundle.sh: cannot find libxxhash.so.0" >&2; exit 1; }
bundle_shared "$xxhash" >/dev/null
# gzip, not xz: the GPU machine's image is not ours, and every tar reads it.
tar czf "$dest.tar.gz" -C "$(dirname "$dest")" "$(basename "$dest")"
du -sh "$dest" "$dest.tar.gz"
