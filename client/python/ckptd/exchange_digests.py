"""What a save gives the replica exchange to compare: digests and
descriptions of one rank's plain leaves, from the checkpointer's save plan
(checkpointer._Plan) and the save's pickled values.

ReplicaExchange.exchange (replica_exchange.py) learns which ranks hold each
plain tensor and value, and whether they agree, without knowing what a
save plan is: it takes callables and calls only those its path needs, on
the checkpointer's submit thread (checkpointer.py, step 6):

- key(): the whole description in a few bytes, which the exchange
  digests into the record that ranks compare first (the replicated path:
  every rank holds the same leaves with the same bytes);
- structure(): what the holders and the index depend on, not the bytes,
  and digest_group(fqns): the bytes of the leaves one holder set shares,
  with which a kept verdict answers (the verdict path);
- detailed(): every leaf's description with its own digest, gathered only
  when the digests differ, to find the holders and name the fqn whose
  replicas disagree (the detailed path).

Each takes the plan, the values ({fqn: (pickled, digest)}, as
Checkpointer._encode gives them) and, where bytes are compared, the host
copies of the plan's checked GPU tensors (`gpu_hosts`, in
plan.gpu_checked's order). Tensor digests are XXH3 in C++ (_state_cache).
"""

import pickle
from typing import TYPE_CHECKING, Dict, List, Sequence

import torch

from ckptd import _state_cache
from ckptd import values as values_mod

if TYPE_CHECKING:
    from ckptd.checkpointer import _Plan


def _describe_checked(t: torch.Tensor, dtype_name: str) -> tuple:
    """replica_exchange.describe_tensor of a checked tensor (contiguous, on
    the CPU, at most check_bytes: the plan's checked tensors and the GPU
    ones' host copies), its digest XXH3 in C++ (_state_cache) instead of
    blake2b in Python. Every save of ranks that hold plain tensors under
    fqns of their own describes each of them (their keys always differ):
    with 1,000 tensors of 64 KiB a rank, blake2b took ~80 ms of each rank's
    CPU per save, XXH3 ~4 ms (bench/peers, "many small" with plain tensors)."""
    return ("tensor", dtype_name, tuple(t.shape), _state_cache.digest_tensors([t]))


def _local(plan: "_Plan", values) -> Dict[str, tuple]:
    local = dict(plan.structure)
    for fqn, (data, digest) in values.items():
        local[fqn] = ("value", values_mod.capacity(len(data)), len(data), digest)
    return local


def _structure_key(plan: "_Plan") -> bytes:
    if plan.structure_key is None:
        plan.structure_key = values_mod.digest(
            pickle.dumps(sorted(plan.structure.items()), protocol=4))
    return plan.structure_key


def structure(plan: "_Plan", values) -> bytes:
    """What the exchange's holders and the index depend on
    (replica_exchange.py, the verdict path): the plan's structure and
    each value's pickled length, not their bytes."""
    lengths = sorted((fqn, len(data)) for fqn, (data, _) in values.items())
    return values_mod.digest(pickle.dumps((_structure_key(plan), lengths), protocol=4))


def digest_group(plan: "_Plan", values, gpu_hosts: List[torch.Tensor],
                 fqns: Sequence[str]) -> bytes:
    """The bytes of the given leaves, in that order, as replicas
    compare them: values' digests and checked tensors' bytes (tensors
    above check_bytes and aliases are compared by structure alone)."""
    tensors = dict(zip(plan.checked_fqns, plan.checked))
    tensors.update(zip(plan.gpu_checked_fqns, gpu_hosts))
    checked = [tensors[f] for f in fqns if f in tensors]
    described = [(f, values[f][1]) for f in fqns if f in values]
    return values_mod.digest(pickle.dumps(
        (described, _state_cache.digest_tensors(checked) if checked else b""),
        protocol=4))


def key(plan: "_Plan", values, gpu_hosts: List[torch.Tensor]) -> bytes:
    """What ranks compare first (replica_exchange.py): the structure, the
    values, the checked tensors' bytes as this save holds them (the GPU
    ones' in `gpu_hosts`)."""
    _structure_key(plan)
    checked = (plan.cache.digest() if plan.cache is not None
               else _state_cache.digest_tensors(plan.checked))
    gpu_checked = _state_cache.digest_tensors(gpu_hosts) if gpu_hosts else b""
    described = sorted((fqn, values_mod.capacity(len(data)), len(data), digest)
                       for fqn, (data, digest) in values.items())
    return pickle.dumps((plan.structure_key, described, checked, gpu_checked), protocol=4)


def detailed(plan: "_Plan", values, gpu_hosts: List[torch.Tensor]) -> Dict[str, tuple]:
    """Descriptions with each checked tensor's own digest: what ranks
    exchange when their digests differ, to name the fqn. The checked
    tensors are the plan's: the copies this save took, or (a matched
    plan) tensors over the very memory this save's hold."""
    local = _local(plan, values)
    for fqn, d in plan.structure.items():
        if d[0] == "tensor":
            local[fqn] = d + (None,)  # above check_bytes: not compared
    for fqn, t in zip(plan.checked_fqns + plan.gpu_checked_fqns,
                      plan.checked + gpu_hosts):
        local[fqn] = _describe_checked(t, plan.structure[fqn][1])
    return local
