"""Likelihoods: the observation model on top of the network's output.

A likelihood owns three things:

1. **Data-set-size scaling.** Observations are sampled inside
   ``pyro.plate("data", size=dataset_size, subsample=...)``, so a minibatch of ``B`` points
   is scaled by ``dataset_size / B`` and the ELBO's expected gradient does not depend on the
   batch size. ``dataset_size`` is given at construction, per call, or set by
   :func:`pyrobnn.fit`; without it the batch is taken to be the whole data set.
2. **Aggregation** of per-sample network outputs into a predictive summary
   (:meth:`Likelihood.summarize`).
3. **Metrics**, through the summaries in :mod:`pyrobnn.evaluation.predictions`.

Each likelihood also declares whether and how the samplers' native kernels
(:mod:`pyrobnn.infer.core.native`) evaluate it (:meth:`Likelihood.native_form`): one of the kinds
of :data:`NATIVE_KINDS` with its parameters, or why not.

The network's output always has a trailing feature dimension: ``(N, D)`` for regression,
``(N, C)`` logits for classification, ``(N, K)`` logits for Bernoulli.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import constraints

from pyrobnn.evaluation.predictions import ClassificationPrediction, RegressionPrediction
from pyrobnn.models.distributions import distribution_to
from pyrobnn.utils.validation import check_label_dtype, check_label_range

__all__ = [
    "Likelihood",
    "GaussianLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "CategoricalLikelihood",
    "BernoulliLikelihood",
    "NATIVE_KINDS",
    "NativeForm",
]

#: the likelihoods the native kernels evaluate, each a case of ``mlp_kernels.cpp`` (whose codes
#: are generated from this order): a Gaussian with a fixed or a latent scale, a heteroscedastic
#: Gaussian with the exp or softplus link, categorical and Bernoulli on logits
NATIVE_KINDS = ("gaussian", "gaussian_latent", "exp", "softplus", "categorical", "bernoulli")


@dataclass(frozen=True)
class NativeForm:
    """How the native kernels evaluate a likelihood: ``kind`` (one of :data:`NATIVE_KINDS`) with
    its ``params``, or ``kind=None`` and ``why`` not."""

    kind: str | None
    params: dict = field(default_factory=dict)
    why: str = ""


def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class Likelihood(nn.Module):
    """Base class. Subclasses implement :meth:`distribution`, :meth:`check_targets` and
    :meth:`summarize`."""

    #: name of the observation site
    site_name = "obs"
    #: name of the data plate
    plate_name = "data"
    #: "regression" or "classification"
    task = "regression"

    def __init__(self, dataset_size=None):
        super().__init__()
        self.dataset_size = dataset_size
        self._arange = torch.arange(0, device="cpu")  # made on the outputs' device at first use

    def native_form(self) -> NativeForm:
        """How the native kernels evaluate this likelihood (:class:`NativeForm`); a likelihood
        of one's own has none, and the samplers take the torch path, saying so."""
        return NativeForm(None, why=f"the likelihood {type(self).__name__} declares no native form")

    def latent_sites(self) -> dict:
        """Latent sample sites of the likelihood (e.g. a noise scale with a prior):
        ``{name: prior distribution}``."""
        return {}

    def distribution(self, output, **latents):
        """The observation distribution, batch shape ``output.shape[:-1]``."""
        raise NotImplementedError

    def check_targets(self, y, output_shape):
        """``y`` in the shape and dtype the observation site expects, or a ``ValueError``."""
        raise NotImplementedError

    def check_target_values(self, y, output_dim: int):
        """Full-data checks on the target values (label ranges); shapes are checked per call."""

    def flag_target_values(self, y, output_dim: int):
        """The device-side form of :meth:`check_target_values`, with no host synchronization:
        ``(y_safe, bad)``, ``bad`` a 0-d boolean tensor (or ``None``) saying that some value is
        refused, and ``y_safe`` targets that the likelihood can score without an indexing error
        (the training step that sees ``bad`` is not applied)."""
        return y, None

    def refused_targets(self, output_dim: int) -> str:
        """What :meth:`flag_target_values` refuses, in words, for error messages."""
        return "targets the likelihood refuses"

    def summarize(self, outputs, latents):
        """Predictive summary from ``outputs`` of shape ``(S, N, ...)`` and latent samples."""
        raise NotImplementedError

    def sample_latents(self):
        """Sample this likelihood's latent sites (outside the data plate)."""
        return {name: pyro.sample(name, prior) for name, prior in self.latent_sites().items()}

    def forward(self, output, y=None, dataset_size=None, **latents):
        if y is not None:
            y = self.check_targets(y, output.shape[-2:])
        d = self.distribution(output, **latents)
        n = output.shape[-2]
        size = dataset_size if dataset_size is not None else self.dataset_size
        size = n if size is None else int(size)
        if size < n:
            raise ValueError(f"dataset_size={size} is smaller than the batch of {n} points")
        if self._arange.shape[0] != n or self._arange.device != output.device:
            self._arange = torch.arange(n, device=output.device)
        with pyro.plate(self.plate_name, size=size, subsample=self._arange):
            return pyro.sample(self.site_name, d, obs=y)


def _check_float_targets(y, output_shape, what):
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"targets must be a tensor, got {type(y).__name__}")
    if not y.is_floating_point():
        raise ValueError(f"{what} targets must be floating point, got dtype {y.dtype}")
    n, d = output_shape
    if y.dim() == 1 and d == 1:
        y = y.unsqueeze(-1)
    if y.shape != torch.Size((n, d)):
        raise ValueError(
            f"targets of shape {tuple(y.shape)} do not match the network's output of shape "
            f"{(n, d)}; y must have shape ({n}, {d})" + (f" or ({n},)" if d == 1 else "")
        )
    return y


class GaussianLikelihood(Likelihood):
    r"""Homoscedastic Gaussian: :math:`y \sim N(f(x), \sigma^2)`.

    :param scale: the noise standard deviation :math:`\sigma`:

        - a number: fixed;
        - ``"learned"``: a point parameter, initialized at ``init_scale``;
        - a distribution with positive support: a prior, making :math:`\sigma` the latent site
          ``"noise_scale"`` (our guides give it a log-normal posterior).
    :param init_scale: initial value of a learned scale.
    :param dataset_size: number of training points, for minibatch scaling.
    """

    noise_site = "noise_scale"

    def __init__(self, scale=1.0, init_scale: float = 1.0, dataset_size=None):
        super().__init__(dataset_size)
        self.scale_prior = None
        self.scale_unconstrained = None
        if isinstance(scale, str):
            if scale != "learned":
                raise ValueError(f"scale must be a number, 'learned' or a prior, got {scale!r}")
            if not init_scale > 0:
                raise ValueError("init_scale must be positive")
            self.scale_unconstrained = nn.Parameter(torch.tensor(_inverse_softplus(init_scale), device=torch.get_default_device()))  # as nn.Linear's
        elif isinstance(scale, torch.distributions.Distribution):
            support = scale.support
            bounded_below = isinstance(support, (constraints.greater_than, constraints.greater_than_eq))
            if not (bounded_below and support.lower_bound >= 0):
                raise ValueError(f"a prior on the noise scale needs positive support, got {support}")
            if scale.batch_shape != torch.Size() or scale.event_shape != torch.Size():
                raise ValueError("the noise-scale prior must be a scalar distribution")
            # on the device the module's parameters are made on, and moved with them (_apply)
            self._prior_device = torch.get_default_device()
            self.scale_prior = distribution_to(scale, self._prior_device)
        else:
            scale = float(scale)
            if not scale > 0 or not math.isfinite(scale):
                raise ValueError(f"noise scale must be positive and finite, got {scale}")
            self.register_buffer("fixed_scale", torch.tensor(scale, device=torch.get_default_device()))  # as nn.Linear's

    def _apply(self, fn, recurse=True):
        # a prior given as a distribution is not a buffer: it moves with the module by hand
        out = super()._apply(fn, recurse)
        if self.scale_prior is not None:
            device = fn(torch.empty(0, device=self._prior_device)).device
            if device != self._prior_device:
                self.scale_prior, self._prior_device = distribution_to(self.scale_prior, device), device
        return out

    @property
    def noise_kind(self) -> str:
        if self.scale_prior is not None:
            return "prior"
        return "learned" if self.scale_unconstrained is not None else "fixed"

    def latent_sites(self):
        return {self.noise_site: self.scale_prior} if self.scale_prior is not None else {}

    def scale(self, **latents):
        """The noise scale (a sampled value with a leading sample shape, or a scalar)."""
        if self.scale_prior is not None:
            return latents[self.noise_site]
        if self.scale_unconstrained is not None:
            return F.softplus(self.scale_unconstrained)
        return self.fixed_scale

    def distribution(self, output, **latents):
        scale = self.scale(**latents)
        if scale.dim():
            # sampled with shape sample_shape + (1,): align with (..., N, D)
            scale = scale.unsqueeze(-1)
        return dist.Normal(output, scale.to(output.dtype), validate_args=False).to_event(1)

    def check_targets(self, y, output_shape):
        return _check_float_targets(y, output_shape, "regression")

    def native_form(self) -> NativeForm:
        """A latent scale with its prior (the kernels take the priors they have codes for), or the
        fixed (or current learned) scale."""
        if self.scale_prior is not None:
            return NativeForm("gaussian_latent", {"site": self.noise_site, "prior": self.scale_prior})
        return NativeForm("gaussian", {"scale": float(self.scale())})

    def summarize(self, outputs, latents):
        if self.scale_prior is not None:
            scale = latents[self.noise_site].reshape(-1, 1, 1)
        else:
            scale = self.scale().detach().reshape(1, 1, 1)
        return RegressionPrediction(outputs, scale.to(outputs.dtype).expand_as(outputs))


class HeteroscedasticGaussianLikelihood(Likelihood):
    r"""Input-dependent Gaussian noise: the network outputs ``2 D`` values, the mean and the
    unconstrained scale :math:`s`, :math:`y \sim N(f_{1:D}(x), \sigma(f_{D+1:2D}(x))^2)`
    (Nix & Weigend 1994; Kendall & Gal 2017), with

    - ``link="softplus"`` (default): :math:`\sigma = \text{softplus}(s) + \sigma_{min}`;
    - ``link="exp"``: :math:`\sigma = \text{clip}(e^{s}, \sigma_{min}, \sigma_{max})`, the
      network's second output a log-scale (the MILE protocol: clipped to ``[1e-6, 1e6]``).

    :param min_scale: floor on the scale, for numerical stability.
    :param max_scale: ceiling on the scale with ``link="exp"``.
    """

    def __init__(self, min_scale: float = 1e-4, dataset_size=None, link: str = "softplus", max_scale: float = 1e6):
        super().__init__(dataset_size)
        if link not in ("softplus", "exp"):
            raise ValueError(f"link must be 'softplus' or 'exp', got {link!r}")
        if not (math.isfinite(min_scale) and min_scale > 0):
            raise ValueError(f"min_scale must be a positive finite number, got {min_scale}")
        if not (max_scale > min_scale):
            raise ValueError(f"max_scale must exceed min_scale ({min_scale}), got {max_scale}")
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.link = link

    def split(self, output):
        if output.shape[-1] % 2:
            raise ValueError(
                f"a heteroscedastic likelihood needs an even number of network outputs (mean "
                f"and scale per target), got {output.shape[-1]}"
            )
        d = output.shape[-1] // 2
        if self.link == "exp":
            return output[..., :d], torch.exp(output[..., d:]).clamp(self.min_scale, self.max_scale)
        return output[..., :d], F.softplus(output[..., d:]) + self.min_scale

    def distribution(self, output, **latents):
        loc, scale = self.split(output)
        return dist.Normal(loc, scale, validate_args=False).to_event(1)

    def native_form(self) -> NativeForm:
        return NativeForm(self.link, {"min_scale": self.min_scale, "max_scale": self.max_scale})

    def check_targets(self, y, output_shape):
        n, d2 = output_shape
        if d2 % 2:
            self.split(torch.empty(output_shape, device="meta"))  # checks the shape only
        return _check_float_targets(y, (n, d2 // 2), "regression")

    def summarize(self, outputs, latents):
        loc, scale = self.split(outputs)
        return RegressionPrediction(loc, scale)


class ClassLabels(dist.Categorical):
    """A categorical distribution over class labels whose ``log_prob`` names labels outside
    ``[0, C)`` instead of failing in torch's indexing (under Pyro's own ``SVI``, where the model
    checks only the labels' type and shape: a range check would cost a host synchronization on
    every step, and this one costs nothing until the indexing has failed)."""

    def log_prob(self, value):
        try:
            return super().log_prob(value)
        except (IndexError, RuntimeError) as e:
            classes = self.logits.shape[-1]
            if value.numel() and bool(((value < 0) | (value >= classes)).any()):
                raise ValueError(
                    f"class labels must lie in [0, {classes}) for a network with {classes} outputs, got labels from "
                    f"{int(value.min())} to {int(value.max())}"
                ) from e
            raise


class CategoricalLikelihood(Likelihood):
    """Categorical over the network's ``C`` outputs, read as logits. Targets are integer class
    labels in ``[0, C)``."""

    task = "classification"

    def distribution(self, output, **latents):
        return ClassLabels(logits=output, validate_args=False)

    def native_form(self) -> NativeForm:
        return NativeForm("categorical")

    def check_targets(self, y, output_shape):
        n, c = output_shape
        if not isinstance(y, torch.Tensor):
            raise ValueError(f"labels must be a tensor, got {type(y).__name__}")
        check_label_dtype(y)
        if y.shape != torch.Size((n,)):
            raise ValueError(f"labels of shape {tuple(y.shape)} do not match {n} predictions: expected ({n},)")
        return y

    def check_target_values(self, y, output_dim):
        check_label_range(y, output_dim, f" for a network with {output_dim} outputs")

    def refused_targets(self, output_dim) -> str:
        return f"class labels outside [0, {output_dim})"

    def flag_target_values(self, y, output_dim):
        return y.clamp(0, output_dim - 1), ((y < 0) | (y >= output_dim)).any()

    def summarize(self, outputs, latents):
        return ClassificationPrediction(torch.softmax(outputs, -1))


class BernoulliLikelihood(Likelihood):
    """Independent Bernoulli per output, the network's outputs read as logits. Targets are 0/1,
    of shape ``(N, K)`` (or ``(N,)`` for one output)."""

    task = "classification"

    def distribution(self, output, **latents):
        return dist.Bernoulli(logits=output, validate_args=False).to_event(1)

    def native_form(self) -> NativeForm:
        return NativeForm("bernoulli")

    def check_targets(self, y, output_shape):
        n, k = output_shape
        if not isinstance(y, torch.Tensor):
            raise ValueError(f"targets must be a tensor, got {type(y).__name__}")
        if y.dim() == 1 and k == 1:
            y = y.unsqueeze(-1)
        if y.shape != torch.Size((n, k)):
            raise ValueError(f"targets of shape {tuple(y.shape)} do not match the output shape {(n, k)}")
        return y.to(torch.get_default_dtype()) if not y.is_floating_point() else y

    def check_target_values(self, y, output_dim):
        if y.numel() and not torch.all((y == 0) | (y == 1)):
            raise ValueError("Bernoulli targets must be 0 or 1")

    def refused_targets(self, output_dim) -> str:
        return "Bernoulli targets other than 0 and 1"

    def flag_target_values(self, y, output_dim):
        return y, ~((y == 0) | (y == 1)).all()

    def summarize(self, outputs, latents):
        p = torch.sigmoid(outputs)
        return ClassificationPrediction(torch.stack([1 - p, p], -1))
