"""Numbers of the distributions and KL divergences against independent computations."""

import math
import warnings

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from scipy import integrate, stats
from torch.distributions import kl_divergence

from pyrobnn.models.distributions import (
    ARDNormal,
    BernoulliUnitNoise,
    ConcreteUnitNoise,
    GaussianUnitNoise,
    LogUniform,
    MultiplicativeNormal,
    ScaleMixtureNormal,
)
from pyrobnn.models.kl import kl_method, log_uniform_kl

EULER_GAMMA = 0.5772156649015329


def _e_log_abs_one_plus(alpha):
    """E log|1 + sqrt(alpha) eps|, eps ~ N(0, 1), by adaptive quadrature split at the pole."""
    s = math.sqrt(alpha)
    f = lambda e: math.log(abs(1 + s * e)) * stats.norm.pdf(e)  # noqa: E731
    edges = [-40.0, -1 / s, 40.0] if -40 < -1 / s else [-40.0, 40.0]
    with warnings.catch_warnings():  # the integrable log singularity at the pole
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        return sum(integrate.quad(f, a, b, limit=500, epsabs=1e-12, epsrel=1e-12)[0] for a, b in zip(edges[:-1], edges[1:]))


def test_log_uniform_kl_against_numerical_integration():
    # KL(N(t, a t^2) || 1/|w|) = -H(q) + E log|w| + C = -0.5 log a + E log|1 + sqrt(a) eps| + C';
    # the approximation fixes C' so that the KL vanishes as a -> inf, where
    # E log|1 + sqrt(a) eps| - 0.5 log a -> E log|eps| = -(gamma + log 2) / 2.
    e_log_abs_eps = -(EULER_GAMMA + math.log(2)) / 2
    errors = []
    for log_alpha in np.linspace(-8, 8, 65):
        exact = -0.5 * log_alpha + _e_log_abs_one_plus(math.exp(log_alpha)) - e_log_abs_eps
        approx = log_uniform_kl(torch.tensor(log_alpha, dtype=torch.float64)).item()
        errors.append(abs(approx - exact))
    # Molchanov et al. 2017 report the approximation within about 0.01 nats; measured 0.0094
    assert max(errors) < 0.01
    assert max(errors) > 1e-4  # it is an approximation, not the exact value: the check is live


def test_log_uniform_normalizer_makes_monte_carlo_match_the_approximation():
    # E_q[log q(w) - log p(w)] with our LogUniform.log_prob equals the registered KL up to
    # the approximation's error (0.01) and Monte Carlo error
    torch.manual_seed(1)
    theta = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    for log_alpha in (-4.0, 0.0, 3.0):
        q = MultiplicativeNormal.from_log_alpha(theta, torch.full_like(theta, log_alpha))
        p = LogUniform(theta.shape, dtype=torch.float64)
        w = q.sample((400_000,))
        mc = q.log_prob(w) - p.log_prob(w)
        se = mc.std(0) / math.sqrt(w.shape[0])
        analytic = kl_divergence(q, p)
        assert torch.all((mc.mean(0) - analytic).abs() < 0.01 + 5 * se)


def test_normal_normal_kl_against_monte_carlo():
    torch.manual_seed(2)
    q = dist.Normal(torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.3, 1.5, 0.05]))
    p = dist.Normal(torch.tensor(0.0), torch.tensor([1.0, 0.7, 2.0]))
    w = q.sample((500_000,)).double()
    mc = dist.Normal(q.loc.double(), q.scale.double()).log_prob(w) - dist.Normal(p.loc.double(), p.scale.double()).log_prob(w)
    se = mc.std(0) / math.sqrt(w.shape[0])
    assert torch.all((mc.mean(0) - kl_divergence(q, p).double()).abs() < 5 * se)
    assert kl_method(q, p) == "analytic"


def test_ard_kl_is_the_normal_kl_at_the_optimal_prior_variance():
    mu = torch.tensor([0.0, 0.2, -3.0, 1e-3], dtype=torch.float64)
    sigma = torch.tensor([1.0, 0.1, 0.5, 2.0], dtype=torch.float64)
    q = dist.Normal(mu, sigma)
    ard = kl_divergence(q, ARDNormal(torch.zeros(4, dtype=torch.float64)))
    assert torch.allclose(ard, 0.5 * torch.log1p(mu**2 / sigma**2))
    # numerical minimization over the prior variance of the ordinary Normal-Normal KL
    for i in range(4):
        grid = torch.logspace(-8, 4, 200_001, dtype=torch.float64)
        kls = kl_divergence(dist.Normal(mu[i], sigma[i]), dist.Normal(0.0, grid.sqrt()))
        assert abs(kls.min().item() - ard[i].item()) < 1e-6
        assert torch.isclose(grid[kls.argmin()], mu[i] ** 2 + sigma[i] ** 2, rtol=1e-3)


def test_scale_mixture_density_matches_scipy_and_integrates_to_one():
    pi, s1, s2 = 0.25, 1.0, math.exp(-6)
    d = ScaleMixtureNormal(torch.tensor(pi, dtype=torch.float64), torch.tensor(s1, dtype=torch.float64), torch.tensor(s2, dtype=torch.float64))
    w = torch.tensor([-2.0, -1e-3, 0.0, 1e-4, 0.5], dtype=torch.float64)
    expected = np.log(pi * stats.norm.pdf(w.numpy(), 0, s1) + (1 - pi) * stats.norm.pdf(w.numpy(), 0, s2))
    assert np.allclose(d.log_prob(w).numpy(), expected, rtol=1e-10)
    f = lambda v: math.exp(d.log_prob(torch.tensor(v, dtype=torch.float64)).item())  # noqa: E731
    total = sum(integrate.quad(f, a, b, limit=200)[0] for a, b in [(-20, -0.05), (-0.05, 0.05), (0.05, 20)])
    assert abs(total - 1) < 1e-8
    torch.manual_seed(3)
    x = d.expand((400_000,)).sample()
    # Var = pi s1^2 + (1 - pi) s2^2; standard error of the sample variance from the 4th moment
    var = pi * s1**2 + (1 - pi) * s2**2
    m4 = 3 * (pi * s1**4 + (1 - pi) * s2**4)
    se = math.sqrt((m4 - var**2) / x.numel())
    assert abs(x.pow(2).mean().item() - var) < 5 * se
    assert kl_method(dist.Normal(0.0, 1.0), d) == "monte_carlo"


def test_log_uniform_samples_stay_in_range_and_log_prob_is_minus_log_abs():
    p = LogUniform((1000,), sample_range=(1e-3, 10.0))
    w = p.sample()
    assert ((w.abs() >= 1e-3 * (1 - 1e-6)) & (w.abs() <= 10.0 * (1 + 1e-6))).all()
    assert (w > 0).any() and (w < 0).any()
    v = torch.tensor([0.5, -2.0])
    assert torch.allclose(p.expand((2,)).log_prob(v), LogUniform.log_normalizer - v.abs().log())


def test_multiplicative_normal_additive_parameterization():
    theta = torch.tensor([0.5, -0.2, 1e-9], dtype=torch.float64, requires_grad=True)
    log_sigma2 = torch.tensor([-6.0, -2.0, -10.0], dtype=torch.float64)
    q = MultiplicativeNormal.from_log_sigma2(theta, log_sigma2)
    # unclipped: the variance is sigma^2 and does not depend on theta
    assert torch.allclose(q.scale[:2] ** 2, log_sigma2[:2].exp())
    q.scale[:2].sum().backward()
    assert torch.allclose(theta.grad[:2], torch.zeros(2, dtype=torch.float64), atol=1e-12)
    # clipped (theta ~ 0, log alpha would be ~ 31): alpha = e^8 and variance = alpha theta^2
    assert q.log_alpha[2].item() == 8.0
    assert torch.allclose(q.variance[2], math.exp(8.0) * (theta[2].detach() ** 2 + MultiplicativeNormal.eps))
    assert torch.allclose(q.log_alpha[:2], log_sigma2[:2] - torch.log(theta[:2].detach() ** 2))


def _unit_noise_cases():
    loc = torch.tensor([[0.5, -1.0, 2.0], [0.1, 0.2, -0.3]], dtype=torch.float64)
    return loc, torch.Size((1, 3))


def test_dropout_kl_formula_and_pseudo_density_identity():
    loc, units = _unit_noise_cases()
    prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)).expand(loc.shape)
    p = 0.3
    q = BernoulliUnitNoise(loc, units, p, prior=prior)
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    expected = (loc**2).sum() / (2 * 0.49 * (1 - p)) - 3 * entropy
    assert torch.isclose(kl_divergence(q, prior).sum(), expected)
    assert kl_method(q, prior) == "approximation"
    # log p(w) - log q~(w) = -KL exactly at any sample, so Trace_ELBO has no KL noise
    w = q.sample((5,))
    assert torch.allclose((prior.log_prob(w) - q.log_prob(w)).sum((-1, -2)), -expected.expand(5))
    # a bias (no units): plain weight decay
    bias_prior = dist.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.7, dtype=torch.float64)).expand((3,))
    b = BernoulliUnitNoise(loc[0], torch.Size(), 0.0, prior=bias_prior)
    assert torch.isclose(kl_divergence(b, b.prior).sum(), (loc[0] ** 2).sum() / (2 * 0.49))


def test_unit_noise_samples_share_noise_along_a_unit_and_have_the_right_moments():
    torch.manual_seed(4)
    loc, units = _unit_noise_cases()
    for q, var in [
        (BernoulliUnitNoise(loc, units, 0.4), 0.4 / 0.6),
        (GaussianUnitNoise(loc, units, torch.log(torch.full(units, 0.5, dtype=torch.float64))), 0.5),
    ]:
        w = q.sample((200_000,))
        ratio = w / loc
        assert torch.allclose(ratio[:, 0, :], ratio[:, 1, :])  # one noise variable per input unit
        se = w.std(0) / math.sqrt(w.shape[0])
        assert torch.all((w.mean(0) - loc).abs() < 5 * se)
        assert torch.allclose(ratio.var(0), torch.full_like(loc, var), rtol=0.02)
        assert torch.allclose(q.variance, loc**2 * var)


def test_concrete_noise_approaches_bernoulli_and_is_differentiable_in_p():
    torch.manual_seed(5)
    loc, units = _unit_noise_cases()
    p = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    q = ConcreteUnitNoise(loc, units, p, temperature=0.1)
    w = q.rsample((100_000,))
    keep = w / loc * (1 - p.detach())
    # at temperature 0.1 the relaxed mask is almost binary, kept with probability 1 - p
    near_binary = ((keep < 0.05) | (keep > 0.95)).double().mean().item()
    assert near_binary > 0.9
    assert abs((keep > 0.5).double().mean().item() - 0.8) < 0.01
    w.sum().backward()
    assert p.grad is not None and torch.isfinite(p.grad)


def test_kl_method_reports_registered_kinds():
    theta = torch.ones(3)
    assert kl_method(MultiplicativeNormal.from_log_alpha(theta, torch.zeros(3)), LogUniform((3,))) == "approximation"
    assert kl_method(dist.Normal(theta, 1.0).to_event(1), dist.Normal(0.0, 1.0).expand((3,)).to_event(1)) == "analytic"
    assert kl_method(dist.Normal(theta, 1.0), ARDNormal(torch.zeros(3))) == "analytic"
    assert kl_method(GaussianUnitNoise(theta, (3,), torch.zeros(3)), dist.Normal(0.0, 1.0)) == "monte_carlo"


def test_unchecked_log_normal_and_without_validation_score_as_the_checked_ones():
    import pyro.distributions as pdist

    from pyrobnn.models.distributions import unchecked_log_normal, without_validation

    loc, scale = torch.tensor([0.3, -1.0]), torch.tensor([0.5, 2.0])
    value = torch.tensor([1.7, 0.2])
    checked = pdist.LogNormal(loc, scale, validate_args=True)
    for d in (unchecked_log_normal(loc, scale), without_validation(checked)):
        assert isinstance(d, pdist.LogNormal)
        assert torch.allclose(d.log_prob(value), checked.log_prob(value))
        assert torch.allclose(d.mean, checked.mean)
        assert not d._validate_args and not d.base_dist._validate_args
    assert checked._validate_args and checked.base_dist._validate_args  # the copy left the original as it was
    with pytest.raises(ValueError):
        checked.log_prob(torch.tensor([-1.0, 1.0]))  # the checks that were taken off
    with pytest.raises(TypeError, match="torch distribution"):
        without_validation(3.0)
