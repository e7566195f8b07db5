"""Mean-field Normal posterior (Bayes by Backprop)."""

from __future__ import annotations

import torch
from torch import nn

from pyrobnn.guides.base import WeightGuide, inverse_softplus, site_key
from pyrobnn.models.distributions import SampleAwareNormal, ScalarNormal
from pyrobnn.models.kl import normal_kl
from pyrobnn.models.numerics import softplus

__all__ = ["MeanFieldNormal", "mean_field_normal_terms", "positive_scale"]


def positive_scale(rho):
    r""":math:`\sigma = \text{softplus}(\rho) + \epsilon_{tiny}`, the dtype's smallest normal
    number added: softplus underflows to exactly 0 (for float32, at :math:`\rho < -104`), where
    the KL's :math:`\log \sigma` and every density would be infinite. The addition rounds away
    (the value and its gradient are those of softplus) wherever :math:`\sigma` exceeds
    :math:`2^{-101}` in float32, :math:`2^{-968}` in float64; unlike a clamp it keeps the gradient
    below that, and its backward pass costs nothing (a clamp's reads the weights twice more)."""
    return softplus(rho) + torch.finfo(rho.dtype).tiny


def mean_field_normal_terms(loc, rho, prior_loc: float, prior_scale: float):
    """``loc``, ``softplus(rho)`` and the summed KL of ``N(loc, softplus(rho)^2)`` against
    ``N(prior_loc, prior_scale^2)``: the fused form of :class:`MeanFieldNormal`'s factor."""
    scale = positive_scale(rho)
    return loc, scale, normal_kl(loc, scale, prior_loc, prior_scale).sum()


class MeanFieldNormal(WeightGuide):
    r"""Fully factorized Gaussian posterior (Blundell et al. 2015):

    .. math:: q(w) = \prod_i N(w_i; \mu_i, \sigma_i^2), \qquad \sigma_i = \text{softplus}(\rho_i),

    two tensors per weight tensor, ``loc`` (:math:`\mu`) and ``rho``.

    :param model: the :class:`~pyrobnn.models.BayesianModel`.
    :param init_loc: ``"net"`` (default) starts each mean at the network's own initial
        weights; a float ``s`` draws the means from :math:`N(0, s^2)`.
    :param init_scale: initial :math:`\sigma` for every weight, default ``1e-3``. Starting
        almost deterministic lets the likelihood shape the means before noise is added; the
        KL then widens :math:`\sigma` wherever the data allow. A large initial scale on a
        freshly initialized network tends to drown the data term in weight noise, and
        mean-field BNNs then settle near the prior (underfit), a known failure of the
        method on small data (see e.g. Trippe & Turner 2018).

    Its KL against :class:`~pyrobnn.models.priors.NormalPrior` is exact, against
    :class:`~pyrobnn.models.priors.LogUniformPrior` the Molchanov approximation, against
    :class:`~pyrobnn.models.priors.ARDPrior` exact at the optimal prior variance, and against
    :class:`~pyrobnn.models.priors.ScaleMixturePrior` estimated by Monte Carlo.
    """

    default_elbo = "trace"

    def __init__(self, model, init_loc="net", init_scale: float = 1e-3):
        super().__init__(model)
        smallest = torch.finfo(model.dtype).tiny
        if not (isinstance(init_scale, (int, float)) and not isinstance(init_scale, bool) and smallest <= init_scale < float("inf")):
            raise ValueError(
                f"init_scale must be a finite number >= {smallest:.3g} (the smallest normal {model.dtype} number; a "
                f"smaller scale is subnormal and the KL's gradient overflows), got {init_scale!r}"
            )
        self.init_scale = float(init_scale)
        self.loc = nn.ParameterDict()
        self.rho = nn.ParameterDict()
        for site in self.sites:
            value = model.init_value(site).detach()
            if isinstance(init_loc, str):
                if init_loc != "net":
                    raise ValueError(f"init_loc must be 'net' or a float, got {init_loc!r}")
                loc = value.clone()
            else:
                loc = float(init_loc) * torch.randn_like(value)
            self.loc[site_key(site.name)] = nn.Parameter(loc)
            self.rho[site_key(site.name)] = nn.Parameter(
                torch.full_like(value, inverse_softplus(torch.tensor(self.init_scale, dtype=torch.float64, device="cpu")).item())
            )

    def config(self) -> dict:
        return {"init_scale": self.init_scale}

    def scale_of(self, site) -> torch.Tensor:
        return positive_scale(self.rho[site_key(site.name)])

    def posterior(self, site):
        key = site_key(site.name)
        return SampleAwareNormal(self.loc[key], positive_scale(self.rho[key]), validate_args=False)

    def posterior_mean_of(self, site):
        return self.loc[site_key(site.name)]

    def fused_terms(self, site, prior):
        if not isinstance(prior, ScalarNormal):
            return None
        key = site_key(site.name)
        return mean_field_normal_terms, (self.loc[key], self.rho[key], prior.loc_value, prior.scale_value)
