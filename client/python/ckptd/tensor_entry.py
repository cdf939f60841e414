"""The leaves of a flattened state dict, sorted into tensors and values.

A TensorEntry is what this rank holds of one tensor fqn: its local tensor
(any strides), the box of the global tensor it fills, and the ranks known
to hold the same box (from the device mesh for a DTensor, from
`ckptd.Shard`; None for a plain tensor, whose replicas the save finds by
exchanging fqns, `replica_exchange.py`). Everything else is a value, saved
pickled (`values.py`).

Thread-safety: pure functions.
"""

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

import ckptd
from ckptd.dtypes import SAFETENSORS_BY_TORCH

# The element types torch and safetensors share, and the daemon stores.
DTYPE_NAMES = SAFETENSORS_BY_TORCH


@dataclasses.dataclass
class TensorEntry:
    local: torch.Tensor
    global_shape: Tuple[int, ...]
    offsets: Tuple[int, ...]
    replicas: Optional[Sequence[int]]  # None: plain tensor, found at save
    is_dtensor: bool


def _is_dtensor(value) -> bool:
    return type(value).__name__ == "DTensor" and hasattr(value, "device_mesh")


def tensor_entry(fqn: str, value) -> Optional[TensorEntry]:
    """The entry of a tensor leaf, or None if the leaf is a Python value.
    Raises ValueError naming the fqn for tensors the daemon cannot hold."""
    if isinstance(value, ckptd.Shard):
        local = value.tensor
        if isinstance(local, np.ndarray):
            local = torch.from_numpy(local)
        entry = TensorEntry(local, tuple(value.global_shape), tuple(value.offsets),
                            value.replicas, False)
    elif _is_dtensor(value):
        try:
            shard = ckptd._dtensor_shard(value)
        except ValueError as e:
            raise ValueError(f"{fqn}: {e}") from None
        entry = TensorEntry(shard.tensor, tuple(shard.global_shape),
                            tuple(shard.offsets), shard.replicas, True)
    elif isinstance(value, torch.Tensor):
        entry = TensorEntry(value, tuple(value.shape), (0,) * value.dim(), None, False)
    else:
        return None
    t = entry.local
    if t.device.type == "meta":
        # As in DCP: a load fills tensors in place, so they must have memory.
        raise ValueError(f"{fqn}: a tensor on the meta device has no memory to save from "
                         f"or load into; materialize the state first (for a model "
                         f"built on the meta device: model.to_empty(device=...))")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{fqn}: only CPU and CUDA tensors are supported, got {t.device}")
    if t.layout != torch.strided or getattr(t, "is_nested", False):
        raise ValueError(f"{fqn}: only dense (strided) tensors are supported")
    if str(t.dtype) not in DTYPE_NAMES:
        raise ValueError(f"{fqn}: unsupported dtype {t.dtype} (supported: "
                         f"{', '.join(k[6:] for k in DTYPE_NAMES)})")
    return entry


def split_leaves(leaves: Dict[str, Any]) -> Tuple[Dict[str, TensorEntry], Dict[str, Any]]:
    """({fqn: TensorEntry}, {fqn: Python value}) of a flattened state dict."""
    tensors, values = {}, {}
    for fqn, value in leaves.items():
        entry = tensor_entry(fqn, value)
        if entry is None:
            values[fqn] = value
        else:
            tensors[fqn] = entry
    return tensors, values
