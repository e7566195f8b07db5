"""The Bayesian-optimization benchmarks' test problems (benchmarks/bo_problems.py): each is
maximized on the unit cube, and the optimum the regret is measured against is the function's
value at its known maximizer and no sample exceeds it."""

import math
import os
import sys

import pytest
import torch

pytest.importorskip("botorch", reason="the benchmark problems are BoTorch's test functions: pip install 'pyrobnn[bo]'")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bo_problems  # noqa: E402

#: a maximizer of each single-objective problem, in the unit cube
MAXIMIZERS = {
    "branin": [(math.pi + 5) / 15, 2.275 / 15],  # Branin's (pi, 2.275) on [-5, 10] x [0, 15]
    "branin_embed40": [(math.pi + 5) / 15, 2.275 / 15] + [0.3] * 38,  # the other 38 inputs do not matter
    "gramacylee2": [(2 - 1 / math.sqrt(2)) / 8, 2 / 8],  # (-1/sqrt 2, 0) on [-2, 6]^2
    "hartmann6": [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573],
    "ackley10": [0.5] * 10,  # the origin of [-32.768, 32.768]^10
}


@pytest.mark.parametrize("name", bo_problems.DEVELOPMENT + bo_problems.HELD_OUT + bo_problems.SHIFTED + bo_problems.REGIMES)
def test_problems_are_maximized_on_the_unit_cube_below_their_optimum(name):
    p = bo_problems.problem(name)
    x = torch.rand(4000, p.d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = p.f(x)
    assert y.shape == (4000, 2 if name == "branincurrin" else 1) and bool(torch.isfinite(y).all())
    assert (p.optimum is None) == (name == "branincurrin")
    if p.optimum is not None:
        assert float(y.max()) <= p.optimum + 1e-9
    if name in MAXIMIZERS:
        at = p.f(torch.tensor([MAXIMIZERS[name]], dtype=torch.float64))
        assert float(at) == pytest.approx(p.optimum, abs=1e-4)
    if name in bo_problems.SHIFTED:
        assert float(p.f(bo_problems.shifted_maximizer(p.d)[None])) == pytest.approx(p.optimum, abs=1e-9)


#: the unit-cube maximizers of the problems the shifted ones move: Ackley's and Griewank's origin,
#: Levy's and Rosenbrock's (1, ..., 1), on [-32.768, 32.768]^d, [-600, 600]^d, [-10, 10]^d, [-5, 10]^d
CENTRED = {"ackley10": 0.5, "griewank8": 0.5, "levy20": 0.55, "levy4": 0.55, "rosenbrock5": 0.4}


@pytest.mark.parametrize("name", bo_problems.SHIFTED)
def test_a_shifted_problem_is_its_function_moved_off_the_centre(name):
    base = name[: -len("_shifted")]
    p, q = bo_problems.problem(name), bo_problems.problem(base)
    t = bo_problems.shifted_maximizer(p.d)
    assert bool(((t >= 0.1) & (t <= 0.9)).all()) and float((t - CENTRED[base]).abs().max()) > 0.2
    x = torch.rand(500, p.d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    # f(x) = g(x - t + c): at x = u + t - c the shifted problem is the original one at u (u in the cube)
    torch.testing.assert_close(p.f(x + t - CENTRED[base]), q.f(x), rtol=1e-9, atol=1e-9)
    assert p.optimum == q.optimum
    assert float(p.f(t[None] + 0.05 * torch.randn(1, p.d, dtype=torch.float64, generator=torch.Generator().manual_seed(2)))) < p.optimum


def test_an_unknown_problem_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown problem 'branin3'"):
        bo_problems.problem("branin3")
    with pytest.raises(ValueError, match="unknown problem 'branin_shifted'"):  # only the centred problems are shifted
        bo_problems.problem("branin_shifted")
