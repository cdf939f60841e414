"""Nested state dicts as DCP flattens them, and values put back in place.

`torch.distributed.checkpoint` saves what `get_state_dict(model, optimizer)`
returns by flattening it to dotted fqns (`flatten_state_dict`, walked by
`_traverse.traverse_state_dict`). ckptd names its items the same way, so a
checkpoint saved here is read under the same names by stock DCP and by
ckptd.torch. The rule, as DCP has it:

- a mapping is always walked; its keys become path parts through str();
- a list is walked only if it holds a tensor, a mapping, or a list that is
  itself walked; otherwise it is one leaf (a plain list of numbers or
  strings is one value);
- anything else (tensors, tuples, numbers, strings, objects) is a leaf.

Empty mappings vanish, as in DCP. Paths keep the original keys (not their
str()), so that `set_leaf` finds an int-keyed entry again.

Thread-safety: pure functions.
"""

from typing import Any, Dict, Mapping, Tuple

Path = Tuple[Any, ...]


def _is_tensor(value) -> bool:
    import torch
    return isinstance(value, torch.Tensor)


def _is_leaf(value) -> bool:
    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    for entry in value:
        if isinstance(entry, (Mapping, list)) and not _is_leaf(entry):
            return False
        if _is_tensor(entry):
            return False
    return True


def flatten(state_dict: Mapping) -> Tuple[Dict[str, Any], Dict[str, Path]]:
    """Returns ({fqn: leaf}, {fqn: path of original keys}); raises on two
    leaves that flatten to the same fqn (DCP refuses those too)."""
    leaves: Dict[str, Any] = {}
    paths: Dict[str, Path] = {}

    def visit(path: Path, value) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(path + (k,), v)
        elif _is_leaf(value):
            fqn = ".".join(str(p) for p in path)
            if fqn in leaves:
                raise ValueError(f"two entries of the state dict flatten to {fqn!r}")
            leaves[fqn] = value
            paths[fqn] = path
        else:  # a list holding tensors or containers
            for i, v in enumerate(value):
                visit(path + (i,), v)

    for key, value in state_dict.items():
        visit((key,), value)
    return leaves, paths


def set_leaf(state_dict, path: Path, value) -> None:
    """Replaces the leaf at `path` (from `flatten`) in the nested dict."""
    container = state_dict
    for key in path[:-1]:
        container = container[key]
    container[path[-1]] = value

