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
   per fqn, its holders, and whether they disagree (the detailed path).

Ranks whose leaves differ by design (plain tensors under per-rank fqns, a
pipeline stage's own layers) would take the detailed path on every save:
gathering and merging every rank's descriptions, tens of milliseconds for
a thousand leaves a rank, before the save is submitted. So the verdict of
the last detailed exchange is kept, and the first collective also carries
each rank's structure digest (fqns, kinds, dtypes, shapes, the values'
pickled lengths: everything the holders and the index depend on) and,
where that structure is the one the kept verdict was reached on, one
digest per holder set of two or more ranks (the fqns those ranks share),
in at most `_GROUP_SLOTS` slots. If every rank kept the same verdict, no
structure changed and the members of each holder set agree on their
set's digest, the kept verdict is the answer (the verdict path): the
same holders, the bytes of shared leaves compared, no leaf of a rank's
own hashed at all. Anything else (a structure changed, a rank without
the verdict, a set that disagrees) takes the paths above, so an error
still names the fqn.

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
import collections
import dataclasses
import pickle
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ckptd import values as values_mod
from ckptd.errors import CkptdError


class ReplicaMismatchError(CkptdError, ValueError):
    """Ranks hold different state under the same fqn."""


class SaveInputError(CkptdError, ValueError):
    """A rank's state dict cannot be saved (the message names rank and fqn),
    or ranks named different checkpoints."""


Descriptions = Dict[str, tuple]

_DIGEST_BYTES = 16  # values_mod.digest's
_NONE = bytes(_DIGEST_BYTES)  # a digest slot left empty
# Holder sets the verdict path compares (the module comment): a kept
# verdict with more sets than this is not reused. Most states have one or
# two (values every rank holds; a data-parallel group's replicated leaves).
_GROUP_SLOTS = 16
# The first collective's record: key, names, structure, kept verdict, then
# one slot per holder set.
_RECORD_BYTES = _DIGEST_BYTES * (4 + _GROUP_SLOTS)


@dataclasses.dataclass
class _Verdict:
    """The outcome of the last detailed exchange, kept for the verdict path."""

    structures: Tuple[bytes, ...]  # every rank's structure digest then (self.ranks order)
    holders: Dict[str, List[int]]
    merged: Descriptions
    # Holder sets of two or more ranks in a fixed order: (ranks, fqns held
    # by exactly those ranks). Every rank computes the same list.
    groups: List[Tuple[Tuple[int, ...], List[str]]]
    id: bytes  # digest of structures and groups: equal ids, equal verdicts

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
        self._verdict: Optional[_Verdict] = None
        # How each exchange was answered: "alone", "replicated", "verdict",
        # "detailed" (tests and diagnostics).
        self.paths: "collections.Counter[str]" = collections.Counter()
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
                 decision: int = 0, structure: Optional[Callable[[], bytes]] = None,
                 digest_group: Optional[Callable[[Sequence[str]], bytes]] = None
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

        `structure()` digests what the holders and the index depend on
        (not the bytes), and `digest_group(fqns)` the given leaves' bytes
        and values in that order: with both, a kept verdict can answer
        (the module comment). The merged descriptions it returns are those
        of the detailed exchange that reached it: structure as now, digests
        as then.

        `decision` is a number the group's first rank decides for the save
        (its generation, generations.py); the third value returned is that
        rank's, the same on every rank. It rides in the first collective,
        outside the digest compared."""
        if not self.compares:
            self.paths["alone"] += 1
            if error is not None:
                raise SaveInputError(error)
            return tuple(self.ranks), None, decision
        if self._closed:
            raise CkptdError("the replica exchange's group was released: the "
                             "interpreter is exiting; this save is not made")
        try:
            return self._exchange(error, key, detailed, names, decision, structure,
                                  digest_group)
        except BaseException:
            self._verdict = None  # the next exchange starts afresh
            raise

    def _exchange(self, error, key, detailed, names, decision, structure, digest_group):
        shape = _NONE if error is not None or structure is None else structure()
        kept = self._verdict if shape != _NONE and digest_group is not None else None
        if kept is not None and kept.structures[self.ranks.index(self.rank)] == shape:
            # The verdict path needs no key: each set's digest stands for it.
            mine = _NONE
            slots = [digest_group(fqns) if self.rank in members else _NONE
                     for members, fqns in kept.groups]
            offered = kept.id
        else:
            kept, slots, offered = None, [], _NONE
            mine = values_mod.digest(
                pickle.dumps((names, error, None if error else key()), protocol=4))
        named = values_mod.digest(pickle.dumps(names, protocol=4))
        record = b"".join([mine, named, shape, offered] + slots).ljust(_RECORD_BYTES, b"\0")
        records, failed, decisions = self._all_gather_first(record, error is not None,
                                                            decision)
        decided = decisions[0]  # self.ranks is sorted: the first rank's
        if kept is not None and not failed and self._verdict_holds(kept, records):
            self.paths["verdict"] += 1
            return kept.holders, kept.merged, decided
        if not failed and mine != _NONE and all(r[:_DIGEST_BYTES] == mine for r in records):
            self.paths["replicated"] += 1
            return tuple(self.ranks), None, decided
        self.paths["detailed"] += 1
        gathered = [None] * len(self.ranks)
        local = (error, [] if error else sorted(detailed().items()), names)
        self._dist.all_gather_object(gathered, local, group=self._group)
        holders, merged = _merge(dict(zip(self.ranks, gathered)))
        self._verdict = _keep(holders, merged, [r[2 * _DIGEST_BYTES:3 * _DIGEST_BYTES]
                                                for r in records])
        return holders, merged, decided

    def _verdict_holds(self, kept: _Verdict, records: List[bytes]) -> bool:
        """Whether every rank offered `kept` for an unchanged structure and
        the members of each holder set agree. Depends only on the gathered
        records and the verdict, which equal ids make the same on every
        rank: every rank reaches the same answer."""
        def field(record: bytes, i: int) -> bytes:
            return record[i * _DIGEST_BYTES:(i + 1) * _DIGEST_BYTES]
        if any(field(r, 3) != kept.id for r in records):
            return False
        if tuple(field(r, 2) for r in records) != kept.structures:
            return False
        if len(set(field(r, 1) for r in records)) != 1:
            return False  # different names: the detailed path says which
        at = {rank: i for i, rank in enumerate(self.ranks)}
        for slot, (members, _) in enumerate(kept.groups):
            if len({field(records[at[m]], 4 + slot) for m in members}) != 1:
                return False
        return True

    def _all_gather_first(self, record: bytes, failed: bool, decision: int
                          ) -> Tuple[List[bytes], bool, List[int]]:
        """Every rank's record and decision, in self.ranks' order, and
        whether any rank's input failed."""
        words = len(record) // 8
        mine = torch.empty(words + 2, dtype=torch.int64)
        mine[:words] = torch.frombuffer(bytearray(record), dtype=torch.int64)
        mine[words] = int(failed)
        mine[words + 1] = decision
        out = [torch.empty_like(mine) for _ in self.ranks]
        self._dist.all_gather(out, mine, group=self._group)
        return ([t[:words].numpy().tobytes() for t in out],
                any(int(t[words]) for t in out), [int(t[words + 1]) for t in out])


def _keep(holders: Dict[str, List[int]], merged: Descriptions,
          structures: List[bytes]) -> Optional[_Verdict]:
    """The verdict to keep from a detailed exchange that succeeded, or None
    where the verdict path could not use it (a rank gave no structure, or
    too many holder sets)."""
    if any(s == _NONE for s in structures):
        return None
    by_members: Dict[Tuple[int, ...], List[str]] = {}
    for fqn, members in holders.items():
        ranks = tuple(sorted(set(members)))
        if len(ranks) > 1:
            by_members.setdefault(ranks, []).append(fqn)
    if len(by_members) > _GROUP_SLOTS:
        return None
    groups = [(members, sorted(fqns)) for members, fqns in sorted(by_members.items())]
    structures = tuple(structures)
    return _Verdict(structures=structures, holders=holders, merged=merged, groups=groups,
                    id=values_mod.digest(pickle.dumps((structures, groups), protocol=4)))


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
