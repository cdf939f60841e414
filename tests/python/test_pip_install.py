"""`pip install` of the repository into a fresh virtual environment, as the
README tells users, then a save and a restore through the daemon that
install gave, run by an ordinary user, from that environment alone.

Run by ctest as: python test_pip_install.py (the project venv's Python,
which has torch); CKPT_JOBS (default 2) is the build's parallelism;
CKPT_KEEP_TMP=1 keeps the temporary directory (venv, logs). Exits 77
(skipped, with the reason) where PyPI cannot be reached or the project venv
has no torch. Needs no build of the project: every binary it runs is the
install's own.

The steps, each what a user does after scripts/setup-debian.sh:
1. The repository's files (tracked, and untracked ones git does not
   ignore) are copied, as a fresh clone would have them; the build must not
   write into that copy (checked at the end), and the project's own build
   directories are never touched.
2. A fresh venv (no system or project site-packages).
3. torch: the user's `pip install torch` is stood in for by the project
   venv's torch (the one scripts/test.sh installed from
   scripts/requirements-dcp.txt): a .pth file adds a directory of links to
   the files of torch and of its dependency closure, metadata included, and
   to nothing else. Installing PyPI's wheel (about 5 GiB with its CUDA
   libraries) on every run would dominate the test; to pip and to Python
   the environment then looks as if torch had been installed into it.
4. `pip install <copy>` fails, naming --no-build-isolation (pip's build
   isolation hides torch). Then the README's pip block (the ```sh block
   marked `<!-- tested: readme-pip -->`), run as written by bash in the
   copy, with HOME a directory of the test's: it makes the venv of step 2
   again (`python3 -m venv` leaves an existing one's packages), activates
   it, `pip install torch -r scripts/requirements-package.txt` finds torch
   satisfied by step 3's links and installs the build tools, and
   `pip install --no-build-isolation .` builds and installs the package
   (numpy, a dependency, comes from PyPI); `pip check` passes. `python3`
   there is this interpreter (the Python the project venv's torch is
   for), and pip's cache stays the caller's. The block's time is printed
   beside the README's bound (3 minutes on 2 cores) and the load average,
   not asserted: other work on the machine would make that flaky.
5. The commands (issue 32): `ckptd` and `ckptctl` are binaries in the
   venv's bin, first on its PATH, with every library they link found
   (torch's wheels' libcudart by their run path) and the package's
   version. The daemon is that `ckptd`, started as an ordinary user (a
   uid with no privileges, setpriv, when the test runs as root) on a
   directory that user owns; so are the trainer and ckptctl (the daemon
   reads a trainer's memory, which takes the same uid). Where the
   interpreter lies below a directory that uid may not enter (pyenv's
   under /root), the trainer runs in a mount namespace of its own that
   opens the way (test_slurm_launcher.reach_interpreter).
6. From the fresh venv, with no PYTHONPATH: ckptd, ckptd.torch and both
   extension modules import from its site-packages; ckptd.torch saves
   nested state twice (the second save checks its plan in _state_cache)
   and loads it back equal; ckptd.Client saves and loads a numpy array.
   The venv's `ckptctl list` shows those checkpoints, committed, the last
   of each job LATEST; `ckptctl status` names the daemon's pid and root;
   the daemon's process and every file it wrote belong to the uid.
7. The package's CUDA side (issue 32), built with no CUDA toolkit against
   torch's CUDA wheels: the build (in a directory of the test's,
   SKBUILD_BUILD_DIR) read no header from /usr/local, where this machine's
   toolkit is, and its crt/ headers from the wheel the README's
   requirements add; ckptd._ckpt has CUDA and ckptd._allocator_hook is
   there; _ckpt alone loads the wheels' libcudart.so, and with torch
   imported too the process maps exactly one libcudart, the wheels'. Then
   the simulated-device suite (test_gpu) runs through the installed
   package and the venv's `ckptd`.
8. The wheel to carry (README, scripts/portable-wheel.py): see
   check_portable_wheel.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from importlib import metadata

from readme_blocks import readme_block

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip vendors it
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[2]
SKIPPED = 77
# The ordinary user the daemon, the trainer and ckptctl run as when the test
# runs as root: a uid with no passwd entry (nothing of ckptd needs one) and
# no other use here.
USER_UID = 64125
# The README's bound for `pip install --no-build-isolation .` on 2 cores.
INSTALL_BUDGET_S = 180

# What pip prints when it cannot reach the index (or the index offers no
# version at all of a package it surely has).
NETWORK_ERRORS = ("NewConnectionError", "Temporary failure in name resolution",
                  "Network is unreachable", "Max retries exceeded",
                  "ConnectTimeoutError", "ProxyError", "(from versions: none)")

CLIENT_SNIPPET = r"""
import os, sys
import numpy as np
import torch
import ckptd
import ckptd.torch as ckpt
from ckptd import _ckpt, _state_cache

socket, site = sys.argv[1], sys.argv[2]
for module in (ckptd, _ckpt, _state_cache):
    assert os.path.realpath(module.__file__).startswith(os.path.realpath(site)), \
        f"{module.__name__} imported from {module.__file__}, not {site}"


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(64, 33, generator=g),
                      "b": torch.randn(33, generator=g).to(torch.bfloat16)},
            "optim": {"step": torch.tensor(float(seed))},
            "step": seed, "rng": torch.get_rng_state()}

sd = state(1)
ckpt.save(sd, checkpoint_id="step-1", job="pip", socket=socket)
for k, v in state(2).items():  # same tensors, new values: the cached plan
    if isinstance(v, dict):
        for name, t in v.items():
            sd[k][name].copy_(t)
    else:
        sd[k] = v
ckpt.save(sd, checkpoint_id="step-2", job="pip", socket=socket)

out = {"model": {"w": torch.zeros(64, 33), "b": torch.zeros(33, dtype=torch.bfloat16)},
       "optim": {"step": torch.tensor(0.0)}, "step": 0, "rng": torch.zeros_like(sd["rng"])}
ckpt.load(out, checkpoint_id="latest", job="pip", socket=socket)
want = state(2)
for k in ("w", "b"):
    assert torch.equal(out["model"][k], want["model"][k]), k
assert torch.equal(out["optim"]["step"], want["optim"]["step"])
assert out["step"] == 2 and torch.equal(out["rng"], want["rng"])

client = ckptd.Client("pip-numpy", socket=socket)
a = np.arange(1000, dtype=np.uint16)
client.save("step-1", {"a": a}).wait_committed()
b = np.zeros_like(a)
client.load("latest", {"a": b})
assert np.array_equal(a, b)
print("ckptd", ckptd.__file__, "saved and restored through", socket)
"""

CUDA_SNIPPET = r"""
import os, subprocess, sys
site = sys.argv[1]
import torch
from ckptd import _allocator_hook, _ckpt

assert _ckpt.HAS_CUDA, "the pip build has no CUDA side"
for module in (_ckpt, _allocator_hook):
    assert os.path.realpath(module.__file__).startswith(os.path.realpath(site)), module
# _ckpt needs the shared runtime and finds the wheels' copy by its run path
# (not torch's having loaded it first): ldd resolves it from the file alone.
needed = subprocess.run(["ldd", _ckpt.__file__], check=True, stdout=subprocess.PIPE,
                        text=True).stdout
linked = [line.split("=>")[1].split()[0] for line in needed.splitlines()
          if "libcudart" in line and "=>" in line]
assert len(linked) == 1 and "/nvidia/" in linked[0], f"_ckpt's runtime: {needed}"
# One runtime in the process, torch's.
with open("/proc/self/maps") as maps:
    mapped = {os.path.realpath(line.split()[-1]) for line in maps if "libcudart" in line}
assert mapped == {os.path.realpath(linked[0])}, f"mapped {mapped}, _ckpt links {linked}"
print(f"CUDA side built against torch's wheels; one runtime mapped: {mapped.pop()}")
"""


class Skip(Exception):
    pass


def run(what, argv, log, fails=False, **kwargs):
    """Runs argv, its output appended to `log`; prints `what` and how long
    it took; returns the output. It must exit 0, or if `fails`, not 0."""
    return timed_run(what, argv, log, fails, **kwargs)[0]


def timed_run(what, argv, log, fails=False, **kwargs):
    """run(), returning (output, seconds)."""
    started = time.monotonic()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, **kwargs)
    took = time.monotonic() - started
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, argv))}\n{p.stdout}\n")
    print(f"{took:6.1f} s  {what}", flush=True)
    if (p.returncode != 0) != fails:
        fail(what, p.stdout)
    return p.stdout, took


def fail(what, output):
    """Raises Skip if `output` says PyPI was out of reach, else AssertionError."""
    if any(e in output for e in NETWORK_ERRORS):
        raise Skip(f"PyPI is not reachable:\n{output[-2000:]}")
    raise AssertionError(f"{what}:\n{output[-6000:]}")


def copy_checkout(dest):
    """The files a fresh clone of the working tree has."""
    files = subprocess.run(
        ["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, stdout=subprocess.PIPE).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():  # a tracked file may be deleted in the tree
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def dependency_closure(name):
    """The distributions `pip install NAME` needs here, NAME included, as
    {canonical name: Distribution}, following extras and markers."""
    found = {}
    pending = [(name, frozenset())]
    seen = set()
    while pending:
        dist_name, extras = pending.pop()
        if (canonicalize_name(dist_name), extras) in seen:
            continue
        seen.add((canonicalize_name(dist_name), extras))
        dist = metadata.distribution(dist_name)
        found[canonicalize_name(dist_name)] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [dict(default_environment(), extra=e) for e in {"", *extras}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                pending.append((req.name, frozenset(req.extras)))
    return found


def link_torch(venv_site, farm):
    """Makes the project venv's torch and its dependencies importable (and
    known to pip) in the venv whose site-packages is `venv_site`, except
    the distributions that venv already has (pip, setuptools): pip then
    treats those as it would after `pip install torch` there."""
    try:
        closure = dependency_closure("torch")
    except metadata.PackageNotFoundError as e:
        raise Skip(f"the project venv has no {e} (scripts/test.sh installs it)")
    present = {canonicalize_name(d.metadata["Name"])
               for d in metadata.distributions(path=[str(venv_site)])}
    # Who has files under each top-level name here: a namespace package
    # (nvidia/) holds files of distributions outside the closure too
    # (nvidia-cuda-crt, say), which the new venv must not see.
    owners = {}
    for dist in metadata.distributions():
        for f in dist.files or []:
            owners.setdefault(f.parts[0], set()).add(canonicalize_name(dist.metadata["Name"]))
    farm.mkdir()
    for name, dist in sorted(closure.items()):
        if name in present:
            continue
        site = pathlib.Path(dist.locate_file(""))
        if dist.files is None:
            raise AssertionError(f"{name} has no RECORD: cannot tell its files")
        tops = {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}
        for top in tops:
            if owners.get(top, set()) <= set(closure):
                if not (farm / top).exists():
                    (farm / top).symlink_to(site / top)
                continue
            # Shared with a distribution outside the closure: this
            # distribution's files one by one.
            for f in dist.files:
                if f.parts[0] == top:
                    (farm / f).parent.mkdir(parents=True, exist_ok=True)
                    if not (farm / f).exists():
                        (farm / f).symlink_to(site / f)
    (venv_site / "ckptd_test_torch.pth").write_text(f"{farm}\n")
    return sorted(set(closure) - present)


class User:
    """How to run a command as the ordinary user: as ourselves when we are
    not root; else as USER_UID, with no privileges (setpriv), and, for the
    venv's Python, in a mount namespace where its interpreter is reachable
    (`work` then holds that namespace's mount point)."""

    def __init__(self, work):
        self.root = os.geteuid() == 0
        self.uid = USER_UID if self.root else os.getuid()
        self.gid = USER_UID if self.root else os.getgid()
        self.work = work
        self.drop = (["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                      "--clear-groups", "--"] if self.root else [])
        if self.root:  # root without the right to make namespaces (a container)
            probe = subprocess.run(["unshare", "--mount", "true"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
            if probe.returncode != 0:
                raise Skip("run as root, the test runs the trainer as an ordinary user in a "
                           f"mount namespace of its own, and unshare --mount fails: "
                           f"{probe.stdout.strip()}")

    def owned_dir(self, path):
        """A new directory `path` of the user's, closed to others."""
        path.mkdir(mode=0o700)
        if self.root:
            os.chown(path, self.uid, self.gid)
        return path

    def binary(self, *argv):
        """argv, a binary that reads nothing under /root, as the user."""
        return [*self.drop, *map(str, argv)]

    def python(self, *argv):
        """argv, run by the venv's Python, as the user."""
        if not self.root:
            return list(map(str, argv))
        # The interpreter's installation is bound back, in the namespace,
        # below a directory closed to the user (the slurm test's way).
        from test_slurm_launcher import reach_interpreter
        opening = reach_interpreter(str(self.work))
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                opening + 'exec "$@"', "sh", *self.drop, *map(str, argv)]


class Daemon:
    """The `ckptd` at `binary`, started as `user`, on `directory` (the
    user's own)."""

    def __init__(self, binary, directory, user, wrap=lambda argv: argv):
        self.socket = str(directory / "ckptd.sock")
        self.root = str(directory / "root")
        self.log = open(directory.parent / f"{directory.name}.log", "w")
        self.process = subprocess.Popen(
            wrap(user.binary(binary, "--socket", self.socket,
                             "--root", self.root, "--pool_bytes", str(64 << 20),
                             "--max_sessions", "256", "--max_connections", "1024")),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket + ".session"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                with open(self.log.name) as f:
                    raise AssertionError(f"ckptd did not start: {f.read()[-4000:]}")
            time.sleep(0.02)

    def stop(self):
        """SIGTERM (a drain); returns the exit status."""
        self.process.terminate()
        status = self.process.wait(timeout=60)
        self.log.close()
        return status


def check_command(binary, env, version, log):
    """`binary` (ckptd or ckptctl) is the venv's own, first on its PATH, an
    ELF binary whose libraries are all found, torch's wheels' libcudart by
    a run path relative to the binary (none into the build)."""
    found = shutil.which(binary.name, path=env["PATH"])
    assert found == str(binary), f"{binary.name} on the venv's PATH is {found}, not {binary}"
    with open(binary, "rb") as f:
        assert f.read(4) == b"\x7fELF", f"{binary} is not a binary"
    linked = run(f"ldd {binary.name}", ["ldd", binary], log)
    assert "not found" not in linked, f"{binary}: libraries not found:\n{linked}"
    cudart = [line.split("=>")[1].split()[0] for line in linked.splitlines()
              if "libcudart" in line and "=>" in line]
    assert len(cudart) == 1 and "/nvidia/" in cudart[0], \
        f"{binary} does not link torch's wheels' libcudart:\n{linked}"
    dynamic = run(f"readelf -d {binary.name}", ["readelf", "-d", binary], log)
    paths = [path for line in dynamic.splitlines() if "(RUNPATH)" in line or "(RPATH)" in line
             for path in line.split("[", 1)[1].rstrip("]").split(":")]
    assert paths and all(p.startswith("$ORIGIN/") for p in paths), \
        f"{binary}'s run path is {paths}, not relative to the binary"
    if binary.name == "ckptd":
        said = run("ckptd --version", [binary, "--version"], log).strip()
        assert said == f"ckptd {version}", f"ckptd --version: {said!r}, the package is {version}"


def check_headers(venv, build_dir, log, env):
    """No header of the build came from /usr/local: there lie a CUDA
    toolkit's headers (this machine's /usr/local/include links them all),
    which a user of the package need not have, and which would silently
    stand in for any the wheels lack. Where the package has CUDA, its
    crt/ headers are the venv's (nvidia-cuda-crt, which the README's
    requirements add)."""
    deps = run("the headers the build read (ninja -t deps)",
               [venv / "bin" / "ninja", "-C", build_dir, "-t", "deps"], log, env=env)
    headers = {line.strip() for line in deps.splitlines() if line.startswith("    /")}
    local = sorted(h for h in headers if h.startswith("/usr/local/"))
    assert not local, f"the pip build read headers from /usr/local: {local[:10]}"
    if "cuda_runtime_api.h" in deps:
        crt = [h for h in headers if h.endswith("/crt/host_defines.h")]
        assert crt and all("/nvidia/" in h for h in crt), \
            f"the CUDA side's crt/ headers are not the wheels': {crt}"


def check_portable_wheel(python, src, build_dir, work, env, user, log):
    """8. The wheel for machines without the build dependencies (README,
    "A wheel to carry"): `pip wheel` from the same build (nothing is
    compiled again), scripts/portable-wheel.py, and `pip install` of the
    result into a second fresh venv (torch linked in as before). Every
    library its commands and modules load, past the C/C++ runtime and
    torch's, is resolved from its ckptd.libs/ (ldd, the loader's own
    answer), and its daemon and ckptctl, run as the ordinary user with the
    system's copies of those libraries made unreadable (each bound over by
    /dev/null in a mount namespace, when the test runs as root), serve
    ckptd.torch's saves and restores from that venv."""
    dist = work / "dist"
    run("pip wheel <the repository>, from the same build",
        [python, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-build-isolation",
         "--no-deps", "-w", dist, src], log,
        env=dict(env, SKBUILD_BUILD_DIR=str(build_dir)), cwd=work)
    built = sorted(dist.glob("ckptd-*.whl"))
    assert len(built) == 1, f"pip wheel made {built}"
    print(run("scripts/portable-wheel.py", [python, src / "scripts" / "portable-wheel.py",
              built[0], work / "portable"], log, env=env, cwd=work).strip())
    wheel = work / "portable" / built[0].name
    with zipfile.ZipFile(wheel) as z:
        bundled = sorted(pathlib.PurePath(n).name for n in z.namelist()
                         if n.startswith("ckptd.libs/"))
    for name in ("libgrpc++.so", "libprotobuf.so", "libabsl_status", "liburing.so",
                 "libcurl.so", "libxxhash.so"):
        assert any(b.startswith(name) for b in bundled), f"{name} is not in the wheel: {bundled}"

    venv = work / "portable-venv"
    run(f"python -m venv {venv}", [sys.executable, "-m", "venv", venv], log)
    python = venv / "bin" / "python"
    site = pathlib.Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
        check=True, stdout=subprocess.PIPE, text=True).stdout.strip())
    link_torch(site, work / "torch-for-portable-venv")
    env = dict(env, PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv))
    _, took = timed_run("pip install <the portable wheel> into a second fresh venv",
                        [python, "-m", "pip", "--disable-pip-version-check", "install", wheel],
                        log, env=env, cwd=work)
    print(f"          installed in {took:.1f} s", flush=True)
    libs = site / "ckptd.libs"
    for elf in [venv / "bin" / "ckptd", venv / "bin" / "ckptctl", *(site / "ckptd").glob("*.so")]:
        linked = run(f"ldd {elf.name}", ["ldd", elf], log, env=env)
        for line in linked.splitlines():
            parts = line.split()
            if len(parts) < 3 or parts[1] != "=>" or re.match(
                    r"(linux-vdso|ld-linux|lib(c|m|dl|rt|pthread|util|resolv|stdc\+\+|gcc_s)\.so|"
                    r"lib(torch|c10|shm|cudart))", parts[0]):
                continue
            assert os.path.realpath(parts[2]).startswith(os.path.realpath(libs) + "/"), \
                f"{elf} loads {parts[0]} from {parts[2]}, not from {libs}:\n{linked}"

    # The system's copies of what the wheel carries, unreadable.
    cache = subprocess.run(["/sbin/ldconfig", "-p"], check=True, stdout=subprocess.PIPE,
                           text=True).stdout
    system = sorted({os.path.realpath(line.split("=>")[1].strip())
                     for line in cache.splitlines()
                     if "=>" in line and line.split()[0] in bundled})
    assert system, "none of the wheel's libraries is on this machine: nothing to hide"
    masks = "".join(f"mount --bind /dev/null '{path}' && " for path in system)

    def hidden(argv):
        if not user.root:
            return argv
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                masks + 'exec "$@"', "sh", *map(str, argv)]

    print(f"          the system's copies of {len(system)} libraries hidden from the "
          "wheel's ckptd and ckptctl" if user.root else
          "          not root: the system's copies are not hidden (ldd alone)", flush=True)
    user_env = dict(env, HOME=str(user.owned_dir(work / "portable-home")))
    daemon = Daemon(venv / "bin" / "ckptd", user.owned_dir(work / "portable-daemon"), user,
                    wrap=hidden)
    try:
        print(run("ckptd.torch and ckptd.Client save and restore through the portable "
                  "wheel's package and ckptd",
                  user.python(python, "-c", CLIENT_SNIPPET, daemon.socket, site), log,
                  env=user_env, cwd=work).strip())
        listed = json.loads(run("the portable wheel's ckptctl lists them",
                                hidden(user.binary(venv / "bin" / "ckptctl", "--socket",
                                                   daemon.socket, "list", "--json")),
                                log, env=user_env, cwd=work))
        assert sorted((c["job"], c["checkpoint"]) for c in listed["checkpoints"]) == \
            [("pip", "step-1"), ("pip", "step-2"), ("pip-numpy", "step-1")], listed
    finally:
        stopped = daemon.stop()
    assert stopped == 0, f"the portable wheel's ckptd exited {stopped} at SIGTERM"


def main():
    if os.geteuid() == 0:
        # The ordinary user's trainer imports the torch linked from the
        # project venv: a checkout below a directory others may not enter
        # (a clone in `mktemp -d`) is out of its reach.
        from test_slurm_launcher import closed_ancestor
        closed = closed_ancestor(os.path.join(sysconfig.get_path("platlib"), "x"))
        if closed is not None:
            print(f"SKIPPED: the project venv is below {closed}, which the ordinary "
                  "user of this test may not enter")
            return SKIPPED
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-pip-"))
    log = work / "pip.log"
    daemon = None
    try:
        src = work / "src"
        copy_checkout(src)
        before = tree(src)
        # The README's block, and the venv it makes: under a HOME of ours.
        block = readme_block("readme-pip")
        made = re.findall(r"^python3 -m venv ~/(\S+) ", block, re.M)
        if len(made) != 1:
            raise AssertionError(f"the README's pip block makes no venv under ~ "
                                 f"(`python3 -m venv ~/DIR`) in one place:\n{block}")
        home = work / "installer"
        home.mkdir(mode=0o755)
        venv = home / made[0]
        run(f"python -m venv {venv}", [sys.executable, "-m", "venv", venv], log)
        python = venv / "bin" / "python"
        venv_site = pathlib.Path(subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
            check=True, stdout=subprocess.PIPE, text=True).stdout.strip())
        linked = link_torch(venv_site, work / "torch-from-project-venv")
        print(f"          torch and {len(linked) - 1} distributions it needs linked from "
              f"{sysconfig.get_path('platlib')}", flush=True)

        # A user's environment: no PYTHONPATH (ctest's or a caller's), the
        # venv first on PATH, the build's parallelism bounded.
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", os.environ.get("CKPT_JOBS", "2"))
        pip = [python, "-m", "pip", "--disable-pip-version-check"]
        # Without the flag, pip's build isolation hides torch: the build
        # stops at once, saying what to do.
        isolated = run("pip install <the repository> stops: pip's isolation hides torch",
                       [*pip, "install", src], log, fails=True, env=env, cwd=work)
        if "install --no-build-isolation" not in isolated:
            fail("pip install <the repository> did not name --no-build-isolation", isolated)

        # The README's block as written, in the copy, in a shell of the
        # user's: the venv not yet active, `python3` this interpreter.
        shell_bin = work / "bin"
        shell_bin.mkdir()
        (shell_bin / "python3").write_text(f"#!/bin/sh\nexec '{sys.executable}' \"$@\"\n")
        (shell_bin / "python3").chmod(0o755)
        shell_env = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"}
        shell_env.update(HOME=str(home), PATH=f"{shell_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                         PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR",
                                                      os.path.expanduser("~/.cache/pip")))
        # The build in a directory of ours (not the temporary one pip would
        # make), to read afterwards which headers it compiled against.
        build_dir = work / "pip-build"
        shell_env["SKBUILD_BUILD_DIR"] = str(build_dir)
        (work / "readme-pip.sh").write_text(block)
        output, took = timed_run(
            "the README's pip block: venv, torch and the build tools, "
            "pip install --no-build-isolation . "
            f"(CMAKE_BUILD_PARALLEL_LEVEL={env['CMAKE_BUILD_PARALLEL_LEVEL']})",
            ["bash", "-e", work / "readme-pip.sh"], log, env=shell_env, cwd=src)
        if not re.search(r"^Requirement already satisfied: torch ", output, re.M):
            fail("the README's pip block did not take the torch linked in (it would "
                 "download torch on every run)", output)
        print(f"          the block: {took:.0f} s; the README's bound {INSTALL_BUDGET_S} s "
              f"on 2 cores; load average now {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores", flush=True)
        run("pip check", [*pip, "check"], log, env=env, cwd=work)
        check_headers(venv, build_dir, log, env)
        after = tree(src)
        assert after == before, ("pip install wrote into the source tree: "
                                 f"{sorted(set(after) - set(before))[:20]}")

        # The commands the install gave.
        version = run("the installed version", [python, "-c",
                      "from importlib.metadata import version; print(version('ckptd'))"],
                      log, env=env, cwd=work).strip()
        ckptd_bin, ckptctl_bin = venv / "bin" / "ckptd", venv / "bin" / "ckptctl"
        for binary in (ckptd_bin, ckptctl_bin):
            check_command(binary, env, version, log)

        # The daemon, the trainer and ckptctl as an ordinary user.
        user = User(work)
        if user.root:
            os.chmod(work, 0o755)  # mkdtemp's 0700: the user reaches the venv
        user_env = dict(env, HOME=str(user.owned_dir(work / "home")))
        daemon = Daemon(ckptd_bin, user.owned_dir(work / "daemon"), user)
        with open(f"/proc/{daemon.process.pid}/status") as f:
            uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
        assert uids == [str(user.uid)] * 4, f"the daemon runs as uids {uids}, not {user.uid}"
        exe = os.path.realpath(f"/proc/{daemon.process.pid}/exe")
        assert exe == os.path.realpath(ckptd_bin), f"the daemon is {exe}, not the venv's"
        print(run(f"ckptd.torch and ckptd.Client save and restore from the fresh venv, "
                  f"through its ckptd, as uid {user.uid}",
                  user.python(python, "-c", CLIENT_SNIPPET, daemon.socket, venv_site), log,
                  env=user_env, cwd=work).strip())

        ctl = [ckptctl_bin, "--socket", daemon.socket]
        listed = json.loads(run("the venv's ckptctl lists them", user.binary(*ctl, "list", "--json"),
                                log, env=user_env, cwd=work))
        checkpoints = {(c["job"], c["checkpoint"]): c for c in listed["checkpoints"]}
        assert sorted(checkpoints) == [("pip", "step-1"), ("pip", "step-2"),
                                       ("pip-numpy", "step-1")], listed
        for key, c in checkpoints.items():
            assert c["committed"] and c["world_size"] == 1 and int(c["total_bytes"]) > 0, (key, c)
        latest = sorted(key for key, c in checkpoints.items() if c["latest"])
        assert latest == [("pip", "step-2"), ("pip-numpy", "step-1")], listed
        text = run("ckptctl list pip", user.binary(*ctl, "list", "pip"), log, env=user_env,
                   cwd=work)
        rows = {line.split()[1]: line for line in text.splitlines()[1:]}
        assert text.split()[:2] == ["JOB", "CHECKPOINT"] and sorted(rows) == ["step-1", "step-2"] \
            and all(row.split()[:3] == ["pip", name, "committed"] for name, row in rows.items()) \
            and rows["step-2"].endswith("(latest)") and "latest" not in rows["step-1"], text
        status = json.loads(run("ckptctl status", user.binary(*ctl, "status", "--json"), log,
                                env=user_env, cwd=work))
        assert (status["pid"], status["root"], status["version"]) == \
            (daemon.process.pid, daemon.root, version), status
        stopped = daemon.stop()
        daemon = None
        assert stopped == 0, f"the venv's ckptd exited {stopped} at SIGTERM"
        others = [str(path) for path in pathlib.Path(work / "daemon").rglob("*")
                  if path.lstat().st_uid != user.uid]
        assert not others, f"the daemon wrote files that are not the user's: {others[:10]}"
        print(run("the CUDA side, built against torch's CUDA wheels",
                  [python, "-c", CUDA_SNIPPET, venv_site], log, env=env, cwd=work).strip())
        # The simulated-device suite through the installed package: the
        # test's own directory on the path (for its helpers), not ckptd's.
        run("the simulated-device tests (test_gpu) through the installed package and ckptd",
            [python, "-m", "unittest", "-q", "test_gpu"], log,
            env=dict(env, CKPTD_BINARY=str(ckptd_bin)), cwd=src / "tests" / "python")
        check_portable_wheel(python, src, build_dir, work, env, user, log)
        return 0
    except Skip as e:
        print(f"SKIPPED: {e}")
        return SKIPPED
    except AssertionError as e:
        print(f"FAILED: {e}\n(CKPT_KEEP_TMP=1 keeps {work}, its logs included)")
        raise
    finally:
        if daemon is not None:
            daemon.stop()
        if os.environ.get("CKPT_KEEP_TMP") != "1":
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
