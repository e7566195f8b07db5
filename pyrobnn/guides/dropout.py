"""Dropout as variational inference: MC dropout and concrete dropout."""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from pyrobnn.guides.base import WeightGuide, site_key
from pyrobnn.methods import refuse_unsupported
from pyrobnn.models.distributions import BernoulliUnitNoise, ConcreteUnitNoise

__all__ = ["MCDropout", "ConcreteDropout"]


def _check_model(model, key, guide_name):
    refuse_unsupported(key, model, guide_name)
    for site in model.sites:
        if site.unit_shape is None:
            raise ValueError(
                f"site {site.name!r}: dropout needs the input-unit axis of the layer, unknown for "
                f"{type(site.module).__name__} (supported: Linear, Conv1d/2d/3d with groups=1)"
            )


def _rate_for(spec, site) -> float:
    if isinstance(spec, dict):
        for pattern, value in spec.items():
            if fnmatch.fnmatchcase(site.name, pattern) or site.module_name == pattern:
                return float(value)
        raise ValueError(f"no dropout rate given for site {site.name!r}; patterns: {list(spec)}")
    return float(spec)


class MCDropout(WeightGuide):
    r"""MC dropout as variational inference (Gal & Ghahramani 2016).

    Each layer's weights are :math:`W = M \odot \xi` with :math:`\xi_u = z_u / (1-p)`,
    :math:`z_u \sim \text{Bernoulli}(1-p)` per input unit ``u``: dropout on the layer's inputs
    with inverted scaling, so :math:`E[W] = M`. Biases are deterministic. The KL against the
    prior :math:`N(0, s^2)` is Gal & Ghahramani's approximation (see
    :func:`pyrobnn.models.kl.dropout_kl`), which is the familiar weight decay
    :math:`\|M\|^2 / (2 s^2 (1-p))`; with :math:`s^2 = 1/l^2` and the likelihood scaled by
    :math:`N`, dividing the loss by :math:`N\tau` gives the weight decay
    :math:`l^2 (1-p) / (2 N \tau)` of the paper's code on the un-inverted weights.

    :param p: dropout probability, a float for every layer or a dict from site-name or
        module-name patterns to rates (e.g. ``{"0.weight": 0.1, "*": 0.5}`` for lighter
        dropout on the inputs).

    Prediction with :func:`pyrobnn.predict` averages over masks (MC dropout); the
    posterior-mean prediction is standard dropout's weight-scaling rule.
    """

    default_elbo = "meanfield"

    def __init__(self, model, p=0.5):
        super().__init__(model)
        _check_model(model, "mc_dropout", "MCDropout")
        self.loc = nn.ParameterDict()
        self.dropout_rates = {}
        for site in self.sites:
            self.loc[site_key(site.name)] = nn.Parameter(model.init_value(site).detach().clone())
            rate = _rate_for(p, site) if len(site.unit_shape) else 0.0
            if not 0 <= rate < 1:
                raise ValueError(f"dropout rate must be in [0, 1), got {rate} for {site.name!r}")
            self.dropout_rates[site.name] = rate

    def config(self) -> dict:
        return {"p": dict(self.dropout_rates)}

    def posterior(self, site):
        loc = self.loc[site_key(site.name)]
        return BernoulliUnitNoise(loc, site.unit_shape, self.dropout_rates[site.name], prior=self.site_prior(site, loc))

    def posterior_mean_of(self, site):
        return self.loc[site_key(site.name)]


class ConcreteDropout(WeightGuide):
    r"""Concrete dropout (Gal, Hron & Kendall 2017): MC dropout whose rate ``p`` is learned per
    layer through the concrete (relaxed Bernoulli) distribution at temperature ``t``.

    The KL :math:`\|M\|^2/(2 s^2 (1-p)) - K\,\mathcal H(p)` has an entropy term that keeps
    ``p`` from collapsing to 0; ``K`` is the number of the layer's input units.

    :param init_p: initial dropout rate of every layer (0.1, as in the paper's code).
    :param temperature: of the relaxation (0.1, as in the paper).
    """

    default_elbo = "meanfield"

    def __init__(self, model, init_p: float = 0.1, temperature: float = 0.1):
        super().__init__(model)
        _check_model(model, "concrete_dropout", "ConcreteDropout")
        if not 0 < init_p < 1:
            raise ValueError(f"init_p must be in (0, 1), got {init_p}")
        if not temperature > 0:
            raise ValueError("temperature must be positive")
        self.temperature = float(temperature)
        self.init_p = float(init_p)
        self.loc = nn.ParameterDict()
        self.p_logit = nn.ParameterDict()
        logit = torch.logit(torch.tensor(float(init_p), dtype=model.dtype, device=model.device))
        for site in self.sites:
            self.loc[site_key(site.name)] = nn.Parameter(model.init_value(site).detach().clone())
            if len(site.unit_shape):
                self.p_logit[site_key(site.module_name or "_root")] = nn.Parameter(logit.clone())

    def config(self) -> dict:
        return {"init_p": self.init_p, "temperature": self.temperature}

    def dropout_prob(self, site) -> torch.Tensor:
        return torch.sigmoid(self.p_logit[site_key(site.module_name or "_root")])

    def dropout_probabilities(self) -> dict:
        """Learned dropout rate per layer: ``{module name: p}``."""
        return {
            s.module_name: self.dropout_prob(s).item() for s in self.sites if len(s.unit_shape)
        }

    def posterior(self, site):
        loc = self.loc[site_key(site.name)]
        prior = self.site_prior(site, loc)
        if not len(site.unit_shape):
            return ConcreteUnitNoise(loc, site.unit_shape, torch.zeros((), dtype=loc.dtype, device=loc.device), prior=prior)
        return ConcreteUnitNoise(loc, site.unit_shape, self.dropout_prob(site), self.temperature, prior=prior)

    def posterior_mean_of(self, site):
        return self.loc[site_key(site.name)]
