"""Saving again to a checkpoint name (DCP's overwrite), atomically.

DCP's file system writer overwrites a checkpoint directory in place: a
reader during the second save, or after a crash in it, sees a mixture of
the two. ckptd never rewrites a committed checkpoint. A save to a name that
is already taken is stored as a new *generation* of it, "NAME~N"
(common/names.h: '~' is outside the characters of a plain name, so no
name a user chose reads as a generation of another), committed as any
checkpoint is, and:

- a reader of NAME takes its newest committed generation: the old
  checkpoint until the new one is committed, the new one from then on,
  never a mixture;
- the daemon deletes the older generations once the new one has committed
  (storage/retention.h, in both tiers), after any load reading them ends;
- `list_checkpoints` and `latest_checkpoint` show NAME, not NAME~N.

Which generation a save takes is decided by the first rank of the save's
group alone, and reaches the others in the replica exchange the save makes
anyway (replica_exchange.py): every rank names the same one, with no
collective of its own and no listing on the other ranks. That rank lists
the job's checkpoints once (every tier, at its first save) and then counts
its own saves: a process saves into its job alone (job ownership), so what
it saved is all that changed since.

Thread-safety: Generations is used by one thread (the submit thread).
"""

from typing import Callable, Dict, Iterable, List, Optional, Tuple

SEPARATOR = "~"
MAX_NAME_LENGTH = 128  # kMaxStorageNameLength, common/names.h
# decide()'s answer for a taken name that may not be overwritten.
EXISTS = -1


def split(name: str) -> Tuple[str, int]:
    """(base name, generation): ("step-1~3") -> ("step-1", 3); a plain name
    is generation 0."""
    base, sep, digits = name.rpartition(SEPARATOR)
    if (sep and base and digits.isdigit() and digits.isascii() and digits[0] != "0"
            and len(digits) <= 18):
        return base, int(digits)
    return name, 0


def storage_name(base: str, generation: int) -> str:
    """The name generation `generation` of `base` is stored under."""
    if generation == 0:
        return base
    name = f"{base}{SEPARATOR}{generation}"
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"checkpoint {base!r} is saved again, as generation {generation}, and "
            f"{name!r} is longer than {MAX_NAME_LENGTH} characters: use a shorter name")
    return name


def newest_committed(entries: Iterable[dict], base: str) -> Optional[dict]:
    """The committed entry of a list (Client.list()) with the highest
    generation of `base`, or None."""
    best, best_generation = None, -1
    for e in entries:
        b, g = split(e["checkpoint"])
        if b == base and e["committed"] and g > best_generation:
            best, best_generation = e, g
    return best


def visible(entries: Iterable[dict]) -> List[dict]:
    """The committed entries a reader sees: each name's newest committed
    generation, oldest commit first."""
    newest: Dict[str, Tuple[int, dict]] = {}
    for e in entries:
        if not e["committed"]:
            continue
        base, g = split(e["checkpoint"])
        if base not in newest or g > newest[base][0]:
            newest[base] = (g, e)
    out = [e for _, e in newest.values()]
    out.sort(key=lambda e: (e["committed_unix_micros"], e["checkpoint"]))
    return out


class Generations:
    """Which generation the next save to a name takes, on the rank that
    decides it (the module comment)."""

    def __init__(self):
        # Per name: the highest generation that exists (committed or not:
        # a remnant's name is not reused) or was given out here.
        self._highest: Optional[Dict[str, int]] = None
        self._committed: Optional[set] = None

    def decide(self, base: str, overwrite: bool, list_job: Callable[[], List[dict]]) -> int:
        """The generation a save to `base` takes (0: the plain name, which
        is free), or EXISTS if the name is committed and `overwrite` is
        False. Calls list_job() (every checkpoint of the job, Client.list())
        on first use; its error propagates, and the next call lists again."""
        if self._highest is None:
            highest: Dict[str, int] = {}
            committed = set()
            for e in list_job():
                b, g = split(e["checkpoint"])
                highest[b] = max(highest.get(b, -1), g)
                if e["committed"]:
                    committed.add(b)
            self._highest, self._committed = highest, committed
        if base not in self._highest:
            return 0
        if not overwrite and base in self._committed:
            return EXISTS
        return self._highest[base] + 1

    def given(self, base: str, generation: int) -> None:
        """Records that a save to `base` took `generation` (decided here or
        by another rank)."""
        if self._highest is None or generation < 0:
            return
        self._highest[base] = max(self._highest.get(base, -1), generation)
        # Counted as taken from now on: a later save to it is a new
        # generation even if this one fails (no name is used twice).
        self._committed.add(base)
