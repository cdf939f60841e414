"""The save's index: what ckptd.torch needs at load beyond the tensor items.

Stored as one small byte item, INDEX_FQN, by every rank (byte items are per
rank; a loading rank gets its own rank's copy, or any rank's). It holds:

- values: {fqn: (capacity, length)} of the pickled Python values saved as
  U8 tensor items (`values.py`): the load allocates `capacity` bytes and
  unpickles the first `length`;
- aliases: {fqn: Alias} of tensors saved through another fqn's bytes
  because they share its storage (`storage_sharing.py`).

Every rank writes the entries of every rank (the replica exchange gives each
rank the others' values and aliases), so any rank's copy serves any loading
rank, whatever the new world size.

Plain data only (tuples, ints, strings), pickled: nothing but this package
reads it.

Thread-safety: pure functions.
"""

import dataclasses
import pickle
from typing import Dict, Optional, Tuple

INDEX_FQN = "_ckptd.torch.index"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Alias:
    """`fqn` is the view as_strided(shape, stride, offset) of `base`'s
    contiguous elements; base_shape and dtype say how `base` was saved.
    whole: the alias is all of base, as base (a tied weight, a DTensor
    under two names): it loads straight from base's chunks."""

    base: str
    offset: int
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    base_shape: Tuple[int, ...]
    dtype: str  # safetensors name
    whole: bool


@dataclasses.dataclass
class Index:
    values: Dict[str, Tuple[int, int]] = dataclasses.field(default_factory=dict)
    aliases: Dict[str, Alias] = dataclasses.field(default_factory=dict)

    def encode(self) -> bytes:
        aliases = {k: dataclasses.astuple(a) for k, a in sorted(self.aliases.items())}
        return pickle.dumps({"version": VERSION, "values": dict(sorted(self.values.items())),
                             "aliases": aliases}, protocol=4)

    @staticmethod
    def decode(data: Optional[bytes]) -> "Index":
        if data is None:  # saved without ckptd.torch: tensors only
            return Index()
        d = pickle.loads(data)
        if d.get("version") != VERSION:
            raise ValueError(f"ckptd.torch index version {d.get('version')} "
                             f"(this package reads {VERSION})")
        return Index(values={k: tuple(v) for k, v in d["values"].items()},
                     aliases={k: Alias(*v) for k, v in d["aliases"].items()})
