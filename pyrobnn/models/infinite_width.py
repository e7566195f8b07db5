r"""The infinite-width limit of a fully connected Bayesian network: its NNGP kernel.

An MLP with independent Gaussian priors on its weights, scaled by fan-in, tends to a Gaussian
process as its hidden layers widen (Neal 1996; Lee et al. 2018, "Deep Neural Networks as Gaussian
Processes", ICLR). For the network

.. math::

    z = (x - c) \odot s,\qquad h_1 = W_1 z + b_1,\qquad h_{l+1} = W_{l+1}\,\phi(h_l) + b_{l+1},

with :math:`W_l \sim N(0, \sigma_{w,l}^2/\mathrm{fan\_in}_l)` and :math:`b_l \sim N(0,
\sigma_{b,l}^2)`, the covariance of the pre-activations of layer :math:`l` at two inputs is

.. math::

    K_1(x, x') = \sigma_{b,1}^2 + \sigma_{w,1}^2\,\frac{z \cdot z'}{d},\qquad
    K_{l+1}(x, x') = \sigma_{b,l+1}^2 + \sigma_{w,l+1}^2\,
        \mathbb E_{(u, v) \sim N(0, K_l)}[\phi(u)\,\phi(v)],

where the expectation is over the bivariate Gaussian with the layer's covariances at
:math:`(x, x)`, :math:`(x, x')`, :math:`(x', x')`. It has a closed form for

- ``"erf"``: :math:`\frac{2}{\pi}\arcsin\frac{2K(x,x')}{\sqrt{(1 + 2K(x,x))(1 + 2K(x',x'))}}`
  (Williams 1997, "Computing with infinite networks"); erf is a smooth, tanh-like activation;
- ``"relu"``: :math:`\frac{\sqrt{K(x,x)K(x',x')}}{2\pi}(\sin\theta + (\pi - \theta)\cos\theta)`,
  :math:`\cos\theta = K(x,x')/\sqrt{K(x,x)K(x',x')}` (the arc-cosine kernel of degree 1, Cho &
  Saul 2009);
- ``"cos"``: :math:`\tfrac12\big(e^{-(K(x,x) + K(x',x') - 2K(x,x'))/2} + e^{-(K(x,x) + K(x',x') +
  2K(x,x'))/2}\big)`, from :math:`\cos u \cos v = \tfrac12(\cos(u - v) + \cos(u + v))` and
  :math:`\mathbb E \cos w = e^{-\mathrm{Var}\,w/2}` for a centred Gaussian :math:`w`. In the first
  layer the biases cancel from the first term, which is :math:`e^{-\sigma_{w,1}^2 |z - z'|^2 /
  (2d)}`: a squared-exponential kernel of the inputs' distance, the same everywhere in the input
  space (stationary), as a GP's usual kernels are; the second term is at most
  :math:`e^{-2\sigma_{b,1}^2}`, so with wide first-layer biases (:data:`COS_PHASE_SCALE`) the
  first layer is random Fourier features (Rahimi & Recht 2007, "Random features for large-scale
  kernel machines", with Gaussian rather than uniform phases) and every later layer, whose
  inputs' covariance then depends on :math:`z - z'` alone, stays stationary. The erf and ReLU
  kernels are not: their variance and correlations depend on where the inputs are, not only on
  how far apart.

A fixed constant added to the outputs (:class:`OutputMean`, :math:`f(x) = h_{L+1}(x) + \mu`) makes
the limit :math:`GP(\mu, K_{L+1})`: a GP with a constant mean is the limit of a network with that
output offset, not of one without it.

:class:`InfiniteWidthMLP` is such a network's description (the scales above, the activation, the
input scaling and the output mean); it builds the finite network with its priors
(:meth:`InfiniteWidthMLP.bayesian_model`) and gives the limit's covariance
(:meth:`InfiniteWidthMLP.covariance`), so that hyperparameters fitted on the kernel by a GP's
marginal likelihood are the prior of the finite network (:mod:`pyrobnn.integrations.botorch` does
that for Bayesian optimization). :func:`infinite_width_of` reads the description back from a
:class:`~pyrobnn.models.BayesianModel` built that way or by hand. :class:`NNGPCrossCovariance`
evaluates the covariance against fixed points (a GP's training inputs) at many new inputs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
from torch import nn

from pyrobnn.models.priors import NormalPrior

__all__ = ["Erf", "Cos", "InputScaling", "OutputMean", "InfiniteWidthMLP", "NNGPCrossCovariance", "nngp_covariance",
           "activation_expectation", "activation_variance", "infinite_width_of", "ACTIVATIONS", "COS_PHASE_SCALE"]

#: the activations whose infinite-width expectation has a closed form here
ACTIVATIONS = ("erf", "relu", "cos")
#: the scale of the first layer's biases that makes a network of cosine units stationary: the
#: kernel's non-stationary term is at most :math:`e^{-2\pi^2} = 2.7 \times 10^{-9}` of its
#: variance (module docstring)
COS_PHASE_SCALE = math.pi

#: how close to +-1 the erf kernel's correlation may come before arcsin, whose derivative is
#: infinite there (its correlation is below 1 by construction; the guard is for rounding)
_CORRELATION_EDGE = 1e-7


class _ArcCosine(torch.autograd.Function):
    r""":math:`J(c) = \sin\theta + (\pi - \theta)\cos\theta` at :math:`c = \cos\theta`
    (Cho & Saul 2009's first-order arc-cosine function), with its derivative :math:`J'(c) = \pi -
    \theta` in closed form. Through ``acos`` and ``sqrt`` autograd would sum two infinite terms
    at :math:`c = 1` (the kernel's diagonal, and nearly equal inputs), and a correlation held
    below 1 to avoid them perturbs a nearly singular kernel matrix enough to make it indefinite
    (ReLU kernels of inputs in few dimensions, or behind large biases)."""

    @staticmethod
    def forward(ctx, cos):
        cos = cos.clamp(-1.0, 1.0)
        ctx.save_for_backward(cos)
        theta = torch.acos(cos)
        return torch.sin(theta) + (math.pi - theta) * cos

    @staticmethod
    def backward(ctx, grad):
        (cos,) = ctx.saved_tensors
        return grad * (math.pi - torch.acos(cos))  # differentiable again (second derivatives are infinite at c = 1)


class Erf(nn.Module):
    """The error function as an activation: smooth and bounded like tanh, with a closed-form
    infinite-width kernel (Williams 1997)."""

    def forward(self, x):
        return torch.erf(x)


class Cos(nn.Module):
    """The cosine as an activation: behind wide first-layer biases, random Fourier features, whose
    infinite-width kernel is stationary (module docstring)."""

    def forward(self, x):
        return torch.cos(x)


#: each activation's module, in the finite network and as it is read back
_MODULES = {"erf": Erf, "relu": nn.ReLU, "cos": Cos}


class InputScaling(nn.Module):
    r"""A fixed affine map of the inputs, :math:`z = (x - c) \odot s` (buffers ``center`` and
    ``scale``, moved and saved with the network): the inputs' centre and, per feature or shared,
    the inverse of a length scale. Not random, so it is no weight site of a Bayesian model."""

    def __init__(self, center: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        # numbers become tensors on the default device, as nn.Linear's parameters are made
        center, scale = (v if isinstance(v, torch.Tensor) else torch.as_tensor(v, device=torch.get_default_device()) for v in (center, scale))
        if center.dim() != 1 or scale.shape not in (center.shape, torch.Size([1])):
            raise ValueError(f"center must be (d,) and scale (d,) or (1,); got {tuple(center.shape)} and {tuple(scale.shape)}")
        if not bool(torch.isfinite(center).all() and torch.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError("center must be finite and scale positive and finite")
        self.register_buffer("center", center.clone())
        self.register_buffer("scale", scale.clone())

    def forward(self, x):
        return (x - self.center) * self.scale

    def extra_repr(self) -> str:
        return f"features={self.center.numel()}"


class OutputMean(nn.Module):
    r"""A fixed constant added to the network's outputs, :math:`f(x) = g(x) + \mu` (buffer
    ``mean``: one value per output, or one for all): the prior mean of the function, as a GP's
    constant mean is. Not random, so it is no weight site of a Bayesian model."""

    def __init__(self, mean: torch.Tensor):
        super().__init__()
        mean = mean if isinstance(mean, torch.Tensor) else torch.as_tensor(mean, device=torch.get_default_device())
        if mean.dim() != 1 or not bool(torch.isfinite(mean).all()):
            raise ValueError(f"mean must be a finite (outputs,) or (1,) tensor, got shape {tuple(mean.shape)}")
        self.register_buffer("mean", mean.clone())

    def forward(self, y):
        return y + self.mean

    def extra_repr(self) -> str:
        return f"outputs={self.mean.numel()}"


def activation_expectation(activation: str, kxx, kxy, kyy):
    r""":math:`\mathbb E[\phi(u)\phi(v)]` for :math:`(u, v)` Gaussian with zero mean, variances
    ``kxx``, ``kyy`` and covariance ``kxy`` (broadcast together), in closed form (module
    docstring)."""
    if activation == "erf":
        rho = 2 * kxy / torch.sqrt((1 + 2 * kxx) * (1 + 2 * kyy))
        return (2 / math.pi) * torch.asin(rho.clamp(-1 + _CORRELATION_EDGE, 1 - _CORRELATION_EDGE))
    if activation == "relu":
        norms = torch.sqrt(kxx * kyy)
        return norms * _ArcCosine.apply(kxy / norms) / (2 * math.pi)
    if activation == "cos":
        # both variances are >= 0 (Cauchy-Schwarz); the clamp is for rounding at u = v
        total = kxx + kyy
        return 0.5 * (torch.exp(-(total - 2 * kxy).clamp_min(0) / 2) + torch.exp(-(total + 2 * kxy).clamp_min(0) / 2))
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def activation_variance(activation: str, k):
    r""":math:`\mathbb E[\phi(u)^2]` for :math:`u \sim N(0, k)`: :func:`activation_expectation` at
    :math:`k_{xx} = k_{xy} = k_{yy} = k`, in its simpler closed form: :math:`k/2` (ReLU),
    :math:`\frac{2}{\pi}\arcsin\frac{2k}{1 + 2k}` (erf), :math:`\tfrac12(1 + e^{-2k})` (cos).
    A layer's variances, in fewer operations than the general form's."""
    if activation == "relu":
        return k / 2
    if activation == "erf":
        return (2 / math.pi) * torch.asin((2 * k / (1 + 2 * k)).clamp(max=1 - _CORRELATION_EDGE))
    if activation == "cos":
        return 0.5 * (1 + torch.exp(-2 * k))
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def nngp_covariance(z1, z2=None, *, activation: str, weight_scales, bias_scales, diag: bool = False):
    r"""The NNGP covariance of the network's outputs at scaled inputs ``z1`` ``(..., n, d)`` and
    ``z2`` ``(..., p, d)``: ``(..., n, p)``, or its diagonal ``(..., n)`` with ``diag`` (then
    ``z2`` is not used). ``z2=None`` is ``z2 = z1``: the matrix's diagonal then holds each layer's
    variances, read from it instead of computed beside it (a third of the operations per layer:
    what the marginal likelihood's fit evaluates hundreds of times). ``weight_scales`` and
    ``bias_scales`` hold :math:`\sigma_{w,l}` and :math:`\sigma_{b,l}` per linear layer, first to
    last, each a number or a tensor broadcastable to ``(..., 1, 1)`` (a batch of
    hyperparameters)."""
    weight_scales, bias_scales = list(weight_scales), list(bias_scales)
    if len(weight_scales) != len(bias_scales) or not weight_scales:
        raise ValueError(f"one weight and one bias scale per linear layer: got {len(weight_scales)} and {len(bias_scales)}")
    d = z1.shape[-1]

    def var(scale):  # (..., 1, 1) for matrices; its [..., 0] is (..., 1) for the diagonals
        scale = torch.as_tensor(scale, dtype=z1.dtype, device=z1.device)
        return (scale.reshape(1, 1) if scale.dim() < 2 else scale) ** 2

    wv, bv = var(weight_scales[0]), var(bias_scales[0])
    if z2 is None and not diag:
        kxy = bv + wv * (z1 @ z1.transpose(-1, -2)) / d
        for w, b in zip(weight_scales[1:], bias_scales[1:]):
            k = kxy.diagonal(dim1=-2, dim2=-1)
            kxy = var(b) + var(w) * activation_expectation(activation, k.unsqueeze(-1), kxy, k.unsqueeze(-2))
        return kxy
    kxx = bv[..., 0] + wv[..., 0] * (z1 * z1).sum(-1) / d
    if diag:
        for w, b in zip(weight_scales[1:], bias_scales[1:]):
            kxx = var(b)[..., 0] + var(w)[..., 0] * activation_variance(activation, kxx)
        return kxx
    kyy = bv[..., 0] + wv[..., 0] * (z2 * z2).sum(-1) / d
    kxy = bv + wv * (z1 @ z2.transpose(-1, -2)) / d
    for w, b in zip(weight_scales[1:], bias_scales[1:]):
        wv, bv = var(w), var(b)
        kxy = bv + wv * activation_expectation(activation, kxx.unsqueeze(-1), kxy, kyy.unsqueeze(-2))
        kxx = bv[..., 0] + wv[..., 0] * activation_variance(activation, kxx)
        kyy = bv[..., 0] + wv[..., 0] * activation_variance(activation, kyy)
    return kxy


class NNGPCrossCovariance:
    r"""The NNGP covariance of ``network`` (an :class:`InfiniteWidthMLP`) between new inputs and
    fixed ``points`` ``(N, d)``: the points' scaled inputs and per-layer variances
    :math:`K_l(x', x')` are formed once, so that at new inputs :math:`x` a call computes
    :math:`K_{L+1}(x, x)` and :math:`K_{L+1}(x, X)` in one pass over the layers, each layer's
    :math:`K_l(x, x)` shared by both (what a GP's posterior variance at a fixed training set
    needs: an acquisition evaluates it at every step of its optimizer). The network's scales are
    numbers: nothing is differentiated but ``x``."""

    def __init__(self, network: InfiniteWidthMLP, points: torch.Tensor):
        d = network.input_center.numel()
        if points.dim() != 2 or points.shape[-1] != d:
            raise ValueError(f"points must be (N, {d}): points by the network's {d} inputs, got shape {tuple(points.shape)}")
        if not bool(torch.isfinite(points).all()):
            raise ValueError("points has NaN or infinite values")
        self.activation = network.activation
        self._weights = [w * w for w in network.weight_scales]
        self._biases = [b * b for b in network.bias_scales]
        self._center = network.input_center.to(points)
        self._scale = network.input_scale.to(points)
        self._points = (points.detach() - self._center) * self._scale
        k = self._biases[0] + self._weights[0] * (self._points * self._points).sum(-1) / d
        self._variances = [k]  # K_l(x', x') of each layer's pre-activations, first to last but one
        for w, b in zip(self._weights[1:-1], self._biases[1:-1]):
            k = b + w * activation_variance(self.activation, k)
            self._variances.append(k)

    def __call__(self, x):
        """For ``x`` ``(n, d)``: the variances :math:`K(x_i, x_i)` ``(n,)`` and the covariances
        :math:`K(x_i, x'_j)` with the points ``(n, N)``."""
        d = self._points.shape[-1]
        if x.dim() != 2 or x.shape[-1] != d:
            raise ValueError(f"x must be (n, {d}): points by the network's {d} inputs, got shape {tuple(x.shape)}")
        z = (x - self._center) * self._scale
        kxx = self._biases[0] + self._weights[0] * (z * z).sum(-1) / d
        kxy = self._biases[0] + self._weights[0] * (z @ self._points.T) / d
        for w, b, kyy in zip(self._weights[1:], self._biases[1:], self._variances):
            kxy = b + w * activation_expectation(self.activation, kxx.unsqueeze(-1), kxy, kyy.unsqueeze(-2))
            kxx = b + w * activation_variance(self.activation, kxx)
        return kxx, kxy


@dataclasses.dataclass(frozen=True)
class InfiniteWidthMLP:
    r"""A fully connected network's description for its infinite-width limit: inputs scaled by
    :class:`InputScaling` (``input_center``, ``input_scale``), then linear layers with
    ``activation`` between them; layer :math:`l`'s weights :math:`N(0, \sigma_{w,l}^2/
    \mathrm{fan\_in})`, its biases :math:`N(0, \sigma_{b,l}^2)` (``weight_scales``,
    ``bias_scales``, first to last). ``len(weight_scales) - 1`` hidden layers. ``output_mean``
    (``(outputs,)`` or ``(1,)``, default none: zero) is added to the outputs by an
    :class:`OutputMean`: the limit's constant mean."""

    activation: str
    weight_scales: tuple
    bias_scales: tuple
    input_center: torch.Tensor
    input_scale: torch.Tensor
    output_mean: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        scales = tuple(float(s) for s in self.weight_scales), tuple(float(s) for s in self.bias_scales)
        if len(scales[0]) != len(scales[1]) or len(scales[0]) < 2:
            raise ValueError("weight_scales and bias_scales need one value per linear layer, at least two layers (one hidden)")
        if not all(math.isfinite(s) and s > 0 for s in scales[0] + scales[1]):
            raise ValueError(f"the prior scales must be positive and finite, got {scales}")
        object.__setattr__(self, "weight_scales", scales[0])
        object.__setattr__(self, "bias_scales", scales[1])
        InputScaling(self.input_center, self.input_scale)  # checks the shapes and values
        if self.output_mean is not None:
            OutputMean(self.output_mean)

    @property
    def depth(self) -> int:
        """The number of hidden layers."""
        return len(self.weight_scales) - 1

    def covariance(self, x1, x2=None, diag: bool = False):
        """The limit's covariance of the outputs at inputs ``x1`` and ``x2`` (default ``x1``), in
        the inputs' own units (the scaling applied here)."""
        scaling = InputScaling(self.input_center, self.input_scale).to(x1)
        z1 = scaling(x1)
        z2 = z1 if x2 is None else scaling(x2)
        return nngp_covariance(z1, z2, activation=self.activation, weight_scales=self.weight_scales, bias_scales=self.bias_scales,
                               diag=diag)

    def network(self, out_features: int, width: int = 50) -> nn.Sequential:
        """The finite network: ``InputScaling, Linear, act, ..., Linear`` (then ``OutputMean``
        where there is an output mean) with ``width`` units per hidden layer (parameters on the
        default device, in the default dtype, as ``nn.Linear``'s)."""
        act = _MODULES[self.activation]
        d = self.input_center.numel()
        layers, fan_in = [InputScaling(self.input_center, self.input_scale)], d
        for _ in range(self.depth):
            layers += [nn.Linear(fan_in, width), act()]
            fan_in = width
        layers.append(nn.Linear(fan_in, out_features))
        if self.output_mean is not None:
            if self.output_mean.numel() not in (1, out_features):
                raise ValueError(f"output_mean has {self.output_mean.numel()} values for {out_features} outputs")
            layers.append(OutputMean(self.output_mean))
        return nn.Sequential(*layers)

    def priors(self) -> dict:
        """The weight priors of :meth:`network`'s sites, by site name."""
        priors = {}
        for layer, (w, b) in enumerate(zip(self.weight_scales, self.bias_scales)):
            index = 1 + 2 * layer
            priors[f"{index}.weight"] = NormalPrior(w, fan_in=True)
            priors[f"{index}.bias"] = NormalPrior(b)
        return priors

    def bayesian_model(self, likelihood, out_features: int = 1, width: int = 50, dtype=None):
        """:meth:`network` as a :class:`~pyrobnn.models.BayesianModel` with :meth:`priors` and
        ``likelihood``, in ``dtype`` (default: the input centre's)."""
        from pyrobnn.models.bayesian_model import BayesianModel

        dtype = dtype or self.input_center.dtype
        # BayesianModel moves the likelihood to the network's dtype and device
        return BayesianModel(self.network(out_features, width).to(dtype), likelihood, prior=self.priors())


def infinite_width_of(model) -> InfiniteWidthMLP:
    """The :class:`InfiniteWidthMLP` of a :class:`~pyrobnn.models.BayesianModel` whose network is
    an ``nn.Sequential`` of an optional :class:`InputScaling`, then ``Linear``, activation (``Erf``,
    ``nn.ReLU`` or ``Cos``), ..., ``Linear``, then an optional :class:`OutputMean`, every weight and bias random under a
    :class:`~pyrobnn.models.priors.NormalPrior` (weights scaled by fan-in). Anything else is
    refused by name: its infinite-width limit is not this kernel."""
    net = model.net
    if not isinstance(net, nn.Sequential):
        raise ValueError(f"the infinite-width kernel needs an nn.Sequential MLP, got {type(net).__name__}")
    modules = list(net.named_children())
    scaling = None
    if modules and isinstance(modules[0][1], InputScaling):
        scaling = modules.pop(0)[1]
    output_mean = None
    if modules and isinstance(modules[-1][1], OutputMean):
        output_mean = modules.pop()[1].mean
    linears = [(name, m) for name, m in modules[0::2]]
    activations = [m for _, m in modules[1::2]]
    if not linears or not all(isinstance(m, nn.Linear) for _, m in linears) or len(linears) != len(activations) + 1:
        raise ValueError("the infinite-width kernel needs Linear layers with one activation between each two: "
                         f"got {[type(m).__name__ for _, m in modules]}")
    kinds = {next((name for name, kind in _MODULES.items() if isinstance(a, kind)), type(a).__name__) for a in activations}
    if len(kinds) != 1 or not kinds <= set(ACTIVATIONS):
        raise ValueError(f"the infinite-width kernel has a closed form for one of {ACTIVATIONS} activations throughout, got {sorted(kinds)}")
    weight_scales, bias_scales = [], []
    for name, linear in linears:
        scales = []
        for part in ("weight", "bias"):
            site_name = f"{name}.{part}"
            if getattr(linear, part) is None or site_name not in {s.name for s in model.sites}:
                raise ValueError(f"the infinite-width kernel needs {site_name} to be a random site")
            site = model.site(site_name)
            prior = model.site_prior(site)
            if not isinstance(prior, NormalPrior) or (part == "weight" and not prior.fan_in):
                raise ValueError(f"the infinite-width kernel needs a NormalPrior (fan_in=True on weights) on {site_name}, got {prior!r}")
            scales.append(prior.scale)
        weight_scales.append(scales[0])
        bias_scales.append(scales[1])
    d = linears[0][1].in_features
    like = linears[0][1].weight
    if scaling is None:
        center, scale = torch.zeros(d, dtype=like.dtype, device=like.device), torch.ones(1, dtype=like.dtype, device=like.device)
    else:
        center, scale = scaling.center, scaling.scale
    return InfiniteWidthMLP(kinds.pop(), tuple(weight_scales), tuple(bias_scales), center, scale, output_mean)
