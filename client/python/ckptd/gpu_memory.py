"""Which of a state dict's tensors are GPU memory, and the stream their
writes are queued on: the seam between ckptd.Client and the GPU.

CudaMemory is torch's CUDA tensors on the CUDA runtime libckpt was built
with. SimulatedMemory is the simulated GPU of the binding
(ckptd._ckpt.SimulatedGpu, gpu/ in the repository), whose device memory a
daemon started with --gpu=simulated maps: arrays or CPU tensors over that
memory stand for CUDA tensors, so the Python GPU path runs where no GPU is.

Both answer the same three questions for the tensors of one save or load
(a rank's GPU tensors are on one device):
  holds(tensor, address, length): is it GPU memory?
  stream(tensors): the stream (an int handle) the trainer's writes to them
      are queued on now; the save records its ready event there and the
      GPU-side STAGED makes it wait.
  synchronize(tensors): waits for that stream (before a load writes them).

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

    def holds(self, tensor, address: int, length: int) -> bool:
        if getattr(getattr(tensor, "device", None), "type", None) != "cuda":
            return False
        install_allocator_hook()
        return True

    @staticmethod
    def _device(tensors):
        devices = {t.device for t in tensors}
        if len(devices) != 1:
            raise ValueError("the GPU tensors of one save or load must be on one device, "
                             f"got {sorted(str(d) for d in devices)}")
        return devices.pop()

    def stream(self, tensors) -> int:
        import torch
        return torch.cuda.current_stream(self._device(tensors)).cuda_stream

    def synchronize(self, tensors) -> None:
        import torch
        torch.cuda.current_stream(self._device(tensors)).synchronize()


class SimulatedMemory:
    """Memory of a ckptd._ckpt.SimulatedGpu, on its one stream."""

    def __init__(self, gpu):
        self.gpu = gpu

    def holds(self, tensor, address: int, length: int) -> bool:
        return length > 0 and self.gpu.holds(address, length)

    def stream(self, tensors) -> int:
        return self.gpu.stream

    def synchronize(self, tensors) -> None:
        self.gpu.synchronize()
