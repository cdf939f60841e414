"""The GPU path of the Python package through a real ckptd started with
--gpu=simulated: device memory of the simulated GPU (gpu/, a SimulatedGpu
given to the client) registered, saved with the GPU-side STAGED and
restored, through the binding (ckptd._ckpt) and through ckptd.Client; and
the errors a caller meets. (CUDA tensors themselves need a GPU.)

Run by ctest as: python -m unittest test_gpu (in this directory), with
PYTHONPATH holding the built package and CKPTD_BINARY the daemon.
"""

import ctypes
import random
import time
import unittest

import numpy as np

import ckptd
from ckptd import _ckpt
from test_ckptd import Daemon

MiB = 1 << 20


def random_bytes(n, seed):
    return random.Random(seed).randbytes(n)


def item(fqn, region, length):
    """A flat uint8 tensor of `length` bytes filling GPU region `region`."""
    return {"fqn": fqn, "dtype": "U8", "global_shape": [length], "offsets": [0],
            "local_shape": [length], "region": region, "offset": 0, "length": length}


class SimulatedGpuBinding(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(flags=["--gpu=simulated"])
        self.addCleanup(self.daemon.stop)
        self.gpu = _ckpt.SimulatedGpu()
        self.client = _ckpt.Client(self.daemon.socket, "gpujob", 0, 1, 0, 1, gpu=self.gpu)
        self.addCleanup(self.gpu.synchronize)

    def test_device_memory_saves_and_restores_bit_exact_and_a_write_queued_after_the_gpu_side_staged_is_not_saved(self):
        sizes = {"model.w": 2 * MiB, "model.b": MiB + 4096}
        addresses = {fqn: self.gpu.allocate(n) for fqn, n in sizes.items()}
        saved = {fqn: random_bytes(n, seed) for seed, (fqn, n) in enumerate(sizes.items())}
        for fqn, data in saved.items():
            self.gpu.write(addresses[fqn], data)  # the training step, on the stream
        items = [item(fqn, self.client.register_gpu_region(addresses[fqn], n), n)
                 for fqn, n in sizes.items()]
        layout = self.client.define_layout(items)

        handle = self.client.save("step-1", layout, {"meta": b"m"}, stream=self.gpu.stream)
        handle.wait_staged_on_stream(self.gpu.stream)
        # The next optimizer step, queued right away: the stream runs it only
        # after the daemon's copies.
        for fqn, n in sizes.items():
            self.gpu.write(addresses[fqn], b"\xff" * n)
        handle.wait_committed()
        self.assertEqual(handle.progress()["phase"], "COMMITTED")

        for fqn, n in sizes.items():
            self.gpu.write(addresses[fqn], bytes(n))
        self.gpu.synchronize()
        loaded = self.client.load("step-1", items, ["meta"], False)
        self.assertEqual(loaded["byte_items"], {"meta": b"m"})
        for fqn, n in sizes.items():
            self.assertTrue(self.gpu.read(addresses[fqn], n) == saved[fqn], fqn)

    def test_a_save_that_names_a_released_region_fails_and_says_so(self):
        address = self.gpu.allocate(MiB)
        region = self.client.register_gpu_region(address, MiB)
        layout = self.client.define_layout([item("w", region, MiB)])
        self.client.release_regions([region])
        with self.assertRaises(ckptd.errors.CkptdError) as raised:
            handle = self.client.save("step-1", layout, {}, stream=self.gpu.stream)
            handle.wait_staged()
        self.assertIn("released", str(raised.exception))

    def test_memory_that_is_not_device_memory_is_refused_with_a_clear_error(self):
        host = ctypes.create_string_buffer(4096)
        address = ctypes.addressof(host)
        with self.assertRaises(ckptd.errors.CkptdError) as raised:
            self.client.register_gpu_region(address, 4096)
        self.assertIn("NOT_FOUND", str(raised.exception))
        # The simulated GPU refuses to touch it too, rather than write there.
        with self.assertRaises(ckptd.errors.CkptdError):
            self.gpu.write(address, b"x")
        with self.assertRaises(ckptd.errors.CkptdError):
            self.gpu.read(address, 1)


def device_array(gpu, n):
    """A uint8 array of `n` bytes over new memory of the simulated GPU, and
    its address: what a CUDA tensor is to ckptd.Client."""
    address = gpu.allocate(n)
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(address)), address


class ClientOnSimulatedGpu(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(flags=["--gpu=simulated"])
        self.addCleanup(self.daemon.stop)
        self.gpu = _ckpt.SimulatedGpu()
        self.client = ckptd.Client("gpujob", socket=self.daemon.socket, gpu=self.gpu)
        self.addCleanup(self.gpu.synchronize)

    def test_gpu_and_host_tensors_of_one_state_dict_save_and_restore_with_the_gpu_side_staged(self):
        w, w_at = device_array(self.gpu, 2 * MiB)
        b, b_at = device_array(self.gpu, 64 << 10)
        host = np.arange(1000, dtype=np.float32)
        state = {"model.w": w, "model.b": b, "opt.host": host}
        step = {}
        for s in (1, 2):  # the second save reuses the regions and the layout
            step[s] = {"model.w": random_bytes(2 * MiB, 10 + s),
                       "model.b": random_bytes(64 << 10, 20 + s)}
            self.gpu.write(w_at, step[s]["model.w"])  # the step, queued on the stream
            self.gpu.write(b_at, step[s]["model.b"])
            handle = self.client.save(f"step-{s}", state)
            handle.wait_staged_on_stream()
            # The next step's writes, queued at once: they run after the copies.
            self.gpu.write(w_at, b"\xff" * (2 * MiB))
            handle.wait_committed()

        for s in (1, 2):
            # Queued behind a long kernel, not yet run: the load waits for the
            # stream before it writes.
            self.gpu.delay(0.2)
            self.gpu.write(w_at, bytes(2 * MiB))
            self.gpu.write(b_at, bytes(64 << 10))
            host[...] = 0
            self.client.load(f"step-{s}", state)
            self.assertTrue(self.gpu.read(w_at, 2 * MiB) == step[s]["model.w"], s)
            self.assertTrue(self.gpu.read(b_at, 64 << 10) == step[s]["model.b"], s)
            np.testing.assert_array_equal(host, np.arange(1000, dtype=np.float32))

    def test_the_gpu_side_staged_of_a_save_without_gpu_tensors_says_to_wait_on_the_cpu(self):
        handle = self.client.save("host-only", {"h": np.ones(10, dtype=np.float32)})
        with self.assertRaises(ValueError) as raised:
            handle.wait_staged_on_stream()
        self.assertIn("wait_staged()", str(raised.exception))
        handle.wait_committed()


def daemon_mappings(daemon) -> int:
    """Allocations of the simulated GPU the daemon maps now."""
    with open(f"/proc/{daemon.process.pid}/maps") as maps:
        return sum("ckpt-sim-alloc" in line for line in maps)


def await_mappings(daemon, n) -> int:
    deadline = time.monotonic() + 10
    while daemon_mappings(daemon) != n and time.monotonic() < deadline:
        time.sleep(0.01)
    return daemon_mappings(daemon)


def release_gpu_memory():
    """The C function behind the _ckpt.release_gpu_memory capsule: what the
    allocator hook calls when PyTorch returns a segment to the driver."""
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(_ckpt.release_gpu_memory, b"ckptd._ckpt.release_gpu_memory")
    return ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_uint64)(address)


class AllocatorRelease(unittest.TestCase):
    def test_memory_the_allocator_returns_is_unmapped_at_once_and_mapped_again_by_a_later_save(self):
        daemon = Daemon(flags=["--gpu=simulated"])
        self.addCleanup(daemon.stop)
        gpu = _ckpt.SimulatedGpu()
        client = ckptd.Client("gpujob", socket=daemon.socket, gpu=gpu)
        self.addCleanup(gpu.synchronize)
        w, w_at = device_array(gpu, MiB)
        b, b_at = device_array(gpu, MiB)
        state = {"model.w": w, "model.b": b}
        gpu.write(w_at, random_bytes(MiB, 1))
        gpu.write(b_at, random_bytes(MiB, 2))
        client.save("step-1", state).wait_committed()
        self.assertEqual(await_mappings(daemon, 2), 2)

        # PyTorch's allocator frees the segment under model.w (then, here,
        # allocates it again at the same address).
        release_gpu_memory()(w_at, MiB)
        self.assertEqual(await_mappings(daemon, 1), 1)

        step2 = random_bytes(MiB, 3)
        gpu.write(w_at, step2)
        client.save("step-2", state).wait_committed()
        self.assertEqual(await_mappings(daemon, 2), 2)
        gpu.write(w_at, bytes(MiB))
        client.load("step-2", state)
        self.assertTrue(gpu.read(w_at, MiB) == step2)

    def test_the_hook_attaches_to_pytorchs_caching_allocator_where_it_is_built(self):
        try:
            from ckptd import _allocator_hook  # noqa: F401
        except ImportError:
            self.skipTest("ckptd._allocator_hook is not built here (torch without CUDA)")
        from ckptd import gpu_memory
        self.assertTrue(gpu_memory.install_allocator_hook())
        self.assertTrue(gpu_memory.install_allocator_hook())  # once per process


class WithoutSimulatedGpu(unittest.TestCase):
    def test_a_client_on_the_cuda_runtime_refuses_host_memory_as_a_gpu_region(self):
        daemon = Daemon()
        self.addCleanup(daemon.stop)
        client = _ckpt.Client(daemon.socket, "gpujob", 0, 1, 0, 1)
        host = ctypes.create_string_buffer(4096)
        # No driver here, or a driver that does not know the pointer: either
        # way an error, never a region.
        with self.assertRaises(ckptd.errors.CkptdError):
            client.register_gpu_region(ctypes.addressof(host), 4096)


if __name__ == "__main__":
    unittest.main()
