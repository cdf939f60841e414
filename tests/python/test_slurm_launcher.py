"""deploy/slurm/ckptd-slurm driven by Slurm's environment, on three "nodes".

Each node is a process holding its own network, mount and UTS namespaces
(unshare): its own hostname (node01..node03), no network shared with the
others, and its own /tmp (a directory of the test bound over /tmp), which
is the node-local storage the launcher keeps its run directory in. What a
Slurm cluster shares between nodes, the storage root and the submit
directory the barrier lives in, is a directory outside /tmp. Every command
of the launcher and every trainer runs in its node's namespaces as a uid
with no privileges (setpriv), with SLURM_JOB_ID, SLURM_NODEID,
SLURM_NNODES and SLURM_JOB_NODELIST set as srun sets them.

Checked: `wait` blocks until the last node's daemon answers (node03 is
started late), and with a node missing it fails after its deadline naming
that node; a trainer with no socket configured (only Slurm's variables)
finds its node's daemon and saves and restores a checkpoint the three
nodes commit together; a save still being written when `stop` runs on
every node is drained to COMMITTED; afterwards no daemon runs, the
launcher's files are gone, and everything written belongs to the uid.

The README's Slurm job script (the ```sh block marked `<!-- tested:
readme-slurm -->`) is run as written, by bash, as the batch step: on the
first of the nodes its `#SBATCH --nodes` asks for, as the uid, in the
"checkout" it is submitted from (a directory of the uid's holding the
launcher and the training script), with Slurm's variables set as sbatch
sets them. Where it differs from a real cluster, and only there:
- `srun` is the test's: a small program on PATH that hands its command,
  directory, environment and output to the test, which starts one task
  per node in that node's namespaces as the uid (the job's variables,
  SLURM_NODEID and the rest as srun sets them per task), and exits with
  the highest status of the tasks, as srun does. It takes the options the
  block uses and refuses any other.
- The nodes share one network namespace here (their names lead to its
  loopback), since torchrun's rendezvous and gloo need one between them.
- `~/ckptd-venv`, the venv of the README's pip install
  (test_pip_install.py runs that block), stands in as a venv whose
  site-packages reach this build's package and the project venv's torch,
  with the build's ckptd and ckptctl and a torchrun in its bin.
- `train.py` is the test's: each rank saves through ckptd.torch, with no
  socket configured, a checkpoint both nodes commit, and loads it back.
- The job has one GPU a node (SLURM_GPUS_ON_NODE=1, whatever its #SBATCH
  line asks): torchrun starts one rank a node.
Checked: the script exits 0; every rank saved and restored through its
node's per-job socket; the checkpoint has both nodes' manifests and its
COMMIT; `stop` drained every daemon; then no daemon of the uid is left,
the barrier is gone, and the root is the uid's. The script takes 7 to 17 s
on 2 cores beside other builds (four processes import torch); not run
under the sanitizers, which instrument none of torch and would only slow
it.

Run as: python test_slurm_launcher.py (in this directory), with PYTHONPATH
holding the built package and CKPTD_BINARY, CKPTCTL_BINARY the binaries.
Exits 77, which ctest reports as skipped, without root or namespaces.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
import unittest

from readme_blocks import readme_block

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.normpath(os.path.join(HERE, "..", "..", "deploy", "slurm", "ckptd-slurm"))
UID = 64123          # no passwd entry needed: the launcher keys on the uid
JOB = "4242"
NODES = ["node01", "node02", "node03"]
NODELIST = "node[01-03]"
BIG_BYTES = 8 << 20  # per node, written at RATE: in flight when stop comes
RATE = 2 << 20

TRAINER = textwrap.dedent("""
    import os, sys
    import numpy as np
    import ckptd
    assert "CKPTD_SOCKET" not in os.environ
    node = int(os.environ["SLURM_NODEID"])
    want = f"/tmp/ckptd-slurm-{os.getuid()}-{os.environ['SLURM_JOB_ID']}/ckptd.sock"
    assert ckptd.default_socket() == want, (ckptd.default_socket(), want)
    c = ckptd.Client("slurm-job", rank=node, world_size=3, node=node, local_world_size=1)
    small = np.arange(1024, dtype=np.float32) + node
    c.save("step-1", {f"small.{node}": small}).wait_committed()
    back = np.zeros_like(small)
    # By name: LATEST follows COMMIT, written by whichever node commits,
    # so another node may see the commit before LATEST moves.
    c.load("step-1", {f"small.{node}": back})
    assert (back == small).all(), "restored bytes differ"
    big = np.full(%d // 4, node, dtype=np.float32)
    c.save("step-2", {f"big.{node}": big}).wait_staged()
    print("staged", flush=True)
    sys.stdin.read()   # the test stops the daemons now, then lets this exit
    os._exit(0)
""" % BIG_BYTES)


def prerequisites():
    """None, or why this cannot run here."""
    if os.geteuid() != 0:
        return "needs root (namespaces for the nodes, setpriv to a plain uid)"
    for tool in ("unshare", "nsenter", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux, mount)"
    for name in ("CKPTD_BINARY", "CKPTCTL_BINARY", "PYTHONPATH"):
        if not os.environ.get(name):
            return f"{name} is not set (ctest sets it)"
    r = subprocess.run(["unshare", "--net", "--mount", "--uts", "true"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"unshare --net --mount --uts fails here: {r.stderr.strip()}"
    # Each node's /tmp is replaced; what the nodes run must live elsewhere.
    for path in (sys.executable, LAUNCHER, os.environ["CKPTD_BINARY"],
                 os.environ["CKPTCTL_BINARY"], *os.environ["PYTHONPATH"].split(":")):
        if os.path.realpath(path).startswith("/tmp/"):
            return f"{path} is under /tmp, which each node's namespace replaces"
    # The plain uid runs the checkout's launcher and binaries: a checkout
    # below a directory others may not enter (a clone in `mktemp -d`) is
    # out of its reach (only the interpreter's installation is opened).
    closed = closed_ancestor(LAUNCHER)
    if closed is not None:
        return f"the checkout is below {closed}, which a plain uid may not enter"
    return None


def closed_ancestor(path):
    """The first directory above `path` others may not enter (/root, where
    the venv's interpreter is pyenv's), else None."""
    here = "/"
    for part in os.path.dirname(os.path.realpath(path)).strip("/").split("/"):
        here = os.path.join(here, part)
        if not os.stat(here).st_mode & 0o001:
            return here
    return None


def reach_interpreter(base):
    """Shell commands, for a node's own mount namespace, that let the uid
    run this interpreter where a directory above its installation is
    closed: the installation is bound elsewhere, an empty tmpfs (0755)
    covers the closed directory, and the installation is bound back at its
    path inside. Nothing changes outside the namespace."""
    prefix = os.path.realpath(sys.base_prefix)
    closed = closed_ancestor(os.path.join(prefix, "x"))
    if closed is None:
        return ""
    hold = os.path.join(base, "interpreter")
    os.makedirs(hold, exist_ok=True)
    return (f"mount --bind '{prefix}' '{hold}' && "
            f"mount -t tmpfs -o mode=0755 ckptd-test '{closed}' && "
            f"mkdir -p '{prefix}' && mount --bind '{hold}' '{prefix}' && ")


class Node:
    """A process holding one node's namespaces; commands enter them.

    Each node has a network namespace of its own, or, given `network` (a
    ClusterNetwork), joins that one, where the nodes' names in `/etc/hosts`
    all lead to its loopback device: what torchrun's rendezvous between the
    nodes needs."""

    def __init__(self, index, base, network=None):
        self.index = index
        self.name = NODES[index]
        self.tmp = os.path.join(base, f"{self.name}-tmp")  # its /tmp
        os.mkdir(self.tmp)
        os.chmod(self.tmp, 0o1777)
        if network is None:
            enter, hosts = ["unshare", "--net"], ""
        else:
            enter = ["nsenter", f"--net=/proc/{network.holder.pid}/ns/net", "unshare"]
            hosts = f"mount --bind '{network.hosts}' /etc/hosts && "
        self.holder = subprocess.Popen(
            [*enter, "--mount", "--uts", "--propagation", "private", "sh", "-c",
             reach_interpreter(base) + hosts +
             f"mount --bind '{self.tmp}' /tmp && hostname {self.name} && echo up && "
             "exec sleep 600"], stdout=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline()
        assert line.strip() == "up", f"{self.name}'s namespaces did not come up: {line!r}"

    def argv(self, env, *cmd, cwd=None):
        """cmd in this node's namespaces as the uid, with exactly `env`
        (and in `cwd`)."""
        at = ["sh", "-c", 'cd "$0" && exec "$@"', cwd] if cwd else []
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--mount", "--uts", "--",
                "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--",
                "env", "-i", *[f"{k}={v}" for k, v in env.items()], *at, *cmd]

    def close(self):
        self.holder.kill()
        self.holder.wait()
        self.holder.stdout.close()


def uid_daemons():
    """The pids of the uid's ckptd processes."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
            if comm == "ckptd" and os.stat(f"/proc/{entry}").st_uid == UID:
                pids.append(int(entry))
        except OSError:
            pass
    return pids


class ClusterNetwork:
    """A network namespace the nodes share, its loopback up, and a hosts
    file in which every node's name is that loopback's address."""

    def __init__(self, base, names):
        self.hosts = os.path.join(base, "hosts")
        with open(self.hosts, "w") as f:
            f.write(f"127.0.0.1 localhost {' '.join(names)}\n::1 localhost\n")
        os.chmod(self.hosts, 0o644)
        self.holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep 600"],
            stdout=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline()
        assert line.strip() == "up", f"the cluster's network did not come up: {line!r}"

    def close(self):
        self.holder.kill()
        self.holder.wait()
        self.holder.stdout.close()


SRUN = """#!{python}
# srun, for the README's job script on the test's nodes: the test (root)
# runs the step's tasks, one per node, as the job's uid; this hands it the
# command, directory, environment and output, and exits with the step's
# status (tests/python/test_slurm_launcher.py, StandInSrun).
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({relay!r})
request = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(request).encode()], [1, 2])
s.shutdown(socket.SHUT_WR)
sys.exit(int(s.makefile().read() or 1))
"""


class StandInSrun:
    """The test's srun: `bin` holds the program the job script calls; the
    test runs each step it is handed on every node, one task a node."""

    FLAGS = ("--overlap", "--label", "--ntasks-per-node=1")
    WITH_VALUES = ("--kill-on-bad-exit=", "--gpus-per-node=")

    def __init__(self, base, nodes, procs):
        self.nodes, self.procs = nodes, procs
        self.steps = 0
        self.lock = threading.Lock()
        self.path = os.path.join(base, "srun.sock")
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        os.chmod(self.path, 0o666)
        self.server.listen(8)
        self.bin = os.path.join(base, "srun-bin")
        os.mkdir(self.bin)
        program = os.path.join(self.bin, "srun")
        with open(program, "w") as f:
            f.write(SRUN.format(python=sys.executable, relay=self.path))
        os.chmod(program, 0o755)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self.step, args=(conn,), daemon=True).start()

    def step(self, conn):
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
            while chunk := conn.recv(1 << 16):
                data += chunk
            out, err = fds
            try:
                status = self.run_step(json.loads(data), out, err)
            finally:
                os.close(out)
                os.close(err)
            conn.sendall(str(status).encode())

    def run_step(self, request, out, err):
        argv, env = list(request["argv"]), request["env"]
        while argv and argv[0].startswith("-"):
            option = argv.pop(0)
            if option not in self.FLAGS and not option.startswith(self.WITH_VALUES):
                os.write(err, f"srun (the test's): unknown option {option}\n".encode())
                return 1
        if not argv or env.get("SLURM_NTASKS_PER_NODE") != "1":
            os.write(err, b"srun (the test's): no command, or not one task a node\n")
            return 1
        with self.lock:
            step, self.steps = self.steps, self.steps + 1
        tasks = []
        for node in self.nodes:
            task_env = dict(env, SLURM_NODEID=str(node.index), SLURM_PROCID=str(node.index),
                            SLURM_LOCALID="0", SLURM_STEP_ID=str(step),
                            SLURMD_NODENAME=node.name)
            p = subprocess.Popen(node.argv(task_env, *argv, cwd=request["cwd"]),
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            self.procs.append(p)
            tasks.append(p)
        return max(code if code >= 0 else 128 - code for code in (p.wait() for p in tasks))

    def close(self):
        self.server.close()


# The training script the README's job runs: "your training script".
TRAIN_PY = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist
    import ckptd
    import ckptd.torch as ckpt
    assert "CKPTD_SOCKET" not in os.environ
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    name = f"layer{rank}.weight"
    state = {"model": {name: torch.arange(256.0) + rank}, "step": 7}
    ckpt.save(state, checkpoint_id="step-7", job="readme-slurm")
    back = {"model": {name: torch.zeros(256)}, "step": 0}
    ckpt.load(back, checkpoint_id="step-7", job="readme-slurm")
    assert torch.equal(back["model"][name], state["model"][name]) and back["step"] == 7
    print(f"train.py: rank {rank} of {world}, node {os.environ['GROUP_RANK']}: step-7 "
          f"saved and restored through {ckptd.default_socket()}", flush=True)
    dist.barrier()
    os._exit(0)  # no finalizing with gloo's threads about (test_ckptd.py)
""")


class ReadmeJobScriptTest(unittest.TestCase):
    """The README's Slurm job script, run as written (the module's
    docstring says where the test stands in for a cluster)."""

    JOB = "4343"

    def setUp(self):
        if "LD_PRELOAD" in os.environ:
            self.skipTest("a sanitized build: the job's torch processes run in the gcc build")
        if shutil.which("ip") is None:
            self.skipTest("ip (iproute2) is not installed: the nodes' network needs it")
        self.script = readme_block("readme-slurm")
        nodes = re.findall(r"^#SBATCH .*--nodes=(\d+)", self.script, re.M)
        per_node = re.findall(r"^#SBATCH .*--ntasks-per-node=(\d+)", self.script, re.M)
        self.assertEqual(len(nodes), 1, "the job script names its --nodes in one #SBATCH line")
        self.assertEqual(per_node, ["1"], "the job script runs one task a node")
        self.count = int(nodes[0])
        self.assertLessEqual(self.count, len(NODES))
        self.base = tempfile.mkdtemp(prefix="ckptd-slurm-readme-", dir="/var/tmp")
        os.chmod(self.base, 0o755)
        self.procs = []
        self.network = ClusterNetwork(self.base, NODES[:self.count])
        self.nodes = []
        for i in range(self.count):
            self.nodes.append(Node(i, self.base, self.network))
        self.srun = StandInSrun(self.base, self.nodes, self.procs)

    def tearDown(self):
        self.srun.close()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for pid in uid_daemons():
            os.kill(pid, 9)
        time.sleep(0.2)  # the steps' srun programs see their step end and exit
        for n in self.nodes:
            n.close()
        self.network.close()
        if os.environ.get("CKPT_KEEP"):
            print("kept", self.base)
            return
        shutil.rmtree(self.base, ignore_errors=True)

    def owned(self, path, mode=0o755):
        os.makedirs(path, mode=mode)
        os.chown(path, UID, UID)
        return path

    def stand_in_venv(self, venv):
        """~/ckptd-venv: a venv whose site-packages reach this build's
        package and the project venv's torch, with the build's ckptd and
        ckptctl and a torchrun in its bin."""
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        site = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                               "import sysconfig; print(sysconfig.get_path('platlib'))"],
                              check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(site, "ckptd-test-build.pth"), "w") as f:
            f.write("\n".join([*os.environ["PYTHONPATH"].split(":"),
                               sysconfig.get_path("platlib")]) + "\n")
        bin_dir = os.path.join(venv, "bin")
        os.symlink(os.environ["CKPTD_BINARY"], os.path.join(bin_dir, "ckptd"))
        os.symlink(os.environ["CKPTCTL_BINARY"], os.path.join(bin_dir, "ckptctl"))
        with open(os.path.join(bin_dir, "torchrun"), "w") as f:
            f.write(f"#!{bin_dir}/python\nimport sys\n"
                    "from torch.distributed.run import main\nsys.exit(main())\n")
        os.chmod(os.path.join(bin_dir, "torchrun"), 0o755)

    def test_the_readme_job_script_runs_as_written(self):
        home = self.owned(os.path.join(self.base, "home"), 0o700)
        self.stand_in_venv(os.path.join(home, "ckptd-venv"))
        submit = self.owned(os.path.join(self.base, "checkout"))
        self.owned(os.path.join(submit, "deploy", "slurm"))
        shutil.copy2(LAUNCHER, os.path.join(submit, "deploy", "slurm", "ckptd-slurm"))
        for name, text in (("train.py", TRAIN_PY), ("job.sh", self.script)):
            with open(os.path.join(submit, name), "w") as f:
                f.write(text)
        for top, dirs, files in os.walk(self.base):
            for name in [top] + [os.path.join(top, f) for f in dirs + files]:
                if name.startswith((home, submit)):
                    os.lchown(name, UID, UID)
        count = self.count
        env = {"PATH": f"{self.srun.bin}:/usr/bin:/bin", "HOME": home,
               "SLURM_JOB_ID": self.JOB, "SLURM_JOB_NAME": "job.sh", "SLURM_NODEID": "0",
               "SLURM_NNODES": str(count), "SLURM_JOB_NUM_NODES": str(count),
               "SLURM_JOB_NODELIST": f"node[01-{count:02d}]", "SLURM_SUBMIT_DIR": submit,
               "SLURM_NTASKS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "1",
               "SLURMD_NODENAME": NODES[0]}
        # The job's output in files, as sbatch's: a step the script leaves
        # running holds them open, and must not hold the test too.
        out_path, err_path = (os.path.join(self.base, f"job.{n}") for n in ("out", "err"))
        started = time.monotonic()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            batch = subprocess.Popen(self.nodes[0].argv(env, "bash", "job.sh", cwd=submit),
                                     stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(batch)
        try:
            status = batch.wait(timeout=300)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - started
        # Slurm ends the job's steps when the script ends: tearDown kills
        # what is left, which the script should have stopped itself.
        left = [p.args[p.args.index("--") + 1:] for p in self.procs if p.poll() is None]
        with open(out_path) as f_out, open(err_path) as f_err:
            stdout, stderr = f_out.read(), f_err.read()
        said = f"the job script's output:\n{stdout}\n{stderr}"
        self.assertEqual(status, 0, f"the job script exited {status} after {took:.0f} s; {said}")
        self.assertEqual(left, [], f"steps left running when the script ended; {said}")
        print(f"the README's job script ran in {took:.1f} s", file=sys.stderr)
        socket_path = f"/tmp/ckptd-slurm-{UID}-{self.JOB}/ckptd.sock"
        self.assertIn(f"all {count} nodes' daemons answer", stdout + stderr, said)
        for rank in range(count):
            self.assertIn(f"train.py: rank {rank} of {count}, node {rank}: step-7 saved and "
                          f"restored through {socket_path}", stdout, said)
        self.assertEqual((stdout + stderr).count("drained and exited"), count, said)
        checkpoint = os.path.join(home, "ckpt", "readme-slurm", "step-7")
        manifests = sorted(n for n in os.listdir(checkpoint) if n.endswith(".manifest"))
        self.assertEqual(manifests, [f"node-{i:04d}.manifest" for i in range(count)])
        self.assertTrue(os.path.exists(os.path.join(checkpoint, "COMMIT")))
        self.assertEqual(uid_daemons(), [])
        self.assertEqual([n for n in os.listdir(submit) if n.startswith(".ckptd-slurm")], [])
        for top, dirs, files in os.walk(os.path.join(home, "ckpt")):
            for name in [top] + [os.path.join(top, f) for f in dirs + files]:
                self.assertEqual(os.lstat(name).st_uid, UID, name)


class SlurmLauncherTest(unittest.TestCase):
    def setUp(self):
        # Outside /tmp: each node's /tmp is its own.
        self.base = tempfile.mkdtemp(prefix="ckptd-slurm-test-", dir="/var/tmp")
        os.chmod(self.base, 0o755)
        self.shared = os.path.join(self.base, "shared")  # the submit directory
        os.mkdir(self.shared)
        os.chown(self.shared, UID, UID)
        self.root = os.path.join(self.shared, "ckpt")
        self.logs = os.path.join(self.base, "logs")
        os.mkdir(self.logs)
        self.nodes = []
        self.procs = []
        for i in range(3):
            self.nodes.append(Node(i, self.base))

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
        # Daemons of the uid left by a failure: their namespaces go below.
        for pid in self.uid_daemons():
            os.kill(pid, 9)
        for n in self.nodes:
            n.close()
        if os.environ.get("CKPT_KEEP"): print("kept", self.base); return
        shutil.rmtree(self.base, ignore_errors=True)

    def env(self, node, **extra):
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp",
               "PYTHONPATH": os.environ["PYTHONPATH"],
               "CKPTD_BINARY": os.environ["CKPTD_BINARY"],
               "CKPTCTL_BINARY": os.environ["CKPTCTL_BINARY"],
               "SLURM_JOB_ID": JOB, "SLURM_NODEID": str(node.index),
               "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": NODELIST,
               "SLURM_SUBMIT_DIR": self.shared, "CKPTD_SLURM_ROOT": self.root}
        # A sanitized build's (tests/python/run_sanitized.sh): the trainers
        # load instrumented modules, the binaries are wrappers that read these.
        for name in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                     "CKPT_BINARY_ASAN_OPTIONS"):
            if name in os.environ:
                env[name] = os.environ[name]
        env.update(extra)
        return env

    def run_on(self, node, *cmd, timeout=60, **extra):
        return subprocess.run(node.argv(self.env(node, **extra), *cmd), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def start_daemon(self, node):
        log = open(os.path.join(self.logs, f"{node.name}.log"), "w")
        p = subprocess.Popen(node.argv(self.env(node), LAUNCHER, "run", "--",
                                       "--pool_bytes", str(16 << 20), "--buffer_bytes",
                                       str(2 << 20), "--io_workers", "2", "--gpu", "off",
                                       "--write_rate_limit", str(RATE)),
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append(p)
        return p

    def log_of(self, node):
        with open(os.path.join(self.logs, f"{node.name}.log")) as f:
            return f.read()

    def run_dir(self, node):
        return os.path.join(node.tmp, f"ckptd-slurm-{UID}-{JOB}")

    def uid_daemons(self):
        return uid_daemons()

    def test_three_nodes(self):
        n1, n2, n3 = self.nodes
        self.assertEqual(subprocess.run([LAUNCHER, "hostlist", "gpu[01-02,10],login,r[1-2]n[8-9]"],
                                        capture_output=True, text=True, check=True).stdout.split(),
                         ["gpu01", "gpu02", "gpu10", "login", "r1n8", "r1n9", "r2n8", "r2n9"])

        # Refusals before anything starts: a multi-node job without a shared
        # root; a run directory in /tmp that is not the user's own.
        r = self.run_on(n1, LAUNCHER, "run", CKPTD_SLURM_ROOT="")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("needs CKPTD_SLURM_ROOT", r.stderr)
        # With a root per node (the daemon's --node_local_root) the launcher
        # takes the run directory's; the daemon then wants its remote tier,
        # where such nodes meet to commit, and says so.
        r = self.run_on(n1, LAUNCHER, "run", "--", "--node_local_root", "--gpu", "off",
                        CKPTD_SLURM_ROOT="")
        self.assertNotEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("needs CKPTD_SLURM_ROOT", r.stderr)
        self.assertIn("--node_local_root with --nodes 3 needs --remote", r.stdout + r.stderr)
        squatted = os.path.join(n1.tmp, f"ckptd-slurm-{UID}-77")
        os.mkdir(squatted, 0o755)
        r = self.run_on(n1, LAUNCHER, "run", SLURM_JOB_ID="77")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("refusing to use it", r.stderr)
        self.assertEqual(os.listdir(squatted), [])  # and left alone

        run1, run2 = self.start_daemon(n1), self.start_daemon(n2)

        # node03 never started: the wait ends at its deadline, naming it.
        t = time.monotonic()
        r = self.run_on(n1, LAUNCHER, "wait", "--timeout", "3")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertGreaterEqual(time.monotonic() - t, 3)
        self.assertIn("1 of 3 nodes' daemons have not answered: node03 (node 2)", r.stderr)

        # node03 late: node02's wait returns only once its daemon answers.
        waiter = subprocess.Popen(n2.argv(self.env(n2), LAUNCHER, "wait", "--timeout", "40"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(waiter)
        time.sleep(1.5)
        self.assertIsNone(waiter.poll(), "wait returned with node03's daemon not started")
        run3 = self.start_daemon(n3)
        out, err = waiter.communicate(timeout=45)
        self.assertEqual(waiter.returncode, 0, err)
        self.assertIn("all 3 nodes' daemons answer", out)
        self.assertIn("node 2 (node03): ckptd", self.log_of(n3))
        self.assertIn("answers at", self.log_of(n3))

        # One daemon per node, each in its node's network namespace, as the uid.
        netns = set()
        for n in self.nodes:
            with open(os.path.join(self.run_dir(n), "ckptd.pid")) as f:
                pid = int(f.read())
            self.assertEqual(os.stat(f"/proc/{pid}").st_uid, UID)
            netns.add(os.readlink(f"/proc/{pid}/ns/net"))
            st = os.stat(self.run_dir(n))
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (UID, 0o700))
        self.assertEqual(len(netns), 3)
        self.assertNotIn(os.readlink("/proc/self/ns/net"), netns)

        r = self.run_on(n2, LAUNCHER, "env")
        self.assertEqual(r.stdout.strip(),
                         f"export CKPTD_SOCKET=/tmp/ckptd-slurm-{UID}-{JOB}/ckptd.sock")

        # A trainer per node, with nothing but Slurm's variables.
        trainers = [subprocess.Popen(n.argv(self.env(n), sys.executable, "-c", TRAINER),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for n in self.nodes]
        self.procs += trainers
        for n, t in zip(self.nodes, trainers):
            line = t.stdout.readline()
            if line.strip() != "staged":
                t.kill()
                self.fail(f"{n.name}'s trainer: {line!r} {t.stderr.read()}")
        job_dir = os.path.join(self.root, "slurm-job")
        self.assertTrue(os.path.exists(os.path.join(job_dir, "step-1", "COMMIT")))
        self.assertFalse(os.path.exists(os.path.join(job_dir, "step-2", "COMMIT")),
                         "step-2 committed before the stop: nothing left to drain")

        # Stop every node at once, step-2 still being written: it drains.
        stops = [subprocess.Popen(n.argv(self.env(n), LAUNCHER, "stop"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in self.nodes]
        self.procs += stops
        for n, s in zip(self.nodes, stops):
            out, err = s.communicate(timeout=50)
            self.assertEqual(s.returncode, 0, err)
            self.assertIn(f"node {n.index} ({n.name}): ckptd (pid", out)
            self.assertIn("drained and exited", out)
        for t in trainers:
            t.stdin.close()
            t.wait(timeout=30)
            self.assertEqual(t.returncode, 0, t.stderr.read())
        for n, p in zip(self.nodes, (run1, run2, run3)):
            self.assertEqual(p.wait(timeout=30), 0, self.log_of(n))
            log = self.log_of(n)
            self.assertIn("drain: refusing new saves", log)
            self.assertIn("ended while draining: slurm-job/step-2", log)
            self.assertIn("ckptd exited with status 0", log)
        self.assertTrue(os.path.exists(os.path.join(job_dir, "step-2", "COMMIT")))
        self.assertEqual(self.uid_daemons(), [])

        # The launcher's files are gone; the daemon's lock file stays.
        for n in self.nodes:
            self.assertEqual(os.listdir(self.run_dir(n)), ["ckptd.sock.lock"])
        self.assertEqual(os.listdir(self.shared), ["ckpt"])  # the barrier too
        # Everything written belongs to the uid.
        for top, dirs, files in os.walk(self.root):
            for name in [top] + [os.path.join(top, f) for f in dirs + files]:
                self.assertEqual(os.lstat(name).st_uid, UID, name)

        # A stop with no daemon says so and succeeds.
        r = self.run_on(n1, LAUNCHER, "stop")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("nothing to stop", r.stdout)


class DefaultSocketTest(unittest.TestCase):
    """ckptd.default_socket(): $CKPTD_SOCKET, then the Slurm job's, then
    the user's own under $XDG_RUNTIME_DIR, then the system daemon's."""

    def test_order(self):
        import ckptd
        job = "987654321"
        run_dir = f"/tmp/ckptd-slurm-{os.getuid()}-{job}"
        runtime_dir = tempfile.mkdtemp(prefix="ckptd-xdg-")
        saved = {k: os.environ.pop(k, None)
                 for k in ("CKPTD_SOCKET", "SLURM_JOB_ID", "XDG_RUNTIME_DIR")}
        try:
            self.assertEqual(ckptd.default_socket(), ckptd.DEFAULT_SOCKET)
            # A login session without a daemon of its own keeps the system one.
            os.environ["XDG_RUNTIME_DIR"] = runtime_dir
            self.assertEqual(ckptd.default_socket(), ckptd.DEFAULT_SOCKET)
            user_socket = os.path.join(runtime_dir, "ckptd", "ckptd.sock")
            os.mkdir(os.path.dirname(user_socket), 0o700)
            open(user_socket, "w").close()
            self.assertEqual(ckptd.default_socket(), user_socket)
            os.environ["SLURM_JOB_ID"] = job
            # A job without a per-job daemon keeps the user's.
            self.assertEqual(ckptd.default_socket(), user_socket)
            os.mkdir(run_dir, 0o700)
            open(os.path.join(run_dir, "ckptd.sock"), "w").close()
            self.assertEqual(ckptd.default_socket(), os.path.join(run_dir, "ckptd.sock"))
            os.environ["CKPTD_SOCKET"] = "/elsewhere.sock"
            self.assertEqual(ckptd.default_socket(), "/elsewhere.sock")
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(runtime_dir, ignore_errors=True)
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


if __name__ == "__main__":
    why = prerequisites()
    if why:
        print(f"skipped: {why}")
        sys.exit(SKIP)
    unittest.main()
