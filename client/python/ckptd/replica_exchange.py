"""Which ranks hold each plain tensor and value, and whether they agree.

DCP's rule, which users rely on: a plain tensor or a Python value saved
under the same fqn on several ranks is replicated state, written once (the
optimizer's per-parameter `step`, learning rates, a DDP model). The daemon
writes a chunk once if every holder declares the same replica set, so each
rank must learn which ranks hold each of its fqns. A DTensor's replicas come
from its mesh; plain leaves are the ones exchanged here.

Each rank describes every plain leaf by a small tuple: its kind, dtype and
shape (or pickled length), and a digest of its bytes (values always; plain
tensors up to `check_bytes`, since hashing a large replicated tensor on
every save would cost the trainer what ckptd saves it). Ranks then:

1. all-gather one 16-byte digest of their whole description (one small
   collective, the common case: every rank holds the same leaves with the
   same bytes, so every leaf is held by the whole group). The digest covers
   the structure (a digest kept with the save plan), the values' digests,
   and one XXH3 of every checked tensor's bytes in fqn order, computed in
   C++ (`_state_cache`), so it costs no Python work per tensor;
2. only if those differ, all-gather the descriptions themselves and find,
   per fqn, its holders, and whether they disagree.

Every rank sees the same gathered data and so reaches the same verdict:
either all ranks submit the save, or none does, each raising the same
error, which names the fqn. A rank whose own input is bad (a tensor on a
device other than the CPU or a GPU, an unsupported dtype) takes part with
its error instead of a description, so that its peers fail too rather than
wait for it. Replicas that disagree are
caught before any byte is written, so the previous checkpoint stays LATEST.

The bytes of replicated tensors above `check_bytes` and of HSDP-replicated
DTensor shards are not compared: the daemon reads one replica only.

The exchange runs on a gloo group of its own over the given group's ranks,
created by open() on the first save's call, which every rank makes (not
when the checkpointer is made: a load, which may run on some ranks alone,
makes one too). The checkpointer runs the exchange on its submit thread,
after the save call has returned, while the training loop issues its own
collectives on its own groups; two threads issuing collectives on one
group could interleave them differently on different ranks. Gloo on CPU
whatever the training's backend: the exchange moves a few bytes and needs
no device.

The group is released when the interpreter starts to exit (atexit), not
left to the interpreter's final garbage collection: a gloo worker thread
that drops the tensors of a finished collective takes the GIL to do it, and
in an interpreter that is finalizing, taking the GIL ends the thread
(pthread_exit), whose unwind through torch's noexcept work destructor
aborts the process ("terminate called without an active exception", exit
status -6, after a run that did everything right). Released at atexit, the
group is destroyed while threads may still take the GIL (torch destroys a
process group without holding it) and its worker threads are joined.

Thread-safety: open() on the thread that makes the group's other
collectives (group creation is one); exchange() one call at a time (the
checkpointer's submit thread).
"""

import atexit
import pickle
import weakref
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch

from ckptd import values as values_mod
from ckptd.errors import CkptdError


class ReplicaMismatchError(CkptdError, ValueError):
    """Ranks hold different state under the same fqn."""


class SaveInputError(CkptdError, ValueError):
    """A rank's state dict cannot be saved (the message names rank and fqn),
    or ranks named different checkpoints."""


Descriptions = Dict[str, tuple]

# Exchanges that made a group, released at exit (the module comment).
_WITH_GROUPS: "weakref.WeakSet[ReplicaExchange]" = weakref.WeakSet()


@atexit.register
def _release_groups() -> None:
    for exchange in list(_WITH_GROUPS):
        exchange.close()


def describe_tensor(t: torch.Tensor, dtype_name: str, check_bytes: int) -> tuple:
    nbytes = t.numel() * t.element_size()
    digest = None
    if nbytes <= check_bytes:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        digest = values_mod.digest(raw)
    return ("tensor", dtype_name, tuple(t.shape), digest)


class ReplicaExchange:
    """The exchange over one process group (None: the default group; no
    torch.distributed: this process alone)."""

    def __init__(self, group=None):
        import torch.distributed as dist
        self._dist = dist if dist.is_available() and dist.is_initialized() else None
        self._group = None
        self._closed = False
        if self._dist is None:
            self.ranks, self.rank = [0], 0
            return
        self.rank = dist.get_rank()
        self.ranks = sorted(dist.get_process_group_ranks(group or dist.group.WORLD))

    def open(self) -> None:
        """Creates the exchange's own group, once; every rank of the group
        calls it (ranks outside it need not)."""
        if self.compares and self._group is None and not self._closed:
            self._group = self._dist.new_group(
                self.ranks, backend="gloo", use_local_synchronization=True,
                group_desc="ckptd_replica_exchange")
            _WITH_GROUPS.add(self)

    def close(self) -> None:
        """Destroys the exchange's group (still registered with
        torch.distributed unless the caller destroyed every group); a later
        save's exchange raises."""
        group, self._group = self._group, None
        self._closed = True
        if group is not None and self._dist.is_initialized():
            try:
                self._dist.destroy_process_group(group)
            except (ValueError, RuntimeError):
                pass  # already destroyed with the default group: dropping it is enough

    @property
    def compares(self) -> bool:
        """Whether other ranks take part (else nothing is compared)."""
        return self._dist is not None and len(self.ranks) > 1

    def exchange(self, error: Optional[str], key: Callable[[], bytes],
                 detailed: Callable[[], Descriptions], names: Tuple[str, str] = ("", ""),
                 decision: int = 0
                 ) -> Tuple[Union[Tuple[int, ...], Dict[str, List[int]]], Optional[Descriptions],
                            int]:
        """Who holds each of this rank's plain leaves, over every rank's.

        `key()` digests this rank's leaves (structure, values, checked
        bytes); `detailed()` describes each leaf (tensors with their own
        digest). Returns (holders, merged): holders is a tuple of ranks when
        every rank holds exactly the same leaves with the same bytes (each
        leaf is then held by all of them; merged is None: the local
        descriptions are everyone's), else {fqn: holders (global ranks)}
        with merged = {fqn: the holders' description} over every rank's
        leaves. Raises SaveInputError if any rank's input is bad,
        ReplicaMismatchError if holders of an fqn disagree, SaveInputError
        if ranks name different (job, checkpoint)s in `names` (a typo, or a
        timestamp in the name: the daemon would wait for ranks that never
        come to either checkpoint).

        `decision` is a number the group's first rank decides for the save
        (its generation, generations.py); the third value returned is that
        rank's, the same on every rank. It rides in the first collective,
        outside the digest compared."""
        if not self.compares:
            if error is not None:
                raise SaveInputError(error)
            return tuple(self.ranks), None, decision
        if self._closed:
            raise CkptdError("the replica exchange's group was released: the "
                             "interpreter is exiting; this save is not made")
        mine = values_mod.digest(
            pickle.dumps((names, error, None if error else key()), protocol=4))
        keys, decisions = self._all_gather_key(mine, decision)
        decided = decisions[0]  # self.ranks is sorted: the first rank's
        if error is None and all(k == mine for k in keys):
            return tuple(self.ranks), None, decided
        gathered = [None] * len(self.ranks)
        local = (error, [] if error else sorted(detailed().items()), names)
        self._dist.all_gather_object(gathered, local, group=self._group)
        return (*_merge(dict(zip(self.ranks, gathered))), decided)

    def _all_gather_key(self, key: bytes, decision: int) -> Tuple[List[bytes], List[int]]:
        """Every rank's key and decision, in self.ranks' order."""
        mine = torch.empty(len(key) // 8 + 1, dtype=torch.int64)
        mine[:-1] = torch.frombuffer(bytearray(key), dtype=torch.int64)
        mine[-1] = decision
        out = [torch.empty_like(mine) for _ in self.ranks]
        self._dist.all_gather(out, mine, group=self._group)
        return ([t[:-1].numpy().tobytes() for t in out], [int(t[-1]) for t in out])


def _merge(by_rank: Dict[int, tuple]) -> Tuple[Dict[str, List[int]], Descriptions]:
    by_names: Dict[Tuple[str, str], List[int]] = {}
    for rank, (_, _, names) in sorted(by_rank.items()):
        by_names.setdefault(names, []).append(rank)
    if len(by_names) > 1:
        raise SaveInputError(
            "ranks save under different names: " + "; ".join(
                f"ranks {ranks} job {job!r} checkpoint {checkpoint!r}"
                for (job, checkpoint), ranks in by_names.items()) +
            ". Every rank of a save passes the same job and checkpoint_id; "
            "nothing was saved.")
    errors = [f"rank {r}: {e}" for r, (e, _, _) in sorted(by_rank.items()) if e is not None]
    if errors:
        raise SaveInputError("; ".join(errors))
    holders: Dict[str, Dict[tuple, List[int]]] = {}
    for rank, (_, items, _) in sorted(by_rank.items()):
        for fqn, description in items:
            holders.setdefault(fqn, {}).setdefault(description, []).append(rank)
    merged: Descriptions = {}
    ranks: Dict[str, List[int]] = {}
    for fqn in sorted(holders):
        variants = holders[fqn]
        if len(variants) > 1:
            raise ReplicaMismatchError(_disagreement(fqn, variants))
        (description, members), = variants.items()
        merged[fqn] = description
        ranks[fqn] = members
    return ranks, merged


def _show(d: tuple) -> str:
    if d[0] == "tensor":
        return f"a {d[1]} tensor of shape {list(d[2])}"
    if d[0] == "value":
        return f"a Python value of {d[2]} pickled bytes"
    return f"an alias of {d[1].base}"


def _disagreement(fqn: str, variants: Dict[tuple, List[int]]) -> str:
    shown = {_show(d) for d in variants}
    if len(shown) == 1:
        what = "different bytes" if next(iter(variants))[0] == "tensor" else "different values"
        parts = "; ".join(f"ranks {r}" for r in variants.values())
        detail = f"{parts} hold {what}"
    else:
        detail = "; ".join(f"ranks {r} hold {_show(d)}" for d, r in variants.items())
    return (f"replicas disagree on {fqn!r}: {detail}. A plain tensor or value "
            f"under one fqn on several ranks is replicated state, saved once, "
            f"so it must be equal on every rank; give per-rank state per-rank "
            f"fqns. Nothing was saved; the previous checkpoint is unchanged.")
