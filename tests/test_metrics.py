"""Metric functions against hand computations and scipy."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats

from pyrobnn.evaluation import metrics
from pyrobnn.evaluation.predictions import ClassificationPrediction, RegressionPrediction


def test_expected_calibration_error_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.45, 0.55]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0])
    # bins of width 0.1: confidences 0.9 (right), 0.8 (wrong), 0.7 (right), 0.55 (wrong)
    expected = (abs(0.9 - 1) + abs(0.8 - 0) + abs(0.7 - 1) + abs(0.55 - 0)) / 4
    assert metrics.expected_calibration_error(probs, y, num_bins=10) == pytest.approx(expected)


def test_mixture_quantiles_cdf_and_log_likelihood_against_scipy():
    loc = torch.tensor([[[0.0]], [[2.0]], [[-1.0]]], dtype=torch.float64)
    scale = torch.tensor([[[1.0]], [[0.5]], [[2.0]]], dtype=torch.float64)
    cdf = lambda v: np.mean([stats.norm.cdf(v, m, s) for m, s in zip([0, 2, -1], [1, 0.5, 2])])  # noqa: E731
    for q in (0.05, 0.5, 0.95):
        expected = optimize.brentq(lambda v: cdf(v) - q, -20, 20, xtol=1e-12)
        assert metrics.gaussian_mixture_quantile(loc, scale, q).item() == pytest.approx(expected, abs=1e-8)
    y = torch.tensor([[0.7]], dtype=torch.float64)
    dens = np.mean([stats.norm.pdf(0.7, m, s) for m, s in zip([0, 2, -1], [1, 0.5, 2])])
    assert metrics.gaussian_mixture_log_likelihood(loc, scale, y) == pytest.approx(math.log(dens))


def test_crps_closed_form_against_the_integral_definition():
    loc = torch.tensor([[[0.0]], [[1.5]]], dtype=torch.float64)
    scale = torch.tensor([[[1.0]], [[0.3]]], dtype=torch.float64)
    y0 = 0.4
    cdf = lambda v: 0.5 * (stats.norm.cdf(v, 0, 1) + stats.norm.cdf(v, 1.5, 0.3))  # noqa: E731
    integral = integrate.quad(lambda v: cdf(v) ** 2, -30, y0, limit=200)[0] + integrate.quad(lambda v: (1 - cdf(v)) ** 2, y0, 30, limit=200)[0]
    assert metrics.gaussian_mixture_crps(loc, scale, torch.tensor([[y0]], dtype=torch.float64)) == pytest.approx(integral, rel=1e-8)
    # one Gaussian: CRPS = s (z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)) (Gneiting & Raftery 2007)
    z = (y0 - 0.0) / 1.0
    gauss = z * (2 * stats.norm.cdf(z) - 1) + 2 * stats.norm.pdf(z) - 1 / math.sqrt(math.pi)
    assert metrics.gaussian_mixture_crps(loc[:1], scale[:1], torch.tensor([[y0]], dtype=torch.float64)) == pytest.approx(gauss, rel=1e-10)


def test_regression_prediction_coverage_and_rescaling():
    torch.manual_seed(0)
    loc = torch.zeros(1, 20_000, 1, dtype=torch.float64)
    scale = torch.ones(1, 20_000, 1, dtype=torch.float64)
    pred = RegressionPrediction(loc, scale)
    y = torch.randn(20_000, 1, dtype=torch.float64)
    # binomial standard error of a 90% coverage on 20,000 points: 0.0021
    assert pred.coverage(y, 0.9) == pytest.approx(0.9, abs=5 * 0.0021)
    rescaled = pred.rescale(3.0, 2.0)
    assert torch.allclose(rescaled.mean, torch.full((20_000, 1), 3.0, dtype=torch.float64))
    assert rescaled.log_likelihood(3 + 2 * y) == pytest.approx(pred.log_likelihood(y) - math.log(2))


def test_entropy_and_mutual_information_identities():
    # every sample says the same: no epistemic uncertainty
    same = ClassificationPrediction(torch.tensor([[[0.2, 0.8]]] * 4))
    assert same.mutual_information.item() == pytest.approx(0.0, abs=1e-7)
    # confident samples that disagree evenly: all uncertainty is epistemic, log 2 nats
    split = ClassificationPrediction(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
    assert split.entropy.item() == pytest.approx(math.log(2))
    assert split.mutual_information.item() == pytest.approx(math.log(2))
    assert split.expected_entropy.item() == pytest.approx(0.0)


def test_error_percent_counts_mistakes_exactly():
    y = torch.arange(1000) % 10
    scores = torch.nn.functional.one_hot(y, 10).double()
    scores[:309] = scores[:309].roll(1, dims=-1)  # 309 mistakes
    assert metrics.error_percent(scores, y) == 30.9  # 100 * (1 - accuracy) gives 30.900000000000006
    assert metrics.error_percent(scores.log_softmax(-1), y) == 30.9  # logits give the same
    with pytest.raises(ValueError, match="one row of class scores per label"):
        metrics.error_percent(scores[:10], y)
    with pytest.raises(ValueError, match="one row of class scores per label"):
        metrics.error_percent(scores[:0], y[:0])
    with pytest.raises(ValueError, match="integer tensor"):
        metrics.error_percent(scores, y.double())
    with pytest.raises(ValueError, match=r"lie in \[0, 10\)"):
        metrics.error_percent(scores, y + 1)
    nan_scores = scores.clone()
    nan_scores[3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        metrics.error_percent(nan_scores, y)
    log_probs = scores.log()  # -inf where a probability is 0: allowed
    assert metrics.error_percent(log_probs, y) == 30.9
