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
"""


class CudaMemory:
    """CUDA tensors of torch, on their device's current stream."""

    def holds(self, tensor, address: int, length: int) -> bool:
        return getattr(getattr(tensor, "device", None), "type", None) == "cuda"

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
