"""SWAG's Gaussian from known iterates, written out from Maddox et al. (2019, sec. 3) by hand."""

import math

import pytest
import torch

import pyrobnn
from pyrobnn.infer.modes.swag import swag, swag_moments


def test_swag_covariance_is_the_diagonal_plus_low_rank_formula():
    g = torch.Generator().manual_seed(0)
    iterates = torch.randn(1, 12, 5, dtype=torch.float64, generator=g) + torch.arange(5, dtype=torch.float64)
    rank = 4
    w = iterates[0]
    mean = w.mean(0)
    diag = (w**2).mean(0) - mean**2
    # deviation of iterate t from the running mean of iterates 1..t, for the last `rank` of them
    cols = [w[t] - w[: t + 1].mean(0) for t in range(12 - rank, 12)]
    D = torch.stack(cols, 1)  # (d, K)
    expected = 0.5 * torch.diag(diag) + D @ D.T / (2 * (rank - 1))
    moments = swag_moments(iterates, rank)
    assert torch.allclose(moments.mean[0], mean, atol=1e-12)
    assert torch.allclose(moments.diagonal[0], diag, atol=1e-12)
    assert torch.allclose(moments.covariance()[0], expected, atol=1e-12)


def test_swag_draws_have_the_swag_covariance():
    g = torch.Generator().manual_seed(1)
    moments = swag_moments(torch.randn(2, 10, 3, dtype=torch.float64, generator=g), rank=5)
    s = 40000
    draws = moments.sample(s, torch.Generator().manual_seed(2))
    for r in range(2):
        cov = moments.covariance()[r]
        sd = cov.diagonal().sqrt()
        assert ((draws[r].mean(0) - moments.mean[r]).abs() < 5 * sd / math.sqrt(s)).all()
        # covariance entries: standard error sqrt((S_ii S_jj + S_ij^2) / n) for Gaussian draws
        se = ((cov.diagonal().unsqueeze(0) * cov.diagonal().unsqueeze(1) + cov**2) / s).sqrt()
        assert ((torch.cov(draws[r].T) - cov).abs() < 5 * se).all()


def test_swag_runs_on_a_model_and_feeds_predict():
    torch.manual_seed(0)
    x = torch.randn(64, 1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(64, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(16,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    result = swag(model, x, y, num_epochs=10, lr=1e-3, batch_size=16, rank=5, num_samples=20, num_runs=2,
                  map_options={"max_epochs": 50}, progress=False)
    assert result.num_chains == 2 and result.num_draws == 20
    pred = pyrobnn.predict(model, result, x[:3])
    assert pred.epistemic_std.min() > 0
    with pytest.raises(ValueError, match="swag: num_epochs must be an integer >= 2, got 1"):
        swag(model, x, y, num_epochs=1)


def test_swag_result_goes_into_arviz():
    torch.manual_seed(1)
    x = torch.randn(32, 1)
    y = x + 0.1 * torch.randn(32, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(4,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    result = swag(model, x, y, num_epochs=4, batch_size=8, rank=3, num_samples=10, num_runs=2, map_options={"max_epochs": 20}, progress=False)
    from pyrobnn.infer.results import diagnostics

    idata = diagnostics.inference_data(model, result, x[:5], y[:5])
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == 10


def test_swag_warns_when_sgd_leaves_the_map():
    torch.manual_seed(2)
    x = torch.randn(64, 1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(64, 1)
    model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(16,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
    ensemble = pyrobnn.deep_ensemble(model, x, y, num_members=1, max_epochs=300, lr=1e-2, batch_size=None, progress=False)
    with pytest.warns(UserWarning, match="moved away from the MAP"):
        swag(model, x, y, num_epochs=5, lr=0.05, momentum=0.0, batch_size=64, rank=3, num_samples=5, map_estimate=ensemble, progress=False)
