#!/usr/bin/env bash
# Builds the Python package `ckptd` on a GPU machine, from the repository's
# sources and what scripts/gpu-bundle.sh put in gpu-bundle/python/, against
# that machine's Python and torch (which need not be the development
# machine's: the extensions are compiled here, with this machine's C++
# compiler; libckpt itself comes prebuilt in the bundle).
#
# The package is the one pip builds (pyproject.toml), as far as the GPU
# sees it: where torch has CUDA 13 wheels, the CUDA side (cuda/, host code)
# is compiled here against their headers and linked to their libcudart.so,
# the runtime torch itself loads (cmake/find_torch_wheel_cuda.py finds it
# for both builds), so the trainer holds one CUDA runtime. Elsewhere
# (torch's CUDA from a toolkit, say) _ckpt links the bundle's libckpt_cuda
# and the toolkit's static runtime, as the project's own build does.
#
#   scripts/gpu-python-build.sh [OUTPUT_DIR]    # default: gpu-python/
#
# Then PYTHONPATH=OUTPUT_DIR imports ckptd (ckptd._ckpt, with CUDA;
# ckptd._state_cache, so ckptd.torch; ckptd._allocator_hook where torch has
# CUDA and the CUDA headers are found). PYTHON (default python3) and CXX
# (default c++) choose the interpreter and the compiler, GPU_BUNDLE_DIR
# (default gpu-bundle) the bundle.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bundle=$(realpath "${GPU_BUNDLE_DIR:-gpu-bundle}")
py=$bundle/python
out=${1:-$repo/gpu-python}
python=${PYTHON:-python3}
cxx=${CXX:-c++}
[ -f "$py/link.txt" ] || { echo "gpu-python-build.sh: $py/link.txt is missing (run scripts/gpu-bundle.sh on the development machine)" >&2; exit 1; }

read_python() { "$python" -c "$1"; }
suffix=$(read_python 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
python_include=$(read_python 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$python_include/Python.h" ] || { echo "gpu-python-build.sh: no Python.h in $python_include (the Python development headers)" >&2; exit 1; }
torch_dir=$(read_python 'import os, torch; print(os.path.dirname(torch.__file__))')
read_python 'import numpy' || { echo "gpu-python-build.sh: $python has no numpy, which ckptd needs" >&2; exit 1; }
# torch's own C++ ABI, which every module that includes its headers must use.
torch_abi=$(read_python 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
pybind11_include=$(read_python 'import pybind11; print(pybind11.get_include())' 2>/dev/null ||
                   echo "$torch_dir/include")
# The CUDA runtime of torch's wheels (libcudart.so and its headers), or else
# the toolkit's headers (for the allocator hook) with the bundle's static
# runtime. Where the wheels lack the crt/ headers (pip installs them from
# PyPI, which a GPU machine cannot reach), this machine's toolkit lends its
# own, if they are of the same CUDA release.
wheel_cudart=
cuda_includes=()
toolkit_include=${CUDA_HOME:-/usr/local/cuda}/include
release() { awk '/^#define CUDART_VERSION /{print $3}' "$1/cuda_runtime_api.h" 2>/dev/null; }
why=$(mktemp)
found=$("$python" "$repo/cmake/find_torch_wheel_cuda.py" 2>"$why") && finder=0 || finder=$?
IFS=';' read -ra parts <<< "$found"
if [ $finder = 2 ] && [ -f "$toolkit_include/crt/host_defines.h" ] &&
   [ "$(release "$toolkit_include")" = "$(release "${parts[1]}")" ]; then
  echo "gpu-python-build.sh: $(cat "$why"); taking them from the toolkit, $toolkit_include (CUDA $(release "$toolkit_include"), as the wheels')"
  # crt/ alone: no other toolkit header may stand in for the wheels'.
  mkdir -p "$out/toolkit-crt"
  ln -sfn "$toolkit_include/crt" "$out/toolkit-crt/crt"
  parts+=("$out/toolkit-crt")
  finder=0
fi
if [ $finder = 0 ]; then
  wheel_cudart=${parts[0]}
  cuda_includes=("${parts[@]:1}")
  echo "gpu-python-build.sh: CUDA from torch's wheels: $wheel_cudart, headers ${cuda_includes[*]}"
else
  echo "gpu-python-build.sh: not torch's wheels' CUDA ($(cat "$why")): the bundle's static runtime"
  [ -f "$toolkit_include/cuda_runtime_api.h" ] && cuda_includes=("$toolkit_include")
fi
rm -f "$why"
cuda_isystem=()
for dir in "${cuda_includes[@]}"; do cuda_isystem+=(-isystem "$dir"); done
compile=(-O2 -DNDEBUG -fPIC -fvisibility=hidden -std=c++20 -pthread)
common=("${compile[@]}" -shared)
mapfile -t ckpt_libs < <(sed "s|@BUNDLE@|$bundle|" "$py/link.txt")
mkdir -p "$out/ckptd"
cp client/python/ckptd/*.py "$out/ckptd/"
cuda_objects=()
if [ -n "$wheel_cudart" ]; then
  # cuda/ from source in place of the bundle's archive and static runtime,
  # one compile a file, in parallel.
  mapfile -t ckpt_libs < <(printf '%s\n' "${ckpt_libs[@]}" |
                           grep -vE '/lib(ckpt_cuda|cudart_static)\.a$')
  mkdir -p "$out/cuda"
  pids=()
  for source in cuda/*.cc; do
    object=$out/cuda/$(basename "$source" .cc).o
    "$cxx" "${compile[@]}" -c -MD -MF "${object%.o}.d" \
      -DCKPT_HAVE_CUDA=1 -I"$repo" -I"$py/include" "${cuda_isystem[@]}" \
      -o "$object" "$source" > "${object%.o}.log" 2>&1 &
    pids+=($!)
    cuda_objects+=("$object")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "gpu-python-build.sh: ${cuda_objects[$i]%.o}.cc failed:" >&2
                            tail -30 "${cuda_objects[$i]%.o}.log" >&2; exit 1; }
  done
  # The wheels' runtime by its directory, as pip's build finds it.
  ckpt_libs+=("$wheel_cudart" -Wl,-rpath,"$(dirname "$wheel_cudart")")
fi

# The three compile in parallel; each logs to OUTPUT_DIR/NAME.log, and
# lists the headers it read in OUTPUT_DIR/NAME.d (tests/gpu_bundle_test.sh
# checks that none came from outside the bundle). _ckpt finds the bundle's
# libraries through an RPATH (not a RUNPATH, which the libraries' own
# dependencies would not see).
"$cxx" "${common[@]}" -MD -MF "$out/_ckpt.d" -DCKPT_HAVE_CUDA=1 -I"$repo" -I"$py/include" \
  -isystem "$python_include" -isystem "$pybind11_include" \
  -o "$out/ckptd/_ckpt$suffix" client/python/ckpt_module.cc "${cuda_objects[@]}" "${ckpt_libs[@]}" \
  -Wl,--disable-new-dtags,-rpath,"$bundle/lib" -Wl,-rpath-link,"$bundle/lib" \
  > "$out/_ckpt.log" 2>&1 &
ckpt_pid=$!
torch_flags=(-D_GLIBCXX_USE_CXX11_ABI="$torch_abi" -isystem "$torch_dir/include"
             -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$python_include"
             -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib")
"$cxx" "${common[@]}" -MD -MF "$out/_state_cache.d" -I"$py/include" "${torch_flags[@]}" \
  -o "$out/ckptd/_state_cache$suffix" client/python/state_cache_module.cc \
  -ltorch_python -ltorch_cpu -lc10 "$bundle/lib/libxxhash.so.0" \
  -Wl,-rpath,"$bundle/lib" > "$out/_state_cache.log" 2>&1 &
cache_pid=$!
hook_pid=
if [ -f "$torch_dir/lib/libc10_cuda.so" ] && [ ${#cuda_includes[@]} -gt 0 ]; then
  "$cxx" "${common[@]}" "${torch_flags[@]}" "${cuda_isystem[@]}" \
    -o "$out/ckptd/_allocator_hook$suffix" client/python/allocator_hook_module.cc \
    -lc10_cuda -lc10 > "$out/_allocator_hook.log" 2>&1 &
  hook_pid=$!
else
  echo "gpu-python-build.sh: ckptd._allocator_hook is not built (no CUDA torch, or no cuda_runtime_api.h found)"
fi
status=0
for job in "_ckpt:$ckpt_pid" "_state_cache:$cache_pid" ${hook_pid:+"_allocator_hook:$hook_pid"}; do
  if ! wait "${job#*:}"; then
    echo "gpu-python-build.sh: ckptd.${job%%:*} failed:" >&2
    tail -30 "$out/${job%%:*}.log" >&2
    status=1
  fi
done
[ $status = 0 ] && echo "gpu-python-build.sh: ckptd built in $out for $("$python" --version 2>&1), torch $(read_python 'import torch; print(torch.__version__)')"
exit $status
