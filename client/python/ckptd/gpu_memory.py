"""Which of a state dict's tensors are GPU memory, and the stream their
writes are queued on: the seam between ckptd.Client and the GPU.

CudaMemory is torch's CUDA tensors on the CUDA runtime libckpt was built
with. SimulatedMemory is the simulated GPU of the binding
(ckptd._ckpt.SimulatedGpu, gpu/ in the repository), whose device memory a
daemon started with --gpu=simulated maps: arrays or CPU tensors over that
memory stand for CUDA tensors, so the Python GPU path runs where no GPU is.

Both answer the same questions for the tensors of one save or load (a
rank's GPU tensors are on one device):
  holds(tensor, address, length): is it GPU memory?
  device(tensors): their device (ValueError if there are several).
  stream(device): the stream (an int handle) the trainer's writes to them
      are queued on now; the save records its ready event there and the
      GPU-side STAGED makes it wait.
  synchronize(device): waits for that stream (before a load writes them).
and, for ckptd.torch (checkpointer.py), which copies non-contiguous
tensors into buffers of its own and compares small replicated tensors'
bytes between ranks:
  buffer_like(tensor, shape): a contiguous buffer for a copy of `tensor`
      (or of a box of `shape` of its dtype): device memory for CUDA, so the
      copy is queued on the stream and the CPU does not wait; host memory
      for the simulated GPU, which has no device-side copy, so a copy into
      it first synchronizes (copies_on_device False).
  mark(device): a point on the stream now (the save call);
  host_bytes(device, mark, tensors): on another thread, later, host copies
      of `tensors` as they were at the mark (the trainer mutates them only
      after the save is STAGED, which comes later still).

CudaMemory also hooks into PyTorch's CUDA caching allocator at the first
CUDA tensor (ckptd._allocator_hook): when the allocator returns a segment
to the driver, every ckptd client of the process releases its GPU regions
over it, so the daemon does not keep freed memory alive. Where the hook is
not built (torch without CUDA, the pip build), a warning says so once.
"""

import warnings

from ckptd import _ckpt

_hook_state = {"tried": False}


def install_allocator_hook() -> bool:
    """Attaches ckptd's tracker to PyTorch's CUDA caching allocator (once per
    process); False, with a warning, where ckptd._allocator_hook is missing."""
    if _hook_state["tried"]:
        return _hook_state.get("attached", False)
    _hook_state["tried"] = True
    try:
        from ckptd import _allocator_hook
    except ImportError as e:
        warnings.warn(
            "ckptd._allocator_hook is not built (it needs torch with CUDA and the CUDA "
            f"toolkit when ckptd is built: {e}): GPU memory PyTorch's allocator frees stays "
            "mapped by the daemon until a later save maps the memory again or the client "
            "closes", RuntimeWarning, stacklevel=3)
        return False
    _allocator_hook.attach(_ckpt.release_gpu_memory)
    _hook_state["attached"] = True
    return True


class CudaMemory:
    """CUDA tensors of torch, on their device's current stream."""

    copies_on_device = True

    def __init__(self):
        self._side_streams = {}  # device -> torch.cuda.Stream of host_bytes

    def holds(self, tensor, address: int, length: int) -> bool:
        if getattr(getattr(tensor, "device", None), "type", None) != "cuda":
            return False
        install_allocator_hook()
        return True

    @staticmethod
    def device(tensors):
        devices = {t.device for t in tensors}
        if len(devices) != 1:
            raise ValueError("the GPU tensors of one save or load must be on one device, "
                             f"got {sorted(str(d) for d in devices)}")
        return devices.pop()

    def stream(self, device) -> int:
        import torch
        return torch.cuda.current_stream(device).cuda_stream

    def synchronize(self, device) -> None:
        import torch
        torch.cuda.current_stream(device).synchronize()

    def buffer_like(self, tensor, shape=None):
        import torch
        return torch.empty(tensor.shape if shape is None else shape, dtype=tensor.dtype,
                           device=tensor.device)

    def mark(self, device):
        import torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def host_bytes(self, device, mark, tensors) -> list:
        import torch
        # The calling thread (not the trainer's) made current on `device`
        # first: leaving torch.cuda.stream() restores the thread's previous
        # stream, and with it its device, which on a fresh thread is GPU 0:
        # a context there would cost every rank of another GPU hundreds of
        # MiB on GPU 0.
        if torch.cuda.current_device() != device.index:
            torch.cuda.set_device(device)
        # A stream of its own, which does not wait for what the trainer
        # queued after the mark (the legacy default stream would); the
        # copies run on it once the mark is reached.
        side = self._side_streams.get(device)
        if side is None:
            side = self._side_streams[device] = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            side.wait_event(mark)
            # Pinned host tensors (a non-blocking D2H copy allocates them so).
            hosts = [t.to("cpu", non_blocking=True) for t in tensors]
        side.synchronize()  # the caller holds `tensors` alive until here
        return hosts


class SimulatedMemory:
    """Memory of a ckptd._ckpt.SimulatedGpu, on its one stream."""

    copies_on_device = False

    def __init__(self, gpu):
        self.gpu = gpu

    def holds(self, tensor, address: int, length: int) -> bool:
        return length > 0 and self.gpu.holds(address, length)

    def device(self, tensors):
        return None  # one device

    def stream(self, device) -> int:
        return self.gpu.stream

    def synchronize(self, device) -> None:
        self.gpu.synchronize()

    def buffer_like(self, tensor, shape=None):
        import torch
        return torch.empty(tensor.shape if shape is None else shape, dtype=tensor.dtype)

    def mark(self, device):
        return self.gpu.stream  # host_bytes waits for all the stream's work

    def host_bytes(self, device, mark, tensors) -> list:
        # Everything queued so far includes the writes before the mark; the
        # trainer queues none to these tensors before the save is STAGED.
        self.gpu.synchronize()
        return list(tensors)
