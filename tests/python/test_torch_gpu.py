"""ckptd.torch with GPU tensors, through a real ckptd started with
--gpu=simulated: CPU tensors over the simulated GPU's memory (a
ckptd._ckpt.SimulatedGpu given to the Checkpointer) stand for CUDA
tensors, and every write to them is queued on its stream, as a kernel's
is. What CUDA tensors add on a real device (device-side copies of
non-contiguous tensors, the replica check's D2H on a side stream) runs in
scripts/gpu-test.sh.

Run by ctest as: python -m unittest test_torch_gpu (in this directory), with
PYTHONPATH holding the built package and CKPTD_BINARY the daemon.
"""

import ctypes
import os
import threading
import time
import unittest

import torch

import ckptd.torch as ckpt
from ckptd import _ckpt
from test_ckptd import Daemon, run_ranks
from test_torch_api import stored_chunks

MiB = 1 << 20


def device_tensor(gpu, shape, dtype=torch.float32):
    """A tensor of `shape` over new memory of the simulated GPU (zeros
    until written), and its address."""
    n = int(torch.Size(shape).numel()) * dtype.itemsize
    address = gpu.allocate(n)
    raw = (ctypes.c_uint8 * n).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape), address


def random_like(t, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (t.numel() * t.element_size(),), dtype=torch.uint8, generator=g)
    return raw.view(t.dtype).reshape(t.shape)


def same_bytes(a, b) -> bool:
    """Bit-exact equality (random bytes make NaNs, which torch.equal sees unequal)."""
    def raw(t):
        return t.contiguous().reshape(-1).view(torch.uint8)
    return a.shape == b.shape and torch.equal(raw(a), raw(b))


def queue_write(gpu, t, value):
    """Queues `value`'s bytes into device tensor `t` on the GPU's stream."""
    gpu.write(t.data_ptr(), value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


class TorchApiOnSimulatedGpu(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(flags=["--gpu=simulated"])
        self.addCleanup(self.daemon.stop)
        self.gpu = _ckpt.SimulatedGpu()
        self.addCleanup(self.gpu.synchronize)

    def checkpointer(self, job):
        return ckpt.Checkpointer(job, socket=self.daemon.socket, gpu=self.gpu)

    def test_gpu_tensors_save_in_place_with_the_gpu_side_staged_reuse_the_plan_and_load_back(self):
        c = self.checkpointer("gpu-torch")
        w, _ = device_tensor(self.gpu, (256, 512))       # 512 KiB
        step, _ = device_tensor(self.gpu, ())            # 4 bytes, read in place
        base, _ = device_tensor(self.gpu, (64, 32))
        wt = base.t()                                    # non-contiguous
        host = torch.arange(100, dtype=torch.float64)
        sd = {"model": {"w": w, "wt": wt}, "optim": {"step": step, "host": host},
              "epoch": 0}
        saved = {}
        for s in (1, 2):
            saved[s] = {"w": random_like(w, 10 + s), "wt": random_like(base, 20 + s).t(),
                        "step": torch.tensor(float(s))}
            self.gpu.delay(0.1)  # the training step is still running at the call
            queue_write(self.gpu, w, saved[s]["w"])
            queue_write(self.gpu, base, saved[s]["wt"].t())
            queue_write(self.gpu, step, saved[s]["step"])
            sd["epoch"] = s
            r = c.async_save(sd, checkpoint_id=f"step-{s}")
            r.wait_staged_on_stream()
            # The optimizer step, queued at once: it runs after the copies.
            queue_write(self.gpu, w, torch.full_like(w, -1.0))
            queue_write(self.gpu, step, torch.tensor(-1.0))
            r.upload_completion.result()
            plan = c._plan
            self.assertTrue(plan.gpu)
            if s == 1:
                first_plan = plan
            else:
                self.assertIs(plan, first_plan, "the second save did not reuse the plan")
        # GPU memory is read in place, even the 4-byte step: no host copy.
        regions = c.client._regions
        for t in (w, step):
            storage = t.untyped_storage()
            self.assertIn((storage.data_ptr(), storage.nbytes(), True, False), regions)
        # The small CPU tensor went through the arena, a snapshot region.
        self.assertTrue(any(not on_gpu and snapshot
                            for (_, _, on_gpu, snapshot) in regions))

        for s in (1, 2):
            self.gpu.delay(1.0)  # queued work the load must wait for
            queue_write(self.gpu, w, torch.zeros_like(w))
            queue_write(self.gpu, base, torch.zeros_like(base))
            host.zero_()
            self.assertEqual(c.load(sd, checkpoint_id=f"step-{s}"), f"step-{s}")
            self.gpu.synchronize()  # the queued writes ran before the load's
            self.assertTrue(same_bytes(w, saved[s]["w"]), s)
            self.assertTrue(same_bytes(wt, saved[s]["wt"]), s)
            self.assertEqual(step.item(), float(s))
            self.assertTrue(torch.equal(host, torch.arange(100, dtype=torch.float64)))
            self.assertEqual(sd["epoch"], s)

    def test_only_cpu_tensors_read_in_place_make_the_cpu_wait_in_the_gpu_side_staged(self):
        # 96 MiB of GPU tensors through the daemon's 64 MiB pool behind a
        # stream busy for 3 s: the daemon enqueues its last copies only
        # after the delay. CPU tensors copied at the call (the small `step`)
        # and pickled values lie in the checkpointer's own buffers, which
        # it rewrites only after STAGED: the stream wait alone orders the
        # step. A CPU tensor read in place is the trainer's own memory,
        # which the daemon reads on its CPU: the CPU waits for the enqueue.
        c = self.checkpointer("gpu-snapshot")
        ws = {f"w{i}": device_tensor(self.gpu, (8 << 20,))[0] for i in range(3)}
        step = torch.tensor(7.0)
        big = torch.full((64 << 10,), 3.0)  # 256 KiB: read in place
        for in_place in (False, True):
            with self.subTest(in_place=in_place):
                optim = {"step": step, **({"big": big} if in_place else {})}
                sd = {"model": ws, "optim": optim, "epoch": 1}
                c.save(sd, checkpoint_id=f"plan-{in_place}")  # plans, registers
                values = {n: random_like(w, i) for i, (n, w) in enumerate(ws.items())}
                self.gpu.synchronize()
                start = time.monotonic()
                self.gpu.delay(3.0)
                for n, w in ws.items():
                    queue_write(self.gpu, w, values[n])
                r = c.async_save(sd, checkpoint_id=f"step-{in_place}")
                r.wait_staged_on_stream()
                waited = time.monotonic() - start
                if in_place:
                    self.assertGreaterEqual(waited, 2.5)
                else:
                    self.assertLess(waited, 2.0)
                # The optimizer step: on the GPU behind the stream wait, on
                # the CPU at once (the copy of `step` was taken at the call).
                queue_write(self.gpu, ws["w0"], torch.full_like(ws["w0"], -1.0))
                step.fill_(-1.0)
                big.fill_(-1.0)
                r.upload_completion.result()
                self.gpu.synchronize()
                c.load(sd, checkpoint_id=f"step-{in_place}")
                self.gpu.synchronize()
                for n, w in ws.items():
                    self.assertTrue(same_bytes(w, values[n]), n)
                self.assertEqual(step.item(), 7.0)
                if in_place:
                    self.assertTrue(torch.equal(big, torch.full_like(big, 3.0)))
                else:
                    big.fill_(3.0)

    def test_the_gpu_side_staged_waits_for_no_hand_over_and_a_failed_save_releases_the_stream(self):
        # The submit thread hands every save over 2 s late (a slow peer in
        # the exchange). A save whose host tensors are all copies makes the
        # stream wait through a relay record reserved at the call: the CPU
        # goes on at once, the step queued next still runs after the
        # daemon's copies. With a CPU tensor read in place the CPU waits
        # for the hand-over (and the daemon's read) as before.
        c = self.checkpointer("gpu-relay")
        w, _ = device_tensor(self.gpu, (256, 1024))  # 1 MiB
        step = torch.tensor(3.0)                     # copied at the call
        big = torch.full((64 << 10,), 2.0)           # 256 KiB: read in place
        submit = c._submitter.submit
        c._submitter.submit = lambda job, fail: submit(lambda: (time.sleep(2.0), job()), fail)
        for in_place in (False, True):
            with self.subTest(in_place=in_place):
                sd = {"w": w, "optim": {"step": step, **({"big": big} if in_place else {})}}
                c.save(sd, checkpoint_id=f"plan-{in_place}")
                at_call = random_like(w, 5)
                queue_write(self.gpu, w, at_call)
                start = time.monotonic()
                r = c.async_save(sd, checkpoint_id=f"step-{in_place}")
                r.wait_staged_on_stream()
                waited = time.monotonic() - start
                if in_place:
                    self.assertGreaterEqual(waited, 1.8)
                else:
                    self.assertLess(waited, 1.0)
                queue_write(self.gpu, w, torch.full_like(w, -1.0))  # the optimizer step
                r.upload_completion.result()
                self.gpu.synchronize()
                self.assertTrue(same_bytes(w, torch.full_like(w, -1.0)))
                c.load(sd, checkpoint_id=f"step-{in_place}")
                self.gpu.synchronize()
                self.assertTrue(same_bytes(w, at_call))

        # A save that fails after the relay record was reserved (a value
        # that cannot be pickled) passes it on all the same: the stream
        # that waits for it goes on.
        r = c.async_save({"w": w, "bad": lambda: None}, checkpoint_id="bad")
        r.wait_staged_on_stream()
        with self.assertRaisesRegex(ckpt.SaveInputError, "bad: cannot pickle"):
            r.upload_completion.result()
        drained = threading.Thread(target=self.gpu.synchronize, daemon=True)
        drained.start()
        drained.join(30)
        self.assertFalse(drained.is_alive(), "the stream still waits for the failed save")

    def test_the_save_holds_the_bytes_of_the_call_whatever_the_stream_runs_before_the_submit(self):
        c = self.checkpointer("gpu-call")
        w, _ = device_tensor(self.gpu, (1024,))
        at_call = random_like(w, 1)
        queue_write(self.gpu, w, at_call)
        # The submit thread hands the save over late (a slow peer in the
        # exchange), after the trainer queued more work: a long kernel and
        # new bytes. The copies wait only for the writes before the call.
        submit = c._submitter.submit
        c._submitter.submit = lambda job, fail: submit(lambda: (time.sleep(0.3), job()), fail)
        r = c.async_save({"w": w}, checkpoint_id="step-1")
        self.gpu.delay(2.0)
        queue_write(self.gpu, w, torch.full_like(w, 7.0))
        r.upload_completion.result()
        self.gpu.synchronize()
        w.zero_()
        c.load({"w": w}, checkpoint_id="step-1")
        self.assertTrue(same_bytes(w, at_call))

    def test_a_tensor_on_another_device_fails_the_futures_and_the_gpu_side_staged_naming_the_fqn(self):
        c = self.checkpointer("gpu-bad")
        r = c.async_save({"a": {"b": torch.zeros(2, device="meta")}}, checkpoint_id="x")
        with self.assertRaisesRegex(ckpt.SaveInputError, "a.b: a tensor on the meta device has no memory"):
            r.staging_completion.result()
        # The GPU-side STAGED of a failed save raises the save's error...
        with self.assertRaisesRegex(ckpt.SaveInputError, "a.b: a tensor on the meta device has no memory"):
            r.wait_staged_on_stream()
        # ...and that of a save without GPU tensors says so.
        r = c.async_save({"host": torch.ones(4)}, checkpoint_id="y")
        with self.assertRaisesRegex(ValueError, "no GPU tensors"):
            r.wait_staged_on_stream()
        r.upload_completion.result()


def replicated_gpu_rank(socket, store, rank, world, job):
    """Two ranks save a DDP-style state of GPU tensors (replicated plain
    tensors, every write queued on the stream behind a long kernel), which
    is stored once; then a save whose replicas differ only in bytes still
    queued at the call, which must fail on both ranks naming the fqn; then
    saves where rank 1's GPU fails, which must fail on both ranks."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    gpu = _ckpt.SimulatedGpu()
    try:
        c = ckpt.Checkpointer(job, socket=socket, gpu=gpu)
        bias, _ = device_tensor(gpu, (256,))
        weight, _ = device_tensor(gpu, (512, 1024))  # 2 MiB: above check_bytes
        sd = {"model": {"bias": bias, "weight": weight}}
        gpu.delay(0.3)
        queue_write(gpu, bias, torch.arange(256, dtype=torch.float32))
        queue_write(gpu, weight, torch.ones(512, 1024))
        c.save(sd, checkpoint_id="step-1")

        gpu.delay(0.3)
        queue_write(gpu, bias, torch.arange(256, dtype=torch.float32) + rank)
        r = c.async_save(sd, checkpoint_id="step-2")
        try:
            r.upload_completion.result()
            raise AssertionError("a save whose GPU replicas disagree succeeded")
        except ckpt.ReplicaMismatchError as e:
            assert "model.bias" in str(e), e
        try:
            r.wait_staged_on_stream()
            raise AssertionError("the GPU-side STAGED of a failed save returned")
        except ckpt.ReplicaMismatchError:
            pass

        # A rank whose GPU fails at the save call, or while the submit
        # thread reads its replicas' bytes: every rank fails, naming it,
        # instead of waiting for it in the exchange.
        queue_write(gpu, bias, torch.arange(256, dtype=torch.float32))
        for name in ("mark", "host_bytes"):
            original = getattr(c._memory, name)
            if rank == 1:
                def broken(*args, **kwargs):
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
                setattr(c._memory, name, broken)
            r = c.async_save(sd, checkpoint_id=f"broken-{name}")
            try:
                r.upload_completion.result()
                raise AssertionError(f"a save whose rank 1 failed in {name} succeeded")
            except ckpt.SaveInputError as e:  # the exchange's verdict
                assert rank == 0 or name == "host_bytes", e
                assert "rank 1: " in str(e) and "illegal memory access" in str(e), e
            except RuntimeError as e:  # rank 1's own error at the call keeps its class
                assert rank == 1 and name == "mark" and "illegal memory access" in str(e), e
            setattr(c._memory, name, original)
        gpu.synchronize()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # gRPC threads of a spawned interpreter


class ReplicatedGpuTensors(unittest.TestCase):
    def test_replicated_gpu_tensors_are_stored_once_and_replicas_that_differ_or_fail_to_read_fail_every_rank(self):
        daemon = Daemon(flags=["--gpu=simulated"])
        self.addCleanup(daemon.stop)
        store = os.path.join(daemon.dir, "gloo-gpu")
        self.assertEqual(run_ranks(replicated_gpu_rank, 2, daemon.socket, store, "ddp-gpu"),
                         [0, 0])
        gpu = _ckpt.SimulatedGpu()
        c = ckpt.Checkpointer("ddp-gpu", socket=daemon.socket, gpu=gpu)
        bias, _ = device_tensor(gpu, (256,))
        weight, _ = device_tensor(gpu, (512, 1024))
        self.assertEqual(c.load({"model": {"bias": bias, "weight": weight}}), "step-1")
        self.assertTrue(torch.equal(bias, torch.arange(256, dtype=torch.float32)))
        self.assertTrue(torch.equal(weight, torch.ones(512, 1024)))
        listed = [x["checkpoint"] for x in c.client.list() if x["committed"]]
        self.assertEqual(listed, ["step-1"])
        chunks = stored_chunks(daemon.socket, "ddp-gpu", "step-1")
        self.assertEqual(chunks["model.bias"], [([0], [256])])
        self.assertEqual(chunks["model.weight"], [([0, 0], [512, 1024])])


if __name__ == "__main__":
    unittest.main()
