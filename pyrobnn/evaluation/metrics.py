"""Metrics of predictive distributions, as plain functions of tensors.

Regression predictives here are equal-weight Gaussian mixtures over posterior samples,
:math:`p(y|x) = \\frac1S \\sum_s N(y; \\mu_s(x), \\sigma_s(x)^2)`; classification predictives
are the mean of the per-sample class probabilities. Sample dimension first everywhere.
"""

from __future__ import annotations

import math

import torch

from pyrobnn.utils.validation import check_label_dtype, check_label_range

__all__ = [
    "rmse",
    "gaussian_mixture_log_likelihood",
    "gaussian_mixture_cdf",
    "gaussian_mixture_quantile",
    "interval_coverage",
    "gaussian_mixture_crps",
    "accuracy",
    "categorical_log_likelihood",
    "expected_calibration_error",
    "calibration_bins",
    "brier_score",
    "ood_auroc",
    "entropy",
]


def rmse(mean: torch.Tensor, y: torch.Tensor) -> float:
    """Root mean squared error of the predictive mean."""
    return torch.sqrt(torch.mean((mean - y) ** 2)).item()


def gaussian_mixture_log_likelihood(loc, scale, y) -> float:
    r"""Mean over points of :math:`\log \frac1S \sum_s N(y; \mu_s, \sigma_s^2)`, the test
    log-likelihood of Hernández-Lobato & Adams 2015 and Gal & Ghahramani 2016 (summed over
    output dimensions, averaged over points). ``loc, scale``: ``(S, N, D)``; ``y``: ``(N, D)``."""
    log_p = torch.distributions.Normal(loc, scale).log_prob(y.unsqueeze(0)).sum(-1)
    return (torch.logsumexp(log_p, 0) - math.log(loc.shape[0])).mean().item()


def gaussian_mixture_cdf(loc, scale, value):
    """CDF of the equal-weight mixture at ``value`` (broadcast against ``loc[0]``)."""
    return torch.special.ndtr((value.unsqueeze(0) - loc) / scale).mean(0)


def gaussian_mixture_quantile(loc, scale, q: float, iterations: int = 60):
    """Quantile ``q`` of the equal-weight Gaussian mixture per point, by bisection."""
    scale = scale.expand_as(loc)
    lo = (loc - 10 * scale).min(0).values
    hi = (loc + 10 * scale).max(0).values
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        below = gaussian_mixture_cdf(loc, scale, mid) < q
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def interval_coverage(lower, upper, y) -> float:
    """Fraction of targets inside ``[lower, upper]``."""
    return ((y >= lower) & (y <= upper)).to(torch.float64).mean().item()


def _normal_abs_moment(mu, sigma):
    # E|X| for X ~ N(mu, sigma^2)
    z = mu / sigma
    return sigma * math.sqrt(2 / math.pi) * torch.exp(-0.5 * z**2) + mu * (1 - 2 * torch.special.ndtr(-z))


def gaussian_mixture_crps(loc, scale, y, max_pairs: int = 2**24) -> float:
    r"""Mean continuous ranked probability score of the mixture (lower is better):

    .. math:: CRPS = E|Y - y| - \tfrac12 E|Y - Y'|,

    in closed form for a Gaussian mixture (Grimit et al. 2006): every expectation is a sum of
    :math:`E|N(m, s^2)|` terms. The pairwise term costs :math:`S^2` per point; points are
    processed in chunks to bound memory.
    """
    S = loc.shape[0]
    scale = scale.expand_as(loc)
    loc2 = loc.reshape(S, -1)
    scale2 = scale.reshape(S, -1)
    y2 = y.reshape(-1)
    first = _normal_abs_moment(loc2 - y2, scale2).mean(0)
    second = torch.empty_like(first)
    chunk = max(1, max_pairs // (S * S))
    for i in range(0, loc2.shape[1], chunk):
        m = loc2[:, i : i + chunk]
        s = scale2[:, i : i + chunk]
        diff = m.unsqueeze(0) - m.unsqueeze(1)
        sd = torch.sqrt(s.unsqueeze(0) ** 2 + s.unsqueeze(1) ** 2)
        second[i : i + chunk] = _normal_abs_moment(diff, sd).mean((0, 1))
    return (first - 0.5 * second).mean().item()


def entropy(probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy in nats along ``dim`` (0 log 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(dim)


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of points whose most probable class is the label."""
    return (probs.argmax(-1) == y).to(torch.float64).mean().item()


def error_percent(scores: torch.Tensor, y: torch.Tensor) -> float:
    """Classification error in percent, ``100 * mistakes / N`` from the count of mistakes, so
    that equal predictions give bit-equal errors (``100 * (1 - accuracy)`` does not: 30.9
    against 30.900000000000006). ``scores`` are probabilities, logits or log-probabilities
    (``-inf`` allowed, NaN not); ``y`` integer labels in ``[0, classes)``."""
    if scores.shape[:-1] != y.shape or y.numel() == 0:
        raise ValueError(f"need one row of class scores per label, got scores {tuple(scores.shape)} and labels {tuple(y.shape)}")
    check_label_dtype(y)
    check_label_range(y, scores.shape[-1])
    if scores.is_floating_point() and torch.isnan(scores).any():
        raise ValueError(f"the class scores contain NaN ({int(torch.isnan(scores).sum())} entries)")
    return 100.0 * int((scores.argmax(-1) != y).sum()) / y.numel()


def categorical_log_likelihood(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Mean log predictive probability of the labels."""
    p = probs.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    return torch.log(p.clamp_min(torch.finfo(probs.dtype).tiny)).mean().item()


def expected_calibration_error(probs: torch.Tensor, y: torch.Tensor, num_bins: int = 15) -> float:
    r"""Expected calibration error of the top-label confidence (Guo et al. 2017):
    :math:`\sum_b \frac{n_b}{N} |acc_b - conf_b|` over ``num_bins`` equal-width bins."""
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).to(probs.dtype)
    bins = torch.clamp((confidence * num_bins).long(), max=num_bins - 1)
    conf_sum = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add_(0, bins, confidence)
    acc_sum = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add_(0, bins, correct)
    return ((conf_sum - acc_sum).abs().sum() / confidence.numel()).item()


def calibration_bins(probs: torch.Tensor, y: torch.Tensor, num_bins: int = 15):
    """Per equal-width confidence bin: ``(count, mean confidence, accuracy)``, each
    ``(num_bins,)`` (confidence and accuracy are NaN in empty bins); the data of a reliability
    diagram."""
    confidence, predicted = probs.max(-1)
    correct = (predicted == y).to(probs.dtype)
    bins = torch.clamp((confidence * num_bins).long(), max=num_bins - 1)
    count = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add_(0, bins, torch.ones_like(confidence))
    conf = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add_(0, bins, confidence) / count
    acc = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add_(0, bins, correct) / count
    return count, conf, acc


def brier_score(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean over points of :math:`\sum_c (p_c - 1[y = c])^2` (Brier 1950; the multi-class form,
    between 0 and 2)."""
    onehot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(probs.dtype)
    return ((probs - onehot) ** 2).sum(-1).mean().item()


def ood_auroc(score_in: torch.Tensor, score_out: torch.Tensor) -> float:
    """Area under the ROC curve for telling out-of-distribution points (positives) from
    in-distribution ones by a score that should be higher out of distribution (predictive
    entropy, mutual information); 0.5 is chance. Computed by torchmetrics."""
    from torchmetrics.functional.classification import binary_auroc

    for name, score in (("score_in", score_in), ("score_out", score_out)):
        if score.numel() == 0:
            raise ValueError(f"{name} is empty: the AUROC needs points on both sides")
        if not torch.isfinite(score).all():
            raise ValueError(f"{name} contains non-finite values")
    scores = torch.cat([score_in.reshape(-1), score_out.reshape(-1).to(score_in.device)]).double()
    labels = torch.cat([torch.zeros(score_in.numel(), dtype=torch.long, device=scores.device), torch.ones(score_out.numel(), dtype=torch.long, device=scores.device)])
    return float(binary_auroc(scores, labels))
