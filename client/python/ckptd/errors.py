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
- StateMismatch: a tensor of the state dict does not fit what the
  checkpoint stores under its fqn (shape or dtype); names fqn, the stored
  and the found shape and dtype. Also a ValueError.
- SaveFailed: the daemon failed or cancelled the save (its reason).

Thread-safety: plain exception classes.
"""

import re

from ckptd.dtypes import TORCH_BY_SAFETENSORS


class CkptdError(RuntimeError):
    """An error reported by the ckptd daemon or the client library."""


class DaemonUnavailable(CkptdError):
    """No ckptd daemon answers at the socket."""


class CheckpointNotFound(CkptdError):
    """The job has no such (committed) checkpoint."""


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
    return StateMismatch(
        f"state mismatch at {m['fqn']!r}: the checkpoint stores {stored[0]} "
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
