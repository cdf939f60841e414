"""The errors of the ckptd package, by what the user can do about them.

Every error the daemon or libckpt reports reaches Python as a CkptdError
(ckptd.Error is the same class) whose message starts with the status code
("NOT_FOUND: ..."); the binding (ckpt_module.cc) raises the subclass that
says what happened:

- DaemonUnavailable: no daemon answers at the socket (not started, stopped,
  restarted, or it died during a save). The message names the socket and
  how to start the daemon. A Client reconnects on its next call; saves that
  were in flight on a daemon that died fail with this error, and so do
  waits on a daemon that stopped answering (hung, SIGSTOP) once a
  keepalive ping goes unanswered: within about 15 s.
- CheckpointNotFound: the job has no such checkpoint (or none committed,
  for "latest"); the message names job and checkpoint.
- CheckpointExists: a save with overwrite=False (ckptd.torch) names a
  checkpoint that is committed; nothing was saved.
- StateMismatch: a tensor of the state dict does not fit what the
  checkpoint stores under its fqn (shape or dtype); names fqn, the stored
  and the found shape and dtype. Also a ValueError.
- SaveFailed: the daemon failed or cancelled the save (its reason).

Thread-safety: plain exception classes.
"""

import importlib.util
import re

from ckptd.dtypes import TORCH_BY_SAFETENSORS


def _dcp_exception_base():
    """torch.distributed.checkpoint's CheckpointException where torch is
    installed (code written for DCP catches it), else nothing: the package
    also serves numpy users without torch, who should not pay torch's import."""
    if importlib.util.find_spec("torch") is None:
        return ()
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:  # a torch built without torch.distributed
        return ()
    return (CheckpointException,)


class CkptdError(RuntimeError, *_dcp_exception_base()):
    """An error reported by the ckptd daemon or the client library.

    Also a RuntimeError, and, where torch is installed, DCP's
    CheckpointException (a BaseException there), so `except Exception`
    and `except CheckpointException` both catch it. `failures` maps ranks to
    (exception, traceback) as DCP's does: the ranks whose errors this one
    reports, where known (empty otherwise)."""

    def __init__(self, message="", failures=None):
        RuntimeError.__init__(self, message)
        self._failures = dict(failures or {})

    @property
    def failures(self):
        return self._failures

    # DCP's __str__ lists the failures' tracebacks; ckptd's messages name
    # the rank, fqn and cause themselves.
    __str__ = RuntimeError.__str__


class InvalidStateDict(CkptdError, ValueError):
    """The state dict given to a load holds what cannot be loaded into (a
    tensor on the meta device, an unsupported dtype); names the fqn."""


class MissingKeys(CkptdError, KeyError):
    """Keys of the state dict the checkpoint does not hold (a load without
    allow_partial_load). The message starts as DCP's default planner's
    ("Missing key in checkpoint state_dict: FQN."), which code written for
    DCP matches; `keys` lists them all."""

    def __init__(self, message="", keys=()):
        super().__init__(message)
        self.keys = list(keys)

    __str__ = RuntimeError.__str__


def missing_keys(keys, job, checkpoint):
    keys = sorted(keys)
    return MissingKeys(f"Missing key in checkpoint state_dict: {keys[0]}. "
                       f"({len(keys)} missing from {job}/{checkpoint}: {keys})", keys)


class DaemonUnavailable(CkptdError):
    """No ckptd daemon answers at the socket."""


class CheckpointNotFound(CkptdError):
    """The job has no such (committed) checkpoint."""


class CheckpointExists(CkptdError):
    """A save with overwrite=False names a committed checkpoint."""


class StateMismatch(CkptdError, ValueError):
    """A tensor's shape or dtype differs from the stored one."""

    def __init__(self, message, fqn=None, stored=None, found=None):
        super().__init__(message)
        self.fqn = fqn
        self.stored = stored  # (dtype, shape) in the checkpoint
        self.found = found    # (dtype, shape) in the state dict


class SaveFailed(CkptdError):
    """The daemon failed or cancelled the save."""


# The daemon's refusal of a load whose tensor differs from the stored one
# (restore/load_plan.cc). Matched to name the fqn in the user's terms; any
# other INVALID_ARGUMENT stays a plain CkptdError.
_MISMATCH = re.compile(
    r"item (?P<fqn>\S+): requested DTYPE_(?P<want_dtype>\w+) \[(?P<want>[\d,]*)\] "
    r"but stored DTYPE_(?P<have_dtype>\w+) \[(?P<have>[\d,]*)\]")


def _shape(text):
    return [int(n) for n in text.split(",") if n]


def state_mismatch(message):
    """The StateMismatch a daemon message describes, or None."""
    m = _MISMATCH.search(message)
    if m is None:
        return None
    stored = (TORCH_BY_SAFETENSORS.get(m["have_dtype"], m["have_dtype"]), _shape(m["have"]))
    found = (TORCH_BY_SAFETENSORS.get(m["want_dtype"], m["want_dtype"]), _shape(m["want"]))
    # A shape that differs is worded first as DCP's planner words it
    # ("Size mismatch between saved ... and current: ... for FQN"), which
    # users' code and PyTorch's tests match on.
    size = (f"Size mismatch between saved {stored[1]} and current: {found[1]} "
            f"for {m['fqn']}; " if stored[1] != found[1] else "")
    return StateMismatch(
        f"{size}state mismatch at {m['fqn']!r}: the checkpoint stores {stored[0]} "
        f"{stored[1]}, the state dict has {found[0]} {found[1]} ({message})",
        fqn=m["fqn"], stored=stored, found=found)


def checkpoint_not_found(job, checkpoint, message, available=None):
    what = ("no committed checkpoint" if checkpoint == "latest"
            else f"no committed checkpoint {checkpoint!r}")
    listing = ""
    if available is not None:
        listing = (f"; committed checkpoints: {available}" if available
                   else "; it has no committed checkpoint")
    return CheckpointNotFound(f"job {job!r} has {what}{listing} ({message})")
