"""The test problems of the Bayesian-optimization benchmarks (``bayesopt.py``, regret;
``bo_calibration.py``, the predictive away from the data), in one place: each a function on the
unit cube, maximized, with its dimension and, for one objective, its optimal value.

The split is fixed before any default is chosen: :data:`DEVELOPMENT` (where defaults may be
tuned), :data:`HELD_OUT` (only reported) and :data:`REGIMES`, where BNN surrogates should do well
(Li, Rudner, Wilson et al. 2024): Branin in 2 of 40 inputs (high-dimensional, low effective
dimension), Gramacy & Lee's (2008) non-stationary :math:`x_1 \\exp(-x_1^2 - x_2^2)` on
:math:`[-2, 6]^2` (flat almost everywhere, a bump in one corner), and Branin-Currin's two outputs.
BoTorch's test functions are negated (BoTorch maximizes), as is Gramacy & Lee's (its minimum,
:math:`-e^{-1/2}/\\sqrt 2` at :math:`(-1/\\sqrt 2, 0)`, is the maximum here; the calibration figures of docs/bayesopt.md of 2026-11-26 were measured on
it unnegated, which the surrogates' sign-symmetric priors score alike in law).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

DEVELOPMENT = ["branin", "hartmann6", "ackley10", "levy20"]
HELD_OUT = ["rosenbrock5", "levy4", "griewank8", "styblinskitang10"]
REGIMES = ["branin_embed40", "gramacylee2", "branincurrin"]


@dataclass
class Problem:
    """``f`` maps ``(n, d)`` points of the unit cube to ``(n, m)`` outcomes (maximized);
    ``optimum`` is the largest value of a single objective (``None`` with several)."""

    f: Callable
    d: int
    optimum: Optional[float]


def problem(name: str) -> Problem:
    from botorch.test_functions import Ackley, Branin, Griewank, Hartmann, Levy, Rosenbrock, StyblinskiTang
    from botorch.test_functions.multi_objective import BraninCurrin

    if name == "branin_embed40":
        branin = Branin(negate=True)
        low, high = branin.bounds.to(torch.float64)
        return Problem(lambda x: branin(low + x[:, :2] * (high - low)).unsqueeze(-1), 40, float(branin.optimal_value))
    if name == "gramacylee2":
        def negated_gramacy_lee(x):
            z = -2 + 8 * x
            return -(z[:, :1] * torch.exp(-(z**2).sum(-1, keepdim=True)))
        return Problem(negated_gramacy_lee, 2, math.exp(-0.5) / math.sqrt(2))
    if name == "branincurrin":
        fn = BraninCurrin(negate=True)
        return Problem(lambda x: fn(x), 2, None)  # its domain is the unit cube
    make = {
        "branin": lambda: Branin(negate=True), "hartmann6": lambda: Hartmann(dim=6, negate=True),
        "ackley10": lambda: Ackley(dim=10, negate=True), "levy20": lambda: Levy(dim=20, negate=True),
        "rosenbrock5": lambda: Rosenbrock(dim=5, negate=True), "levy4": lambda: Levy(dim=4, negate=True),
        "griewank8": lambda: Griewank(dim=8, negate=True), "styblinskitang10": lambda: StyblinskiTang(dim=10, negate=True),
    }
    if name not in make:
        raise ValueError(f"unknown problem {name!r}: one of {DEVELOPMENT + HELD_OUT + REGIMES}")
    fn = make[name]()
    bounds = fn.bounds.to(torch.float64)

    def f(x):
        return fn(bounds[0] + x * (bounds[1] - bounds[0])).unsqueeze(-1)

    return Problem(f, bounds.shape[1], float(fn.optimal_value))  # the negated function's optimum (BoTorch signs it)


def single_objective() -> list:
    """The problems with one objective (an optimum, so a regret), in the order of the split."""
    return [name for name in DEVELOPMENT + HELD_OUT + REGIMES if problem(name).optimum is not None]
