"""Checkpointer: one rank's DCP-shaped saves and loads through ckptd; this
file holds the saves, checkpoint_loader.py (CheckpointLoader, mixed in) the
loads.

Owns the connection to the node's daemon (a ckptd.Client), the buffers of
pickled values (values.ValueBuffers), the copy buffers of small and
non-contiguous tensors, and the replica exchange over the process group.
ckptd.torch's functions keep one per (job, socket, group).

A save, on the caller's thread (the save call):
  1. waits until the previous save of this checkpointer is STAGED (its
     value and copy buffers are about to be rewritten; normally long done);
  2. checks the state dict against the plan of the previous save in one C++
     call (_state_cache.StateCache, state_cache_module.cc: same structure,
     same tensors' memory); on a match it has copied the small tensors into
     their buffers and returns the tensors to keep alive and the values;
  3. otherwise plans afresh (_plan): flattens the state dict to DCP's fqns,
     sorts the leaves into tensors and values, finds tensors that share
     storage (saved once), decides which tensors are saved from their own
     memory and which through a copy buffer, registers the memory, builds
     the items and defines their layout with the daemon;
  4. pickles the values;
  5. hands the rest to the submit thread (save_submitter.py) and returns an
     AsyncSaveResponse that holds every tensor the daemon reads until
     STAGED.
Then, on the submit thread:
  6. exchanges a digest of its leaves with the group (one small collective
     on the checkpointer's own process group, replica_exchange.py; the
     digests and descriptions it compares: exchange_digests.py), which
     gives every plain tensor and value its replica set, or fails every
     rank with the same error;
  7. puts the pickled values into their buffers and submits the save under
     the plan's layout (the save RPC); the response's watcher then resolves
     its futures.

With the plan matched, the call costs one C++ check (with the small
tensors' copies) and one pickle per value; the exchange and the RPC (the
C++ client's own save call, docs/BENCHMARKS.md) overlap the caller's next
work. staging_completion covers steps 6 and 7 too, so a trainer that waits
for it before mutating its state waits for no less than before.

Which tensors are copied: those of at most COPY_MAX_BYTES (AdamW's step
scalars, a fresh torch.get_rng_state() every save: copied, any new tensor of
the same shape and dtype fits the plan) as long as the copies stay within
COPY_TOTAL_BYTES, and every non-contiguous one. The copy is taken at the
save call, so its bytes are those of that moment. Tensors that share
storage with another leaf are never copied (the aliases are found from
their memory).

GPU tensors (CUDA, or the simulated GPU's memory: the client's
gpu_memory.py seam) are read in place, however small (a copy per small
tensor would be a copy launch per tensor at the call); a non-contiguous one
is copied into a buffer on its device, queued on the current stream. The
call then records the save's ready event on that stream (step 7, the RPC,
comes later, on the submit thread: recorded there, the event would order
the daemon's copies after whatever the trainer queued in between), and
the RPC says it was recorded. The trainer must queue no write to a saved
tensor before the GPU-side STAGED (the response's wait_staged_on_stream()):
not the optimizer step, and not a forward pass that updates saved buffers
(BatchNorm's running statistics). When the save's host tensors are all
copies (snapshot regions: no CPU tensor read in place), the call also
reserves a relay record (ckpt::StagedRelay), for which that wait makes the
stream wait at once; the submit thread passes the daemon's staged record
on to it after step 7, or, if the save failed, passes on at once: a relay
record never made would hold the trainer's stream for good. Small
replicated plain GPU tensors are compared between ranks through host
copies the submit thread makes on a side stream, after an event recorded
at the call (gpu_memory.host_bytes), and waits for before step 7: the
relay record, made after step 7, orders the trainer's next writes after
them too.

Errors found by the exchange or later (bad input on any rank, replicas that
disagree, the daemon refusing the save, a failed commit) reach the caller
through the futures, as DCP's do.

Thread-safety: one thread at a time (the training loop's); the responses'
futures may be waited on from anywhere. The submit thread touches the plan
and the value buffers only between a save call and that save's STAGED (or
failure), and the next call waits for that first (step 1); load() waits for
the submit thread to be idle.
"""

import dataclasses
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

import ckptd
try:
    from ckptd import _state_cache
except ImportError as e:  # built before torch was in this Python
    raise ImportError(
        "ckptd._state_cache is missing: it is built against torch, and torch was "
        "not installed for this Python when ckptd was configured; install torch, "
        "then re-run scripts/build.sh (scripts/test.sh installs it first)") from e
from ckptd import errors as errors_mod
from ckptd import exchange_digests
from ckptd import flatten as flatten_mod
from ckptd import generations as generations_mod
from ckptd import stateful as stateful_mod
from ckptd import values as values_mod
from ckptd.checkpoint_loader import CheckpointLoader
from ckptd.index import INDEX_FQN, Alias, Index
from ckptd.replica_exchange import ReplicaExchange
from ckptd.save_response import AsyncSaveResponse, SaveWatcher
from ckptd.save_submitter import SaveSubmitter
from ckptd.storage_sharing import find_aliases
from ckptd.tensor_entry import DTYPE_NAMES, split_leaves

# Plain tensors up to this many bytes are hashed to check that replicas
# agree (replica_exchange.py); the AdamW step scalars, biases, norms.
DEFAULT_CHECK_BYTES = 1 << 20
# Tensors copied into the checkpointer's buffers at the save call (see the
# module comment): up to this size each, this much in all.
COPY_MAX_BYTES = 8 << 10
COPY_TOTAL_BYTES = 4 << 20
_ALIGN = 64  # of each copy in the arena: any dtype's alignment


def default_job() -> str:
    return os.environ.get("CKPTD_JOB", "default")


def _replicas(holders, fqn: str) -> List[int]:
    """The holders of `fqn` from ReplicaExchange.exchange's answer."""
    return list(holders) if isinstance(holders, tuple) else sorted(set(holders[fqn]))


def _dtensor_type():
    from torch.distributed.tensor import DTensor
    return DTensor


@dataclasses.dataclass
class _Plan:
    """What saving one structure of state dict takes besides its bytes."""

    cache: Optional[Any]          # _state_cache.StateCache, None: uncacheable
    generation: int               # the ckptd.Client connection it was made on
    value_fqns: List[str]         # the value leaves, in walk order
    structure: Dict[str, tuple]   # replica_exchange descriptions, no digests
    checked: List[torch.Tensor]   # plain tensors whose bytes replicas compare
    checked_fqns: List[str]       # ... their fqns
    aliases: Dict[str, Alias]
    items: List[dict]             # tensor items, then value items
    value_item: Dict[str, int]    # fqn -> index into items
    holders: Any                  # the exchange's (replica_exchange.py) in items
    layout: Optional[int] = None
    structure_key: Optional[bytes] = None
    buffers: Any = None           # the copy buffers, owned
    index_key: Any = None         # (values, aliases) the index bytes encode
    index_bytes: bytes = b""
    # GPU tensors (the GPU section of the module comment).
    gpu: bool = False             # items in GPU memory: a ready event per save
    gpu_device: Any = None        # their device (gpu_memory.py)
    gpu_checked: List[torch.Tensor] = dataclasses.field(default_factory=list)
    gpu_checked_fqns: List[str] = dataclasses.field(default_factory=list)
    synchronize_copies: bool = False  # GPU copies are host copies: sync first
    # Every host item is a copy buffer (snapshot): the trainer's stream
    # waits for STAGED through a relay, before the save is handed over.
    relay: bool = False


class Checkpointer(CheckpointLoader):
    """This rank of `job`, saving and loading through the daemon at `socket`.

    Every rank of the job (torch.distributed's world) saves together, as
    with DCP; `process_group` names the ranks the replica exchange runs
    over (default: the world), on a gloo group of its own that they create
    at their first save. local_world_size, local_rank and node default to
    torchrun's LOCAL_WORLD_SIZE, LOCAL_RANK and GROUP_RANK (else: one node
    holding every rank, and no local rank: the daemon then names a rank that
    never connected only where torchrun's numbering tells it). `gpu`: None
    for CUDA tensors, or a ckptd._ckpt.SimulatedGpu whose memory stands for
    them (ckptd.Client's).
    """

    def __init__(self, job: Optional[str] = None, *, socket: Optional[str] = None,
                 process_group=None, check_bytes: int = DEFAULT_CHECK_BYTES,
                 local_world_size: Optional[int] = None, node: Optional[int] = None,
                 local_rank: Optional[int] = None, gpu: Optional[Any] = None):
        import torch.distributed as dist
        self._exchange = ReplicaExchange(process_group)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if local_world_size is None:
            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        if node is None:
            node = int(os.environ.get("GROUP_RANK", "0"))
        if local_rank is None and "LOCAL_RANK" in os.environ:
            local_rank = int(os.environ["LOCAL_RANK"])
        self.job = job or default_job()
        self.rank = self._exchange.rank
        self.client = ckptd.Client(self.job, self.rank, world,
                                   socket=socket, node=node,
                                   local_world_size=local_world_size,
                                   local_rank=local_rank, gpu=gpu)
        self._memory = self.client._gpu  # gpu_memory.py: CUDA, or the simulated GPU
        self._check_bytes = check_bytes
        self._buffers = values_mod.ValueBuffers()
        self._last: Optional[AsyncSaveResponse] = None
        self._plan: Optional[_Plan] = None
        self._watcher = SaveWatcher(self.job)
        self._submitter = SaveSubmitter(self.job)
        # The generation of a save to a taken name is decided by the
        # group's first rank (generations.py).
        self._decides = self.rank == self._exchange.ranks[0]
        self._generations = generations_mod.Generations()

    # -- save ---------------------------------------------------------------

    def async_save(self, state_dict, *, checkpoint_id: str,
                   overwrite: bool = True) -> AsyncSaveResponse:
        if self._last is not None:
            try:
                self._last.staging_completion.result()
            except Exception:  # noqa: BLE001 - that save's caller sees it
                pass
            self._last = None
        self._exchange.open()
        plan, keep, values, error, raised = None, None, None, None, None
        connection, mark, stream, relay = None, None, None, None
        try:
            connection = self.client._connection()  # reconnects to a new daemon
            plan = self._plan
            matched = None
            cached = (plan is not None and plan.cache is not None
                      and plan.generation == self.client.generation)
            if cached:
                if plan.synchronize_copies:
                    self._memory.synchronize(plan.gpu_device)
                matched = self._match(plan, state_dict)
            if matched is None:
                # Stateful objects (stateful.py) are asked for their state
                # here: the plain dict of a training loop is matched above
                # without a walk in Python, a dict holding a model misses
                # there and is matched once resolved.
                resolved = stateful_mod.ResolvedState(state_dict)
                if resolved.has_stateful:
                    state_dict = resolved.state_dict
                    if cached:
                        matched = self._match(plan, state_dict)
            if matched is None:
                plan, keep, value_leaves = self._new_plan(state_dict)
            else:
                keep, value_leaves = matched
            if plan.gpu:
                # Here, not on the submit thread: the save holds what the
                # stream has written by the call (the copies just queued
                # included), whatever the trainer queues after it.
                stream = self._memory.stream(plan.gpu_device)
                if plan.gpu_checked and self._exchange.compares:
                    mark = self._memory.mark(plan.gpu_device)
                connection.record_ready(stream)
                if plan.relay:
                    relay = connection.reserve_relay()
            values = self._encode(plan, value_leaves)
        except ValueError as e:
            error = str(e)  # the peers learn it in the exchange, and fail too
        except ckptd.Error as e:
            error, raised = f"rank {self.rank}: {e}", e
        except Exception as e:  # noqa: BLE001 - a GPU out of memory, say: the peers
            # must hear of it, or they wait for this rank in the exchange
            error, raised = f"{type(e).__name__}: {e}", e
        response = self._watcher.take(checkpoint_id)
        # From here the response keeps alive what the daemon will read (the
        # tensors read in place; the plan, with its copy buffers, should the
        # next save replace it before this one is staged).
        response._keep_alive = (keep, plan)
        response._socket = self.client.socket
        response._connection = connection
        response._stream = stream
        response._relay = relay

        def fail(e: BaseException) -> None:
            self._plan = None
            response._fail(response._explain(e))

        self._submitter.submit(
            lambda: self._submit(response, connection, plan, values, error, raised, mark,
                                 relay, overwrite),
            fail)
        self._last = response
        return response

    def _submit(self, response: AsyncSaveResponse, connection, plan: Optional[_Plan],
                values, error: Optional[str], raised: Optional[BaseException],
                mark, relay, overwrite: bool) -> None:
        """Steps 6 and 7 of a save (the module comment), on the submit thread;
        then passes STAGED on to the save's relay, if it has one, whatever
        happened (a relay record never made would hold the trainer's stream
        for good)."""
        handle = None
        try:
            handle = self._submit_save(response, connection, plan, values, error, raised,
                                       mark, overwrite)
        finally:
            if relay is not None:
                try:
                    relay.pass_on(handle)
                except ckptd.Error as e:
                    # Made from the CPU instead (ckpt::StagedRelay), or not
                    # at all: say so, the save itself is unaffected.
                    warnings.warn(f"ckptd: save {response.checkpoint_id!r}: {e}",
                                  RuntimeWarning)

    def _submit_save(self, response: AsyncSaveResponse, connection, plan: Optional[_Plan],
                     values, error: Optional[str], raised: Optional[BaseException],
                     mark, overwrite: bool):
        """Steps 6 and 7; the save's handle, or None if it failed."""
        gpu_hosts: List[torch.Tensor] = []
        if error is None and mark is not None:
            try:
                gpu_hosts = self._memory.host_bytes(plan.gpu_device, mark, plan.gpu_checked)
            except Exception as e:  # noqa: BLE001 - the peers must hear of it
                error = f"cannot read its GPU tensors to compare them: {type(e).__name__}: {e}"
        base = response.checkpoint_id
        decision = 0
        if error is None and self._decides:
            try:
                decision = self._generations.decide(base, overwrite, lambda: connection.list(""))
            except ckptd.Error as e:
                error, raised = (f"rank {self.rank}: cannot list the job's checkpoints to "
                                 f"tell whether {base!r} is taken: {e}"), response._explain(e)
        try:
            holders, merged, decision = self._exchange.exchange(
                error, lambda: exchange_digests.key(plan, values, gpu_hosts),
                lambda: exchange_digests.detailed(plan, values, gpu_hosts),
                names=(self.job, base), decision=decision,
                structure=lambda: exchange_digests.structure(plan, values),
                digest_group=lambda fqns: exchange_digests.digest_group(plan, values,
                                                                        gpu_hosts, fqns))
        except ValueError as e:
            # Bad input or replicas that disagree: every rank of the group
            # reaches this same verdict, and none submits. This rank's own
            # daemon error keeps its class (DaemonUnavailable, ...).
            self._plan = None
            response._fail(raised or e)
            return None
        if decision == generations_mod.EXISTS:
            self._plan = None
            response._fail(errors_mod.CheckpointExists(
                f"Checkpoint already exists: {self.job}/{base} is committed and the save "
                f"was made with overwrite=False; nothing was saved"))
            return None
        try:
            name = generations_mod.storage_name(base, decision)
            self._generations.given(base, decision)
            response.storage_name = name
            if holders != plan.holders:
                # Other holders than planned (ranks joined or left an fqn):
                # the items' replica sets change, and so the layout.
                self._set_holders(plan, holders)
            self._fill_values(plan, values)
            index = self._index(plan, values, merged)
            handle = connection.save(name, plan.layout, {INDEX_FQN: index},
                                     ready_recorded=plan.gpu)
        except (ckptd.Error, ValueError) as e:
            self._plan = None
            response._fail(response._explain(e))
            return None
        self._plan = plan
        self._watcher.watch(response, handle, response._keep_alive)
        return handle

    @staticmethod
    def _match(plan: _Plan, state_dict):
        """The cached plan's (tensors to keep, value leaves) for `state_dict`,
        or None. A value leaf that is a Stateful object is a miss: the C++
        check takes any non-container as a value, and such an object must be
        asked for its state, not pickled."""
        matched = plan.cache.match(state_dict)
        if matched is not None and any(map(stateful_mod.is_stateful, matched[1])):
            return None
        return matched

    def save(self, state_dict, *, checkpoint_id: str, overwrite: bool = True) -> None:
        """Saves and returns once the checkpoint is committed."""
        self.async_save(state_dict, checkpoint_id=checkpoint_id,
                        overwrite=overwrite).upload_completion.result()

    def _new_plan(self, state_dict) -> Tuple[_Plan, list, list]:
        """Plans the save of `state_dict` (raises ValueError naming the fqn
        on input the daemon cannot hold); returns (plan, tensors to keep
        alive, value leaves in walk order)."""
        leaves, _ = flatten_mod.flatten(state_dict)
        tensors, raw_values = split_leaves(leaves)
        aliases = find_aliases(tensors, DTYPE_NAMES)
        sharing = set(aliases) | {a.base for a in aliases.values()}
        on_gpu = {fqn for fqn, e in tensors.items() if self._on_gpu(e.local)}
        gpu_device = (self._memory.device([tensors[fqn].local for fqn in on_gpu])
                      if on_gpu else None)
        # Which tensors go through a copy buffer; the arena holds the small ones.
        copied: Dict[str, Tuple[int, int]] = {}  # fqn -> (arena offset, bytes) or (-1, _)
        arena_bytes = 0
        for fqn, e in tensors.items():
            t = e.local
            nbytes = t.numel() * t.element_size()
            if fqn in sharing or nbytes == 0:
                continue
            if fqn in on_gpu:
                if not t.is_contiguous():
                    copied[fqn] = (-1, nbytes)
            elif nbytes <= COPY_MAX_BYTES and arena_bytes + nbytes <= COPY_TOTAL_BYTES:
                copied[fqn] = (arena_bytes, nbytes)
                arena_bytes += -(-nbytes // _ALIGN) * _ALIGN
            elif not t.is_contiguous():
                copied[fqn] = (-1, nbytes)
        synchronize_copies = (not self._memory.copies_on_device
                              and any(fqn in on_gpu for fqn in copied))
        if synchronize_copies:
            self._memory.synchronize(gpu_device)
        arena = torch.empty(max(arena_bytes, 1), dtype=torch.uint8)
        dest: Dict[str, torch.Tensor] = {}
        keep: List[torch.Tensor] = []
        for fqn, (offset, nbytes) in copied.items():
            t = tensors[fqn].local
            if fqn in on_gpu:
                dest[fqn] = self._memory.buffer_like(t)
                if self._memory.copies_on_device:
                    # The copy is only queued: its source stays alive until
                    # the save is staged (freed, its block could be reused
                    # by work on another stream before the copy runs).
                    keep.append(t)
            elif offset < 0:
                dest[fqn] = torch.empty(t.shape, dtype=t.dtype)
            else:
                dest[fqn] = arena[offset:offset + nbytes].view(t.dtype).view(t.shape)
            dest[fqn].copy_(t)
        generation = self.client.generation
        checked, checked_fqns, structure, cache_leaves = [], [], {}, []
        gpu_checked, gpu_checked_fqns = [], []
        items: List[dict] = []
        gpu_items, host_in_place = 0, False
        for fqn, leaf in leaves.items():
            e = tensors.get(fqn)
            if e is None:
                cache_leaves.append((_state_cache.VALUE, False, None))
                continue
            is_checked = (e.replicas is None and fqn not in aliases
                          and e.local.numel() * e.local.element_size() <= self._check_bytes)
            memory = dest.get(fqn)
            # GPU memory is compared through host copies (submit thread).
            memory_on_gpu = fqn in on_gpu and self._on_gpu(memory if memory is not None
                                                           else e.local)
            host_checked = is_checked and not memory_on_gpu
            if memory is None:
                memory = e.local
                keep.append(e.local)
                cache_leaves.append((_state_cache.REFERENCED, host_checked, None))
            else:
                cache_leaves.append((_state_cache.COPIED, host_checked, memory))
            if host_checked:
                checked.append(memory)
                checked_fqns.append(fqn)
            elif is_checked:
                gpu_checked.append(memory)
                gpu_checked_fqns.append(fqn)
            if fqn in aliases:
                structure[fqn] = ("alias", aliases[fqn])
            elif e.replicas is None:
                structure[fqn] = ("tensor", DTYPE_NAMES[str(e.local.dtype)], tuple(e.local.shape))
            if fqn not in aliases and memory.numel() != 0:
                items.append(self._memory_item(fqn, memory, snapshot=fqn in dest))
                gpu_items += memory_on_gpu
                host_in_place |= not memory_on_gpu and fqn not in dest
                items[-1].update(global_shape=list(e.global_shape), offsets=list(e.offsets),
                                 replicas=None if e.replicas is None
                                 else sorted(set(e.replicas)))
        try:
            cache = _state_cache.StateCache(state_dict, cache_leaves, _dtensor_type(),
                                            ckptd.Shard)
        except ValueError:
            cache = None  # a structure the C++ walk does not check: plan every save
        plan = _Plan(cache=cache, generation=generation, value_fqns=list(raw_values),
                     structure=structure, checked=checked,
                     checked_fqns=checked_fqns, aliases=aliases, items=items,
                     value_item={}, holders=None, buffers=(arena, dest),
                     gpu=gpu_items > 0, gpu_device=gpu_device, gpu_checked=gpu_checked,
                     gpu_checked_fqns=gpu_checked_fqns,
                     synchronize_copies=synchronize_copies,
                     relay=gpu_items > 0 and not host_in_place)
        return plan, keep, list(raw_values.values())

    def _encode(self, plan: _Plan, value_leaves: list) -> Dict[str, Tuple[bytes, bytes]]:
        """{fqn: (pickled, digest)}; digests only where replicas compare them."""
        compare = self._exchange.compares
        values = {}
        for fqn, v in zip(plan.value_fqns, value_leaves):
            try:
                data = values_mod.encode(v)
            except Exception as e:  # noqa: BLE001 - pickling fails many ways
                raise ValueError(f"{fqn}: cannot pickle {type(v).__name__}: {e}") from None
            values[fqn] = (data, values_mod.digest(data) if compare else b"")
        return values

    def _set_holders(self, plan: _Plan, holders) -> None:
        for item in plan.items:
            if item["fqn"] in plan.structure or item["fqn"] in plan.value_item:
                item["replicas"] = _replicas(holders, item["fqn"])
        plan.holders = holders
        plan.layout = None

    def _fill_values(self, plan: _Plan, values) -> None:
        """Pickled values into their buffers; a value that outgrew its
        buffer gets a new one, and the plan a new layout."""
        for fqn, (data, _) in values.items():
            buf = self._buffers.fill(fqn, data)
            at = plan.value_item.get(fqn)
            if at is not None and plan.items[at]["address"] == buf.ctypes.data \
                    and plan.items[at]["length"] == buf.nbytes:
                continue
            item = self._buffer_item(fqn, buf, _replicas(plan.holders, fqn))
            if at is None:
                plan.value_item[fqn] = len(plan.items)
                plan.items.append(item)
            else:
                plan.items[at] = item
            plan.layout = None
        if len(values) != len(plan.value_item):
            self._buffers.forget_except(values)
        if plan.layout is None:
            plan.layout = self.client._connection().define_layout(
                [{k: v for k, v in i.items() if k != "address"} for i in plan.items])

    def _index(self, plan: _Plan, values, merged) -> bytes:
        """The index byte item: every rank's values and aliases (merged is
        None when every rank holds the same leaves: then they are ours)."""
        if merged is None:
            index_values = {fqn: (values_mod.capacity(len(data)), len(data))
                            for fqn, (data, _) in values.items()}
            aliases = plan.aliases
        else:
            index_values = {fqn: (d[1], d[2]) for fqn, d in merged.items() if d[0] == "value"}
            aliases = {fqn: d[1] for fqn, d in merged.items() if d[0] == "alias"}
            aliases.update(plan.aliases)
        key = (index_values, aliases)
        if key != plan.index_key:
            plan.index_key = key
            plan.index_bytes = Index(values=index_values, aliases=aliases).encode()
        return plan.index_bytes

    def _buffer_item(self, fqn: str, buf, replicas) -> dict:
        # A snapshot region: the buffer is written again only once this
        # save is STAGED (step 1 of the next save waits for that).
        region = self.client._region(buf.ctypes.data, buf.nbytes, snapshot=True)
        return {"fqn": fqn, "dtype": "U8", "global_shape": [buf.size], "offsets": [0],
                "local_shape": [buf.size], "region": region, "offset": 0,
                "length": buf.nbytes, "replicas": sorted(set(replicas)),
                "address": buf.ctypes.data}

    def _on_gpu(self, t: torch.Tensor) -> bool:
        """Whether `t` is GPU memory (a CUDA tensor, or the simulated GPU's)."""
        if t.numel() == 0:
            return False
        storage = t.untyped_storage()
        return self._memory.holds(t, storage.data_ptr(), storage.nbytes())

    def _memory_item(self, fqn: str, t: torch.Tensor, snapshot: bool = False) -> dict:
        """The item of contiguous `t`, its memory named by its storage (a
        GPU region for GPU memory). `snapshot`: `t` is one of this
        checkpointer's copy buffers, written again only once the save that
        reads it is STAGED (step 1 of the next save waits for that), so
        host memory is registered as a snapshot region (the trainer's
        stream wait alone then stands for STAGED: ckptd.SaveHandle)."""
        storage = t.untyped_storage()
        base = storage.data_ptr()
        on_gpu = self._on_gpu(t)
        region = self.client._region(base, storage.nbytes(), on_gpu,
                                     snapshot=snapshot and not on_gpu)
        return {"fqn": fqn, "dtype": DTYPE_NAMES[str(t.dtype)],
                "local_shape": list(t.shape), "region": region,
                "offset": t.data_ptr() - base, "length": t.numel() * t.element_size()}
