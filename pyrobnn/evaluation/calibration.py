r"""Temperature scaling (Guo et al. 2017, ICML): the non-Bayesian calibration baseline.

A classifier's logits :math:`z(x)` are divided by one temperature :math:`T > 0` fitted after
training on a validation split by minimizing the negative log-likelihood

.. math:: T^\star = \arg\min_T \; -\frac1N \sum_n \log \operatorname{softmax}(z(x_n) / T)_{y_n},

which leaves the predicted class unchanged and softens (:math:`T > 1`) or sharpens
(:math:`T < 1`) the probabilities. The objective is convex in :math:`1/T`; it is minimized over
:math:`\log T` by L-BFGS in float64.
"""

from __future__ import annotations

import torch

from pyrobnn.evaluation.predictions import ClassificationPrediction
from pyrobnn.utils.validation import check_label_dtype, check_label_range

__all__ = ["fit_temperature", "TemperatureScaling"]


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 200) -> float:
    """The NLL-minimizing temperature for ``logits`` ``(N, C)`` and integer ``labels`` ``(N,)``."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a tensor of shape (N, C), got {getattr(logits, 'shape', type(logits).__name__)}")
    if not isinstance(labels, torch.Tensor) or labels.shape != logits.shape[:1]:
        raise ValueError(f"labels must have shape ({logits.shape[0]},), got {getattr(labels, 'shape', type(labels).__name__)}")
    if logits.shape[0] == 0:
        raise ValueError("logits are empty: temperature scaling needs at least one validation point")
    check_label_dtype(labels)
    check_label_range(labels, logits.shape[1], f" for logits with {logits.shape[1]} classes")
    if not torch.isfinite(logits).all():
        raise ValueError("logits contain non-finite values")
    z = logits.detach().double()
    y = labels.detach()
    log_t = torch.zeros((), dtype=torch.float64, device=z.device, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(z / log_t.exp(), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


class TemperatureScaling:
    """A classification network (a callable returning logits, e.g. ``model.deterministic_net(map_values)``)
    with a temperature fitted on validation data.

    Example::

        net = model.deterministic_net({k: v[0, 0] for k, v in map_member.samples.items()})
        scaled = TemperatureScaling(net).fit(x_val, y_val)
        prediction = scaled.predict(x_test)      # ClassificationPrediction
    """

    def __init__(self, net):
        if not callable(net):
            raise TypeError(f"net must be callable (returning logits), got {type(net).__name__}")
        self.net = net
        self.temperature = None

    @torch.no_grad()
    def logits(self, x) -> torch.Tensor:
        return self.net(x)

    def fit(self, x_val, y_val) -> "TemperatureScaling":
        self.temperature = fit_temperature(self.logits(x_val), y_val)
        return self

    @torch.no_grad()
    def predict(self, x) -> ClassificationPrediction:
        if self.temperature is None:
            raise RuntimeError("call fit(x_val, y_val) before predict")
        return ClassificationPrediction(torch.softmax(self.logits(x) / self.temperature, -1).unsqueeze(0))
