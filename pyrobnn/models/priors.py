"""Prior families for network weights.

A :class:`Prior` maps a :class:`~pyrobnn.models.sites.WeightSite` to a distribution whose
batch shape is the parameter's shape (the model adds ``.to_event``). Priors that carry learned
hyperparameters (:class:`ARDPrior`) create them through :meth:`Prior.init_parameters`; the
model owns them as point parameters.

=================================  ==========================================  ==================
prior                              distribution per weight                     KL vs Normal q
=================================  ==========================================  ==================
``NormalPrior(s)``                 N(0, s^2), or N(0, s^2 / fan_in)            exact
``ScaleMixturePrior(pi, s1, s2)``  pi N(0, s1^2) + (1-pi) N(0, s2^2)           Monte Carlo only
``LogUniformPrior()``              p(w) proportional to 1/``|w|`` (improper)   Molchanov approx.
``ARDPrior()``                     N(0, lambda_w), lambda at its EB optimum    exact at optimum
=================================  ==========================================  ==================
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pyrobnn.models.distributions import ARDNormal, LogUniform, ScalarNormal, ScaleMixtureNormal

__all__ = ["Prior", "NormalPrior", "ScaleMixturePrior", "LogUniformPrior", "ARDPrior"]


class Prior:
    """Base class: a rule giving each weight site its prior distribution."""

    #: whether :meth:`distribution` depends only on the site (so the model may cache it)
    cacheable = True

    def distribution(self, site, params=None, dtype=None, device=None):
        """The prior over ``site``, batch shape ``site.shape``.

        :param params: the tensors :meth:`init_parameters` created for this site.
        """
        raise NotImplementedError

    def init_parameters(self, site, init_value) -> dict:
        """Learned hyperparameters for ``site`` as ``{name: tensor}``; none by default."""
        return {}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def _scalar(value, dtype, device):
    return torch.tensor(float(value), dtype=dtype, device=device)


class NormalPrior(Prior):
    r"""Independent :math:`N(0, s^2)` on every weight.

    :param scale: prior standard deviation ``s``.
    :param fan_in: if true, weights (not biases) get :math:`N(0, s^2 / \text{fan\_in})`, the
        scaling under which the variance of a unit's input does not grow with the layer's
        width (Neal 1996).
    """

    def __init__(self, scale: float = 1.0, fan_in: bool = False):
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"prior scale must be a positive finite number, got {scale!r}")
        self.scale = float(scale)
        self.fan_in = bool(fan_in)

    def site_scale(self, site) -> float:
        if self.fan_in and not site.is_bias:
            return self.scale / math.sqrt(site.fan_in)
        return self.scale

    def distribution(self, site, params=None, dtype=None, device=None):
        return ScalarNormal(0.0, self.site_scale(site), site.shape, dtype=dtype, device=device)


class ScaleMixturePrior(Prior):
    r"""Scale mixture of two zero-mean Normals (Blundell et al. 2015, eq. 7).

    Defaults are from the paper's grid: :math:`\pi = 1/2`, :math:`\sigma_1 = e^{0}`,
    :math:`\sigma_2 = e^{-6}`.
    """

    def __init__(self, mixture_weight: float = 0.5, scale1: float = 1.0, scale2: float = math.exp(-6)):
        if not 0 < mixture_weight < 1:
            raise ValueError(f"mixture_weight must be in (0, 1), got {mixture_weight}")
        if not (scale1 > 0 and scale2 > 0):
            raise ValueError("mixture scales must be positive")
        self.mixture_weight = float(mixture_weight)
        self.scale1 = float(scale1)
        self.scale2 = float(scale2)

    def distribution(self, site, params=None, dtype=None, device=None):
        return ScaleMixtureNormal(
            _scalar(self.mixture_weight, dtype, device),
            _scalar(self.scale1, dtype, device),
            _scalar(self.scale2, dtype, device),
        ).expand(site.shape)


class LogUniformPrior(Prior):
    r"""The improper log-uniform prior :math:`p(w) \propto 1/|w|` of sparse variational dropout
    (Molchanov et al. 2017). See :class:`~pyrobnn.models.distributions.LogUniform`."""

    def __init__(self, sample_range=(1e-4, 1.0)):
        low, high = (float(v) for v in sample_range)
        if not (0 < low < high < math.inf):
            raise ValueError(f"sample_range must be (low, high) with 0 < low < high < inf, got {tuple(sample_range)}")
        self.sample_range = (low, high)

    def distribution(self, site, params=None, dtype=None, device=None):
        return LogUniform(site.shape, self.sample_range, dtype=dtype, device=device)


class ARDPrior(Prior):
    r"""Automatic relevance determination: :math:`N(0, \lambda_w)` with one variance per
    weight, set by empirical Bayes (see :class:`~pyrobnn.models.distributions.ARDNormal`).

    With the analytic KL the prior variance is at its optimum :math:`\lambda^* = \mu^2 +
    \sigma^2` by construction and :math:`KL = \frac12\log(1 + 1/\alpha)`. With a Monte Carlo
    KL, :math:`\log\lambda` is a point parameter of the model (initialized at
    ``log(init_variance)``) that the optimizer moves towards the same optimum.
    """

    cacheable = False

    def __init__(self, init_variance: float = 1.0):
        if not init_variance > 0:
            raise ValueError("init_variance must be positive")
        self.init_variance = float(init_variance)

    def init_parameters(self, site, init_value):
        return {
            "log_variance": nn.Parameter(
                torch.full(site.shape, math.log(self.init_variance), dtype=init_value.dtype, device=init_value.device)
            )
        }

    def distribution(self, site, params=None, dtype=None, device=None):
        return ARDNormal(params["log_variance"])
