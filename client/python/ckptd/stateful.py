"""DCP's Stateful protocol: objects asked for their state at save and given
it back at load.

`torch.distributed.checkpoint` takes, beside plain state, objects with
`state_dict()` and `load_state_dict()` (`dcp.stateful.Stateful`: a model, an
optimizer, torchtitan's ModelWrapper and train state, an application's own
state): save calls `state_dict()` and saves what it returns; load calls
`state_dict()`, loads into what it returns in place, and then hands that to
`load_state_dict()`. Pickling such an object as a plain value instead, as
ckptd.torch once did, resumes silently from the live object's old state: the
load replaced the dict entry with the unpickled object and never touched the
live one.

DCP resolves Stateful objects only at the top level of the dict; here they
are resolved at any depth the flattening walks (mappings, and lists that
hold containers or tensors: flatten.py), and inside what a Stateful's own
`state_dict()` returns. The user's containers are never changed by a save:
a container on the way to a Stateful is copied (shallowly), the rest is
shared. At load, the values the load replaced inside those copies are
written back into the user's containers (a non-Stateful value is replaced
in place, as DCP does), and each Stateful's `load_state_dict()` is called
after those nested in it, so a parent is given children already restored
(the objects themselves, in the slots its `state_dict()` returned them in).

Thread-safety: one thread (the caller's); the objects' own methods run on it.
"""

from typing import Any, List, Mapping, Tuple


def is_stateful(value: Any) -> bool:
    """DCP's runtime check (both methods present), less classes and tensors:
    a class has the methods as unbound functions, and a tensor is state."""
    if isinstance(value, type):
        return False
    import torch
    if isinstance(value, torch.Tensor):
        return False
    return (callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None)))


class ResolvedState:
    """A state dict with every Stateful object replaced by its resolved
    `state_dict()`, and what a load needs to finish into the objects."""

    def __init__(self, state_dict: Mapping):
        # (object, its resolved state dict, (container, key) it came from or
        # None at the top), in post-order: nested objects before their parent.
        self._objects: List[Tuple[Any, Any, Any]] = []
        # (user container, our copy, keys whose child was shared, not
        # resolved): a load may replace those children in the copy.
        self._copies: List[Tuple[Any, Any, List[Any]]] = []
        self.state_dict = self._resolve(state_dict, None)

    @property
    def has_stateful(self) -> bool:
        return bool(self._objects)

    def _resolve(self, value: Any, slot) -> Any:
        if is_stateful(value):
            inner = value.state_dict()
            if not isinstance(inner, Mapping):
                raise ValueError(
                    f"{type(value).__name__}.state_dict() returned a "
                    f"{type(inner).__name__}, not a mapping (the Stateful protocol)")
            resolved = self._resolve(inner, None)
            self._objects.append((value, resolved, slot))
            return resolved
        if isinstance(value, Mapping):
            keys = list(value.keys())
            copy = {}
            # Objects are resolved, and later loaded, in the keys' sorted
            # order, as DCP's load does: ranks whose dicts list the keys in
            # other orders then call load_state_dict() (which may run
            # collectives) in one order, not into a deadlock (PyTorch's
            # test_different_ordered_state_dict_keys). The copy keeps the
            # user's order.
            resolved = {k: self._resolve(value[k], (copy, k)) for k in _in_order(keys)}
            for k in keys:
                copy[k] = resolved[k]
            return self._copied_or_same(value, copy, keys)
        if isinstance(value, list) and _walked(value):
            copy = [None] * len(value)
            for i, v in enumerate(value):
                copy[i] = self._resolve(v, (copy, i))
            return self._copied_or_same(value, copy, range(len(value)))
        return value

    def _copied_or_same(self, original, copy, keys):
        shared = [k for k in keys if copy[k] is original[k]]
        if len(shared) == len(copy):
            return original  # nothing under it resolved: the user's own
        self._copies.append((original, copy, shared))
        return copy

    def finish_load(self) -> None:
        """After a load into `state_dict` in place: the replaced values into
        the user's containers, then each object's load_state_dict(), nested
        ones first."""
        for original, copy, shared in self._copies:
            for k in shared:
                if copy[k] is not original[k]:
                    original[k] = copy[k]
        for obj, resolved, slot in self._objects:
            obj.load_state_dict(resolved)
            if slot is not None:
                # A parent Stateful (or a container on the way to it) gets
                # the restored object back where its state_dict() had it.
                container, key = slot
                container[key] = obj


def _in_order(keys: list) -> list:
    """`keys` sorted, where they sort (str keys do); else as given."""
    try:
        return sorted(keys)
    except TypeError:
        return keys


def _walked(value: list) -> bool:
    """Whether flatten.py walks into this list (it holds a tensor or a
    container it walks), or a Stateful is in it (resolved into a mapping,
    which makes the list walked)."""
    from ckptd.flatten import _is_leaf
    return not _is_leaf(value) or any(is_stateful(v) for v in value)
