"""Multiplicative Gaussian noise posteriors: variational dropout, sparse variational dropout,
Gaussian dropout."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from pyrobnn.guides.base import WeightGuide, site_key
from pyrobnn.methods import refuse_unsupported
from pyrobnn.models.distributions import GaussianUnitNoise, LogUniform, MultiplicativeNormal
from pyrobnn.models.kl import log_uniform_kl
from pyrobnn.models.priors import LogUniformPrior

__all__ = ["VariationalDropout", "SparseVariationalDropout", "GaussianDropout", "sparse_vd_terms"]


def sparse_vd_terms(theta, log_sigma2, log_alpha_min: float, log_alpha_max: float, mean_clip: Optional[float] = None):
    """The mean and scale of :meth:`MultiplicativeNormal.from_log_sigma2` and the summed
    log-uniform KL approximation: the fused form of :class:`VariationalDropout`'s per-weight
    factor."""
    q = MultiplicativeNormal.from_log_sigma2(theta, log_sigma2, log_alpha_min, log_alpha_max, mean_clip)
    return q.loc, q.scale, log_uniform_kl(q.log_alpha).sum()


class VariationalDropout(WeightGuide):
    r"""Multiplicative Gaussian posterior :math:`q(w) = N(\theta, \alpha\theta^2)`
    (Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov 2017).

    :param alpha: where the noise variance :math:`\alpha` lives:

        - ``"weight"`` (default): one learned :math:`\alpha` per weight, independent noise
          (variational dropout type B). Parameterized additively (Molchanov et al. 2017):
          the free parameters are :math:`\theta` and :math:`\log\sigma^2`,
          :math:`\log\alpha = \log\sigma^2 - \log\theta^2`. With
          :class:`~pyrobnn.models.priors.LogUniformPrior` this is sparse variational dropout.
        - ``"unit"``: one learned :math:`\alpha` per input unit, the noise of a unit shared by
          every weight reading from it (type A; correlated weights), as Gaussian dropout on
          the layer's inputs with learned rates.
        - a float: a fixed :math:`\alpha` per input unit, i.e. Gaussian dropout
          (Srivastava et al. 2014) with rate :math:`p = \alpha / (1 + \alpha)`.

        Biases have no input unit; in the unit modes they get independent per-element noise
        with their own (learned or fixed) :math:`\alpha`.
    :param init_log_sigma2: initial :math:`\log\sigma^2` in ``"weight"`` mode (default
        ``-10``, as in Molchanov et al.'s code: starting almost noise-free).
    :param init_log_alpha: initial :math:`\log\alpha`: in ``"unit"`` mode (default ``-4``),
        and in ``"weight"`` mode instead of ``init_log_sigma2`` if given
        (:math:`\log\sigma^2 = \log\alpha + \log\theta^2`).
    :param log_alpha_range: :math:`\log\alpha` is clipped to this range, ``(-8, 8)`` by
        default, the range on which the log-uniform KL approximation was fitted. The
        variance is computed from the clipped value, so samples and KL agree. Kingma et al.'s
        variational dropout limited :math:`\alpha \le 1` (``(-8, 0)``); sparsification needs
        large :math:`\alpha`.
    :param train_clip: in ``"weight"`` mode, a :math:`\log\alpha` threshold at and above
        which a weight's posterior mean is zero (its variance kept), during training as after
        it; ``None`` (default) for the plain family. Molchanov et al.'s code trains with
        ``train_clip`` at the pruning threshold 3 (a detail of the code), and it matters: on
        MNIST LeNet-300-100 it gave 106.9x compression at 1.92% error against 58.8x at 1.83%
        for the plain family (``docs/logs/reproductions.md``).

    Prune with :func:`pyrobnn.guides.sparsity` (weights whose :math:`\log\alpha \ge 3`).
    """

    default_elbo = "meanfield"

    def __init__(
        self,
        model,
        alpha="weight",
        init_log_sigma2: Optional[float] = None,
        init_log_alpha: Optional[float] = None,
        log_alpha_range=(-8.0, 8.0),
        train_clip: Optional[float] = None,
    ):
        super().__init__(model)
        lo, hi = log_alpha_range
        if not lo < hi:
            raise ValueError(f"log_alpha_range must be increasing, got {log_alpha_range}")
        self.log_alpha_range = (float(lo), float(hi))
        if train_clip is not None and alpha != "weight":
            raise ValueError("train_clip needs a per-weight alpha (alpha='weight')")
        self.train_clip = None if train_clip is None else float(train_clip)
        if isinstance(alpha, str):
            if alpha not in ("weight", "unit"):
                raise ValueError(f"alpha must be 'weight', 'unit' or a positive float, got {alpha!r}")
            self.mode = alpha
            self.fixed_log_alpha = None
        else:
            if not alpha > 0:
                raise ValueError(f"a fixed alpha must be positive, got {alpha}")
            self.mode = "fixed"
            self.fixed_log_alpha = math.log(alpha)
        self.theta = nn.ParameterDict()
        self.log_sigma2 = nn.ParameterDict()
        self.log_alpha = nn.ParameterDict()
        for site in self.sites:
            key = site_key(site.name)
            value = model.init_value(site).detach()
            self.theta[key] = nn.Parameter(value.clone())
            if self.mode == "weight":
                if init_log_alpha is not None:
                    log_sigma2 = init_log_alpha + torch.log(value**2 + MultiplicativeNormal.eps)
                else:
                    log_sigma2 = torch.full_like(value, -10.0 if init_log_sigma2 is None else init_log_sigma2)
                self.log_sigma2[key] = nn.Parameter(log_sigma2)
                continue
            if site.unit_shape is None:
                raise ValueError(
                    f"site {site.name!r}: no input-unit axis is known for "
                    f"{type(site.module).__name__}; use alpha='weight'"
                )
            prior = model.site_prior(site)
            if len(site.unit_shape) and not isinstance(prior, LogUniformPrior):
                raise ValueError(
                    f"noise shared by an input unit has a KL only against the log-uniform prior "
                    f"(Kingma et al. 2015); site {site.name!r} has {prior!r}. Use LogUniformPrior "
                    "or alpha='weight'"
                )
            if self.mode == "unit":
                shape = site.unit_shape if len(site.unit_shape) else site.shape
                self.log_alpha[key] = nn.Parameter(
                    torch.full(shape, -4.0 if init_log_alpha is None else float(init_log_alpha), dtype=value.dtype, device=value.device)
                )

    def config(self) -> dict:
        alpha = self.mode if self.fixed_log_alpha is None else math.exp(self.fixed_log_alpha)
        return {"alpha": alpha, "log_alpha_range": list(self.log_alpha_range), "train_clip": self.train_clip}

    def _clip(self, log_alpha):
        return torch.clamp(log_alpha, *self.log_alpha_range)

    def site_log_alpha(self, site) -> torch.Tensor:
        """:math:`\\log\\alpha` of the site's factor, broadcastable to the site's shape."""
        return self.posterior(site).log_alpha

    def posterior(self, site):
        key = site_key(site.name)
        theta = self.theta[key]
        if self.mode == "weight":
            return MultiplicativeNormal.from_log_sigma2(theta, self.log_sigma2[key], *self.log_alpha_range, mean_clip=self.train_clip)
        if self.mode == "unit":
            log_alpha = self._clip(self.log_alpha[key])
        else:
            log_alpha = torch.full((), self.fixed_log_alpha, dtype=theta.dtype, device=theta.device)
        if not len(site.unit_shape):
            return MultiplicativeNormal.from_log_alpha(theta, log_alpha.expand(theta.shape))
        return GaussianUnitNoise(theta, site.unit_shape, log_alpha, prior=self.site_prior(site, theta))

    def posterior_mean_of(self, site):
        if self.train_clip is not None:
            return self.posterior(site).loc
        return self.theta[site_key(site.name)]

    def fused_terms(self, site, prior):
        if self.mode != "weight" or not isinstance(prior, LogUniform):
            return None
        key = site_key(site.name)
        return sparse_vd_terms, (self.theta[key], self.log_sigma2[key], *self.log_alpha_range, self.train_clip)


class SparseVariationalDropout(VariationalDropout):
    r"""Sparse variational dropout (Molchanov et al. 2017): per-weight :math:`\alpha` with the
    additive reparameterization and :math:`\log\alpha \in [-8, 8]`. Use it with
    :class:`~pyrobnn.models.priors.LogUniformPrior` and local reparameterization; weights with
    :math:`\log\alpha \ge 3` are pruned."""

    def __init__(self, model, init_log_sigma2: float = -10.0, log_alpha_range=(-8.0, 8.0), train_clip: Optional[float] = None):
        super().__init__(model, "weight", init_log_sigma2=init_log_sigma2, log_alpha_range=log_alpha_range, train_clip=train_clip)

    def config(self) -> dict:
        return {"log_alpha_range": list(self.log_alpha_range), "train_clip": self.train_clip}


class GaussianDropout(VariationalDropout):
    r"""Gaussian dropout with a fixed rate ``p`` on every layer's inputs (Srivastava et al.
    2014): multiplicative noise :math:`N(1, \alpha)`, :math:`\alpha = p / (1 - p)`. With
    :class:`~pyrobnn.models.priors.LogUniformPrior` its KL does not depend on the weights
    (Kingma et al. 2015), so training it is ordinary Gaussian dropout."""

    def __init__(self, model, p: float = 0.5):
        refuse_unsupported("gaussian_dropout", model, "GaussianDropout")
        if not 0 < p < 1:
            raise ValueError(f"dropout rate p must be in (0, 1), got {p}")
        super().__init__(model, alpha=p / (1 - p), log_alpha_range=(-20.0, 20.0))
        self.p = float(p)

    def config(self) -> dict:
        return {"p": self.p}
