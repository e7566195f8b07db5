"""The test problems of the Bayesian-optimization benchmarks (``bayesopt.py``, regret;
``bo_calibration.py``, the predictive away from the data), in one place: each a function on the
unit cube, maximized, with its dimension and, for one objective, its optimal value.

The split is fixed before any default is chosen: :data:`DEVELOPMENT` (where defaults may be
tuned), :data:`HELD_OUT` (only reported), :data:`SHIFTED` (only reported: the problems of both
sets whose maximizer lies at or near the cube's centre, moved off it; added on 2026-11-30, after
every default was chosen) and :data:`REGIMES`, where BNN surrogates should do well
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
#: Ackley-10 and Griewank-8 have their maximizer at the unit cube's centre, Levy-20 and Levy-4 at
#: 0.55 and Rosenbrock-5 at 0.4 in every coordinate, where a prior that favours the centre (a
#: ReLU network's kernel grows with the distance from the inputs' centre) is favoured by the
#: problem, not by the data. Each ``<name>_shifted`` is the function with its maximizer moved to
#: a point drawn once, uniformly from [0.1, 0.9]^d (:data:`SHIFT_SEED`): f(x - t + c) with c the
#: maximizer and t the new one (these functions are defined on all of R^d, with the same global
#: maximum, so the optimum and its value stay).
SHIFTED = ["ackley10_shifted", "levy20_shifted", "rosenbrock5_shifted", "levy4_shifted", "griewank8_shifted"]
#: the seed of the shifted problems' new maximizers
SHIFT_SEED = 2026


def shifted_maximizer(d: int) -> torch.Tensor:
    """The maximizer of a shifted problem of ``d`` inputs: a fixed uniform draw from [0.1, 0.9]^d."""
    return 0.1 + 0.8 * torch.rand(d, generator=torch.Generator().manual_seed(SHIFT_SEED), dtype=torch.float64)


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
    make = {  # each with its own bounds, or other ``bounds`` (BoTorch refuses points outside them)
        "branin": lambda **b: Branin(negate=True, **b), "hartmann6": lambda **b: Hartmann(dim=6, negate=True, **b),
        "ackley10": lambda **b: Ackley(dim=10, negate=True, **b), "levy20": lambda **b: Levy(dim=20, negate=True, **b),
        "rosenbrock5": lambda **b: Rosenbrock(dim=5, negate=True, **b), "levy4": lambda **b: Levy(dim=4, negate=True, **b),
        "griewank8": lambda **b: Griewank(dim=8, negate=True, **b),
        "styblinskitang10": lambda **b: StyblinskiTang(dim=10, negate=True, **b),
    }
    base, shifted = (name[: -len("_shifted")], True) if name in SHIFTED else (name, False)
    if base not in make:
        raise ValueError(f"unknown problem {name!r}: one of {DEVELOPMENT + HELD_OUT + SHIFTED + REGIMES}")
    fn = make[base]()
    bounds = fn.bounds.to(torch.float64)
    offset = torch.zeros(bounds.shape[1], dtype=torch.float64)
    if shifted:  # the unit-cube maximizer c moved to t: f(x - t + c), x - t + c within [-1, 2]^d
        maximizer = (torch.as_tensor(fn.optimizers[0], dtype=torch.float64) - bounds[0]) / (bounds[1] - bounds[0])
        offset = maximizer - shifted_maximizer(bounds.shape[1])
        width = bounds[1] - bounds[0]
        fn = make[base](bounds=list(zip((bounds[0] - width).tolist(), (bounds[1] + width).tolist())))

    def f(x):
        return fn(bounds[0] + (x + offset) * (bounds[1] - bounds[0])).unsqueeze(-1)

    return Problem(f, bounds.shape[1], float(fn.optimal_value))  # the negated function's optimum (BoTorch signs it)


def single_objective() -> list:
    """The problems with one objective (an optimum, so a regret), in the order of the split."""
    return [name for name in DEVELOPMENT + HELD_OUT + SHIFTED + REGIMES if problem(name).optimum is not None]
