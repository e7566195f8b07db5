"""SGLD and SGHMC against exact answers.

On a Gaussian target N(mu, diag(1/lam)) with exact gradients both samplers are linear
recursions whose stationary law is Gaussian with a known covariance: for SGLD,
var = 1 / (lam (1 - eps lam / 4)); for SGHMC, the (w, v) covariance solves a discrete
Lyapunov equation. Many independent chains give independent final states, so the tolerance is
the plain Monte Carlo standard error (sd / sqrt(n) for a mean, sqrt(2 / n) relative for a
variance).
"""

import math

import pytest
import torch

import pyrobnn
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.sgmcmc import cyclical_step_size, minibatch_log_joint_grad, sghmc, sghmc_step, sgld, sgld_step
from test_conjugate import bayesian_linear_model, conjugate_problem

MU = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
LAM = torch.tensor([1.0, 4.0, 0.25], dtype=torch.float64)
CHAINS = 4000


def gaussian_grad(z):
    return -LAM * (z - MU)


def check_moments(z, variance):
    n = z.shape[0]
    assert ((z.mean(0) - MU).abs() < 4 * variance.sqrt() / math.sqrt(n)).all(), (z.mean(0), MU)
    assert ((z.var(0) / variance - 1).abs() < 4 * math.sqrt(2 / n)).all(), (z.var(0), variance)


def test_sgld_has_the_stationary_variance_of_its_discretization():
    eps = 0.1  # large enough that the O(eps) bias (10% at lam = 4) is far outside the tolerance
    g = torch.Generator().manual_seed(0)
    z = torch.zeros(CHAINS, 3, dtype=torch.float64)
    for _ in range(1500):  # relaxation time 2 / (eps * lam_min) = 80 steps
        z = sgld_step(z, gaussian_grad(z), eps, torch.randn(z.shape, generator=g, dtype=z.dtype))
    check_moments(z, 1 / (LAM * (1 - eps * LAM / 4)))
    with pytest.raises(AssertionError):  # the naive answer 1 / lam is rejected at this step size
        check_moments(z, 1 / LAM)


def test_sgld_with_a_small_step_recovers_the_target():
    g = torch.Generator().manual_seed(1)
    z = torch.zeros(CHAINS, 3, dtype=torch.float64)
    eps = 0.01
    for _ in range(4000):
        z = sgld_step(z, gaussian_grad(z), eps, torch.randn(z.shape, generator=g, dtype=z.dtype))
    check_moments(z, 1 / LAM)  # bias eps lam / 4 <= 1%, below the 9% tolerance


def sghmc_stationary_variance(lr, friction, lam):
    """Var(w) of s' = A s + b xi, s = (w, v): solves Sigma = A Sigma A^T + b b^T."""
    out = []
    for l in lam.tolist():
        A = torch.tensor([[1 - lr * l, 1 - friction], [-lr * l, 1 - friction]], dtype=torch.float64)
        b = math.sqrt(2 * friction * lr) * torch.ones(2, 1, dtype=torch.float64)
        K = torch.eye(4, dtype=torch.float64) - torch.kron(A, A)
        sigma = torch.linalg.solve(K, (b @ b.T).reshape(-1)).reshape(2, 2)
        out.append(sigma[0, 0])
    return torch.stack(out)


def test_sghmc_has_the_stationary_variance_of_its_recursion():
    lr, friction = 0.01, 0.1
    g = torch.Generator().manual_seed(2)
    z = torch.zeros(CHAINS, 3, dtype=torch.float64)
    v = torch.zeros_like(z)
    for _ in range(3000):
        z, v = sghmc_step(z, v, gaussian_grad(z), lr, friction, torch.randn(z.shape, generator=g, dtype=z.dtype))
    exact = sghmc_stationary_variance(lr, friction, LAM)
    assert ((exact * LAM - 1).abs() < 0.2).all()  # close to the target, but not equal
    check_moments(z, exact)


def test_minibatch_gradients_average_to_the_full_gradient():
    """N / B scaling: over a partition into minibatches, the estimates average to the exact
    gradient of the log joint (prior counted once per estimate)."""
    X, y, _, _ = conjugate_problem()
    model = bayesian_linear_model()
    potential = FlatPotential(model, X, y.unsqueeze(-1))
    z = torch.randn(5, potential.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full = minibatch_log_joint_grad(potential, z, X, potential.y, X.shape[0])
    parts = [minibatch_log_joint_grad(potential, z, X[i : i + 20], potential.y[i : i + 20], X.shape[0]) for i in range(0, 100, 20)]
    assert torch.allclose(torch.stack(parts).mean(0), full, rtol=1e-10, atol=1e-8)
    _, grad = potential.value_and_grad(z)
    assert torch.allclose(full, -grad, rtol=1e-10, atol=1e-8)


@pytest.mark.slow  # about 25-45 s: a statistical check, run by .ci/run's -m slow
def test_sgld_on_the_conjugate_model_recovers_the_posterior_mean():
    X, y, mean, precision = conjugate_problem()
    model = bayesian_linear_model()
    result = sgld(model, X, y.unsqueeze(-1), step_size=1e-4, num_steps=3000, num_burnin=2999, thinning=1, batch_size=100,
                  num_chains=400, progress=False)
    w = result.samples["weight"][:, -1].reshape(400, 3)
    sd = torch.linalg.inv(precision).diagonal().sqrt()
    assert ((w.mean(0) - mean).abs() < 4 * sd / math.sqrt(400)).all()
    assert ((w.std(0) / sd - 1).abs() < 0.25).all()
    pred = pyrobnn.predict(model, result, X[:4])
    assert pred.mean.shape == (4, 1)


def test_cyclical_schedule_and_containers():
    assert cyclical_step_size(0, 100, 4, 0.2) == pytest.approx(0.2)
    assert cyclical_step_size(25, 100, 4, 0.2) == pytest.approx(0.2)  # a new cycle restarts
    assert cyclical_step_size(12, 100, 4, 0.2) == pytest.approx(0.1 * (math.cos(math.pi * 12 / 25) + 1))
    torch.manual_seed(0)
    x = torch.randn(64, 1)
    y = x + 0.1 * torch.randn(64, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    result = sghmc(model, x, y, step_size=1e-6, num_steps=200, thinning=10, schedule="cyclical", num_cycles=2, exploration=0.5,
                   batch_size=16, num_chains=2, progress=False)
    # per cycle of 100 steps, steps 51-100 sample, every 10th kept: 5 per cycle
    assert result.stats["step"].tolist() == [60, 70, 80, 90, 100, 160, 170, 180, 190, 200]
    assert result.num_chains == 2 and result.num_draws == 10
    with pytest.raises(ValueError, match="friction must be in"):
        sghmc(model, x, y, friction=0.0, progress=False)
    with pytest.raises(ValueError, match="num_burnin must be"):
        sgld(model, x, y, num_steps=10, num_burnin=10, progress=False)


def test_largest_curvature_is_the_top_eigenvalue_of_the_posterior_precision():
    from pyrobnn.infer.core.curvature import largest_curvature

    X, y, _, precision = conjugate_problem()
    potential = FlatPotential(bayesian_linear_model(), X, y.unsqueeze(-1))
    z = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    top = torch.linalg.eigvalsh(precision).max()
    assert torch.allclose(largest_curvature(potential, z, iterations=100, rtol=0.0), top.expand(3), rtol=1e-6)
