"""SMILE (stochastic-gradient microcanonical Langevin dynamics) against known answers.

The kernel is run on a standard Gaussian in 10 dimensions with synthetic gradient noise of a
chosen covariance. Isotropic noise perturbs the unit velocity by a rotation-invariant amount, so
the uniform velocity law, and with it the target, is invariant: mean and variance must match
within Monte Carlo error at any stable step size. Anisotropic noise breaks that invariance (the
bias the SMILE paper derives): without preconditioning the low-noise coordinates' variance
collapses; the gradient-noise preconditioner, scaling each coordinate by the noise's spread,
reduces the spread of the bias. Standard errors come from the spread of the per-chain
estimates over independent chains.
"""

import math

import pytest
import torch

import pyrobnn
from pyrobnn.infer.core.minibatch import MinibatchLoop, minibatch_log_joint_value_and_grad, per_row_minibatch_log_joint_value_and_grad
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.sgmcmc.smile_kernel import SMILESettings, gamma_quantile, smile_init, smile_step
from test_conjugate import bayesian_linear_model, conjugate_problem

DIM, CHAINS = 10, 32


def run_gaussian(noise_sd, step_size, precondition, steps=4000, warmup=1000, seed=0, reset_prob=1.0):
    g = torch.Generator().manual_seed(seed)
    noise_sd = torch.as_tensor(noise_sd, dtype=torch.float64).expand(DIM)

    def log_density_and_grad(z):
        return -0.5 * z.square().sum(-1), -z + noise_sd * torch.randn(z.shape, generator=g, dtype=z.dtype)

    state = smile_init(torch.randn(CHAINS, DIM, generator=g, dtype=torch.float64), log_density_and_grad, step_size)
    settings = SMILESettings(reset_prob=reset_prob, precondition=precondition, tune=False)
    kept = []
    for t in range(steps):
        state, _, _, finite = smile_step(state, log_density_and_grad, settings, warmup=t < warmup)
        assert finite.all()
        if t >= warmup:
            kept.append(state.z)
    z = torch.stack(kept, 1)  # (chains, draws, dim)
    means, variances = z.mean(1), z.var(1)
    n = math.sqrt(CHAINS)
    return means.mean(0), means.std(0) / n, variances.mean(0), variances.std(0) / n


@pytest.mark.parametrize("step_size", [0.3, 1.0])
def test_isotropic_gradient_noise_leaves_a_gaussian_target_unbiased(step_size):
    mean, mean_se, var, var_se = run_gaussian(1.0, step_size, precondition=False)
    assert (mean.abs() < 4 * mean_se).all(), (mean, mean_se)
    assert ((var - 1).abs() < 4 * var_se).all(), (var, var_se)


def test_anisotropic_noise_biases_smile_and_the_noise_preconditioner_reduces_the_bias():
    noise = torch.logspace(-1, 1, DIM, dtype=torch.float64)  # noise sd from 0.1 to 10
    _, _, plain, plain_se = run_gaussian(noise, 0.3, precondition=False)
    # the paper's bias: variance follows the noise, collapsing where the noise is small
    assert plain[0] < 0.1 and plain[-1] > 2.0, plain
    assert (plain.diff() > -4 * plain_se[1:]).all()  # increasing with the noise
    _, _, preconditioned, _ = run_gaussian(noise, 0.3, precondition=True, warmup=1000)
    spread = lambda v: float(v.max() / v.min())
    assert spread(preconditioned) < spread(plain) / 10, (preconditioned, plain)


@pytest.mark.slow  # about 7 s: two statistical runs, run by .ci/run's -m slow
def test_a_preconditioner_that_kept_adapting_while_sampling_would_bias_the_draws():
    """Why the kernel freezes its preconditioner after warm-up: a scaling that follows the
    recent gradients makes the step depend on the chain's path. Frozen, isotropic noise gives
    the exact variance; adapting in every step (as the reference code does) inflates it."""
    _, _, frozen, frozen_se = run_gaussian(1.0, 0.3, precondition=True, warmup=1000)
    assert ((frozen - 1).abs() < 4 * frozen_se).all(), (frozen, frozen_se)
    g = torch.Generator().manual_seed(5)  # the same target with the preconditioner adapting throughout

    def log_density_and_grad(z):
        return -0.5 * z.square().sum(-1), -z + torch.randn(z.shape, generator=g, dtype=z.dtype)

    state = smile_init(torch.randn(CHAINS, DIM, generator=g, dtype=torch.float64), log_density_and_grad, 0.3)
    settings = SMILESettings(reset_prob=1.0, precondition=True, tune=False)
    kept = []
    for t in range(4000):
        state, _, _, _ = smile_step(state, log_density_and_grad, settings, warmup=True)
        if t >= 1000:
            kept.append(state.z)
    variances = torch.stack(kept, 1).var(1)
    assert variances.mean() > 1 + 4 * float(variances.mean(-1).std() / math.sqrt(CHAINS)), variances.mean()


@pytest.mark.parametrize("change, factor, reset", [(0.1, 1.02, False), (1.0, 1.0, False), (2.3, 0.98, False), (10.0, 0.98, True)])
def test_the_tuner_moves_the_step_size_by_where_the_energy_error_falls_among_its_quantiles(change, factor, reset):
    """The tuner's rules on a step whose energy error is set: with a zero gradient nothing moves,
    so the energy error is the drop in the log density we return. Its running |dE| averages
    (mean 1, sd 0.5) define a gamma law; below its a/3 quantile the step grows by 2%, above its
    1 - 2a/3 quantile it shrinks by 2%, above the 0.99 quantile the step is undone."""
    mean, sd = torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    low, high, undo = (float(gamma_quantile(p, mean, sd)) for p in (0.05 / 3, 1 - 0.1 / 3, 0.99))
    assert 0.1 < low < 1.0 < high < 2.3 < undo < 10.0  # where the cases fall

    def flat(z):
        return torch.full((z.shape[0],), -change, dtype=z.dtype), torch.zeros_like(z)

    state = smile_init(torch.zeros(1, 3, dtype=torch.float64), lambda z: (torch.zeros(1, dtype=z.dtype), torch.zeros_like(z)), 0.1)
    state = state._replace(energy_mean=mean, energy_sd=sd, time=torch.tensor([20.0], dtype=torch.float64))
    new, energy_change, was_reset, finite = smile_step(state, flat, SMILESettings(precondition=False, tune=True), warmup=True)
    assert float(energy_change) == pytest.approx(change)
    assert bool(was_reset) is reset and bool(finite)
    assert float(new.step_size) == pytest.approx(0.1 * factor)
    assert float(new.log_density) == (0.0 if reset else -change)  # an undone step keeps the old density
    # in its first ten steps the tuner only watches; outside warm-up it never tunes
    state = state._replace(time=torch.tensor([5.0], dtype=torch.float64))
    assert float(smile_step(state, flat, SMILESettings(precondition=False, tune=True), warmup=True)[0].step_size) == 0.1
    state = state._replace(time=torch.tensor([20.0], dtype=torch.float64))
    assert float(smile_step(state, flat, SMILESettings(precondition=False, tune=True), warmup=False)[0].step_size) == 0.1


def test_a_non_finite_gradient_is_made_safe_and_a_non_finite_step_undone():
    def log_density_and_grad(z):  # a slope up along z[:, 1] into a region without a density
        grad = torch.zeros_like(z)
        grad[:, 1] = 1.0
        grad[:, 0] = float("nan")  # NaN gradients become 0 (the reference's guard)
        value = z[:, 1].clone()
        value = torch.where(z[:, 1] > 1.0, torch.full_like(value, float("nan")), value)
        return value, grad

    z = torch.zeros(4, 3, dtype=torch.float64)
    state = smile_init(z, log_density_and_grad, 0.5)
    undone = 0
    for _ in range(200):
        state, change, reset, finite = smile_step(state, log_density_and_grad, SMILESettings(reset_prob=1.0), warmup=False)
        undone += int((~finite).sum())
        assert torch.isfinite(state.z).all() and torch.isfinite(change).all()
        assert (state.z[:, 1] <= 1.0 + 1e-12).all()  # a step into the region is never kept
    assert undone > 0


def test_wilson_hilferty_gamma_quantiles_match_scipy():
    """The approximation is good in the upper tail, which the reset and shrink thresholds use,
    and poor in the lower tail at small shape (it is what the paper's tuner uses)."""
    stats = pytest.importorskip("scipy.stats")
    for shape in (1.0, 3.0, 20.0):
        mean = torch.tensor([2.0 * shape], dtype=torch.float64)  # scale 2
        sd = torch.sqrt(torch.tensor([4.0 * shape], dtype=torch.float64) - 1e-6)
        for p in (0.0167, 0.5, 0.9667, 0.99):
            exact = stats.gamma.ppf(p, shape, scale=2.0)
            approx = float(gamma_quantile(p, mean, sd))
            tolerance = 0.7 if (shape == 1.0 and p < 0.5) else 0.05 if p < 0.5 else 0.015
            assert approx == pytest.approx(exact, rel=tolerance), (shape, p)
    assert float(gamma_quantile(1.0, mean, sd)) == math.inf and float(gamma_quantile(0.0, mean, sd)) == 0.0


def test_per_chain_minibatches_average_to_the_full_log_joint_and_its_gradient():
    X, y, _, _ = conjugate_problem()
    model = bayesian_linear_model()
    potential = FlatPotential(model, X, y.unsqueeze(-1))
    z = torch.randn(3, potential.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full_value, full_grad = minibatch_log_joint_value_and_grad(potential, z, X, potential.y, 100)
    loop = MinibatchLoop(100, 20, seed=0)
    values, grads = [], []
    for _ in range(5):  # one pass of every chain's own stream: a partition per chain
        idx = loop.next_batches(3)
        v, g = per_row_minibatch_log_joint_value_and_grad(potential, z, X[idx], potential.y[idx], 100)
        values.append(v)
        grads.append(g)
    torch.testing.assert_close(torch.stack(values).mean(0), full_value, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(torch.stack(grads).mean(0), full_grad, rtol=1e-10, atol=1e-8)
    assert not torch.equal(idx[0], idx[1])  # the chains' batches differ


def test_smile_on_a_model_returns_a_posterior_and_refuses_bad_settings():
    X, y, mean, _ = conjugate_problem()
    model = bayesian_linear_model()
    result = pyrobnn.smile(model, X, y.unsqueeze(-1), num_samples=60, num_warmup=40, thinning=3, batch_size=20, num_chains=3,
                           step_size=0.01, progress=False)
    assert result.samples["weight"].shape == (3, 20, 1, 3)
    assert result.family == "sgmcmc" and result.method == "pSMILE"
    assert result.stats["energy_change"].shape == (3, 20) and result.stats["resets"].shape == (3,)
    # chains from one start separate: their minibatches are their own
    same = pyrobnn.smile(model, X, y.unsqueeze(-1), num_samples=30, num_warmup=0, thinning=3, batch_size=20, init=mean.expand(2, 3).clone(),
                         step_size=0.01, progress=False)
    w = same.samples["weight"]
    assert not torch.equal(w[0], w[1])
    with pytest.raises(ValueError, match="batch_size=100 covers all 100 points"):
        pyrobnn.smile(model, X, y.unsqueeze(-1), batch_size=100, progress=False)
    with pytest.raises(ValueError, match="reset_prob must be a fraction"):
        pyrobnn.smile(model, X, y.unsqueeze(-1), reset_prob=1.5, progress=False)
    with pytest.raises(ValueError, match="step_size must be a number"):
        pyrobnn.smile(model, X, y.unsqueeze(-1), step_size=-1.0, progress=False)


@pytest.mark.slow  # about 30 s: a statistical check, run by .ci/run's -m slow
def test_smile_on_the_conjugate_regression_recovers_the_posterior_mean_and_scale():
    """Minibatch noise in linear regression is anisotropic and the posterior correlated, so the
    variances carry the paper's bias (we measured sd ratios of 0.8-1.2 across step sizes and
    batch sizes); the mean carries none by symmetry of the noise, within Monte Carlo error."""
    X, y, mean, precision = conjugate_problem()
    sd = torch.linalg.inv(precision).diagonal().sqrt()
    model = bayesian_linear_model()
    chains = 64
    result = pyrobnn.smile(model, X, y.unsqueeze(-1), num_samples=4000, num_warmup=2000, thinning=2, batch_size=20, step_size=0.005,
                           tune=False, num_chains=chains, init=mean.expand(chains, 3).clone(), progress=False)
    w = result.samples["weight"].reshape(chains, -1, 3)
    per_chain = w.mean(1)
    se = per_chain.std(0) / math.sqrt(chains)
    assert ((per_chain.mean(0) - mean).abs() < 4 * se).all(), (per_chain.mean(0), mean, se)
    ratio = w.reshape(-1, 3).std(0) / sd
    assert ((ratio - 1).abs() < 0.3).all(), ratio


@pytest.mark.parametrize("options", [{}, {"tune": True, "L": 0.5}])
def test_a_step_recorded_per_phase_and_replayed_draws_as_the_eager_one(options, replaying_graphs, monkeypatch):
    # each phase's step recorded once and replayed with the step's batches as inputs, with the
    # stand-in graph that replays by running (CUDA's own is checked on a GPU): the same draws
    import functools
    import importlib

    from pyrobnn.infer.sgmcmc.smile_kernel import SMILE

    smile_module = importlib.import_module("pyrobnn.infer.sgmcmc.smile")  # the package exports its function by that name

    torch.manual_seed(0)
    x = torch.randn(60, 2)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(60, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(2, 1, hidden=(6,), activation="tanh"), pyrobnn.GaussianLikelihood(0.2), pyrobnn.NormalPrior(1.0))
    run = dict(num_samples=10, num_warmup=12, thinning=1, batch_size=16, num_chains=3, seed=2, progress=False, **options)
    eager = pyrobnn.smile(model, x, y, **run)
    monkeypatch.setattr(smile_module, "SMILE", functools.partial(SMILE, graphs=True))
    recorded = pyrobnn.smile(model, x, y, **run)
    assert len(replaying_graphs) == 2  # the warm-up's step and the sampling step
    assert [g.replays for g in replaying_graphs] == [12 - 3, 10 - 3]
    assert all(torch.equal(recorded.samples[k], eager.samples[k]) for k in eager.samples)
    assert torch.equal(recorded.stats["step_size"], eager.stats["step_size"])
