"""Immutable state records: what a sampler's kernel and its adaptation carry from one step to
the next, as named fields of tensors (and counts), updated by building a new record
(``state._replace(z=...)``), never in place.

A record is a ``typing.NamedTuple``: named (``state.z``, not ``state[0]``), immutable, cheap to
build every step, and a pytree to ``torch.utils._pytree`` and ``torch.compile``. Its fields are
tensors, Python numbers, tuples of tensors, or other records. A checkpoint is the record itself:
:func:`to_tree` writes it as nested dicts of CPU tensors (what ``torch.load(weights_only=True)``
reads back, and what the checkpoint's SHA-256 covers), :func:`from_tree` builds it again on the
run's device, finding nested record types from the class's annotations, so that a new field is
written in one place only: the class.
"""

from __future__ import annotations

import typing

import torch

__all__ = ["is_record", "to_tree", "from_tree", "where"]


def is_record(value) -> bool:
    """Whether ``value`` (an instance or a class) is a record: a ``NamedTuple``."""
    cls = value if isinstance(value, type) else type(value)
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def to_tree(value):
    """``value`` as a checkpoint holds it: a record as a dict of its fields, tensors detached on
    the CPU, tuples of tensors as lists, numbers and ``None`` as they are."""
    if is_record(value):
        return {name: to_tree(getattr(value, name)) for name in value._fields}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (tuple, list)):
        return [to_tree(v) for v in value]
    return value


def _field_types(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that does not resolve: no nested records
        return {}


def from_tree(cls, tree, device=None):
    """The record of type ``cls`` that :func:`to_tree` wrote as ``tree``, its tensors on
    ``device``; a field annotated with another record type is built as one."""
    if not isinstance(tree, dict) or set(tree) != set(cls._fields):
        names = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
        raise ValueError(f"a saved {cls.__name__} has the fields {names}, this one {sorted(cls._fields)}")
    types = _field_types(cls)
    values = {}
    for name in cls._fields:
        kind, value = types.get(name), tree[name]
        if isinstance(kind, type) and is_record(kind):
            values[name] = from_tree(kind, value, device)
        else:
            values[name] = _values(value, device)
    return cls(**values)


def _values(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return tuple(_values(v, device) for v in value)
    return value


def where(mask, a, b):
    """Per field, as ``torch.where``: ``a``'s where the 0-d or per-chain ``mask`` holds, else
    ``b``'s (records of the same type; a per-chain mask is broadcast over each field's trailing
    dimensions; a field that is not a tensor is ``a``'s)."""
    def pick(u, v):
        if not isinstance(u, torch.Tensor):
            return u
        m = mask.reshape(mask.shape + (1,) * (u.dim() - mask.dim())) if mask.dim() else mask
        return torch.where(m, u, v)

    return type(a)(*(pick(u, v) for u, v in zip(a, b)))
