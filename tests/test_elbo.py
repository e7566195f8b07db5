"""The ELBO: which KL is used, how the terms are scaled, and agreement with Pyro's ELBOs."""

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import nn

import pyrobnn
from pyrobnn.guides.base import site_key
from pyrobnn.infer import KLAnnealing, SplitELBO
from pyrobnn.models.kl import log_uniform_kl

PRIOR_SCALE = 0.8


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 5), nn.Tanh(), nn.Linear(5, 1)).double()


def data(n=40):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 2, generator=g, dtype=torch.float64)
    return x, torch.sin(x[:, :1]) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)


def entropy(p):
    return -(p * math.log(p) + (1 - p) * math.log(1 - p)) if isinstance(p, float) else -(p * p.log() + (1 - p) * (1 - p).log())


# each case: (prior, guide factory, the KL written out from the guide's parameters)
def _kl_meanfield_normal(model, guide):
    total = 0.0
    for s in model.sites:
        mu, sd = guide.loc[site_key(s.name)], guide.scale_of(s)
        total = total + (math.log(PRIOR_SCALE) - sd.log() + (sd**2 + mu**2) / (2 * PRIOR_SCALE**2) - 0.5).sum()
    return total


def _kl_sparse_vd(model, guide):
    total = 0.0
    for s in model.sites:
        theta, ls2 = guide.theta[site_key(s.name)], guide.log_sigma2[site_key(s.name)]
        log_alpha = torch.clamp(ls2 - torch.log(theta**2 + 1e-16), -8, 8)
        total = total + log_uniform_kl(log_alpha).sum()
    return total


def _kl_ard(model, guide):
    return sum((0.5 * torch.log1p(guide.loc[site_key(s.name)] ** 2 / guide.scale_of(s) ** 2)).sum() for s in model.sites)


def _kl_dropout(rate_of):
    def kl(model, guide):
        total = 0.0
        for s in model.sites:
            m = guide.loc[site_key(s.name)]
            if s.is_bias:
                total = total + (m**2).sum() / (2 * PRIOR_SCALE**2)
            else:
                p = rate_of(guide, s)
                total = total + (m**2).sum() / (2 * PRIOR_SCALE**2 * (1 - p)) - s.shape[1] * entropy(p)
        return total

    return kl


def _kl_unit_vd(model, guide):
    total = 0.0
    for s in model.sites:
        la = guide.log_alpha[site_key(s.name)].clamp(-8, 8)
        total = total + log_uniform_kl(la).expand(s.shape).sum()
    return total


CASES = {
    "meanfield-normal": (pyrobnn.NormalPrior(PRIOR_SCALE), lambda m: pyrobnn.MeanFieldNormal(m, init_scale=0.05), _kl_meanfield_normal),
    "sparsevd-loguniform": (pyrobnn.LogUniformPrior(), lambda m: pyrobnn.SparseVariationalDropout(m, init_log_sigma2=-4.0), _kl_sparse_vd),
    "meanfield-ard": (pyrobnn.ARDPrior(), lambda m: pyrobnn.MeanFieldNormal(m, init_scale=0.05), _kl_ard),
    "mcdropout-normal": (pyrobnn.NormalPrior(PRIOR_SCALE), lambda m: pyrobnn.MCDropout(m, p=0.3), _kl_dropout(lambda g, s: 0.3)),
    "concrete-normal": (pyrobnn.NormalPrior(PRIOR_SCALE), lambda m: pyrobnn.ConcreteDropout(m, init_p=0.2), _kl_dropout(lambda g, s: g.dropout_prob(s))),
    "unitvd-loguniform": (pyrobnn.LogUniformPrior(), lambda m: pyrobnn.VariationalDropout(m, alpha="unit", init_log_alpha=-1.0), _kl_unit_vd),
}


def build(case):
    prior, make_guide, _ = CASES[case]
    model = pyrobnn.BayesianModel(small_net(), pyrobnn.GaussianLikelihood(scale=0.3), prior)
    return model, make_guide(model)


def log_likelihood_at_seed(model, guide, seed, x, y):
    pyro.set_rng_seed(seed)
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    site = model_trace.nodes["obs"]
    return site["fn"].log_prob(site["value"]).sum()


@pytest.mark.parametrize("case", list(CASES))
def test_trace_mean_field_elbo_uses_the_registered_kl(case):
    """Pyro's own TraceMeanField_ELBO, run on our model and guide, equals
    -log-likelihood + the KL written out by hand: the registered KL is the one used, with no
    Monte Carlo noise (which would differ between seeds)."""
    model, guide = build(case)
    x, y = data()
    expected_kl = CASES[case][2](model, guide).item()
    for seed in (0, 1, 2):
        pyro.set_rng_seed(seed)
        loss = TraceMeanField_ELBO().loss(model, guide, x, y)
        nll = -log_likelihood_at_seed(model, guide, seed, x, y).item()
        assert loss - nll == pytest.approx(expected_kl, rel=1e-9, abs=1e-9)
        pyro.set_rng_seed(seed)
        terms = SplitELBO("analytic").terms(model, guide, x, y)
        assert terms.kl.item() == pytest.approx(expected_kl, rel=1e-9, abs=1e-9)
        assert -terms.log_likelihood.item() == pytest.approx(nll, rel=1e-9)


@pytest.mark.parametrize("case", list(CASES))
def test_split_elbo_equals_pyro_trace_elbo_at_the_same_seed(case):
    model, guide = build(case)
    x, y = data()
    for seed in (3, 4):
        pyro.set_rng_seed(seed)
        expected = Trace_ELBO().loss(model, guide, x, y)
        pyro.set_rng_seed(seed)
        assert SplitELBO("monte_carlo").loss(model, guide, x, y) == pytest.approx(expected, rel=1e-9)


def test_monte_carlo_and_registered_kl_agree_in_expectation_for_a_density():
    # mean-field Normal against a Normal prior: MC KL is unbiased for the exact KL
    model, guide = build("meanfield-normal")
    x, y = data()
    exact = _kl_meanfield_normal(model, guide).item()
    elbo = SplitELBO("monte_carlo", num_particles=4000)
    with torch.no_grad():
        values = torch.stack([elbo.terms(model, guide, x, y).kl for _ in range(5)])
    # each value averages 4000 particles; spread of the five gives the standard error
    assert abs(values.mean().item() - exact) < 5 * values.std().item() / math.sqrt(5) + 1e-9


def test_scale_mixture_has_no_closed_form_and_strict_analytic_refuses():
    model = pyrobnn.BayesianModel(small_net(), pyrobnn.GaussianLikelihood(scale=0.3), pyrobnn.ScaleMixturePrior())
    guide = pyrobnn.MeanFieldNormal(model)
    x, y = data()
    elbo = SplitELBO("analytic")
    elbo.terms(model, guide, x, y)
    assert set(elbo.kl_methods.values()) == {"monte_carlo"}
    with pytest.raises(ValueError, match=r"no KL between \w*Normal and ScaleMixtureNormal"):
        SplitELBO("analytic", strict=True).terms(model, guide, x, y)


def test_kl_is_a_sum_over_weights():
    model, guide = build("meanfield-normal")
    x, y = data()
    kl = SplitELBO("analytic").terms(model, guide, x, y).kl.item()
    per_weight = []
    for s in model.sites:
        q = torch.distributions.Normal(guide.loc[site_key(s.name)], guide.scale_of(s))
        per_weight.append(torch.distributions.kl_divergence(q, torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(PRIOR_SCALE, dtype=torch.float64))).reshape(-1))
    per_weight = torch.cat(per_weight)
    assert per_weight.numel() == sum(p.numel() for p in model.net.parameters()) == 21
    assert kl == pytest.approx(per_weight.sum().item(), rel=1e-10)
    assert abs(kl - per_weight.mean().item()) > 1  # a mean would be another number


@pytest.mark.parametrize("batch_size", [8, 10, 13])
def test_expected_gradient_does_not_depend_on_batch_size(batch_size):
    """For a fixed weight sample, averaging the minibatch gradients over a partition of the
    data (dataset_size passed, so each minibatch is scaled by N/B) gives exactly the
    full-batch gradient: the minibatch ELBO is unbiased for every batch size."""
    model, guide = build("meanfield-normal")
    x, y = data(n=40)
    elbo = SplitELBO("monte_carlo")

    def gradient(xb, yb):
        guide.zero_grad()
        pyro.set_rng_seed(11)  # the same weight sample for every minibatch
        elbo.differentiable_loss(model, guide, xb, yb, dataset_size=40).backward()
        return torch.cat([p.grad.reshape(-1) for p in guide.parameters()])

    full = gradient(x, y)
    parts = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, 40, batch_size)]
    # weight each minibatch by its share of the points (exact when sizes differ)
    average = sum(gradient(xb, yb) * (xb.shape[0] / 40) for xb, yb in parts)
    assert torch.allclose(average, full, rtol=1e-9, atol=1e-9)
    # without the N/B scaling the likelihood gradient would be B/N times too small
    guide.zero_grad()
    pyro.set_rng_seed(11)
    elbo.differentiable_loss(model, guide, x[:batch_size], y[:batch_size]).backward()
    unscaled = torch.cat([p.grad.reshape(-1) for p in guide.parameters()])
    assert not torch.allclose(unscaled, gradient(x[:batch_size], y[:batch_size]))


def test_kl_annealing_schedule_and_loss():
    schedule = KLAnnealing(5, 20)
    assert [schedule(t) for t in (0, 4.99, 5, 12.5, 20, 30)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    model, guide = build("meanfield-normal")
    x, y = data()
    elbo = SplitELBO("analytic")
    elbo.kl_weight = 0.25
    terms = elbo.terms(model, guide, x, y)
    assert terms.loss.item() == pytest.approx(-terms.log_likelihood.item() + 0.25 * terms.kl.item(), rel=1e-12)


def test_vectorized_and_looped_particles_estimate_the_same_elbo():
    model, guide = build("meanfield-normal")
    x, y = data()
    with torch.no_grad():
        vec = torch.tensor([SplitELBO("monte_carlo", num_particles=50).loss(model, guide, x, y) for _ in range(40)])
        loop = torch.tensor(
            [SplitELBO("monte_carlo", num_particles=50, vectorize_particles=False).loss(model, guide, x, y) for _ in range(40)]
        )
    se = math.sqrt(vec.var() / 40 + loop.var() / 40)
    assert abs(vec.mean() - loop.mean()) < 5 * se
