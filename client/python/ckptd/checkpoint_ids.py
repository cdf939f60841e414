"""DCP's checkpoint_id as a path, mapped to ckptd's job and checkpoint name.

DCP takes `checkpoint_id` as a path (`f"{folder}/step-{n}"`; torchtitan joins
its folder and `step-N`); ckptd stores checkpoints as `<job>/<name>` under
the daemon's root, where both are names of [A-Za-z0-9._-] (common/names.h).
The mapping, reversible (`checkpoint_path` gives the path back):

- a `str` without '/' is a name, as before: the job comes from `job=`
  ($CKPTD_JOB, else "default");
- a path (a `str` with '/', or an `os.PathLike`) is made absolute
  (os.path.abspath: relative to the working directory, as DCP's file system
  writer takes it) and split: its last component is the checkpoint's name,
  verbatim (it must be a valid name), and its directory becomes the job,
  encoded: '_' escapes, so '_' is written '__', '/' is written '_-', and
  every other byte outside [A-Za-z0-9.-] (and the second '.' of "..") is
  written '_' and its two lowercase hex digits. `/ckpt/llama/step-100` is
  job `_-ckpt_-llama`, checkpoint `step-100`; `.../latest` loads the newest.

Such a job names no directory: the files live under the daemon's root like
every job's. A path job starts with "_-" (the encoded leading '/'), which
tells it from a job named by hand. An explicit `job=` that differs from the
path's is refused (the path decides; a silent choice would save where the
other rank does not look).

Thread-safety: pure functions.
"""

import os
import re
from typing import Optional, Tuple

_PLAIN = re.compile(r"[A-Za-z0-9.\-]")
_NAME = re.compile(r"[A-Za-z0-9._\-]+")
MAX_NAME_LENGTH = 128  # kMaxStorageNameLength, common/names.h
PATH_JOB_PREFIX = "_-"


def encode_directory(directory: str) -> str:
    out = []
    previous = ""
    for byte in os.fsencode(directory):
        c = chr(byte)
        if c == "_":
            out.append("__")
        elif c == "/":
            out.append("_-")
        elif _PLAIN.fullmatch(c) and not (c == "." and previous == "."):
            out.append(c)
        else:
            out.append(f"_{byte:02x}")
        previous = c
    return "".join(out)


def decode_job(job: str) -> Optional[str]:
    """The directory a path job stands for, or None for a job named by hand
    (or a string no path encodes to)."""
    if not job.startswith(PATH_JOB_PREFIX):
        return None
    out = bytearray()
    i = 0
    while i < len(job):
        c = job[i]
        if c != "_":
            out += c.encode()
            i += 1
            continue
        nxt = job[i + 1:i + 2]
        if nxt == "_":
            out += b"_"
            i += 2
        elif nxt == "-":
            out += b"/"
            i += 2
        elif re.fullmatch(r"[0-9a-f]{2}", job[i + 1:i + 3]):
            out.append(int(job[i + 1:i + 3], 16))
            i += 3
        else:
            return None
    return os.fsdecode(bytes(out))


def resolve(checkpoint_id, job: Optional[str]) -> Tuple[Optional[str], str]:
    """(job, checkpoint name) for a DCP-style `checkpoint_id`; job None
    means: the caller's default. Raises ValueError naming the rule broken."""
    is_path = isinstance(checkpoint_id, os.PathLike) or (
        isinstance(checkpoint_id, str) and "/" in checkpoint_id)
    if not is_path:
        if not isinstance(checkpoint_id, str):
            raise ValueError(f"checkpoint_id must be a name or a path, not "
                             f"{type(checkpoint_id).__name__}")
        return job, checkpoint_id
    path = os.path.abspath(os.fspath(checkpoint_id))
    directory, name = os.path.split(path)
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"checkpoint_id {checkpoint_id!r}: its last component "
                         f"{name!r} is the checkpoint's name, which may only contain "
                         f"[A-Za-z0-9._-]")
    path_job = encode_directory(directory)
    if len(path_job) > MAX_NAME_LENGTH:
        raise ValueError(f"checkpoint_id {checkpoint_id!r}: its directory encodes to a "
                         f"job name of {len(path_job)} characters, over "
                         f"{MAX_NAME_LENGTH}; pass job= and a name instead")
    if job is not None and job != path_job:
        raise ValueError(f"checkpoint_id {checkpoint_id!r} is a path, whose job is "
                         f"{path_job!r}, but job={job!r} was given; pass one or the other")
    return path_job, name


def checkpoint_path(job: str, name: str) -> Optional[str]:
    """The path a (job, name) pair was saved under, or None if the job is
    not a path job."""
    directory = decode_job(job)
    return None if directory is None else os.path.join(directory, name)
