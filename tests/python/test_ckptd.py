"""Tests of the ckptd Python package against a real ckptd daemon.

Run by ctest as: python -m unittest test_ckptd (in this directory), with
PYTHONPATH holding the built package and CKPTD_BINARY the daemon to start.
"""

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import unittest

import numpy as np
import torch

import ckptd


class Daemon:
    """A ckptd on a temporary directory, stopped at exit."""

    def __init__(self, root=None, flags=()):
        """`root`: a storage root of the caller's (kept at stop); `flags`:
        more ckptd flags."""
        self.dir = tempfile.mkdtemp(prefix="ckptd-py-")
        self.socket = os.path.join(self.dir, "ckptd.sock")
        self.log = open(os.path.join(self.dir, "ckptd.log"), "w")
        self.process = subprocess.Popen(
            [os.environ["CKPTD_BINARY"], "--socket", self.socket, "--root",
             root or os.path.join(self.dir, "root"), "--pool_bytes", str(64 << 20),
             "--load_batch_ms", "5000",
             # Bounds that fit a hard open-files limit of 4096 (ckptd
             # refuses to start below what its bounds need).
             "--max_sessions", "256", "--max_connections", "1024", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket + ".session"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ckptd did not start; see {self.log.name}")
            time.sleep(0.02)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.dir)


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.w": torch.randn(300, 257, generator=g),
        "model.h": torch.randn(64, 33, generator=g).to(torch.bfloat16),
        "model.mask": torch.rand(17, generator=g) > 0.5,
        "model.ids": torch.randint(0, 1 << 40, (5, 7), generator=g),
        "opt.step": torch.tensor(seed, dtype=torch.int64),
        "numpy.u16": np.arange(1000, dtype=np.uint16) * np.uint16(seed),
        "model.z": torch.randn(6, 5, dtype=torch.complex64, generator=g),
        "numpy.c64": (np.arange(12) * (1 + 2j) * seed).astype(np.complex64),
    }


def equal(a, b):
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return torch.equal(a, b)


def zero(sd):
    for v in sd.values():
        v[...] = 0


def save_rows(socket, _, rank, world, rows):
    """Rank `rank` of 2 saves its half of a [rows, 64] tensor and one copy of
    a replicated bias, and waits for the commit."""
    client = ckptd.Client("sharded", rank, world, socket=socket, local_world_size=world)
    full = torch.arange(rows * 64, dtype=torch.float32).reshape(rows, 64)
    lo, hi = (0, rows // 2) if rank == 0 else (rows // 2, rows)
    sd = {"w": ckptd.Shard(full[lo:hi].clone(), [rows, 64], [lo, 0]),
          "bias": ckptd.Shard(torch.full((8,), 7.0), [8], [0], replicas=[0, 1])}
    client.save("step-1", sd).wait_committed()


def dtensor_rank(socket, store, rank, world, mode):
    """One rank of a gloo job: "save" an HSDP (2 replicas x 2 shards) state of
    DTensors, or "load" it into FSDP DTensors over 2 ranks and check them."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    try:
        full = torch.arange(101 * 64, dtype=torch.float32).reshape(101, 64)
        bias = torch.full((8,), 7.0)
        client = ckptd.Client("dtensor", rank, world, socket=socket, local_world_size=world)
        if mode == "save":
            mesh = init_device_mesh("cpu", (2, 2))
            sd = {"w": distribute_tensor(full, mesh, [Replicate(), Shard(0)]),
                  "bias": distribute_tensor(bias, mesh, [Replicate(), Replicate()])}
            client.save("step-1", sd).wait_committed()
            return
        mesh = init_device_mesh("cpu", (world,))
        sd = {"w": distribute_tensor(torch.zeros(101, 64), mesh, [Shard(0)]),
              "bias": distribute_tensor(torch.zeros(8), mesh, [Replicate()])}
        client.load("step-1", sd)
        want = distribute_tensor(full, mesh, [Shard(0)]).to_local()
        if not torch.equal(sd["w"].to_local(), want) or not torch.equal(
                sd["bias"].to_local(), bias):
            raise AssertionError(f"rank {rank} restored other bytes")
    finally:
        dist.destroy_process_group()


def exit_before_finalizing(code: int) -> None:
    """Ends a rank process without the interpreter's finalization. A gloo
    worker thread of torch drops a finished collective's tensors some time
    after the caller saw it complete, and that takes the GIL; in an
    interpreter that is finalizing, taking the GIL ends the thread
    (pthread_exit), and its unwind through torch's noexcept work destructor
    aborts the process (exit -6, "terminate called without an active
    exception": seen in this suite with a rank's last DTensor.full_tensor()
    on the default group, a core showing ~AsyncAllgatherCoalescedWork on
    the gloo thread). That race is torch's, not the checkpoint's; ckptd's
    own gloo group is released at exit (replica_exchange.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank_entry(target, args):
    try:
        target(*args)
    except SystemExit as e:
        exit_before_finalizing(e.code if isinstance(e.code, int) else 1)
    except BaseException:  # noqa: BLE001 - reported as the process's own would be
        traceback.print_exc()
        exit_before_finalizing(1)
    exit_before_finalizing(0)


def run_ranks(target, world, *args):
    """Runs target(*args, rank, world, ...) in `world` fresh interpreters (gRPC
    does not survive fork in a process that used it); returns exit codes."""
    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_rank_entry,
                         args=(target, args[:2] + (r, world) + args[2:]))
             for r in range(world)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(300)
    return [p.exitcode for p in ranks]


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def client(self, job, rank=0, world=1):
        return ckptd.Client(job, rank, world, socket=self.daemon.socket)

    def open_sessions(self):
        out = subprocess.run([os.environ["CKPTCTL_BINARY"], "--socket", self.daemon.socket,
                              "status"], check=True, stdout=subprocess.PIPE, text=True).stdout
        return int(out.split(" sessions ")[1].split()[0])

    def test_a_restarted_run_saves_the_step_its_killed_run_left_half_submitted(self):
        """Rank 0 of a 2-rank run hands its part of step-4 over and dies
        before rank 1 hands over its own (a kill): the daemon's attempt
        waits for rank 1 of a run that is gone. The restarted run opens new
        sessions: the old attempt fails as rank 0's opens, naming why, and
        the new run's step-4 commits (before, its rank 0 was refused as
        having submitted already, and its rank 1 joined the old attempt)."""
        job = "restarted"
        before = self.open_sessions()
        old = subprocess.run([sys.executable, "-c", f"""
import numpy as np, ckptd
client = ckptd.Client({job!r}, 0, 2, socket={self.daemon.socket!r})
client.save("step-4", {{"w0": np.arange(64.0)}}).wait_staged()
import os; os._exit(0)  # killed: no goodbye
"""], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ)
        self.assertEqual(old.returncode, 0, old.stdout)
        # The daemon has seen the old session end.
        deadline = time.monotonic() + 30
        while self.open_sessions() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.open_sessions(), before)
        ranks = [self.client(job, r, 2) for r in range(2)]
        arrays = [np.arange(64.0) + 100 * r for r in range(2)]
        for attempt in range(100):  # the old attempt's files are removed first
            try:
                first = ranks[0].save("step-4", {"w0": arrays[0]})
                break
            except ckptd.CkptdError as e:
                if "removing the files" not in str(e) or attempt == 99:
                    raise
                time.sleep(0.05)
        handles = [first, ranks[1].save("step-4", {"w1": arrays[1]})]
        for h in handles:
            h.wait_committed()
        got = np.zeros(64)
        ranks[1].load("step-4", {"w1": got})
        self.assertTrue(np.array_equal(got, arrays[1]))

    def test_input_the_client_cannot_save_is_refused_naming_the_fqn(self):
        client = self.client("refused-input")
        for fqn, value, why in [("opt.t", torch.ones(4, 4).t(), "contiguous"),
                                ("step", 3, "ckptd.torch takes")]:
            with self.assertRaisesRegex(ValueError, f"^{fqn}: .*{why}"):
                client.save("step-1", {"ok": torch.ones(2), fqn: value})

    def test_save_and_load_restores_every_dtype_bit_exact(self):
        client = self.client("roundtrip")
        sd = state(1)
        expected = {k: v.copy() if isinstance(v, np.ndarray) else v.clone()
                    for k, v in sd.items()}
        handle = client.save("step-1", sd, byte_items={"rng": b"\x00rng\xff"})
        handle.wait_staged()
        handle.wait_committed()
        self.assertEqual(handle.progress()["phase"], "COMMITTED")
        zero(sd)
        result = client.load("latest", sd, byte_items=["rng"])
        self.assertEqual(result["checkpoint"], "step-1")
        self.assertEqual(result["byte_items"], {"rng": b"\x00rng\xff"})
        for fqn in sd:
            self.assertTrue(equal(sd[fqn], expected[fqn]), fqn)

    def test_a_second_save_reuses_the_layout_and_keeps_its_own_bytes(self):
        client = self.client("two-saves")
        sd = state(2)
        first_save = client.save("a", sd)
        first_save.wait_staged()  # the memory may change now
        first = sd["model.w"].clone()
        sd["model.w"].add_(1)
        client.save("b", sd).wait_committed()
        # Saves commit independently: "b" may commit before "a" does.
        first_save.wait_committed()
        self.assertEqual(len(client._layouts), 1)
        for name, want in (("a", first), ("b", first + 1)):
            zero(sd)
            client.load(name, sd)
            self.assertTrue(torch.equal(sd["model.w"], want), name)
        self.assertEqual([c["checkpoint"] for c in client.list()], ["a", "b"])

    def test_two_ranks_save_shards_and_one_rank_loads_the_whole_tensor(self):
        self.assertEqual(run_ranks(save_rows, 2, self.daemon.socket, None, 101), [0, 0])
        client = self.client("sharded")
        whole = {"w": torch.zeros(101, 64), "bias": torch.zeros(8)}
        result = client.load("step-1", whole)
        self.assertTrue(torch.equal(
            whole["w"], torch.arange(101 * 64, dtype=torch.float32).reshape(101, 64)))
        self.assertTrue(torch.equal(whole["bias"], torch.full((8,), 7.0)))
        # The replicated bias was written once: the bytes read are the two
        # halves and one bias.
        self.assertEqual(result["bytes_read"], 101 * 64 * 4 + 8 * 4)

    def test_hsdp_dtensors_save_deduped_and_load_into_another_mesh(self):
        store = os.path.join(self.daemon.dir, "gloo-save")
        self.assertEqual(run_ranks(dtensor_rank, 4, self.daemon.socket, store, "save"),
                         [0] * 4)
        client = self.client("dtensor")
        whole = {"w": torch.zeros(101, 64), "bias": torch.zeros(8)}
        result = client.load("step-1", whole)
        self.assertTrue(torch.equal(
            whole["w"], torch.arange(101 * 64, dtype=torch.float32).reshape(101, 64)))
        # Each replicated byte was written once.
        self.assertEqual(result["bytes_read"], 101 * 64 * 4 + 8 * 4)
        store = os.path.join(self.daemon.dir, "gloo-load")
        self.assertEqual(run_ranks(dtensor_rank, 2, self.daemon.socket, store, "load"),
                         [0, 0])

    def test_bad_input_is_refused_with_a_clear_error(self):
        client = self.client("bad")
        with self.assertRaisesRegex(ValueError, "contiguous"):
            client.save("x", {"t": torch.zeros(4, 4).t()})
        with self.assertRaisesRegex(ValueError, "unsupported dtype"):
            client.save("x", {"t": torch.zeros(4, dtype=torch.complex128)})
        sd = {"t": torch.ones(4, 4)}
        client.save("x", sd).wait_committed()
        with self.assertRaisesRegex(ckptd.Error, "INVALID_ARGUMENT.*item t"):
            client.load("x", {"t": torch.zeros(4, 5)})
        with self.assertRaisesRegex(ckptd.Error, "NOT_FOUND"):
            client.load("no-such", sd)
        result = client.load("x", {"t": torch.zeros(4, 4), "u": torch.zeros(2)},
                             allow_missing=True)
        self.assertEqual(result["missing"], ["u"])



class MessageLimitTest(unittest.TestCase):
    """Byte items larger together than the daemon's message limit load whole:
    the package follows the daemon's pages without being asked."""

    def test_byte_items_past_the_message_limit_load_whole(self):
        root = tempfile.mkdtemp(prefix="ckptd-py-root-")
        try:
            blobs = {f"state.{i}": bytes([i]) * (64 << 10) for i in range(12)}
            sd = {"w": torch.arange(1024, dtype=torch.float32)}
            # Saved through a daemon with the default limit (a save request
            # must fit the limit itself) ...
            daemon = Daemon(root)
            try:
                client = ckptd.Client("paged", socket=daemon.socket)
                client.save("step-1", sd, byte_items=blobs).wait_committed()
                del client
            finally:
                daemon.stop()
            # ... and loaded through one whose limit is a third of them.
            daemon = Daemon(root, ["--max_request_bytes", str(256 << 10)])
            try:
                client = ckptd.Client("paged", socket=daemon.socket)
                zero(sd)
                result = client.load("latest", sd, byte_items=list(blobs))
                self.assertEqual(result["byte_items"], blobs)
                self.assertTrue(torch.equal(sd["w"], torch.arange(1024, dtype=torch.float32)))
                del client
            finally:
                daemon.stop()
        finally:
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
