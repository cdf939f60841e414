"""Checkpointer: one rank's DCP-shaped saves and loads through ckptd.

Owns the connection to the node's daemon (a ckptd.Client), the buffers of
pickled values (values.ValueBuffers) and the replica exchange over the
process group. ckptd.torch's functions keep one per (job, socket, group).

A save, on the caller's thread:
  1. waits until the previous save of this checkpointer is STAGED (its
     value buffers are about to be rewritten; normally long done);
  2. flattens the state dict to DCP's fqns and sorts the leaves into
     tensors and values; finds tensors that share storage (saved once);
  3. exchanges descriptions of the plain leaves with the group (one small
     collective; replica_exchange.py), which gives every plain tensor and
     value its replica set, or fails every rank with the same error;
  4. builds the tensor items: each tensor's memory is its storage,
     registered once as a region, at the tensor's offset; a non-contiguous
     tensor is copied to a contiguous one first; an empty tensor (an FSDP
     rank's empty shard) has no item but the rank still saves;
  5. submits the save (a layout id once the items were seen before) and
     returns an AsyncSaveResponse that holds every tensor until STAGED.

Errors after step 3 (the daemon refusing the save, a failed commit) reach
the caller through the futures, as DCP's do.

Thread-safety: one thread at a time (the training loop's); the responses'
futures may be waited on from anywhere.
"""

import os
from typing import Any, Dict, List, Optional, Tuple

import torch

import ckptd
from ckptd import flatten as flatten_mod
from ckptd import values as values_mod
from ckptd.index import INDEX_FQN, Index
from ckptd.replica_exchange import ReplicaExchange, describe_tensor
from ckptd.save_response import AsyncSaveResponse
from ckptd.storage_sharing import find_aliases
from ckptd.tensor_entry import DTYPE_NAMES, TensorEntry, split_leaves

# Plain tensors up to this many bytes are hashed to check that replicas
# agree (replica_exchange.py); the AdamW step scalars, biases, norms.
DEFAULT_CHECK_BYTES = 1 << 20


def default_job() -> str:
    return os.environ.get("CKPTD_JOB", "default")


class Checkpointer:
    """This rank of `job`, saving and loading through the daemon at `socket`.

    Every rank of the job (torch.distributed's world) saves together, as
    with DCP; `process_group` is the group the replica exchange runs on
    (default: the world). local_world_size and node default to torchrun's
    LOCAL_WORLD_SIZE and GROUP_RANK (else: one node holding every rank).
    """

    def __init__(self, job: Optional[str] = None, *, socket: Optional[str] = None,
                 process_group=None, check_bytes: int = DEFAULT_CHECK_BYTES,
                 local_world_size: Optional[int] = None, node: Optional[int] = None):
        import torch.distributed as dist
        self._exchange = ReplicaExchange(process_group)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if local_world_size is None:
            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        if node is None:
            node = int(os.environ.get("GROUP_RANK", "0"))
        self.job = job or default_job()
        self.rank = self._exchange.rank
        self.client = ckptd.Client(self.job, self.rank, world,
                                   socket=socket or ckptd.DEFAULT_SOCKET, node=node,
                                   local_world_size=local_world_size)
        self._check_bytes = check_bytes
        self._buffers = values_mod.ValueBuffers()
        self._last: Optional[AsyncSaveResponse] = None

    # -- save ---------------------------------------------------------------

    def async_save(self, state_dict, *, checkpoint_id: str) -> AsyncSaveResponse:
        if self._last is not None:
            try:
                self._last.staging_completion.result()
            except Exception:  # noqa: BLE001 - that save's caller sees it
                pass
        try:
            tensors, values, aliases, error = self._prepare(state_dict)
            local = self._describe(tensors, values, aliases)
            holders, merged = self._exchange.exchange(local, error)
        except ValueError as e:
            # Bad input or replicas that disagree: every rank of the group
            # reaches this same verdict, and none submits.
            return AsyncSaveResponse.failed(checkpoint_id, e)
        keep: List[Any] = []
        items = [self._tensor_item(fqn, e, holders, keep)
                 for fqn, e in sorted(tensors.items()) if fqn not in aliases]
        index = Index()
        for fqn, (data, _) in sorted(values.items()):
            buf = self._buffers.fill(fqn, data)
            items.append(self._buffer_item(fqn, buf, holders[fqn]))
        self._buffers.forget_except(values)
        for fqn, d in merged.items():  # every rank's, for any loading rank
            if d[0] == "value":
                index.values[fqn] = (d[1], d[2])
            elif d[0] == "alias":
                index.aliases[fqn] = d[1]
        index.aliases.update(aliases)
        items = [i for i in items if i is not None]
        response = AsyncSaveResponse(checkpoint_id)
        try:
            handle = self.client._submit(checkpoint_id, items, {INDEX_FQN: index.encode()})
        except ckptd.Error as e:
            return AsyncSaveResponse.failed(checkpoint_id, e)
        response._watch(handle, keep)
        self._last = response
        return response

    def save(self, state_dict, *, checkpoint_id: str) -> None:
        """Saves and returns once the checkpoint is committed."""
        self.async_save(state_dict, checkpoint_id=checkpoint_id).upload_completion.result()

    def _prepare(self, state_dict):
        """(tensors, {fqn: (pickled, digest)}, aliases, error message)."""
        try:
            leaves, _ = flatten_mod.flatten(state_dict)
            tensors, raw_values = split_leaves(leaves)
            aliases = find_aliases(tensors, DTYPE_NAMES)
            values = {}
            for fqn, v in raw_values.items():
                try:
                    data = values_mod.encode(v)
                except Exception as e:  # noqa: BLE001 - pickling fails many ways
                    raise ValueError(f"{fqn}: cannot pickle {type(v).__name__}: {e}") from None
                values[fqn] = (data, values_mod.digest(data))
            return tensors, values, aliases, None
        except ValueError as e:
            return {}, {}, {}, str(e)

    def _describe(self, tensors, values, aliases) -> Dict[str, tuple]:
        local = {}
        for fqn, e in tensors.items():
            if fqn in aliases:
                local[fqn] = ("alias", aliases[fqn])
            elif e.replicas is None:  # plain: replicas found by the exchange
                local[fqn] = describe_tensor(e.local, DTYPE_NAMES[str(e.local.dtype)],
                                             self._check_bytes)
        for fqn, (data, digest) in values.items():
            local[fqn] = ("value", values_mod.capacity(len(data)), len(data), digest)
        return local

    def _tensor_item(self, fqn: str, e: TensorEntry, holders, keep) -> Optional[dict]:
        t = e.local
        if t.numel() == 0:
            return None  # nothing to write; an empty region cannot exist
        if not t.is_contiguous():
            t = t.contiguous()
        keep.append(e.local)
        keep.append(t)
        replicas = holders[fqn] if e.replicas is None else e.replicas
        item = self._memory_item(fqn, t)
        item.update(global_shape=list(e.global_shape), offsets=list(e.offsets),
                    replicas=sorted(set(replicas)))
        return item

    def _buffer_item(self, fqn: str, buf, replicas) -> dict:
        region = self.client._region(buf.ctypes.data, buf.nbytes)
        return {"fqn": fqn, "dtype": "U8", "global_shape": [buf.size], "offsets": [0],
                "local_shape": [buf.size], "region": region, "offset": 0,
                "length": buf.nbytes, "replicas": sorted(set(replicas))}

    def _memory_item(self, fqn: str, t: torch.Tensor) -> dict:
        """The item of contiguous `t`, its memory named by its storage."""
        storage = t.untyped_storage()
        base = storage.data_ptr()
        region = self.client._region(base, storage.nbytes())
        return {"fqn": fqn, "dtype": DTYPE_NAMES[str(t.dtype)],
                "local_shape": list(t.shape), "region": region,
                "offset": t.data_ptr() - base, "length": t.numel() * t.element_size()}

    # -- load ---------------------------------------------------------------

    def load(self, state_dict, *, checkpoint_id: str = "latest",
             allow_missing: bool = False) -> str:
        """Fills `state_dict` in place from `checkpoint_id` ("latest": the
        newest committed), whatever sharding saved it: tensors are written
        into, Python values are replaced by the saved ones. Returns the
        checkpoint's name."""
        first = self.client._client.load(checkpoint_id, [], [INDEX_FQN], True)
        name = first["checkpoint"]
        index = Index.decode(first["byte_items"].get(INDEX_FQN))
        leaves, paths = flatten_mod.flatten(state_dict)
        tensors, values = split_leaves(leaves)
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
            dest = target if target.is_contiguous() else torch.empty(
                target.shape, dtype=target.dtype)
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
                base = request(alias.base, torch.empty(alias.base_shape, dtype=e.local.dtype),
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
            raise ckptd.Error(f"NOT_FOUND: values {missing_values} are not in "
                              f"{self.job}/{name}")
        result = self.client._client.load(name, items, [], allow_missing)
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

    def _load_item(self, fqn, dest: torch.Tensor, global_shape, offsets) -> dict:
        item = self._memory_item(fqn, dest)
        item.update(global_shape=list(global_shape), offsets=list(offsets))
        return item
