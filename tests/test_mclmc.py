"""MCLMC: exact moments of Gaussian targets, the integrator's order, NaN safety, and the
effective sample size it tunes on."""

import math

import pytest
import torch

from pyrobnn.infer.mcmc.autocorrelation import effective_sample_size
from pyrobnn.infer.mcmc.samplers import mclmc, mclmc_tuning_of, nuts
from pyrobnn.infer.core.kernel import FullBatch
from pyrobnn.infer.core.runner import run_chains
from pyrobnn.infer.mcmc.mclmc_kernel import MCLMC, MCLMCAdaptation, mclmc_init, mclmc_step
from test_conjugate import bayesian_linear_model, conjugate_problem
from test_hmc import check_exact_posterior

SCALES = torch.linspace(0.5, 3.0, 20, dtype=torch.float64)


def gaussian(z):
    return 0.5 * ((z / SCALES) ** 2).sum(-1), z / SCALES**2


def sample_mclmc(potential, z0, num_samples, num_warmup, *, thinning=1, generator=None, **tuning):
    """MCLMC on a plain potential, by the one runner: ``(draws, stats)``."""
    chains = run_chains(MCLMC(), MCLMCAdaptation(num_warmup, **tuning), FullBatch(potential), z0, num_samples=num_samples,
                        thinning=thinning, generator=generator)
    return chains.draws, chains.stats


def test_effective_sample_size_of_an_ar1_chain():
    """AR(1) with coefficient phi has ESS n (1 - phi) / (1 + phi); the estimate averaged over
    24 independent chains is within 4% of it (its spread over chains is about 6%)."""
    g = torch.Generator().manual_seed(0)
    n, phi = 20_000, 0.8
    noise = torch.randn(24, n, generator=g, dtype=torch.float64)
    x = torch.zeros_like(noise)
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    ess = effective_sample_size(x)
    assert ess.mean().item() == pytest.approx(n * (1 - phi) / (1 + phi), rel=0.04)
    white = effective_sample_size(torch.randn(24, 2000, generator=g, dtype=torch.float64))
    assert white.mean().item() == pytest.approx(2000, rel=0.05)


def gaussian_moments_z(energy_variance, seed=1, steps=20_000):
    """Errors of the sampled means and variances in Monte Carlo standard errors (from the ESS
    of the draws and of their squares; a variance's SE is sd^2 sqrt(2 / ESS)), and the variance
    ratios."""
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(4, 20, generator=g, dtype=torch.float64) * 3
    draws, stats = sample_mclmc(gaussian, z0, steps, (2000, 1000, 1000), energy_variance=energy_variance, generator=g)
    assert (stats["nonfinite"] == 0).all()
    w = draws.reshape(-1, 20)
    ess = effective_sample_size(draws).sum(0)  # pooled over chains
    ess_sq = effective_sample_size(draws**2).sum(0)
    mean_z = w.mean(0) / (SCALES / ess.sqrt())
    var_z = (w.var(0) - SCALES**2) / (SCALES**2 * (2 / ess_sq).sqrt())
    return mean_z, var_z, w.var(0) / SCALES**2


def test_mclmc_recovers_the_mean_and_variance_of_a_gaussian():
    """20 coordinates with standard deviations 0.5-3: mean and variance of every coordinate within
    5 Monte Carlo standard errors, at a target energy variance (1e-6 per dimension) where the
    unadjusted sampler's bias is below the Monte Carlo error."""
    mean_z, var_z, _ = gaussian_moments_z(1e-6, steps=5000)  # the errors in standard errors: fewer steps, a wider bound
    assert mean_z.abs().max() < 5, mean_z
    assert var_z.abs().max() < 5, var_z


@pytest.mark.slow
def test_mclmc_bias_shrinks_with_the_target_energy_variance():
    """MCLMC is unadjusted: at BlackJAX's default target (5e-4) the narrowest coordinate's variance
    is several percent low, far outside Monte Carlo error; the bias is O(eps^2) and the tuned eps
    O(Var^(1/6)), so a 500 times smaller target cuts it several-fold."""
    _, var_z, ratio = gaussian_moments_z(5e-4)
    _, _, ratio_small = gaussian_moments_z(1e-6)
    assert var_z[0] < -5  # a measurable bias, not noise
    assert (1 - ratio[0]) > 3 * abs(1 - ratio_small[0])


@pytest.mark.slow
def test_mclmc_reaches_the_exact_conjugate_posterior():
    X, y, mean, precision = conjugate_problem(seed=2)
    result = mclmc(bayesian_linear_model(), X, y, num_samples=20_000, num_warmup=(2000, 500, 500), thinning=5,
                   num_chains=4, energy_variance=1e-6, step_size=None, L=None, backend="eager", progress=False)
    w = result.samples["weight"].reshape(4, -1, 3)
    check_exact_posterior(w, mean, torch.linalg.inv(precision))


def test_energy_error_scales_with_the_integrators_order():
    """McLachlan's scheme is second order: the energy error of one step is O(eps^3) (halving the
    step divides it by 8), and over a fixed time O(eps^2) (divided by 4)."""
    g = torch.Generator().manual_seed(3)
    chains = 64
    z = torch.randn(chains, 20, generator=g, dtype=torch.float64) * SCALES
    state = mclmc_init(gaussian, z, g)
    inf = torch.full((chains,), math.inf, dtype=torch.float64)  # no refresh: pure dynamics
    sqrt_inv_mass = torch.ones(chains, 20, dtype=torch.float64)
    noise = torch.zeros(2, chains, 20, dtype=torch.float64)

    def one_step(eps):
        step = torch.full((chains,), eps, dtype=torch.float64)
        return mclmc_step(gaussian, state.z, state.u, state.energy, state.grad, step, inf, sqrt_inv_mass, noise)[4].abs()

    local = (one_step(0.2) / one_step(0.1)).median().item()
    assert local == pytest.approx(8.0, rel=0.1)

    def over_time(eps, time=4.0):
        s = state
        total = torch.zeros(chains, dtype=torch.float64)
        step = torch.full((chains,), eps, dtype=torch.float64)
        for _ in range(round(time / eps)):
            z, u, e, grad, d_energy, _ = mclmc_step(gaussian, s.z, s.u, s.energy, s.grad, step, inf, sqrt_inv_mass, noise)
            s = type(s)(z, u, e, grad)
            total = total + d_energy
        return total.abs()

    global_ratio = (over_time(0.2) / over_time(0.1)).median().item()
    assert global_ratio == pytest.approx(4.0, rel=0.15)


def test_a_non_finite_step_is_undone():
    """Where the potential is NaN (beyond |z_0| > 1.5 here) the chain stays where it was, with a
    fresh velocity, and the step counts as non-finite; no NaN reaches the draws."""

    def walled(z):
        energy, grad = gaussian(z)
        bad = z[:, 0].abs() > 1.5
        return torch.where(bad, torch.nan, energy), torch.where(bad.unsqueeze(-1), torch.nan, grad)

    g = torch.Generator().manual_seed(4)
    z0 = torch.zeros(2, 20, dtype=torch.float64)
    draws, stats = sample_mclmc(walled, z0, 2000, (500, 100, 100), step_size=1.0, L=3.0, generator=g)
    assert torch.isfinite(draws).all()
    assert (draws[..., 0].abs() <= 1.5).all()
    assert (stats["nonfinite"] + stats["nonfinite_warmup"]).sum() > 0


def test_mclmc_refuses_bad_arguments():
    with pytest.raises(ValueError, match="num_samples"):
        sample_mclmc(gaussian, torch.zeros(1, 20, dtype=torch.float64), 0, (10, 10, 10))
    with pytest.raises(ValueError, match="thinning"):
        sample_mclmc(gaussian, torch.zeros(1, 20, dtype=torch.float64), 10, (10, 10, 10), thinning=0)
    with pytest.raises(ValueError, match="two dimensions"):
        sample_mclmc(lambda z: (0.5 * (z**2).sum(-1), z), torch.zeros(1, 1), 10, (10, 10, 10))
    model = bayesian_linear_model()
    X, y, _, _ = conjugate_problem()
    with pytest.raises(ValueError, match=r"mclmc: num_warmup must be an integer >= 0, got -1"):
        mclmc(model, X, y, num_warmup=(10, -1, 5), progress=False)
    with pytest.raises(ValueError, match="num_warmup must be a number of steps or the steps of the three tuning phases"):
        mclmc(model, X, y, num_warmup=(10, 5), progress=False)


@pytest.mark.parametrize("num_warmup", [0, 14, 30, 36, (20, 5, 3)])
def test_a_short_warm_up_runs_skipping_a_third_phase_too_short_for_an_effective_sample_size(num_warmup):
    """A third phase of 2 or 3 steps cannot give an effective sample size (which needs 4 draws):
    it is skipped, L keeping the second phase's value, where the run used to fail at its end."""
    X, y, _, _ = conjugate_problem()
    result = mclmc(bayesian_linear_model(), X, y, num_samples=20, num_warmup=num_warmup, num_chains=2, thinning=2, backend="eager",
                   progress=False)
    assert result.num_draws == 10 and torch.isfinite(result.stats["L"]).all()


def test_a_run_starts_its_tuning_from_a_step_size_and_L_per_chain():
    """``step_size`` and ``L`` take one value per chain (a refit on more data starts where the
    previous run's tuning ended): with no tuning the run keeps them chain by chain, on the eager
    path and the native one; the step and the positions follow them (a chain with a 100x smaller
    step moves less)."""
    X, y, _, _ = conjugate_problem()
    assert X.dtype == torch.float64
    step_size, L = torch.tensor([0.2, 0.002], dtype=torch.float64), torch.tensor([1.5, 0.7], dtype=torch.float64)
    for backend in ("eager", "auto"):  # a list of Python floats is taken in float64, not rounded to float32
        result = mclmc(bayesian_linear_model(), X, y, num_samples=40, num_warmup=0, num_chains=2, thinning=1, step_size=step_size,
                       L=L.tolist(), backend=backend, progress=False, init="prior", seed=3)
        assert torch.equal(result.stats["step_size"], step_size) and torch.equal(result.stats["L"], L)
        z = torch.cat([v.reshape(2, 40, -1) for v in result.samples.values()], -1)
        travelled = (z[:, 1:] - z[:, :-1]).norm(dim=-1).sum(-1)
        assert travelled[1] < 0.05 * travelled[0]
        carried = mclmc_tuning_of(result)  # what a run on more data starts from: these, chain by chain
        assert torch.equal(carried["step_size"], result.stats["step_size"]) and torch.equal(carried["L"], result.stats["L"])
    with pytest.raises(ValueError, match=r"posterior must be an MCLMC result with one L per chain in its stats \(stats\['L'\] of shape \(2,\)\), got None"):
        mclmc_tuning_of(nuts(bayesian_linear_model(), X, y, num_samples=2, num_warmup=2, num_chains=2, progress=False))


@pytest.mark.parametrize("kwargs, message", [
    ({"step_size": torch.ones(3)}, r"step_size must be a number or have shape \(2,\) \(one per chain\), got shape \(3,\)"),
    ({"L": [1.0, 2.0, 3.0]}, r"L must be a number or have shape \(2,\) \(one per chain\), got shape \(3,\)"),
    ({"L": [1.0, -2.0]}, r"L must be .* got an array with 1 of its 2 entries not finite and positive \(the first: -2.0\)"),
    ({"step_size": [0.1, 0.1], "num_processes": 2}, r"mclmc: step_size per chain cannot be split over num_processes=2"),
])
def test_mclmc_refuses_a_per_chain_tuning_start_that_does_not_fit(kwargs, message):
    X, y, _, _ = conjugate_problem()
    with pytest.raises(ValueError, match=message):
        mclmc(bayesian_linear_model(), X, y, num_samples=4, num_warmup=0, num_chains=2, thinning=1, progress=False, **kwargs)
