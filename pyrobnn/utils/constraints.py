"""What a method's arguments may be, declared once beside the method (its
:class:`~pyrobnn.methods.MethodSpec`) and checked once at the call, before any work, as
scikit-learn's ``_parameter_constraints``: the refusal, its message and the documentation's
table of budgets come from the one declaration.

A constraint answers :meth:`Constraint.error` with ``None`` for a value it takes, else the
message that names the argument, what it must be and what it got. :class:`Budget` is an
integer budget (the smallest a method runs with, which the conformance suite runs), and
:class:`Either` joins alternatives (a number or ``"auto"``, a positive number or ``None``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["Constraint", "Budget", "Positive", "PositiveInt", "NonNegative", "Interval", "OneOf", "Flag", "Either", "Phases", "PositiveValues"]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Constraint:
    """One argument's constraint: :meth:`error` gives ``None`` for a value it takes, else the
    message; :attr:`description` says what it takes (``"a finite positive number"``)."""

    description = ""
    #: the smallest value of an integer budget (``None``: not a budget)
    least: Optional[int] = None

    def takes(self, value) -> bool:
        raise NotImplementedError

    def error(self, method: str, name: str, value) -> Optional[str]:
        if self.takes(value):
            return None
        return f"{name} must be {self.description}, got {self.got(value)}"

    def got(self, value) -> str:
        """What a refused value was, for the message: its ``repr`` unless the constraint says
        better (an array's shape, not its entries)."""
        return repr(value)


@dataclass(frozen=True)
class Budget(Constraint):
    """An integer of at least ``least``: how many draws, steps, chains, members or epochs."""

    least: int = 1

    @property
    def description(self) -> str:
        return f"an integer >= {self.least}"

    def takes(self, value) -> bool:
        return _is_int(value) and value >= self.least

    def error(self, method, name, value):
        return None if self.takes(value) else f"{method}: {name} must be {self.description}, got {value!r}"


@dataclass(frozen=True)
class Positive(Constraint):
    """A positive real number, ``finite`` unless told otherwise (a clipping radius may be
    infinite); ``description`` words it where a method's messages always have."""

    finite: bool = True
    description: str = ""

    def __post_init__(self):
        if not self.description:
            object.__setattr__(self, "description", "a finite positive number" if self.finite else "a positive number")

    def takes(self, value) -> bool:
        return _is_real(value) and value > 0 and (math.isfinite(value) or not self.finite) and not math.isnan(value)


@dataclass(frozen=True)
class PositiveInt(Constraint):
    """A positive integer (not a budget of the conformance suite: a count of processes)."""

    description = "a positive integer"

    def takes(self, value) -> bool:
        return _is_int(value) and value >= 1


@dataclass(frozen=True)
class NonNegative(Constraint):
    """A finite non-negative real number."""

    description = "a finite non-negative number"

    def takes(self, value) -> bool:
        return _is_real(value) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class Interval(Constraint):
    """A finite real number between ``low`` and ``high``, each end open or ``closed``
    (``"neither"``, ``"left"``, ``"right"``, ``"both"``); ``what`` names the kind of number
    (``"a fraction"``), if the message should."""

    low: float
    high: float
    closed: str = "neither"
    what: str = ""

    @property
    def description(self) -> str:
        left = "[" if self.closed in ("left", "both") else "("
        right = "]" if self.closed in ("right", "both") else ")"
        return f"{self.what + ' ' if self.what else ''}in {left}{self.low:g}, {self.high:g}{right}"

    def takes(self, value) -> bool:
        if not (_is_real(value) and math.isfinite(value)):
            return False
        above = value >= self.low if self.closed in ("left", "both") else value > self.low
        below = value <= self.high if self.closed in ("right", "both") else value < self.high
        return above and below


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of the ``choices`` (compared by equality)."""

    choices: tuple

    @property
    def description(self) -> str:
        return f"one of {self.choices}"

    def takes(self, value) -> bool:
        return any(value == c and type(value) is type(c) for c in self.choices)


@dataclass(frozen=True)
class Flag(Constraint):
    """``True`` or ``False``."""

    description = "True or False"

    def takes(self, value) -> bool:
        return isinstance(value, bool)


class Either(Constraint):
    """Any of the alternatives: constraints, or plain values taken as they are (``None``,
    ``"auto"``)."""

    def __init__(self, *alternatives):
        self.alternatives = alternatives

    def __repr__(self):
        return f"Either{self.alternatives!r}"

    @property
    def least(self):
        return next((a.least for a in self.alternatives if isinstance(a, Constraint) and a.least is not None), None)

    @property
    def description(self) -> str:
        return " or ".join(a.description if isinstance(a, Constraint) else repr(a) for a in self.alternatives)

    def takes(self, value) -> bool:
        return any(a.takes(value) if isinstance(a, Constraint) else (value is a or (type(value) is type(a) and value == a))
                   for a in self.alternatives)

    def error(self, method, name, value):
        if self.takes(value):
            return None
        budget = next((a for a in self.alternatives if isinstance(a, Budget)), None)
        if budget is not None:  # a budget's message, as every budget's reads
            return f"{method}: {name} must be {self.description}, got {value!r}"
        return f"{name} must be {self.description}, got {self.got(value)}"

    def got(self, value) -> str:
        first = next((a for a in self.alternatives if isinstance(a, Constraint)), None)
        return repr(value) if first is None else first.got(value)


@dataclass(frozen=True)
class PositiveValues(Constraint):
    """A finite positive number, or an array or tensor of them of at most ``most_dims``
    dimensions (one step size per chain, a diagonal mass matrix per chain); ``shape`` words the
    shape an array takes in the message (``"(num_chains,)"``)."""

    most_dims: int = 1
    shape: str = ""

    @property
    def description(self) -> str:
        return f"a finite positive number or an array of them{' of shape ' + self.shape if self.shape else ''}"

    def takes(self, value) -> bool:
        return self.problem(value) is None

    def got(self, value) -> str:
        return self.problem(value) or repr(value)

    def problem(self, value) -> Optional[str]:
        """``None`` for a value it takes, else what is wrong with it (an array by its shape or
        its first bad entry, not by all its entries)."""
        if isinstance(value, bool):
            return repr(value)
        if _is_real(value):
            return None if value > 0 and math.isfinite(value) else repr(value)
        try:
            t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, device="cpu")  # an array: read on the host
        except (TypeError, ValueError, RuntimeError):
            return repr(value) if isinstance(value, str) else f"a value of type {type(value).__name__}"
        if t.dtype == torch.bool or t.is_complex() or t.dim() > self.most_dims:
            return f"a {t.dtype} array of shape {tuple(t.shape)}"
        t = t.detach()
        bad = ~(torch.isfinite(t) & (t > 0))
        count = int(bad.sum())
        if count:
            return f"an array with {count} of its {t.numel()} entries not finite and positive (the first: {t[bad].reshape(-1)[0].item()!r})"
        return None


@dataclass(frozen=True)
class Phases(Constraint):
    """A step budget of at least ``least``, or one such budget per phase (``phases`` of them:
    MCLMC's three tuning phases)."""

    phases: int = 3
    least: int = 0

    @property
    def description(self) -> str:
        return f"a number of steps or the steps of the {'three' if self.phases == 3 else self.phases} tuning phases"

    def takes(self, value) -> bool:
        return self.error("", "", value) is None

    def error(self, method, name, value):
        budget = Budget(self.least)
        if isinstance(value, (tuple, list)):
            if len(value) != self.phases:
                return f"{method}: {name} must be {self.description}, got {value!r}"
            return next((budget.error(method, name, v) for v in value if not budget.takes(v)), None)
        return budget.error(method, name, value)
