"""Finds the CUDA runtime of the torch wheels installed for this Python.

A user who installs ckptd with pip has no CUDA toolkit, only the torch
wheel and NVIDIA's CUDA wheels that come with it (nvidia/cu13/include,
nvidia/cu13/lib/libcudart.so.13). ckptd's CUDA side (cuda/) is host code
calling the runtime, so it is compiled against those headers and linked to
that libcudart: the very runtime torch loads. Two builds ask: the pip build
(cmake/torch_wheel_cuda.cmake) and the GPU machine's build of the package
from the GPU bundle (scripts/gpu-python-build.sh), so both make the same
package.

cuda_runtime_api.h includes crt/host_defines.h, which CUDA 13 ships in a
wheel of its own (nvidia-cuda-crt, the `crt` extra of the cuda-toolkit
wheel torch depends on) that torch does not install: without it the
headers do not compile, and a toolkit's copy found in /usr/local/include
would be a second CUDA's headers mixed in silently.

Prints "LIBCUDART;INCLUDE_DIR..." (a CMake list, no newline: the runtime,
then the directories of the runtime's headers and of crt/, one if they are
the same) and exits 0. Exits 1 where torch has no usable CUDA 13 (no torch,
no CUDA, a CUDA older than 13: cuda/ uses CUDA 13's runtime API, or no
runtime in its wheels), printing nothing; 2 where it has one but the crt/
headers are missing, printing the runtime and its headers' directory. The
reason is on stderr either way.
"""
import glob
import os
import re
import sys

NO_CUDA = 1
NO_CRT = 2


def find():
    try:
        import torch
    except ImportError:
        return None, NO_CUDA, "torch is not installed"
    if not torch.version.cuda:
        return None, NO_CUDA, f"torch {torch.__version__} has no CUDA"
    if int(torch.version.cuda.split(".")[0]) < 13:
        return None, NO_CUDA, f"torch's CUDA {torch.version.cuda} is older than 13"
    try:
        import nvidia
    except ImportError:
        return None, NO_CUDA, "torch's CUDA wheels (nvidia/...) are not installed"
    # nvidia/ is a namespace package: each wheel's part of it may lie in
    # another directory of sys.path, so every part is searched.
    roots = list(nvidia.__path__)
    for root in roots:
        for header in sorted(glob.glob(os.path.join(root, "*", "include", "cuda_runtime_api.h"))):
            include = os.path.dirname(header)
            home = os.path.dirname(include)
            runtimes = sorted(glob.glob(os.path.join(home, "lib", "libcudart.so.*")))
            if not runtimes:
                continue
            with open(header) as f:
                version = re.search(r"^#define CUDART_VERSION +([0-9]+)", f.read(), re.M)
            if not version or int(version.group(1)) < 13000:
                return None, NO_CUDA, (
                    f"{include}: CUDA runtime "
                    f"{version.group(1) if version else 'of unknown version'}, not 13 or newer")
            # crt/ of the same CUDA (nvidia/<the same cuXX>/include/crt).
            relative = os.path.relpath(include, root)
            crt = [os.path.join(r, relative) for r in roots
                   if os.path.isfile(os.path.join(r, relative, "crt", "host_defines.h"))]
            if not crt:
                return f"{runtimes[0]};{include}", NO_CRT, (
                    f"torch's CUDA wheels have the runtime ({runtimes[0]}) but not the "
                    "crt/ headers its cuda_runtime_api.h includes: install them, at "
                    "the version torch chose, with pip install 'cuda-toolkit[crt]' "
                    "(scripts/requirements-package.txt has it)")
            includes = [include] + [d for d in crt[:1] if d != include]
            return ";".join([runtimes[0], *includes]), 0, None
    return None, NO_CUDA, "no CUDA runtime headers and libcudart.so in torch's CUDA wheels"


if __name__ == "__main__":
    found, code, why = find()
    if found:
        print(found, end="")
    if why:
        print(why, file=sys.stderr)
    sys.exit(code)
