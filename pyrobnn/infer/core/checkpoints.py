"""Checkpoints of long runs (NUTS, MCLMC, deep ensembles, SWAG, SG-MCMC), so that a killed run
loses nothing.

A method called with ``checkpoint=path``, or ``checkpoint=Checkpointing(path, every=..., seconds=...)``
(:class:`Checkpointing`, the one options object every method takes), writes its whole state to
``path`` every ``every`` iterations (draws, steps or epochs, as the method counts) or ``seconds``
seconds, whichever comes first, and when it ends. The same call with the
same path reads that state and goes on from it: the random generators, adaptation, optimizer
moments and draws so far are all in the state, so the resumed run gives bit-exactly the result of
an uninterrupted one; a finished run's file returns its result at once. The file records what
the run was (the method, its settings, a hash of the data and of the starting points, the
model's structure), and a call that differs is refused, naming what differs, instead of going
on from another run's state. Files are written atomically and read with
``torch.load(weights_only=True)``; a file whose stored SHA-256 of its state does not match is
refused as corrupted, never resumed from.

While a checkpointed run is in its loop, SIGTERM and SIGINT stop it after the iteration it is in,
with its state written (:mod:`pyrobnn.infer.core.interrupts`). A write that fails (a full disk)
does not end the run: it warns, naming the file and why, and goes on; the file keeps the state
written before (atomic writes), and the next write tries again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import time
import warnings
from typing import Optional

import torch

from pyrobnn.infer.core.interrupts import RunInterrupted, stop_signals
from pyrobnn.infer.results.protocol import structure
from pyrobnn.utils.io import WriteError, atomic_save, safe_load, unwritable_reason
from pyrobnn.utils.validation import check_positive_int, check_positive_number

__all__ = ["Checkpointing", "RunCheckpoint", "digest", "state_digest", "watching", "FORMAT"]

FORMAT = "pyrobnn-run-checkpoint"
#: 2: a sampler's state is the runner's records (:mod:`pyrobnn.infer.core.runner`); 1 is refused
VERSION = 2
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
        shape = tuple(t.shape)
        t = t.reshape(-1)
        h.update(f"{shape}{t.dtype}".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy())  # the buffer itself, not a copy
    return h.hexdigest()


def state_digest(state) -> str:
    """SHA-256 of a nested state (dicts, lists, tensors, plain values), in a fixed order: what a
    checkpoint stores beside its state so that a flipped byte is found before a resume."""
    h = hashlib.sha256()

    def visit(value):
        if isinstance(value, torch.Tensor):
            h.update(b"T")
            h.update(digest(value).encode())
        elif isinstance(value, dict):
            h.update(f"D{len(value)}".encode())
            for k in sorted(value, key=repr):
                h.update(repr(k).encode())
                visit(value[k])
        elif isinstance(value, (list, tuple)):
            h.update(f"L{len(value)}".encode())
            for v in value:
                visit(v)
        else:
            h.update(f"V{value!r}".encode())

    visit(state)
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Where and how often a long run writes its state: to ``path``, after every ``every``
    iterations (draws, steps or epochs, as the method counts; ``None``: by time alone) or once
    ``seconds`` have passed since the last write, whichever comes first, and always at the end.
    Every method that checkpoints takes it as ``checkpoint=``, or a bare path for the defaults."""

    path: str
    every: Optional[int] = None
    seconds: float = 60.0

    def __post_init__(self):
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise TypeError(f"Checkpointing's path must be a file path (a str or os.PathLike), got {self.path!r}")
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.every is not None:
            check_positive_int("every", self.every)
        check_positive_number("seconds", self.seconds)

    @classmethod
    def of(cls, checkpoint) -> "Optional[Checkpointing]":
        """``checkpoint`` as a method's argument takes it: ``None`` (no checkpoints), a path, or a
        :class:`Checkpointing`; a path that cannot be written (a folder, a folder without write
        permission) is refused here, before the run does any work (:meth:`check_writable`)."""
        if checkpoint is None:
            return None
        if isinstance(checkpoint, (str, os.PathLike)):
            checkpoint = cls(checkpoint)
        elif not isinstance(checkpoint, Checkpointing):
            raise TypeError(f"checkpoint must be a file path or a Checkpointing(path, every=..., seconds=...), got {type(checkpoint).__name__}")
        checkpoint.check_writable()
        return checkpoint

    def check_writable(self) -> None:
        """Refuse a path the run could never write its state to, naming it and why (a write that
        fails during the run, a full disk, only warns: the run goes on)."""
        reason = unwritable_reason(self.path)
        if reason is not None:
            raise ValueError(f"checkpoint {self.path} cannot be written: {reason}; pass another path")

    def with_suffix(self, suffix: str) -> "Checkpointing":
        """The same options for the file ``path + suffix`` (a process group's, a MAP's)."""
        return dataclasses.replace(self, path=self.path + suffix)

    def due(self, count: int, last_write: float) -> bool:
        """Whether the state after ``count`` iterations is to be written, the last write having
        been at ``time.monotonic()`` = ``last_write``."""
        if self.every is not None and count % self.every == 0:
            return True
        return time.monotonic() - last_write >= self.seconds


class RunCheckpoint:
    """The checkpoint of one run: where and how often (a :class:`Checkpointing`, or ``None``:
    none is written) and the run's ``identity`` (plain values that must agree for a resume).
    A subclass may write another ``FORMAT`` and say where a run stands and how it resumes in its
    own words (:meth:`position`, :meth:`resume_hint`)."""

    #: what the file says it is, and what its kind is called; :meth:`read` refuses another
    FORMAT, DESCRIPTION = FORMAT, "run checkpoint"

    def __init__(self, checkpointing, kind: str, identity: dict):
        self.options = checkpointing if checkpointing is None or isinstance(checkpointing, Checkpointing) else Checkpointing.of(checkpointing)
        self.path = None if self.options is None else self.options.path
        self.kind, self.identity = kind, identity
        self._last = time.monotonic()
        #: the iteration count of the state in the file (written or read), ``None`` if none
        self.written = None
        self._stop = None
        self._write_failure = None

    @classmethod
    def of_run(cls, checkpointing, kind: str, settings: dict, model, data, start) -> "RunCheckpoint":
        """The checkpoint of a run of ``model`` with these ``settings`` on the tensors ``data``
        from the positions ``start``: its identity is the settings, SHA-256 hashes of the data
        and the start, and the model's structure."""
        identity = dict(settings, data=digest(*data), start=digest(start), structure=structure(model))
        return cls(checkpointing, kind, identity)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    @classmethod
    def read(cls, path) -> dict:
        """The file at ``path``, read without running code from it; a file of another format
        is refused."""
        obj = safe_load(path, map_location="cpu")
        if not isinstance(obj, dict) or obj.get("format") != cls.FORMAT:
            raise ValueError(f"{path} is not a pyrobnn {cls.DESCRIPTION}: pass another checkpoint path")
        return obj

    @staticmethod
    def check_digest(obj: dict, path) -> None:
        """Refuse a file whose state does not match its stored SHA-256 (a flipped byte)."""
        if "sha256" in obj and state_digest(obj.get("state")) != obj["sha256"]:
            raise ValueError(f"{path} is corrupted (its state does not match its SHA-256): remove the file or pass another checkpoint path")

    def load(self):
        """The saved state of this run, or ``None`` when there is no file yet."""
        if self.path is None or not os.path.exists(self.path):
            return None
        obj = self.read(self.path)
        if obj.get("version") != VERSION:
            raise ValueError(f"{self.path} has checkpoint format version {obj.get('version')}; this pyrobnn reads {VERSION}")
        if obj.get("kind") != self.kind:
            raise ValueError(f"{self.path} holds a {obj.get('kind')} run, not a {self.kind} run: pass another checkpoint path")
        self.check_digest(obj, self.path)
        saved = obj.get("identity", {})
        # the settings first: a different seed changes the starting points too
        for key in sorted(set(saved) | set(self.identity), key=lambda k: (k in _DERIVED, k)):
            if saved.get(key) != self.identity.get(key):
                what = _DERIVED.get(key) or f"{key} is {saved.get(key)!r} there and {self.identity.get(key)!r} here"
                raise ValueError(f"{self.path} was written by another {self.kind} run: {what}; remove the file or pass another checkpoint path")
        self.written = obj.get("count")
        return obj["state"]

    def due(self, count: int) -> bool:
        """Whether the state after ``count`` iterations is to be written."""
        return self.options is not None and self.options.due(count, self._last)

    def save(self, state: dict, count=None) -> None:
        """Write ``state`` (tensors and plain values), the state after ``count`` iterations,
        atomically, with the SHA-256 of the state."""
        if self.path is None:
            return
        atomic_save({
            "format": self.FORMAT, "version": VERSION, "kind": self.kind, "identity": self.identity, "count": count,
            "sha256": state_digest(state), "state": state,
        }, self.path)
        self._last = time.monotonic()
        self.written = count

    @contextlib.contextmanager
    def stoppable(self):
        """The run's loop: SIGTERM and SIGINT are recorded, for :meth:`after` to act on (when a
        checkpoint is written; otherwise they act as they always do)."""
        with stop_signals(self.enabled) as request:
            self._stop = request
            try:
                yield request
            finally:
                self._stop = None

    @property
    def stop_requested(self) -> bool:
        return self._stop is not None and self._stop.requested

    def after(self, count: int, state_fn, *, last: bool = False, resumable: bool = True, unit: str = "iterations",
              now: bool = False) -> None:
        """The end of iteration ``count``: the state ``state_fn()`` is written when due, at the
        ``last`` iteration, ``now`` (the last state before a stretch that cannot be written), or
        when a stop signal came (then :class:`RunInterrupted` is raised). A state that cannot be
        written here (not ``resumable``) is not; a stop then leaves the state written last."""
        stop = self.stop_requested
        written = False
        if resumable and (last or stop or now or self.due(count)):
            written = self.try_save(state_fn, count, unit)
        if stop:
            raise self.interrupted(count, unit, finished=last and written)

    def try_save(self, state_fn, count: int, unit: str) -> bool:
        """:meth:`save`, warning instead of raising where the file cannot be written (the run
        goes on; the file keeps its earlier state)."""
        try:
            self.save(state_fn(), count)
            self._write_failure = None
            return True
        except WriteError as e:
            if self._write_failure is None:  # once until a write succeeds again
                held = f"it holds the state after {self.position(self.written, unit)}" if self.written is not None else "no state is saved"
                warnings.warn(f"{self.kind}: the state after {self.position(count, unit)} was not saved: {e}; the run goes on ({held}), "
                              "and each later write tries again", stacklevel=3)
            self._write_failure = str(e)
            return False

    def position(self, count: int, unit: str) -> str:
        """Where a run stands after ``count`` iterations, as the messages say it (``"25 steps"``)."""
        return f"{count} {unit}"

    def resume_hint(self, finished: bool = False) -> str:
        """The call that goes on from the file (that returns the result, for a ``finished`` run)."""
        return f"the same call with checkpoint={self.path!r} " + ("returns it at once" if finished else "resumes from there")

    def stop_overdue(self) -> bool:
        """A stop signal came :data:`~pyrobnn.infer.core.interrupts.GRACE_SECONDS` ago or
        more: a loop that can write its state only at the end of an epoch stops where it is."""
        return self._stop is not None and self._stop.overdue()

    def interrupted(self, count: int, unit: str = "iterations", finished: bool = False) -> RunInterrupted:
        """The :class:`RunInterrupted` for a stop after ``count`` iterations, saying what is in
        the file and how to resume."""
        name = self._stop.signal_name if self._stop is not None else "a signal"
        failure = f" (its state at the stop could not be written: {self._write_failure})" if self._write_failure else ""
        if finished:
            text = f"{self.kind} finished as {name} came; its result is in {self.path}: {self.resume_hint(finished=True)}"
        elif self.written is None:
            text = (f"{self.kind} stopped by {name} after {self.position(count, unit)}{failure}; no state had been written to {self.path} yet: "
                    "the same call starts over")
        else:
            lost = f" (the {count - self.written} {unit} after it are run again)" if count > self.written else ""
            text = (f"{self.kind} stopped by {name} after {self.position(count, unit)}{failure}; its state after "
                    f"{self.position(self.written, unit)} is in {self.path}{lost}: {self.resume_hint()}")
        return RunInterrupted(text, signal_name=name, path=self.path if self.written is not None else None, done=self.written)


def watching(checkpoint):
    """``checkpoint.stoppable()`` for a :class:`RunCheckpoint`, nothing for ``None``."""
    return checkpoint.stoppable() if checkpoint is not None else contextlib.nullcontext()
