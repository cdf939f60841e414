"""Tensors that share storage, saved once.

A state dict can name the same memory twice: tied weights (an embedding and
the output projection), a view and its base, FSDP2 parameters registered
under two names. DCP writes each name's bytes; ckptd.torch writes the bytes
once and records the other names as aliases (`index.Alias`) of the one
written, so they cost no storage and no staging.

A tensor B is saved as an alias of A when both live in the same storage,
have the same dtype, A is contiguous (so an element of B is A's flat element
at B's storage offset minus A's), and B's elements all lie inside A's. A
DTensor is an alias only of a DTensor with the same local tensor (same
storage, offset, shape, strides) and the same global box. Candidates for A
are taken largest first, ties by fqn, so every rank that holds the same
tensors picks the same base. Anything else is saved under its own name
(correct, just not deduplicated).

A load fills the destination in place, so destination tensors that share
storage keep sharing; an alias loads from its base's stored chunks.

Thread-safety: pure functions.
"""

from typing import Dict, Mapping

from ckptd.index import Alias


def _span(t):
    """(first, last) element of t in its storage, or None if it has none or
    a negative stride."""
    if t.numel() == 0 or any(s < 0 for s in t.stride()):
        return None
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.storage_offset(), last


def find_aliases(entries: Mapping[str, "object"], dtype_names: Mapping) -> Dict[str, Alias]:
    """{alias fqn: Alias} among `entries` ({fqn: TensorEntry}, tensor_entry.py);
    the bases stay entries of their own."""
    groups: Dict[int, list] = {}
    for fqn, e in entries.items():
        if e.local.numel() == 0:
            continue
        groups.setdefault(e.local.untyped_storage().data_ptr(), []).append(fqn)
    aliases: Dict[str, Alias] = {}
    for fqns in groups.values():
        if len(fqns) < 2:
            continue
        fqns.sort(key=lambda f: (-entries[f].local.numel(), f))
        bases = []
        for fqn in fqns:
            b = entries[fqn]
            found = None
            for base in bases:
                found = _alias_of(base, entries[base], fqn, b, dtype_names)
                if found is not None:
                    break
            if found is None:
                bases.append(fqn)
            else:
                aliases[fqn] = found
    return aliases


def _alias_of(base_fqn, a, fqn, b, dtype_names):
    ta, tb = a.local, b.local
    if ta.dtype != tb.dtype or not ta.is_contiguous():
        return None
    if a.is_dtensor or b.is_dtensor:
        same = (a.is_dtensor and b.is_dtensor and ta.data_ptr() == tb.data_ptr()
                and ta.shape == tb.shape and ta.stride() == tb.stride()
                and list(a.global_shape) == list(b.global_shape)
                and list(a.offsets) == list(b.offsets))
        if not same:
            return None
        return Alias(base_fqn, 0, tuple(tb.shape), tuple(tb.stride()),
                     tuple(a.global_shape), dtype_names[str(ta.dtype)], True)
    span_a, span_b = _span(ta), _span(tb)
    if span_a is None or span_b is None:
        return None
    if not (span_a[0] <= span_b[0] and span_b[1] <= span_a[1]):
        return None
    offset = span_b[0] - span_a[0]
    whole = offset == 0 and tb.shape == ta.shape and tb.is_contiguous()
    return Alias(base_fqn, offset, tuple(tb.shape), tuple(tb.stride()),
                 tuple(ta.shape), dtype_names[str(ta.dtype)], whole)
