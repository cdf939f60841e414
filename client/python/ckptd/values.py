"""Python values of a state dict as byte buffers the daemon saves as tensors.

A state dict holds more than tensors: step counters, learning rates, RNG
states, a dataloader's state dict. Each such value is pickled and saved as a
1-D U8 tensor item under its own fqn, not as a byte item of the save
request, because:

- a tensor item has a replica set, so a value every rank holds is written
  once for the whole job (byte items are stored once per rank, in the
  manifests every load reads);
- the daemon streams tensor bytes from the trainer's memory, so a value of
  any size saves (a byte item travels inside the 64 MiB control message).

Buffers are reused from save to save: a value's buffer has a capacity that
is a pure function of its pickled length (the next power of two, at least
64 bytes), so replicas declare the same shape, and a value whose length
stays within its capacity keeps the same memory and the same layout (no new
region, no new layout). The true length goes into the save's index
(`index.py`). A buffer is rewritten only once the previous save is STAGED
(the caller, `checkpointer.py`, waits for that).

Pickling is deterministic for equal values, so the digest of the bytes
tells replicas apart: torch tensors inside a value are pickled by their
dtype, shape and raw bytes (a persistent id), not by torch's own reducer,
whose output differs between two pickles of the same tensor.

Thread-safety: ValueBuffers is used by one thread at a time.
"""

import hashlib
import io
import pickle
from typing import Any, Dict

import numpy as np


def _tensor_id(obj):
    import torch
    if not isinstance(obj, torch.Tensor):
        return None
    if getattr(obj, "is_nested", False) or obj.layout != torch.strided:
        return None  # let pickle do it (or fail naming the type)
    t = obj.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return ("ckptd.tensor", str(t.dtype)[len("torch."):], tuple(t.shape),
            obj.requires_grad, raw)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return _tensor_id(obj)


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        import torch
        tag, dtype, shape, requires_grad, raw = pid
        if tag != "ckptd.tensor":
            raise pickle.UnpicklingError(f"unknown persistent id {tag!r}")
        dtype = getattr(torch, dtype)
        if raw:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        return t.reshape(shape).requires_grad_(requires_grad)


def encode(value: Any) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


def decode(data) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def digest(data) -> bytes:
    """16 bytes identifying `data` among replicas (not a security hash)."""
    return hashlib.blake2b(data, digest_size=16).digest()


def capacity(length: int) -> int:
    return max(64, 1 << (max(length, 1) - 1).bit_length())


class ValueBuffers:
    """This rank's buffers of pickled values, one per fqn, reused across
    saves; owns them for the life of the checkpointer."""

    def __init__(self):
        self._buffers: Dict[str, np.ndarray] = {}

    def fill(self, fqn: str, data: bytes) -> np.ndarray:
        """The buffer of `fqn` holding `data` (then padding with zeros)."""
        size = capacity(len(data))
        buf = self._buffers.get(fqn)
        if buf is None or buf.size != size:
            buf = np.zeros(size, dtype=np.uint8)
            self._buffers[fqn] = buf
        buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        buf[len(data):] = 0
        return buf

    def forget_except(self, fqns) -> None:
        """Drops the buffers of values no longer saved."""
        for fqn in set(self._buffers) - set(fqns):
            del self._buffers[fqn]
