"""ckptd.torch: torch.distributed.checkpoint's save, async_save and load,
through the node's ckptd daemon.

    import ckptd.torch as ckpt
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": step, "rng": rng_state}
    response = ckpt.async_save(state, checkpoint_id=f"step-{step:08d}", job="llama")
    response.staging_completion.result()   # before the next optimizer.step()
    ...
    ckpt.load(state, checkpoint_id="latest", job="llama")   # in place
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])

Tensors may be CPU or CUDA tensors (one device per rank). With CUDA
tensors, response.wait_staged_on_stream() before the optimizer step is the
GPU-side STAGED: the CPU goes on, and the current stream runs the step
after the daemon's copies; staging_completion is the CPU wait. The save
holds what the stream had written by the save call. Wait before any GPU
work that writes a saved tensor: a forward pass that updates saved buffers
(BatchNorm's running statistics) counts.

What DCP takes, this takes: nested dicts and lists (named by the dotted fqns
DCP's flatten_state_dict gives, so DCP reads the tensors under the same
names), DTensors (FSDP2, HSDP; empty local shards included), plain tensors
of any strides, and Python values, pickled. As with DCP, a plain tensor or
value under one fqn on several ranks is replicated state, written once;
unlike DCP, replicas that hold different values fail the save, naming the
fqn, instead of one of them being kept silently. Tensors sharing storage
(tied weights, views) are written once. Every rank of the job calls
async_save/save together (they run one small collective, on a gloo group
the package makes at the first save, after the call has returned), as with
DCP; load needs no collective.

Objects with state_dict() and load_state_dict() (DCP's Stateful: a model,
an optimizer, an application's state), at any depth of the dict, are asked
for their state at save and given it back at load, as DCP does
(stateful.py). Errors are ckptd.CkptdError, which is also DCP's
CheckpointException; ranks that pass different job or checkpoint names
fail together within the save's exchange, naming the names.

`checkpoint_id` is a name ("step-00001000", "latest") or, as DCP takes it,
a path ("/ckpt/llama/step-00001000"): the path's directory then names the
job, reversibly (checkpoint_ids.py; docs/DCP.md), and the checkpoint's files
live under the daemon's root like every job's.

The job defaults to $CKPTD_JOB (else "default"), the socket to
$CKPTD_SOCKET (else, in a Slurm job, the node's daemon that
deploy/slurm/ckptd-slurm started; else the daemon's default). Each (job, socket,
process_group) keeps one Checkpointer
(`checkpointer.py`) for the life of the process.

Thread-safety: call from one thread (the training loop's).
"""

import os
from typing import Dict, List, Optional, Tuple

from ckptd import checkpoint_ids, default_socket
from ckptd.checkpointer import Checkpointer, default_job
from ckptd.errors import (CheckpointExists, CheckpointNotFound, CkptdError, DaemonUnavailable,
                          InvalidStateDict, MissingKeys, SaveFailed, StateMismatch)
from ckptd.replica_exchange import ReplicaMismatchError, SaveInputError
from ckptd.save_response import AsyncSaveResponse

__all__ = ["async_save", "save", "load", "list_checkpoints", "latest_checkpoint",
           "checkpointer", "Checkpointer", "AsyncSaveResponse", "ReplicaMismatchError",
           "SaveInputError", "CkptdError", "DaemonUnavailable", "CheckpointNotFound",
           "CheckpointExists",
           "StateMismatch", "SaveFailed", "MissingKeys", "InvalidStateDict"]

_checkpointers: Dict[Tuple, Checkpointer] = {}


def checkpointer(job: Optional[str] = None, socket: Optional[str] = None,
                 process_group=None) -> Checkpointer:
    """The process's Checkpointer for (job, socket, process_group)."""
    socket = socket or default_socket()
    key = (job or default_job(), socket, id(process_group))
    c = _checkpointers.get(key)
    if c is None:
        c = Checkpointer(job, socket=socket, process_group=process_group)
        _checkpointers[key] = c
    return c


def async_save(state_dict, *, checkpoint_id: str, job: Optional[str] = None,
               socket: Optional[str] = None, process_group=None,
               overwrite: bool = True) -> AsyncSaveResponse:
    """Starts saving `state_dict` as checkpoint `checkpoint_id` (a name such
    as "step-00001000") and returns in well under a millisecond once the
    save plan is checked, the small tensors copied and the Python values
    pickled; the ranks' exchange and the hand-over to the daemon follow on
    the package's submit thread (checkpointer.py). Wait for
    response.staging_completion before mutating the state: it resolves once
    the daemon has copied every byte out. response.upload_completion
    resolves once the checkpoint is committed. Errors (bad input,
    disagreeing replicas, a failed save) are raised from the futures, on
    every rank.

    `checkpoint_id` may also be a path, as DCP takes it
    (f"{folder}/step-{n}"): its directory then names the job and its last
    component the checkpoint (checkpoint_ids.py).

    A checkpoint_id that is already saved is replaced, as DCP's writer
    does by default, but atomically: readers see the old checkpoint until
    the new one is committed, then the new one, and the old one's space is
    reclaimed after (generations.py). With overwrite=False such a save
    fails with CheckpointExists, on every rank, and nothing is saved."""
    job, name = _resolve(checkpoint_id, job)
    return checkpointer(job, socket, process_group).async_save(
        state_dict, checkpoint_id=name, overwrite=overwrite)


def save(state_dict, *, checkpoint_id: str, job: Optional[str] = None,
         socket: Optional[str] = None, process_group=None, overwrite: bool = True) -> None:
    """async_save, returning once the checkpoint is committed."""
    async_save(state_dict, checkpoint_id=checkpoint_id, job=job, socket=socket,
               process_group=process_group,
               overwrite=overwrite).upload_completion.result()


def load(state_dict, *, checkpoint_id: str = "latest", job: Optional[str] = None,
         socket: Optional[str] = None, process_group=None,
         allow_partial_load: bool = False, allow_missing: bool = False) -> str:
    """Loads checkpoint `checkpoint_id` ("latest": the newest committed) into
    `state_dict` in place, whatever world size and sharding saved it:
    tensors (DTensors included) are filled, Python values replaced, and
    Stateful objects given their state (load_state_dict). Returns the
    checkpoint's name.

    A key of `state_dict` the checkpoint lacks raises MissingKeys ("Missing
    key in checkpoint state_dict: ...", as DCP's planner) before any byte is
    written; with allow_partial_load (DCP's DefaultLoadPlanner flag;
    allow_missing is its older name here) such keys keep their values. Keys
    the checkpoint has and the state dict lacks are not loaded, as in DCP.
    `checkpoint_id` may be a path, as in async_save ("FOLDER/latest": the
    newest under FOLDER)."""
    job, name = _resolve(checkpoint_id, job)
    return checkpointer(job, socket, process_group).load(
        state_dict, checkpoint_id=name,
        allow_missing=allow_partial_load or allow_missing)


def list_checkpoints(*, job: Optional[str] = None, folder=None,
                     socket: Optional[str] = None, process_group=None) -> List[str]:
    """The job's committed checkpoints, oldest commit first; `folder`: those
    saved under FOLDER/NAME paths instead."""
    return checkpointer(_folder_job(job, folder), socket, process_group).list_checkpoints()


def latest_checkpoint(*, job: Optional[str] = None, folder=None,
                      socket: Optional[str] = None, process_group=None) -> Optional[str]:
    """The newest committed checkpoint of the job (or of `folder`, as in
    list_checkpoints), or None."""
    return checkpointer(_folder_job(job, folder), socket,
                        process_group).latest_checkpoint()


def _resolve(checkpoint_id, job: Optional[str]) -> Tuple[Optional[str], str]:
    try:
        return checkpoint_ids.resolve(checkpoint_id, job)
    except ValueError as e:
        raise SaveInputError(str(e)) from None


def _folder_job(job: Optional[str], folder) -> Optional[str]:
    if folder is None:
        return job
    # The job of any checkpoint path under the folder.
    return _resolve(os.path.join(os.fspath(folder), "latest"), job)[0]
