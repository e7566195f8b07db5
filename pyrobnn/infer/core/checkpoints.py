"""Checkpoints of long runs (NUTS, MCLMC, deep ensembles, SWAG, SG-MCMC), so that a killed run
loses nothing.

A method called with ``checkpoint=path`` writes its whole state to ``path`` every
``checkpoint_every`` iterations (draws, steps or epochs, as the method counts) or
``checkpoint_seconds`` seconds, whichever comes first, and when it ends. The same call with the
same path reads that state and goes on from it: the random generators, adaptation, optimizer
moments and draws so far are all in the state, so the resumed run gives bit-exactly the result of
an uninterrupted one; a finished run's file returns its result at once. The file records what
the run was (the method, its settings, a hash of the data and of the starting points, the
model's structure), and a call that differs is refused, naming what differs, instead of going
on from another run's state. Files are written atomically and read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch

from pyrobnn.utils.validation import check_positive_int, check_positive_number

__all__ = ["RunCheckpoint", "digest", "FORMAT"]

FORMAT = "pyrobnn-run-checkpoint"
VERSION = 1
#: parts of a run's identity that follow from the call, and how a difference reads
_DERIVED = {
    "data": "the training data differ (another SHA-256)",
    "start": "the starting points differ (another SHA-256)",
    "structure": "the model's structure differs",
}


def digest(*tensors) -> str:
    """SHA-256 of the tensors' shapes, dtypes and values (on the CPU)."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class RunCheckpoint:
    """The checkpoint of one run: ``path`` (``None``: none is written), the run's ``identity``
    (plain values that must agree for a resume), and when to write it."""

    def __init__(self, path, kind: str, identity: dict, every=None, seconds: float = 60.0):
        if every is not None:
            check_positive_int("checkpoint_every", every)
        check_positive_number("checkpoint_seconds", seconds)
        self.path = None if path is None else os.fspath(path)
        self.kind, self.identity, self.every, self.seconds = kind, identity, every, float(seconds)
        self._last = time.monotonic()

    @classmethod
    def of_run(cls, path, kind: str, settings: dict, model, data, start, every=None, seconds: float = 60.0) -> "RunCheckpoint":
        """The checkpoint of a run of ``model`` with these ``settings`` on the tensors ``data``
        from the positions ``start``: its identity is the settings, SHA-256 hashes of the data
        and the start, and the model's structure."""
        from pyrobnn.infer.results.protocol import structure

        identity = dict(settings, data=digest(*data), start=digest(start), structure=structure(model))
        return cls(path, kind, identity, every, seconds)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def load(self):
        """The saved state of this run, or ``None`` when there is no file yet."""
        if self.path is None or not os.path.exists(self.path):
            return None
        from pyrobnn.utils.io import safe_load

        obj = safe_load(self.path, map_location="cpu")
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"{self.path} is not a pyrobnn run checkpoint: pass another checkpoint path")
        if obj.get("version") != VERSION:
            raise ValueError(f"{self.path} has checkpoint format version {obj.get('version')}; this pyrobnn reads {VERSION}")
        if obj.get("kind") != self.kind:
            raise ValueError(f"{self.path} holds a {obj.get('kind')} run, not a {self.kind} run: pass another checkpoint path")
        saved = obj.get("identity", {})
        # the settings first: a different seed changes the starting points too
        for key in sorted(set(saved) | set(self.identity), key=lambda k: (k in _DERIVED, k)):
            if saved.get(key) != self.identity.get(key):
                what = _DERIVED.get(key) or f"{key} is {saved.get(key)!r} there and {self.identity.get(key)!r} here"
                raise ValueError(f"{self.path} was written by another {self.kind} run: {what}; remove the file or pass another checkpoint path")
        return obj["state"]

    def due(self, count: int) -> bool:
        """Whether the state after ``count`` iterations is to be written."""
        if self.path is None:
            return False
        if self.every is not None and count % self.every == 0:
            return True
        return time.monotonic() - self._last >= self.seconds

    def save(self, state: dict) -> None:
        """Write ``state`` (tensors and plain values) atomically."""
        if self.path is None:
            return
        from pyrobnn.utils.io import atomic_save

        atomic_save({"format": FORMAT, "version": VERSION, "kind": self.kind, "identity": self.identity, "state": state}, self.path)
        self._last = time.monotonic()

    def maybe_save(self, count: int, state_fn) -> None:
        """Write ``state_fn()`` when :meth:`due` says so."""
        if self.due(count):
            self.save(state_fn())
