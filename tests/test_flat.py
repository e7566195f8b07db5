"""The flat (trace-free) ELBO used by the trainer equals the Pyro-traced one."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn.models.distributions import MultiplicativeNormal
from pyrobnn.models.estimators import ESTIMATORS
from pyrobnn.guides.base import site_key
from pyrobnn.guides.mean_field import mean_field_normal_terms
from pyrobnn.guides.variational_dropout import sparse_vd_terms
from pyrobnn.infer import SplitELBO
from pyrobnn.infer.svi.trace_free import TraceFreeELBO
from pyrobnn.models.kl import base_distribution

CASES = {
    "meanfield-normal": (lambda: pyrobnn.NormalPrior(0.7, fan_in=True), lambda m: pyrobnn.MeanFieldNormal(m, init_scale=0.1)),
    "meanfield-mixture": (lambda: pyrobnn.ScaleMixturePrior(), lambda m: pyrobnn.MeanFieldNormal(m, init_scale=0.1)),
    "sparsevd-loguniform": (lambda: pyrobnn.LogUniformPrior(), lambda m: pyrobnn.SparseVariationalDropout(m, init_log_sigma2=-5.0)),
    "mcdropout-normal": (lambda: pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.MCDropout(m, p=0.2)),
    "concrete-normal": (lambda: pyrobnn.NormalPrior(1.0), lambda m: pyrobnn.ConcreteDropout(m)),
}


def build(case, noise_prior=False):
    torch.manual_seed(0)
    prior, make_guide = CASES[case]
    likelihood = pyrobnn.GaussianLikelihood(scale=dist.LogNormal(-1.0, 0.5) if noise_prior else 0.3)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(3, 1, hidden=(8,), activation="tanh"), likelihood, prior())
    guide = make_guide(model)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 3, generator=g)
    return model, guide, x, x[:, :1].sin()


@pytest.mark.parametrize("noise_prior", [False, True])
@pytest.mark.parametrize("kl", ["monte_carlo", "analytic"])
@pytest.mark.parametrize("case", list(CASES))
def test_flat_equals_traced_with_weight_sampling(case, kl, noise_prior):
    if kl == "monte_carlo" and case in ("mcdropout-normal", "concrete-normal"):
        pass  # their pseudo-density makes the MC KL exact as well: still comparable
    model, guide, x, y = build(case, noise_prior)
    flat = TraceFreeELBO(model, guide, kl=kl)
    for seed in (0, 1):
        pyro.set_rng_seed(seed)
        a = SplitELBO(kl).terms(model, guide, x, y, dataset_size=100)
        pyro.set_rng_seed(seed)
        b = flat.terms(x, y, dataset_size=100)
        assert b.loss.item() == pytest.approx(a.loss.item(), rel=1e-5)
        assert b.kl.item() == pytest.approx(a.kl.item(), rel=1e-5, abs=1e-5)
        # and the same gradient
        grads = []
        for terms_fn in (lambda: SplitELBO(kl).terms(model, guide, x, y, dataset_size=100), lambda: flat.terms(x, y, dataset_size=100)):
            guide.zero_grad()
            pyro.set_rng_seed(seed)
            terms_fn().loss.backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in guide.parameters() if p.grad is not None]))
        assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
@pytest.mark.parametrize("case", ["meanfield-normal", "sparsevd-loguniform", "mcdropout-normal"])
def test_flat_agrees_with_traced_under_estimators(case, estimator):
    model, guide, x, y = build(case)
    flat = TraceFreeELBO(model, guide, kl="analytic", estimator=ESTIMATORS[estimator]())
    with torch.no_grad():
        traced = []
        for _ in range(300):
            with ESTIMATORS[estimator]():
                traced.append(SplitELBO("analytic").loss(model, guide, x, y))
        flat_values = [flat.terms(x, y).loss.item() for _ in range(300)]
    a, b = torch.tensor(traced, dtype=torch.float64), torch.tensor(flat_values, dtype=torch.float64)
    se = math.sqrt(a.var() / 300 + b.var() / 300)
    assert abs(a.mean() - b.mean()) < 5 * se


def _fused_cases():
    torch.manual_seed(2)
    model, guide, _, _ = build("meanfield-normal")
    vd_model, vd_guide, _, _ = build("sparsevd-loguniform")
    clipped = pyrobnn.SparseVariationalDropout(vd_model, train_clip=3.0)
    with torch.no_grad():  # a third of the weights above the clip threshold
        for key, log_sigma2 in clipped.log_sigma2.items():
            log_sigma2.copy_(torch.where(torch.rand_like(log_sigma2) < 1 / 3, 5.0 + torch.log(clipped.theta[key] ** 2), log_sigma2))
    return [(model, guide), (vd_model, vd_guide), (vd_model, clipped)]


def test_fused_terms_equal_the_factor_and_the_registered_kl():
    for model, guide in _fused_cases():
        with torch.no_grad():
            for p in guide.parameters():
                p.add_(0.3 * torch.randn_like(p))
        for site in model.sites:
            prior = model.prior_distribution(site)
            fn, args = guide.fused_terms(site, base_distribution(prior))
            loc, scale, kl = fn(*args)
            q = guide.posterior(site)
            assert torch.equal(loc, q.loc)
            assert torch.equal(loc, guide.posterior_mean_of(site))
            assert torch.allclose(scale, q.scale)
            assert torch.allclose(kl, torch.distributions.kl_divergence(q.to_event(len(site.shape)), prior))


def test_train_clip_zeroes_the_mean_above_the_threshold_and_keeps_the_variance():
    model, clipped = _fused_cases()[2]
    clipped_some = False
    for site in model.sites:
        key = site_key(site.name)
        q = clipped.posterior(site)
        plain = MultiplicativeNormal.from_log_sigma2(clipped.theta[key], clipped.log_sigma2[key])
        above = q.log_alpha >= 3.0
        clipped_some |= bool(above.any() and not above.all())
        assert torch.all(q.loc[above] == 0)
        assert torch.equal(q.loc[~above], plain.loc[~above])
        assert torch.equal(q.scale, plain.scale)
        assert torch.equal(q.log_alpha, plain.log_alpha)
    assert clipped_some


def test_compiled_fused_terms_match_eager():
    """torch.compile of the fused site computations (Kahan-form softplus, one pass) gives the
    eager numbers to float32 rounding."""
    for fn, args in (
        (mean_field_normal_terms, (torch.randn(5000), torch.randn(5000) * 4 - 3, 0.0, 0.5)),
        (sparse_vd_terms, (torch.randn(5000) * 0.1, torch.randn(5000) * 3 - 6, -8.0, 8.0)),
        (sparse_vd_terms, (torch.randn(5000) * 0.1, torch.randn(5000) * 3 - 6, -8.0, 8.0, 3.0)),
    ):
        loc, scale, kl = fn(*args)
        cloc, cscale, ckl = torch.compile(fn, dynamic=True)(*args)
        assert torch.equal(cloc, loc)
        assert torch.allclose(cscale, scale, rtol=1e-5, atol=1e-30)
        assert ckl.item() == pytest.approx(kl.item(), rel=1e-5)


def test_trainer_uses_the_flat_path_only_where_it_applies():
    model, guide, x, y = build("meanfield-normal")
    assert pyrobnn.SVITrainer(model, guide).flat is not None
    assert pyrobnn.SVITrainer(model, guide, num_particles=4).flat is None
    assert pyrobnn.SVITrainer(model, guide, elbo=pyro.infer.Trace_ELBO()).flat is None
    auto = pyro.infer.autoguide.AutoNormal(model)
    assert pyrobnn.SVITrainer(model, auto).flat is None


def test_train_clip_needs_a_per_weight_alpha():
    model, _, _, _ = build("sparsevd-loguniform")
    with pytest.raises(ValueError, match="train_clip needs a per-weight alpha"):
        pyrobnn.VariationalDropout(model, alpha="unit", train_clip=3.0)
