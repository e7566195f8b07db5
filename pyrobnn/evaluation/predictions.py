"""Posterior predictive summaries returned by :func:`pyrobnn.predict`.

Both keep the per-sample quantities they were computed from, so any further metric can be
computed without sampling again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pyrobnn.evaluation import metrics

__all__ = ["RegressionPrediction", "ClassificationPrediction"]


@dataclass
class RegressionPrediction:
    r"""Gaussian-mixture posterior predictive of a regression BNN.

    With per-sample means :math:`\mu_s(x)` and noise scales :math:`\sigma_s(x)`:

    - ``mean`` :math:`= \frac1S\sum_s \mu_s`
    - ``epistemic_std`` :math:`= \sqrt{\frac1S\sum_s(\mu_s - \bar\mu)^2}` (model uncertainty)
    - ``aleatoric_std`` :math:`= \sqrt{\frac1S\sum_s\sigma_s^2}` (noise)
    - ``std`` :math:`= \sqrt{\text{epistemic}^2 + \text{aleatoric}^2}`, the mixture's standard
      deviation (law of total variance).

    :ivar loc_samples: ``(S, N, D)`` per-sample means.
    :ivar scale_samples: per-sample noise scales, broadcastable to ``loc_samples``.
    """

    loc_samples: torch.Tensor
    scale_samples: torch.Tensor

    @property
    def num_samples(self) -> int:
        return self.loc_samples.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        return self.loc_samples.mean(0)

    @property
    def epistemic_std(self) -> torch.Tensor:
        return self.loc_samples.var(0, unbiased=False).sqrt()

    @property
    def aleatoric_std(self) -> torch.Tensor:
        return (self.scale_samples**2).expand_as(self.loc_samples).mean(0).sqrt()

    @property
    def std(self) -> torch.Tensor:
        return (self.epistemic_std**2 + self.aleatoric_std**2).sqrt()

    def rescale(self, shift, scale) -> "RegressionPrediction":
        """The predictive of ``shift + scale * y``, e.g. to undo target standardization."""
        shift = torch.as_tensor(shift, dtype=self.loc_samples.dtype, device=self.loc_samples.device)
        scale = torch.as_tensor(scale, dtype=self.loc_samples.dtype, device=self.loc_samples.device)
        return RegressionPrediction(shift + scale * self.loc_samples, scale * self.scale_samples)

    def _targets(self, y):
        y = torch.as_tensor(y, dtype=self.loc_samples.dtype, device=self.loc_samples.device)
        if y.dim() == 1 and self.loc_samples.shape[-1] == 1:
            y = y.unsqueeze(-1)
        if y.shape != self.loc_samples.shape[1:]:
            raise ValueError(
                f"targets of shape {tuple(y.shape)} do not match predictions of shape "
                f"{tuple(self.loc_samples.shape[1:])}"
            )
        return y

    def log_likelihood(self, y) -> float:
        """Mean test log-likelihood per point, ``log`` of the mean density over samples."""
        return metrics.gaussian_mixture_log_likelihood(self.loc_samples, self.scale_samples.expand_as(self.loc_samples), self._targets(y))

    def rmse(self, y) -> float:
        return metrics.rmse(self.mean, self._targets(y))

    def interval(self, level: float = 0.9):
        """Central ``level`` interval of the mixture per point: ``(lower, upper)``."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        tail = (1 - level) / 2
        return (
            metrics.gaussian_mixture_quantile(self.loc_samples, self.scale_samples, tail),
            metrics.gaussian_mixture_quantile(self.loc_samples, self.scale_samples, 1 - tail),
        )

    def coverage(self, y, level: float = 0.9) -> float:
        lower, upper = self.interval(level)
        return metrics.interval_coverage(lower, upper, self._targets(y))

    def crps(self, y) -> float:
        return metrics.gaussian_mixture_crps(self.loc_samples, self.scale_samples, self._targets(y))

    def metrics(self, y, level: float = 0.9) -> dict:
        """RMSE, test log-likelihood, ``level`` interval coverage and CRPS."""
        return {
            "rmse": self.rmse(y),
            "log_likelihood": self.log_likelihood(y),
            f"coverage_{round(level * 100)}": self.coverage(y, level),
            "crps": self.crps(y),
        }


@dataclass
class ClassificationPrediction:
    r"""Posterior predictive of a classifier from per-sample class probabilities.

    - ``probs`` :math:`= \bar p = \frac1S\sum_s p_s`
    - ``entropy`` :math:`= H[\bar p]` (total uncertainty)
    - ``expected_entropy`` :math:`= \frac1S\sum_s H[p_s]` (aleatoric)
    - ``mutual_information`` :math:`= H[\bar p] - \frac1S\sum_s H[p_s]` (epistemic; the BALD
      score of Houlsby et al. 2011)

    For a Bernoulli likelihood the two classes are ``(1 - p, p)``.

    :ivar sample_probs: ``(S, N, C)``.
    """

    sample_probs: torch.Tensor

    @property
    def num_samples(self) -> int:
        return self.sample_probs.shape[0]

    @property
    def probs(self) -> torch.Tensor:
        return self.sample_probs.mean(0)

    @property
    def entropy(self) -> torch.Tensor:
        return metrics.entropy(self.probs)

    @property
    def expected_entropy(self) -> torch.Tensor:
        return metrics.entropy(self.sample_probs).mean(0)

    @property
    def mutual_information(self) -> torch.Tensor:
        return (self.entropy - self.expected_entropy).clamp_min(0)

    def _labels(self, y):
        y = torch.as_tensor(y, device=self.sample_probs.device)
        if y.shape != self.sample_probs.shape[1:-1]:
            raise ValueError(
                f"labels of shape {tuple(y.shape)} do not match {self.sample_probs.shape[1]} predictions"
            )
        return y.long()

    def accuracy(self, y) -> float:
        return metrics.accuracy(self.probs, self._labels(y))

    def log_likelihood(self, y) -> float:
        return metrics.categorical_log_likelihood(self.probs, self._labels(y))

    def ece(self, y, num_bins: int = 15) -> float:
        return metrics.expected_calibration_error(self.probs, self._labels(y), num_bins)

    def metrics(self, y) -> dict:
        """Accuracy, mean log-likelihood and expected calibration error."""
        return {"accuracy": self.accuracy(y), "log_likelihood": self.log_likelihood(y), "ece": self.ece(y)}
