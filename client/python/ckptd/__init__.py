"""ckptd: save and restore a trainer's state through the node's ckptd daemon.

PyTorch users start with `ckptd.torch` (async_save / save / load shaped like
torch.distributed.checkpoint, taking what get_state_dict returns). This
module is the layer below it: flat state dicts of tensors and shards.

    import ckptd
    client = ckptd.Client("llama", rank=rank, world_size=world)
    handle = client.save("step-00001000", state_dict, byte_items={"rng": rng})
    handle.wait_staged()         # before the optimizer mutates the tensors
    ...
    result = client.load("latest", state_dict)   # in place, any sharding

A state dict maps fqns to tensors (torch CPU or CUDA, or numpy; contiguous), to
DTensors (FSDP2, HSDP: the box and the replicas come from the device mesh and
the placements; Shard and Replicate only), or to `Shard`s, which say which box
of a global tensor the rank holds and which ranks hold identical copies (so
that one of them writes it). A plain tensor is the whole tensor, held by
`replicas` (default: this rank alone). Ranks are torch.distributed's global
ranks. The daemon reads and writes the tensors' memory directly; keep them
alive and unmoved until `wait_staged()` returns or `load()` returns.

CUDA tensors are GPU regions: the daemon copies them out with the GPU's copy
engines, after the trainer's writes queued so far on the device's current
stream (the save records an event there; no CPU wait). `wait_staged()`
waits on the CPU until every byte is copied out; `wait_staged_on_stream()`
makes the stream wait for the copies, so the optimizer step queued next runs
after them and the CPU goes on (the GPU-side STAGED): at once when every
saved tensor is a GPU tensor, otherwise once the daemon has queued its
copies and read the host tensors (this API reads every tensor in place;
ckptd.torch copies small CPU tensors into snapshot buffers, which keep
the CPU out of the wait). A load waits for the stream first, then writes the
tensors. `Client(gpu=ckptd._ckpt.SimulatedGpu())` puts the GPU path on the
simulated device instead (a daemon with --gpu=simulated): arrays or CPU
tensors over its memory (SimulatedGpu.allocate) then stand for CUDA
tensors, for tests and for trying the GPU path where no GPU is.

gRPC does not survive fork(): a process that forks after creating a Client
must not use it in the child (dataloader workers that never touch it are
fine).

Errors are ckptd.CkptdError (alias ckptd.Error) and its subclasses
DaemonUnavailable, CheckpointNotFound, StateMismatch and SaveFailed
(errors.py). A daemon that restarted is reconnected to on the next call
(its regions and layouts are registered again); saves in flight on the
daemon that went away fail with DaemonUnavailable. Every wait (wait_staged,
wait_committed, the futures of ckptd.torch) ends with KeyboardInterrupt on
Ctrl-C.

The save call hands the daemon references, not bytes: it returns in about a
millisecond once the layout (fqns, shapes, addresses) has been seen; a new
layout is defined with the daemon first.
"""

import dataclasses
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

from ckptd.errors import (CheckpointNotFound, CkptdError, DaemonUnavailable,
                          InvalidStateDict, MissingKeys, SaveFailed, StateMismatch)
from ckptd import errors as _errors
from ckptd import _ckpt
from ckptd.dtypes import SAFETENSORS_BY_NUMPY, SAFETENSORS_BY_TORCH
from ckptd.gpu_memory import CudaMemory, SimulatedMemory

Error = CkptdError  # every error of the daemon and libckpt (ckptd/errors.py)
DEFAULT_SOCKET = _ckpt.DEFAULT_SOCKET


def slurm_socket() -> Optional[str]:
    """Inside a Slurm job, the socket of this node's per-job daemon where
    deploy/slurm/ckptd-slurm started one: /tmp/ckptd-slurm-<uid>-<job>/,
    a path it derives from SLURM_JOB_ID and the uid alone for this. None
    where there is none, so that a job using the node's system daemon
    keeps it."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return None
    path = f"/tmp/ckptd-slurm-{os.getuid()}-{job}/ckptd.sock"
    return path if os.path.exists(path) else None


def default_socket() -> str:
    """$CKPTD_SOCKET, else this node's per-job daemon in a Slurm job
    (slurm_socket()), else the user's own daemon at
    $XDG_RUNTIME_DIR/ckptd/ckptd.sock if that socket exists, else the
    daemon's default socket. The rule is libckpt's and ckptctl's
    (common/control_socket.h), asked of libckpt so the three cannot
    differ."""
    return _ckpt.default_client_socket()

# Element types by their safetensors names; the keys are the str() of torch
# and numpy dtypes.
_DTYPES = {**SAFETENSORS_BY_TORCH, **SAFETENSORS_BY_NUMPY}


@dataclasses.dataclass(frozen=True)
class Shard:
    """The box of a global tensor that `tensor` holds on this rank."""

    tensor: Any
    global_shape: Sequence[int]
    offsets: Sequence[int]
    replicas: Optional[Sequence[int]] = None  # ranks with identical copies


def _dtensor_shard(t) -> Shard:
    """The box of a DTensor this rank holds, and the ranks holding the same."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as ShardPlacement
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = t.device_mesh
    me = mesh.get_coordinate()
    if me is None:
        raise ValueError("this rank is not in the tensor's device mesh")
    for p in t.placements:
        if not isinstance(p, (Replicate, ShardPlacement)):
            raise ValueError(f"unsupported placement {p}: only Shard and Replicate")
    local_shape, offsets = compute_local_shape_and_global_offset(
        t.shape, mesh, t.placements)
    # The ranks at my coordinate on every sharded mesh dim hold my box.
    index = tuple(slice(None) if isinstance(p, Replicate) else me[d]
                  for d, p in enumerate(t.placements))
    local = t.to_local()
    if tuple(local.shape) != tuple(local_shape):
        raise ValueError(f"local shape {tuple(local.shape)} is not the mesh's "
                         f"{tuple(local_shape)}")
    return Shard(local, list(t.shape), list(offsets),
                 replicas=mesh.mesh[index].flatten().tolist())


def _as_shard(value, replicas) -> Shard:
    if isinstance(value, Shard):
        return value
    if type(value).__name__ == "DTensor" and hasattr(value, "device_mesh"):
        return _dtensor_shard(value)
    shape = tuple(value.shape)
    return Shard(value, shape, [0] * len(shape), replicas)


def _memory(tensor) -> tuple:
    """(address, length, shape, dtype name) of a contiguous CPU or CUDA tensor."""
    if hasattr(tensor, "data_ptr"):  # torch
        if tensor.device.type not in ("cpu", "cuda"):
            raise ValueError(f"only CPU and CUDA tensors are supported, got {tensor.device}")
        if not tensor.is_contiguous():
            raise ValueError("tensors must be contiguous")
        return (tensor.data_ptr(), tensor.numel() * tensor.element_size(),
                tuple(tensor.shape), str(tensor.dtype))
    if not tensor.flags["C_CONTIGUOUS"]:  # numpy
        raise ValueError("arrays must be C-contiguous")
    return tensor.ctypes.data, tensor.nbytes, tuple(tensor.shape), str(tensor.dtype)


class SaveHandle:
    """One save of this rank: wait for STAGED before mutating the tensors."""

    def __init__(self, handle, keep_alive, stream=None):
        self._handle = handle
        # The tensors themselves (not the caller's dict, which it may change):
        # the daemon reads their memory until STAGED.
        self._keep_alive = keep_alive
        self._stream = stream  # the GPU stream the save recorded on, if any

    def wait_staged(self) -> None:
        """Returns once every byte is copied out; raises if the save failed."""
        self._handle.wait_staged()
        self._keep_alive = None

    def wait_staged_on_stream(self, stream: Optional[int] = None) -> None:
        """The GPU-side STAGED: makes `stream` (default: the stream the save
        recorded on) wait for the daemon's copies of this rank's GPU tensors,
        so work queued there next runs after them. When every saved tensor
        is a GPU tensor this does not wait on the CPU (a failed save shows in
        wait_committed); otherwise (host tensors, read in place) it returns
        once the daemon has queued the
        copies (with a staging pool smaller than the state, once the part
        that does not fit went to storage) and copied the host tensors out. The tensors stay referenced until wait_staged or
        wait_committed: their memory must not be freed before the copies
        ran."""
        if stream is None:
            stream = self._stream
        if stream is None:
            raise ValueError("this save has no GPU tensors: use wait_staged()")
        self._handle.wait_staged_on_stream(stream)

    def wait_committed(self) -> None:
        self._handle.wait_committed()
        self._keep_alive = None

    def cancel(self) -> None:
        self._handle.cancel()

    def progress(self) -> dict:
        return self._handle.progress()


class Client:
    """This process as one rank of a job, connected to the node's ckptd."""

    def __init__(self, job: str, rank: int = 0, world_size: int = 1, *,
                 socket: Optional[str] = None, node: int = 0, local_world_size: int = 0,
                 local_rank: Optional[int] = None, gpu: Optional[Any] = None):
        """`socket`: default default_socket() ($CKPTD_SOCKET, a Slurm job's
        per-node daemon, the daemon's default). `gpu`:
        None for CUDA tensors on the CUDA runtime, or a
        ckptd._ckpt.SimulatedGpu (see the module's docstring)."""
        socket = socket or default_socket()
        self.rank = rank
        self.job = job
        self.socket = socket
        self._connect_args = (socket, job, rank, world_size, node, local_world_size,
                              local_rank, gpu)
        self._gpu = CudaMemory() if gpu is None else SimulatedMemory(gpu)
        self._client = _ckpt.Client(*self._connect_args)
        # Counts connections: ids (regions, layouts) of an older one are void.
        self.generation = 0
        self._regions = {}  # (address, length, on_gpu, snapshot) -> region id
        self._layouts = {}  # items key -> layout id

    def _connection(self):
        """The binding's client, connected anew if the daemon that made the
        session is gone (restarted, or stopped: then DaemonUnavailable)."""
        if not self._client.alive():
            self._client = _ckpt.Client(*self._connect_args)
            self.generation += 1
            self._regions = {}
            self._layouts = {}
        return self._client

    def save(self, checkpoint: str, state_dict: Mapping[str, Any], *,
             byte_items: Optional[Mapping[str, bytes]] = None,
             replicas: Optional[Iterable[int]] = None) -> SaveHandle:
        """Starts a save and returns once the daemon accepted it.

        `replicas` applies to plain tensors: the ranks that hold identical
        copies of them (all ranks, for DDP); default this rank alone.
        """
        self._connection()
        gpu_tensors = []
        items = self._items(state_dict, replicas, gpu_tensors)
        stream = self._gpu.stream(self._gpu.device(gpu_tensors)) if gpu_tensors else None
        handle = self._submit(checkpoint, items, dict(byte_items or {}), stream or 0)
        return SaveHandle(handle, [getattr(v, "tensor", v) for v in state_dict.values()],
                          stream)

    def _submit(self, checkpoint: str, items: list, byte_items: dict, stream: int = 0):
        """Saves `items` (tensor item dicts, see ckpt_module.cc) under a
        layout defined once per distinct item list, recording the ready
        event of GPU items on `stream`; returns the binding's save handle."""
        key = tuple(tuple((k, tuple(v) if isinstance(v, list) else v)
                          for k, v in sorted(i.items())) for i in items)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._client.define_layout(items)
            self._layouts[key] = layout
        return self._client.save(checkpoint, layout, byte_items, stream=stream)

    def _load(self, checkpoint: str, items: list, byte_items: list, allow_missing: bool):
        """The binding's load, with a missing checkpoint said in full."""
        try:
            return self._connection().load(checkpoint, items, byte_items, allow_missing)
        except CheckpointNotFound as e:
            try:
                committed = [c["checkpoint"] for c in self._client.list() if c["committed"]]
            except CkptdError:
                committed = None
            raise _errors.checkpoint_not_found(self.job, checkpoint, str(e),
                                               committed) from None

    def load(self, checkpoint: str, state_dict: Mapping[str, Any], *,
             byte_items: Iterable[str] = (), allow_missing: bool = False) -> dict:
        """Fills the state dict's tensors in place from `checkpoint` (a name or
        "latest"), whatever sharding saved it. Returns {checkpoint, byte_items,
        missing, source, bytes_read}.

        Ctrl-C interrupts it within about 100 ms (as every blocking call of
        the package). When the KeyboardInterrupt propagates, the daemon has
        confirmed that it writes nothing more into the state dict's tensors,
        so they may be freed or reused at once. A daemon that cannot confirm
        within a second (stopped, hung) is named in a RuntimeWarning raised
        before the KeyboardInterrupt: it may then still write into those
        tensors if it resumes, so do not reuse their memory."""
        self._connection()
        gpu_tensors = []
        items = self._items(state_dict, None, gpu_tensors)
        if gpu_tensors:
            # The daemon's copies are not ordered after work the trainer
            # queued on the GPU: let that finish before they overwrite.
            self._gpu.synchronize(self._gpu.device(gpu_tensors))
        return self._load(checkpoint, items, list(byte_items), allow_missing)

    def list(self, checkpoint: str = "") -> list:
        """This job's checkpoints: {checkpoint, committed, latest, total_bytes,
        committed_unix_micros}; with `checkpoint`, only that name and its
        generations ("NAME~N", saved again to the name: docs/FORMAT.md)."""
        return self._connection().list(checkpoint)

    def _region(self, address: int, length: int, on_gpu: bool = False,
                snapshot: bool = False) -> int:
        """The region id of this memory, registered once. `snapshot`: host
        memory that is the caller's own copy for a save, written again only
        after that save is STAGED (libckpt's RegisterSnapshotRegion); the
        flag is part of the key, so memory freed and reused as a trainer's
        tensor never inherits it."""
        key = (address, length, on_gpu, snapshot)
        region = self._regions.get(key)
        if region is None:
            if on_gpu:
                # libckpt keeps it current: a save re-registers memory the
                # allocator freed and allocated again at the same address.
                region = self._client.register_gpu_region(address, length)
            else:
                region = self._client.register_region(address, max(length, 1),
                                                      snapshot=snapshot)
            self._regions[key] = region
        return region

    def _items(self, state_dict: Mapping[str, Any], replicas, gpu_tensors: list) -> list:
        """The item dicts of `state_dict`; appends its GPU tensors to
        `gpu_tensors`."""
        default_replicas = sorted(set(replicas)) if replicas is not None else [self.rank]
        items = []
        for fqn, value in state_dict.items():
            try:
                shard = _as_shard(value, default_replicas)
                address, length, shape, dtype = _memory(shard.tensor)
            except (ValueError, AttributeError) as e:
                # Named, or a rank of many cannot tell which entry it was.
                raise ValueError(f"{fqn}: {e} (ckptd.torch takes nested dicts, "
                                 f"any strides and Python values)") from None
            if dtype not in _DTYPES:
                raise ValueError(f"{fqn}: unsupported dtype {dtype}")
            on_gpu = self._gpu.holds(shard.tensor, address, length)
            if on_gpu:
                if length == 0:
                    raise ValueError(f"{fqn}: an empty GPU tensor has no memory to register")
                gpu_tensors.append(shard.tensor)
            items.append({
                "fqn": fqn, "dtype": _DTYPES[dtype],
                "global_shape": list(shard.global_shape), "offsets": list(shard.offsets),
                "local_shape": list(shape), "region": self._region(address, length, on_gpu),
                "offset": 0, "length": length,
                "replicas": sorted(set(shard.replicas)) if shard.replicas is not None
                else [self.rank],
            })
        return items
