#!/usr/bin/env python3
"""Makes the wheel `pip wheel` built here installable where the build
dependencies are not: on a cluster whose users have pip and torch but no
root, so no `apt-get install` of gRPC, protobuf, abseil and the rest.

    pip wheel --no-build-isolation --no-deps -w dist .
    python3 scripts/portable-wheel.py dist/ckptd-*.whl dist/portable

The wheel's binaries (ckptd, ckptctl) and extension modules link those
libraries from the system (docs/ARCHITECTURE.md, "Installed with pip").
This copies every shared library they load into `ckptd.libs/` inside the
wheel, and sets the run paths (`patchelf`, Debian's package) so that each
finds them there first: the modules as `$ORIGIN/../ckptd.libs`, the
binaries through the path from a venv's `bin` to its
`lib/python3.X/site-packages`, the copied libraries each other as
`$ORIGIN`. What is not copied: the C and C++
runtimes every Linux has (glibc, libstdc++, libgcc_s), which must be as new
as here (Debian 12: glibc 2.36), and what torch brings (its own libraries,
and libcudart from its CUDA wheels, which the package must share with it).
So the wheel is still for this Python and this torch (ckptd._state_cache is
compiled against it), like any torch extension; it keeps its
`linux_x86_64` tag, since it is not built against a manylinux baseline.

The libraries keep their names: where the trainer has already loaded a
library of the same name (Python's own libssl.so.3, say), the loader uses
that one, which its name promises is compatible.
"""
import base64
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

LIBS_DIR = "ckptd.libs"
# The C/C++ runtime, left to the machine.
SYSTEM = re.compile(r"^(linux-vdso|ld-linux[^ ]*|lib(c|m|dl|rt|pthread|util|resolv|stdc\+\+|gcc_s))"
                    r"\.so")
# What torch's installation provides, found at run time beside torch.
TORCH = re.compile(r"^lib(torch[a-z_]*|c10[a-z_]*|shm|cudart)\.so")


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def needed_libraries(elf):
    """{NEEDED name: resolved path} of `elf`'s whole closure, as the loader
    resolves it here, without the C/C++ runtime or torch's."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(["ldd", elf], check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] != "=>":
            continue
        name = parts[0]
        if SYSTEM.match(name) or TORCH.match(name):
            continue
        if parts[2] == "not":
            sys.exit(f"portable-wheel: {elf} needs {name}, which is not found here")
        found[name] = parts[2]
    return found


def patch_rpath(elf, add):
    """Puts `add` first in `elf`'s run path, keeping what it had."""
    old = subprocess.run(["patchelf", "--print-rpath", elf], check=True,
                         stdout=subprocess.PIPE, text=True).stdout.strip()
    paths = [add] + [p for p in old.split(":") if p and p != add]
    subprocess.run(["patchelf", "--set-rpath", ":".join(paths), elf], check=True)


def record_line(root, path):
    data = (root / path).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} WHEEL OUT_DIR")
    wheel, out_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    if shutil.which("patchelf") is None:
        sys.exit("portable-wheel: needs patchelf (scripts/setup-debian.sh installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
            # extractall drops the modes (the scripts' execute bit): kept here.
            modes = {info.filename: info.external_attr for info in z.infolist()}
        dist_info = [p for p in root.glob("*.dist-info")]
        if len(dist_info) != 1:
            sys.exit(f"portable-wheel: {wheel} has {len(dist_info)} .dist-info directories")
        if (root / LIBS_DIR).exists():
            sys.exit(f"portable-wheel: {wheel} already has {LIBS_DIR}/")
        modules = sorted(p for p in (root / "ckptd").glob("*.so") if is_elf(p))
        scripts = sorted(p for p in root.glob("*.data/scripts/*") if is_elf(p))
        if not modules or not scripts:
            sys.exit(f"portable-wheel: {wheel} has no extension modules or no ckptd/ckptctl")
        libraries = {}
        for elf in modules + scripts:
            libraries.update(needed_libraries(elf))
        (root / LIBS_DIR).mkdir()
        for name, path in sorted(libraries.items()):
            copy = root / LIBS_DIR / name
            shutil.copyfile(path, copy)
            copy.chmod(0o755)
            patch_rpath(copy, "$ORIGIN")
        for module in modules:
            patch_rpath(module, f"$ORIGIN/../{LIBS_DIR}")
        # The scripts land in the scheme's scripts directory, the package in
        # its platlib: a venv's layout (bin/, lib/python3.X/site-packages/),
        # which `pip install --user` and a prefix install share, whatever
        # the layout of the Python this runs with (Debian's is dist-packages).
        venv = sysconfig.get_paths(scheme="venv")
        site = os.path.relpath(venv["platlib"], venv["scripts"])
        for script in scripts:
            patch_rpath(script, f"$ORIGIN/{site}/{LIBS_DIR}")
        record = dist_info[0] / "RECORD"
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*")
                       if p.is_file() and p != record)
        record.write_text("".join(record_line(root, f) + "\n" for f in files) +
                          f"{record.relative_to(root)},,\n")
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / wheel.name
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            # RECORD last, as wheels have it.
            for f in files + [str(record.relative_to(root))]:
                info = zipfile.ZipInfo.from_file(root / f, f)
                info.external_attr = modes.get(f, (0o100755 if f.startswith(LIBS_DIR + "/")
                                                   else 0o100644) << 16)
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, (root / f).read_bytes())
    size = sum(os.path.getsize(p) for p in libraries.values()) >> 20
    print(f"portable-wheel: {out} with {len(libraries)} libraries ({size} MiB) in {LIBS_DIR}/")


if __name__ == "__main__":
    main()
