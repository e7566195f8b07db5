r"""Pruning a trained posterior: by :math:`\log\alpha` (sparse variational dropout) or by
signal-to-noise ratio (Bayes by Backprop), compression figures, and export of the pruned
network as an ordinary deterministic ``nn.Module``.

For a factor with mean :math:`\mu` and standard deviation :math:`\sigma` the signal-to-noise
ratio is :math:`|\mu| / \sigma`; for the multiplicative posterior
:math:`N(\theta, \alpha\theta^2)` it is :math:`\alpha^{-1/2}`, so
:math:`\log\alpha = -2 \log \mathrm{SNR}` and the two criteria are one.

- Molchanov, Ashukha & Vetrov 2017 zero the weights whose :math:`\log\alpha \ge 3`
  (:func:`masks_by_log_alpha`).
- Blundell et al. 2015 remove a given fraction of the weights with the lowest
  signal-to-noise ratio, ranked over the whole network (:func:`masks_by_snr`).

Example::

    masks = pyrobnn.guides.sparsity.masks_by_log_alpha(guide, threshold=3.0)
    print(pyrobnn.guides.sparsity.report(guide, masks))           # sparsity per layer, compression
    pruned = pyrobnn.guides.sparsity.PrunedGuide(guide, masks)    # a guide: predict(model, pruned, x)
    net = pyrobnn.guides.sparsity.export(model, pruned)           # plain nn.Module, zeros in place
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List

import pyro
import pyro.distributions as dist
import torch
from torch import nn

from pyrobnn.guides.base import WeightGuide
from pyrobnn.guides.variational_dropout import VariationalDropout

__all__ = [
    "signal_to_noise",
    "log_alpha",
    "masks_by_log_alpha",
    "masks_by_snr",
    "LayerSparsity",
    "SparsityReport",
    "report",
    "PrunedGuide",
    "export",
]


def _check_guide(guide):
    if not isinstance(guide, WeightGuide):
        raise TypeError(f"pruning needs a pyrobnn guide with one factor per weight site, got {type(guide).__name__}")


@torch.no_grad()
def signal_to_noise(guide) -> Dict[str, torch.Tensor]:
    r"""``{site: |E_q w| / sd_q(w)}``, element-wise, at the site's shape. Infinite where the
    factor has no noise."""
    _check_guide(guide)
    if isinstance(guide, VariationalDropout):
        return {name: torch.exp(-0.5 * la) for name, la in log_alpha(guide).items()}
    out = {}
    for site in guide.sites:
        q = guide.posterior(site)
        try:
            sd = q.stddev
        except (NotImplementedError, AttributeError):
            raise TypeError(f"{type(guide).__name__}'s factor at {site.name!r} has no standard deviation") from None
        out[site.name] = (q.mean.abs() / sd).expand(site.shape).clone()
    return out


@torch.no_grad()
def log_alpha(guide) -> Dict[str, torch.Tensor]:
    r"""``{site: log alpha}`` at each site's shape: the (clipped) :math:`\log\alpha` of a
    :class:`~pyrobnn.guides.VariationalDropout` guide (per weight, or per input unit
    broadcast over its weights), :math:`-2\log\mathrm{SNR}` for any other guide."""
    _check_guide(guide)
    if not isinstance(guide, VariationalDropout):
        return {k: -2.0 * torch.log(v) for k, v in signal_to_noise(guide).items()}
    return {s.name: guide.site_log_alpha(s).detach().expand(s.shape).clone() for s in guide.sites}


def masks_by_log_alpha(guide, threshold: float = 3.0) -> Dict[str, torch.Tensor]:
    r"""Boolean keep-masks: a weight is kept where :math:`\log\alpha < ` ``threshold``
    (Molchanov et al. 2017 use 3: dropout rate :math:`\alpha/(1+\alpha) > 0.95`)."""
    return {k: v < threshold for k, v in log_alpha(guide).items()}


def masks_by_snr(guide, fraction: float, weights_only: bool = True) -> Dict[str, torch.Tensor]:
    r"""Boolean keep-masks removing ``fraction`` of the weights, those with the lowest
    signal-to-noise ratio ranked over the whole network (Blundell et al. 2015, Sec. 5.1).

    :param weights_only: rank and prune only ``weight`` parameters (biases kept), as the
        paper counts weights.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    snr = signal_to_noise(guide)
    names = [s.name for s in guide.sites if not (weights_only and s.is_bias)]
    flat = torch.cat([snr[n].reshape(-1) for n in names])
    remove = int(round(fraction * flat.numel()))
    keep_flat = torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
    if remove:
        keep_flat[torch.argsort(flat, stable=True)[:remove]] = False
    masks, offset = {}, 0
    for site in guide.sites:
        if site.name in names:
            masks[site.name] = keep_flat[offset : offset + site.numel].reshape(site.shape)
            offset += site.numel
        else:
            masks[site.name] = torch.ones(site.shape, dtype=torch.bool, device=flat.device)
    return masks


@dataclass
class LayerSparsity:
    name: str
    total: int
    nonzero: int

    @property
    def sparsity(self) -> float:
        """Fraction of the parameters removed."""
        return 1.0 - self.nonzero / self.total


@dataclass
class SparsityReport:
    r"""Per-parameter sparsity and compression. ``compression`` is
    total / non-zero over the ``weight`` parameters, as Molchanov et al.'s tables count them;
    ``compression_with_biases`` counts every random parameter."""

    layers: List[LayerSparsity] = field(default_factory=list)

    def _ratio(self, layers):
        total = sum(layer.total for layer in layers)
        nonzero = sum(layer.nonzero for layer in layers)
        return math.inf if nonzero == 0 else total / nonzero

    @property
    def weights(self) -> List[LayerSparsity]:
        return [layer for layer in self.layers if layer.name.endswith("weight")]

    @property
    def compression(self) -> float:
        return self._ratio(self.weights)

    @property
    def compression_with_biases(self) -> float:
        return self._ratio(self.layers)

    def as_dict(self) -> dict:
        return {
            "sparsity_per_layer": {layer.name: layer.sparsity for layer in self.weights},
            "compression": self.compression,
            "compression_with_biases": self.compression_with_biases,
            "nonzero_weights": sum(layer.nonzero for layer in self.weights),
            "total_weights": sum(layer.total for layer in self.weights),
        }

    def __str__(self):
        rows = [f"{'parameter':24s} {'total':>9s} {'non-zero':>9s} {'sparsity':>9s}"]
        for layer in self.layers:
            rows.append(f"{layer.name:24s} {layer.total:9d} {layer.nonzero:9d} {100 * layer.sparsity:8.2f}%")
        rows.append(f"compression (weights) {self.compression:.1f}x, with biases {self.compression_with_biases:.1f}x")
        return "\n".join(rows)


def report(guide, masks: Dict[str, torch.Tensor]) -> SparsityReport:
    """Sparsity per random parameter of ``guide`` under ``masks``."""
    _check_guide(guide)
    out = SparsityReport()
    for site in guide.sites:
        mask = masks.get(site.name)
        nonzero = site.numel if mask is None else int(mask.expand(site.shape).sum())
        out.layers.append(LayerSparsity(site.name, site.numel, nonzero))
    return out


class PrunedGuide(nn.Module):
    r"""``guide`` with the weights outside ``masks`` set to zero: its samples are
    :math:`m \odot w`, :math:`w \sim q`, and its posterior mean is :math:`m \odot E_q[w]`.

    A Pyro guide for prediction (``pyrobnn.predict``, ``pyro.infer.Predictive``), not for
    training: the pruned sites are recorded as ``Delta`` at the masked sample, next to the
    unmasked sample at ``"<site>/unpruned"``.
    """

    def __init__(self, guide, masks: Dict[str, torch.Tensor]):
        super().__init__()
        _check_guide(guide)
        unknown = set(masks) - {s.name for s in guide.sites}
        if unknown:
            raise ValueError(f"masks for unknown sites {sorted(unknown)}")
        self.guide = guide
        self.masks = {k: v.to(torch.bool) for k, v in masks.items()}
        for site in guide.sites:
            mask = self.masks.get(site.name)
            if mask is not None and mask.shape != site.shape:
                raise ValueError(f"mask of {site.name!r} has shape {tuple(mask.shape)}, the site {tuple(site.shape)}")

    def _apply(self, name, value):
        mask = self.masks.get(name)
        return value if mask is None else value * mask.to(device=value.device, dtype=value.dtype)

    def forward(self, *args, **kwargs):
        samples = {}
        for site in self.guide.sites:
            q = self.guide.posterior(site).to_event(len(site.shape))
            w = pyro.sample(site.name + "/unpruned", q)
            samples[site.name] = pyro.sample(site.name, dist.Delta(self._apply(site.name, w), event_dim=len(site.shape)))
        for name in self.guide.latent_priors:
            samples[name] = pyro.sample(name, self.guide.latent_posterior(name))
        return samples

    @torch.no_grad()
    def posterior_mean(self) -> dict:
        means = self.guide.posterior_mean()
        return {k: self._apply(k, v) for k, v in means.items()}


@torch.no_grad()
def export(model, guide) -> nn.Module:
    """The network at the (pruned) posterior mean, as an ordinary deterministic ``nn.Module``
    (a copy; zeros in place of the pruned weights). ``guide``: a :class:`PrunedGuide`, or any
    guide with ``posterior_mean()``. Its outputs equal ``predict(model, guide, x,
    method="mean")``'s."""
    net = model.deterministic_net(guide.posterior_mean())
    return net.eval()
