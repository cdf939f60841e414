"""The binding's GPU path (ckptd._ckpt) through a real ckptd started with
--gpu=simulated: device memory of the simulated GPU (gpu/, a SimulatedGpu
given to the Client) registered, saved with the GPU-side STAGED, restored
into it; and the errors a caller meets.

Run by ctest as: python -m unittest test_gpu_binding (in this directory),
with PYTHONPATH holding the built package and CKPTD_BINARY the daemon.
"""

import ctypes
import random
import unittest

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
