"""Temperature scaling and the classification metrics on constructed classifiers whose
calibration is known."""

import math

import matplotlib.pyplot as plt
import pytest
import torch

from pyrobnn.evaluation.calibration import TemperatureScaling, fit_temperature
from pyrobnn.evaluation.metrics import brier_score, categorical_log_likelihood, expected_calibration_error, ood_auroc
from pyrobnn.evaluation.plotting import plot_reliability_diagram, save_figure


def calibrated_problem(n=20000, classes=4, seed=0, sharpness=2.0):
    """Logits z ~ N(0, sharpness^2) and labels drawn from softmax(z): calibrated by construction."""
    g = torch.Generator().manual_seed(seed)
    logits = sharpness * torch.randn(n, classes, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
    return logits, labels


def test_temperature_recovers_the_overconfidence_factor():
    """Logits multiplied by 3 after drawing the labels: the fitted temperature is 3 up to the
    sampling error of the maximum-likelihood estimate, and NLL drops back to the calibrated one."""
    logits, labels = calibrated_problem()
    t = fit_temperature(3.0 * logits, labels)
    assert t == pytest.approx(3.0, rel=0.05)
    before = -categorical_log_likelihood(torch.softmax(3.0 * logits, -1), labels)
    after = -categorical_log_likelihood(torch.softmax(3.0 * logits / t, -1), labels)
    calibrated = -categorical_log_likelihood(torch.softmax(logits, -1), labels)
    assert after < before - 0.1
    assert after <= calibrated + 1e-3


def test_ece_of_a_calibrated_classifier_is_near_zero_and_of_an_overconfident_one_is_not():
    logits, labels = calibrated_problem()
    probs = torch.softmax(logits, -1)
    ece = expected_calibration_error(probs, labels)
    # each bin's |acc - conf| is a binomial error: expectation below sum_b sqrt(n_b p(1-p)) / N <= sqrt(B / 4N)
    assert ece < math.sqrt(15 / (4 * labels.numel()))
    assert expected_calibration_error(torch.softmax(3 * logits, -1), labels) > 0.05


def test_ece_agrees_with_torchmetrics_and_brier_with_its_definition():
    from torchmetrics.functional.classification import multiclass_calibration_error

    logits, labels = calibrated_problem(n=3000, seed=1)
    probs = torch.softmax(2 * logits, -1)
    ours = expected_calibration_error(probs, labels, num_bins=15)
    theirs = float(multiclass_calibration_error(probs, labels, num_classes=4, n_bins=15, norm="l1"))
    assert ours == pytest.approx(theirs, abs=1e-6)
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    assert brier_score(p, torch.tensor([0, 1])) == pytest.approx((0.0 + 0.5) / 2)


def test_ood_auroc():
    assert ood_auroc(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.4])) == pytest.approx(1.0)
    assert ood_auroc(torch.tensor([0.1, 0.4]), torch.tensor([0.2, 0.3])) == pytest.approx(0.5)


def test_temperature_scaling_wrapper_and_reliability_diagram(tmp_path):
    logits, labels = calibrated_problem(n=2000)
    net = torch.nn.Identity()
    scaled = TemperatureScaling(lambda x: 0.5 * net(x)).fit(logits, labels)
    assert scaled.temperature == pytest.approx(0.5, rel=0.1)
    pred = scaled.predict(logits[:10])
    assert torch.allclose(pred.probs, torch.softmax(logits[:10], -1), atol=0.05)
    fig, ax = plt.subplots()
    plot_reliability_diagram(ax, torch.softmax(logits, -1), labels, label="calibrated")
    save_figure(fig, tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="labels must have shape"):
        fit_temperature(logits, labels[:5])


def test_empty_or_non_finite_inputs_are_refused():
    with pytest.raises(ValueError, match="logits are empty"):
        fit_temperature(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="logits contain non-finite values"):
        fit_temperature(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="score_out is empty"):
        ood_auroc(torch.tensor([0.1]), torch.tensor([]))
    with pytest.raises(ValueError, match="score_in contains non-finite values"):
        ood_auroc(torch.tensor([float("inf")]), torch.tensor([0.2]))
