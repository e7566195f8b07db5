"""Posterior predictive: vectorized sampling, the uncertainty split, the naive prediction."""

import math

import pyro
import pytest
import torch
from pyro.infer import Predictive
from scipy import stats
from torch import nn

import pyrobnn
from pyrobnn.guides.base import site_key


class TwoBranch(nn.Module):
    """A custom forward with a convolution, a skip connection and a shared layer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 8, 1)

    def forward(self, x):
        h = torch.relu(self.conv(x.unsqueeze(1))).flatten(1)
        return self.fc(h) + x.mean(-1, keepdim=True)


def trained(net, guide_cls=pyrobnn.MeanFieldNormal, scale=0.05, **guide_kwargs):
    model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=scale))
    guide = guide_cls(model, **guide_kwargs)
    # spread the posterior so that the test distinguishes the samples
    for name, p in guide.named_parameters():
        if "rho" in name:
            p.data.fill_(-2.0)
    return model, guide


@pytest.mark.parametrize(
    "net_factory,x",
    [
        (lambda: pyrobnn.MLP(2, 1, hidden=(8,)), torch.randn(6, 2)),
        (TwoBranch, torch.randn(6, 8)),
        (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 1)), torch.randn(6, 1, 6, 6)),
    ],
)
def test_vectorized_predictive_agrees_in_distribution_with_sequential(net_factory, x):
    torch.manual_seed(0)
    model, guide = trained(net_factory())
    S = 1500
    vec = Predictive(model, guide=guide, num_samples=S, parallel=True, return_sites=["_RETURN"])(x)["_RETURN"]
    seq = Predictive(model, guide=guide, num_samples=S, parallel=False, return_sites=["_RETURN"])(x)["_RETURN"]
    assert vec.shape == seq.shape == (S, x.shape[0], 1)
    pvalues = [stats.ks_2samp(vec[:, i, 0].numpy(), seq[:, i, 0].numpy()).pvalue for i in range(x.shape[0])]
    # six two-sample tests of equal distributions: all p-values above 1e-3 (Bonferroni 6e-3)
    assert min(pvalues) > 1e-3, pvalues
    # and the spread is real (not a deterministic output)
    assert vec.std(0).min() > 1e-3


def test_vectorized_samples_are_independent_weight_draws():
    model, guide = trained(nn.Linear(1, 1))
    x = torch.ones(1, 1)
    out = Predictive(model, guide=guide, num_samples=4000, parallel=True, return_sites=["_RETURN"])(x)["_RETURN"].reshape(-1)
    # output = w + b with w, b independent Normals: variance sigma_w^2 + sigma_b^2
    var = sum(guide.scale_of(s).pow(2).sum() for s in model.sites).item()
    # sample variance of 4000 normal draws has relative standard error sqrt(2/3999) = 2.2%
    assert out.var().item() == pytest.approx(var, rel=5 * math.sqrt(2 / 3999))


def test_uncertainty_split_matches_the_mixture_of_sampled_targets():
    torch.manual_seed(1)
    model, guide = trained(pyrobnn.MLP(1, 1, hidden=(8,)), scale=0.2)
    x = torch.linspace(-1, 1, 5).unsqueeze(-1)
    pyro.set_rng_seed(3)
    pred = pyrobnn.predict(model, guide, x, 4000)
    assert torch.allclose(pred.std**2, pred.epistemic_std**2 + pred.aleatoric_std**2)
    assert torch.allclose(pred.aleatoric_std, torch.full((5, 1), 0.2))
    # y drawn from the same predictive: its variance is the mixture's
    ys = Predictive(model, guide=guide, num_samples=4000, parallel=True, return_sites=["obs"])(x)["obs"]
    var_y = ys.var(0)
    se = var_y * math.sqrt(2 / 3999) * 1.5  # normal-theory SE, with room for excess kurtosis
    assert torch.all((var_y - pred.std**2).abs() < 5 * se)


def test_naive_prediction_uses_the_posterior_mean_weights():
    model, guide = trained(pyrobnn.MLP(2, 1, hidden=(8,)))
    x = torch.randn(7, 2)
    pred = pyrobnn.predict(model, guide, x, method="mean")
    net = model.deterministic_net(guide.posterior_mean())
    assert pred.num_samples == 1
    assert torch.allclose(pred.mean, net(x))
    # the deterministic net copies the means; the original keeps its own weights
    assert torch.equal(dict(net.named_parameters())["0.weight"], guide.loc[site_key("0.weight")].detach())
    # the same through the guide's result; a result of draws has no posterior mean to predict at
    vi = pyrobnn.VariationalPosterior(model, guide)
    assert torch.equal(pyrobnn.predict(model, vi, x, method="mean").mean, pred.mean)
    draws = vi.as_draws(5, seed=0)
    with pytest.raises(ValueError, match="method='mean' needs a guide; a Posterior predicts from its draws"):
        pyrobnn.predict(model, draws, x, method="mean")


def test_chunked_prediction_matches_one_pass_in_distribution():
    model, guide = trained(pyrobnn.MLP(2, 1, hidden=(8,)))
    x = torch.randn(9, 2)
    one = pyrobnn.predict(model, guide, x, 3000, seed=0)
    chunked = pyrobnn.predict(model, guide, x, 3000, batch_size=4, sample_batch_size=700, seed=1)
    assert chunked.loc_samples.shape == one.loc_samples.shape == (3000, 9, 1)
    se = torch.sqrt(one.loc_samples.var(0) / 3000 + chunked.loc_samples.var(0) / 3000)
    assert torch.all((one.mean - chunked.mean).abs() < 5 * se)


def test_classification_prediction_reports_entropy_and_mutual_information():
    net = pyrobnn.MLP(2, 3, hidden=(8,))
    model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood())
    guide = pyrobnn.MCDropout(model, p=0.5)
    pred = pyrobnn.predict(model, guide, torch.randn(5, 2), 500)
    assert pred.sample_probs.shape == (500, 5, 3)
    assert torch.allclose(pred.entropy, -(pred.probs * pred.probs.log()).sum(-1))
    assert torch.all(pred.mutual_information >= 0)
    assert torch.all(pred.mutual_information <= pred.entropy + 1e-6)
    assert pred.mutual_information.max() > 1e-3  # dropout masks disagree
