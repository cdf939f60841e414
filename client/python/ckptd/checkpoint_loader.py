"""CheckpointLoader: the load half of a Checkpointer (checkpointer.py, which
holds the save half and mixes this in): which checkpoints the job has, and
load(), which resolves a checkpoint name to the generation it loads
(generations.py) and fills a state dict from it.

A load is two requests to the daemon: the checkpoint's index (its values
and aliases, index.py), then the tensors and values the state dict asks
for, each written straight into its destination where that is contiguous
(else into a scratch buffer, copied out once loaded).

The class holds no state of its own: it reads the Checkpointer's `job`,
`client`, `_memory` (gpu_memory.py), `_submitter` (save_submitter.py; a load
waits for it to be idle: the client is not shared with the submit thread),
and uses its `_on_gpu` and `_memory_item`, which the save names memory with
too.
"""

import re
from collections.abc import MutableMapping
from typing import Dict, List, Optional, Tuple

import torch

import ckptd
from ckptd import errors as errors_mod
from ckptd import flatten as flatten_mod
from ckptd import generations as generations_mod
from ckptd import stateful as stateful_mod
from ckptd import values as values_mod
from ckptd.index import INDEX_FQN, Index
from ckptd.tensor_entry import split_leaves

# The daemon's refusal of a load asking for a tensor it does not store
# (restore/load_plan.cc).
_NOT_STORED = re.compile(r"NOT_FOUND: (?:\w+: )?item (?P<fqn>\S+): not stored in ")


class _Replaced(Exception):
    """The checkpoint a load's index came from was deleted before its
    tensors were read (CheckpointLoader._load_resolved tries again)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class CheckpointLoader:
    """The load half of Checkpointer (see the module comment)."""

    # -- which checkpoints ----------------------------------------------------

    def list_checkpoints(self) -> List[str]:
        """The job's committed checkpoints, oldest commit first (a name
        saved again: once, as of its newest generation's commit)."""
        self._submitter.wait_idle()  # the client is not shared with the submit thread
        return [generations_mod.split(c["checkpoint"])[0]
                for c in generations_mod.visible(self.client.list())]

    def latest_checkpoint(self) -> Optional[str]:
        """The checkpoint "latest" loads (the newest committed), or None."""
        self._submitter.wait_idle()
        for c in self.client.list():
            if c["latest"]:
                return generations_mod.split(c["checkpoint"])[0]
        return None

    # -- load ---------------------------------------------------------------

    def load(self, state_dict, *, checkpoint_id: str = "latest",
             allow_missing: bool = False) -> str:
        """Fills `state_dict` in place from `checkpoint_id` ("latest": the
        newest committed), whatever sharding saved it: tensors are written
        into, Python values are replaced by the saved ones, and Stateful
        objects are given their state back (stateful.py). Returns the
        checkpoint's name."""
        resolved = stateful_mod.ResolvedState(state_dict)
        name = self._load_resolved(resolved.state_dict, checkpoint_id, allow_missing)
        name = generations_mod.split(name)[0]
        resolved.finish_load()
        # As DCP's load does: each top-level entry that is not a Stateful is
        # set again, to its loaded value (a dict subclass sees the
        # replacement; PyTorch's test_stateful_and_non_stateful_loads).
        if isinstance(state_dict, MutableMapping):
            for k in list(state_dict.keys()):
                v = state_dict[k]
                if not stateful_mod.is_stateful(v):
                    state_dict[k] = v
        return name

    def _open(self, checkpoint_id: str) -> dict:
        """The first load of a checkpoint (its index alone), of the newest
        committed generation of `checkpoint_id` (generations.py). Looked up
        again if retention took that generation between the list and the
        load (a newer one committed meanwhile)."""
        for attempt in range(3):
            name = checkpoint_id
            if checkpoint_id != "latest":
                newest = generations_mod.newest_committed(self.client.list(checkpoint_id),
                                                          checkpoint_id)
                if newest is not None:
                    name = newest["checkpoint"]
            try:
                return self.client._load(name, [], [INDEX_FQN], True)
            except errors_mod.CheckpointNotFound:
                if name == checkpoint_id or attempt == 2:
                    raise

    def _load_resolved(self, state_dict, checkpoint_id: str, allow_missing: bool) -> str:
        """load() into a state dict without Stateful objects; returns the
        name of the generation loaded. A load is two requests (the index,
        then the tensors): a checkpoint that a newer generation replaced,
        or that stopped being LATEST's, may be deleted between them; the
        daemon then refuses the second before it writes any byte, and the
        load starts again from the name's newest generation."""
        self._submitter.wait_idle()  # the client is not shared with the submit thread
        for attempt in range(3):
            try:
                return self._load_once(state_dict, checkpoint_id, allow_missing)
            except _Replaced as replaced:
                if attempt == 2:
                    raise replaced.error from None

    def _load_once(self, state_dict, checkpoint_id: str, allow_missing: bool) -> str:
        """_load_resolved's one try; raises _Replaced if the checkpoint the
        index came from is gone at the second request."""
        first = self._open(checkpoint_id)
        name = first["checkpoint"]
        index = Index.decode(first["byte_items"].get(INDEX_FQN))
        leaves, paths = flatten_mod.flatten(state_dict)
        try:
            tensors, values = split_leaves(leaves)
        except ValueError as e:
            raise errors_mod.InvalidStateDict(str(e)) from None
        gpu_targets = [e.local for e in tensors.values() if self._on_gpu(e.local)]
        if gpu_targets:
            # The daemon's copies are not ordered after work the trainer
            # queued on the GPU: let that finish before they overwrite.
            self._memory.synchronize(self._memory.device(gpu_targets))
        items: List[dict] = []
        after: List[Tuple] = []  # (kind, stored fqn, ...) to finish once loaded
        # The daemon takes each stored box once per request: a box asked for
        # again (a tied weight, a view's base) is copied from the first
        # destination once loaded.
        requested: Dict[Tuple, torch.Tensor] = {}

        def request(source, target, global_shape, offsets) -> torch.Tensor:
            """Loads stored box (source, offsets) into `target`; returns the
            contiguous tensor the daemon fills."""
            key = (source, tuple(offsets), tuple(target.shape))
            first = requested.get(key)
            if first is not None:
                after.append(("copy", source, target, first))
                return first
            dest = target if target.is_contiguous() else self._scratch(target, target.shape)
            requested[key] = dest
            items.append(self._load_item(source, dest, global_shape, offsets))
            if dest is not target:
                after.append(("copy", source, target, dest))
            return dest

        for fqn, e in sorted(tensors.items()):
            alias = index.aliases.get(fqn)
            if e.local.numel() == 0:
                continue
            if alias is not None and not alias.whole:
                # A view of its base: load the base, copy the view out.
                base = request(alias.base, self._scratch(e.local, alias.base_shape),
                               alias.base_shape, (0,) * len(alias.base_shape))
                after.append(("view", alias.base, e.local, base, alias))
                continue
            source = alias.base if alias is not None else fqn
            request(source, e.local, e.global_shape, e.offsets)
        missing_values = []
        for fqn in sorted(values):
            if fqn not in index.values:
                missing_values.append(fqn)
                continue
            cap, length = index.values[fqn]
            buf = torch.empty(cap, dtype=torch.uint8)
            items.append(self._load_item(fqn, buf, (cap,), (0,)))
            after.append(("value", fqn, buf, length))
        if missing_values and not allow_missing:
            raise errors_mod.missing_keys(missing_values, self.job, name)
        try:
            result = self.client._load(name, items, [], allow_missing)
        except errors_mod.CheckpointNotFound as e:
            raise _Replaced(e) from None
        except ckptd.Error as e:
            # The daemon refuses a load naming the first tensor it lacks,
            # before it writes any byte; DCP's planner words it so.
            m = _NOT_STORED.search(str(e))
            if m is None:
                raise
            raise errors_mod.missing_keys([m["fqn"]], self.job, name) from e
        skipped = set(result["missing"])
        for kind, fqn, *rest in after:  # fqn: the stored item it needs
            if fqn in skipped:
                continue
            if kind == "copy":
                rest[0].copy_(rest[1])
            elif kind == "view":
                target, base, alias = rest
                target.copy_(base.reshape(-1).as_strided(alias.shape, alias.stride,
                                                         alias.offset))
            else:
                buf, length = rest
                flatten_mod.set_leaf(state_dict, paths[fqn],
                                     values_mod.decode(buf.numpy()[:length].tobytes()))
        return name

    def _scratch(self, like: torch.Tensor, shape) -> torch.Tensor:
        """A buffer of `shape` and `like`'s dtype that a load fills for
        `like`: on its GPU if it is GPU memory (gpu_memory.buffer_like)."""
        if self._on_gpu(like):
            return self._memory.buffer_like(like, shape)
        return torch.empty(shape, dtype=like.dtype)

    def _load_item(self, fqn, dest: torch.Tensor, global_shape, offsets) -> dict:
        item = self._memory_item(fqn, dest)
        item.update(global_shape=list(global_shape), offsets=list(offsets))
        return item
