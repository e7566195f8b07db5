"""IVON against known answers: the conjugate regression's mean-field optimum, the reference
implementation (ivon-opt) step by step, and the mapping of priors and refusals."""

import math

import pyro.distributions as dist
import pytest
import torch

import pyrobnn
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.svi.ivon import default_beta2
from test_conjugate import NOISE, bayesian_linear_model, conjugate_problem


def _moments(result, model):
    guide = result.guide
    site = model.sites[0]
    return guide.posterior_mean_of(site).detach().reshape(-1), guide.scale_of(site).detach().reshape(-1)


@pytest.mark.slow  # about 9 s: six runs, run by .ci/run's -m slow
def test_ivon_reaches_the_mean_field_optimum_of_the_conjugate_regression():
    """Its fixed point is the exact mean with variances 1 / diag(precision). The runs' spread
    over seeds gives the Monte Carlo standard error of the averaged answer."""
    X, y, mean, precision = conjugate_problem()
    target_sd = precision.diagonal().rsqrt()
    means, sds = [], []
    for seed in range(6):
        model = bayesian_linear_model()
        # the Hessian of a linear model is constant: a short average (beta2) converges within the run
        result = pyrobnn.ivon(model, X, y.unsqueeze(-1), epochs=1500, batch_size=100, lr=0.1, beta2=0.99, seed=seed, progress=False)
        m, s = _moments(result, model)
        means.append(m)
        sds.append(s)
    means, sds = torch.stack(means), torch.stack(sds)
    se_m, se_s = means.std(0) / math.sqrt(6), sds.std(0) / math.sqrt(6)
    assert ((means.mean(0) - mean).abs() < 4 * se_m + 1e-3 * target_sd).all(), (means.mean(0), mean, se_m)
    assert ((sds.mean(0) - target_sd).abs() < 4 * se_s + 0.01 * target_sd).all(), (sds.mean(0), target_sd, se_s)
    # not the exact marginal sd: the inputs are correlated, and a diagonal Gaussian cannot say so
    exact_sd = torch.linalg.inv(precision).diagonal().sqrt()
    assert (exact_sd[:2] / target_sd[:2] > 1.4).all()


def test_ivon_agrees_with_the_reference_implementation_step_by_step():
    ivon_opt = pytest.importorskip("ivon")
    X, y, _, _ = conjugate_problem()
    model = bayesian_linear_model()
    steps, n = 25, X.shape[0]
    ours = pyrobnn.ivon(model, X, y.unsqueeze(-1), epochs=steps, batch_size=n, lr=0.05, hess_init=0.5, beta2=0.99, seed=7,
                        warmup=0.0, schedule="constant", progress=False)
    m_ours, s_ours = _moments(ours, model)

    potential = FlatPotential(model, X, y.unsqueeze(-1))
    w = torch.nn.Parameter(model.sites[0].value.detach().reshape(1, -1).clone())
    optimizer = ivon_opt.IVON([w], lr=0.05, ess=n, hess_init=0.5, beta2=0.99, weight_decay=1.0 / n)  # prior N(0, 1)
    torch.manual_seed(7)  # its draws come from the global generator: the same stream as ours
    for _ in range(steps):
        with optimizer.sampled_params(train=True):
            optimizer.zero_grad()
            loss = -potential.log_joint_terms(w, X, potential.y)[1].sum() / n
            loss.backward()
        optimizer.step()
    hess = optimizer.param_groups[0]["hess"]
    torch.testing.assert_close(m_ours, w.detach().reshape(-1), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(s_ours, (n * (hess + 1.0 / n)).rsqrt(), rtol=1e-9, atol=1e-12)


def test_ivon_returns_a_guide_every_verb_takes_and_fits_a_latent_noise_scale():
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 40).unsqueeze(-1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(40, 1)
    model = pyrobnn.BayesianModel(
        pyrobnn.MLP(1, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.25), 1.0)), pyrobnn.NormalPrior(1.0)
    )
    result = pyrobnn.ivon(model, x, y, epochs=300, batch_size=20, progress=False)
    assert isinstance(result.guide, pyrobnn.MeanFieldNormal)
    assert result.method.startswith("IVON") and len(result.history) == 300
    assert result.settings["beta2"] == default_beta2(600) == 0.999
    scale = result.guide.latent_posterior("noise_scale")
    assert 0.05 < float(scale.mean.detach()) < 0.5  # moved from the prior's mean (about 0.41) toward the data's 0.1
    pred = result.predict(x, 50, seed=0)
    assert pred.mean.shape == (40, 1) and torch.isfinite(pred.mean).all()
    samples = result.sample(20, seed=0)
    assert samples.samples["noise_scale"].shape[:2] == (1, 20)


def test_ivon_refuses_what_it_cannot_express_by_name():
    X, y, _, _ = conjugate_problem()
    net = torch.nn.Linear(3, 1, bias=False).double()
    laplace_prior = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=NOISE), pyrobnn.LogUniformPrior())
    with pytest.raises(ValueError, match="site 'weight' has a .* prior"):
        pyrobnn.ivon(laplace_prior, X, y.unsqueeze(-1), progress=False)
    model = bayesian_linear_model()
    for kwargs, message in (({"lr": 0.0}, "lr must be a positive"), ({"beta2": 1.0}, "beta2 must be in"),
                            ({"epochs": 0}, "epochs"), ({"ess": -1.0}, "ess must be a positive")):
        with pytest.raises(ValueError, match=message):
            pyrobnn.ivon(model, X, y.unsqueeze(-1), progress=False, **kwargs)


@pytest.mark.slow  # about 12 s: NUTS, mean-field VI and IVON on one toy problem
def test_ivon_predicts_as_close_to_nuts_as_mean_field_vi_or_closer():
    """On the gap regression, the 2-Wasserstein distance of the predictive to NUTS's over a grid
    through the gap (we measured 0.06 for IVON at 1000-5000 epochs, 0.06-0.13 for mean-field VI
    at 5000-2000 epochs)."""
    from pyrobnn.apps.compare.runner import predictive_w2
    from pyrobnn.data import gap_regression

    x, y = gap_regression(n=60, seed=0)
    grid = torch.linspace(-1.5, 1.5, 31).unsqueeze(-1)

    def model():
        torch.manual_seed(0)
        return pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(16,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))

    m = model()
    reference = pyrobnn.nuts(m, x, y, num_samples=300, num_warmup=300, num_chains=4, progress=False, seed=0).predict(grid)
    m = model()
    guide = pyrobnn.MeanFieldNormal(m)
    pyrobnn.fit(m, guide, x, y, epochs=2000, lr=1e-2, progress=False, seed=0)
    mean_field = predictive_w2(pyrobnn.predict(m, guide, grid, 500, seed=0), reference)
    m = model()
    ivon = predictive_w2(pyrobnn.ivon(m, x, y, epochs=1000, batch_size=60, progress=False).predict(grid, 500, seed=0), reference)
    assert ivon <= mean_field, (ivon, mean_field)


def test_the_learning_rate_ramps_up_then_decays():
    from pyrobnn.infer.svi.ivon import warmup_cosine_factor

    assert warmup_cosine_factor(0, 100, 0.05, "cosine") == pytest.approx(0.2)
    assert warmup_cosine_factor(4, 100, 0.05, "cosine") == pytest.approx(1.0)
    assert warmup_cosine_factor(52, 100, 0.05, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 47 / 95)))
    assert warmup_cosine_factor(60, 100, 0.05, "constant") == 1.0


def test_default_beta2_follows_the_run_length():
    assert default_beta2(100) == 0.999
    assert default_beta2(10_000) == pytest.approx(0.9999)
    assert default_beta2(10**8) == 0.99999


def test_a_warm_start_continues_from_the_previous_fit():
    """``init``: the flat mean and standard deviations read back from a fit's guide are the ones
    it was built from, and one step of 1e-12 from them leaves the means where they were and the
    standard deviations where they were too (the Hessian averaged with weight 1 - 1e-9)."""
    import pyrobnn
    from pyrobnn.infer.core.potential import FlatPotential
    from pyrobnn.infer.svi.ivon import _flat_guide, ivon

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    y = x[:, :1] - 0.5 * x[:, 1:] + 0.1 * torch.randn(40, 1, generator=g, dtype=torch.float64)
    import pyro.distributions as dist
    net = pyrobnn.MLP(2, 1, hidden=(6,), activation="tanh").double()
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=dist.LogNormal(torch.tensor(-2.0, dtype=torch.float64), 1.0)),
                                  pyrobnn.NormalPrior(1.0))
    first = ivon(model, x, y, epochs=30, batch_size=40, progress=False)
    potential = FlatPotential(model, x, y)
    m, s = _flat_guide(first.guide, potential)
    again = ivon(model, x, y, epochs=1, batch_size=40, lr=1e-12, beta2=1 - 1e-9, hess_init=1e-8, progress=False, init=first)
    m2, s2 = _flat_guide(again.guide, potential)
    torch.testing.assert_close(m2, m, rtol=0, atol=1e-9)
    torch.testing.assert_close(s2, s, rtol=1e-6, atol=0)
    fresh_m, _ = _flat_guide(ivon(model, x, y, epochs=1, batch_size=40, lr=1e-12, progress=False).guide, potential)
    assert (fresh_m - m).abs().max() > 1e-3  # the check can fail
    with pytest.raises(TypeError, match="init must be"):
        ivon(model, x, y, epochs=1, init=object())
