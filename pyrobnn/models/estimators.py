"""Gradient estimators for the likelihood term: local reparameterization, flipout, and one
weight sample per example, as Pyro effect handlers.

By default a :class:`~pyrobnn.models.BayesianModel` samples each weight tensor once per
forward pass ("one weight sample per minibatch"). Inside one of these handlers the model's
``Linear`` and ``Conv1d/2d/3d`` layers with random parameters instead send a
``"pyrobnn_layer"`` message, and the handler computes the layer's output from the
distribution that drew its weights (recorded when the guide sampled them):

- :func:`local_reparameterization` (Kingma, Salimans & Welling 2015): for factorized Gaussian
  weights, sample the pre-activations, :math:`N(x\\mu + \\mu_b,\\; x^2\\sigma^2 + \\sigma_b^2)`,
  independently per example.
- :func:`flipout` (Wen et al. 2018): one Gaussian perturbation :math:`\\Delta W = \\sigma\\odot
  \\epsilon` per minibatch, decorrelated across examples by random signs,
  :math:`x\\mu + ((x\\odot s)\\,\\Delta W)\\odot r`.
- :func:`per_example_weights`: a fresh weight sample for every example (the slow baseline of
  Kingma et al.'s variance experiment).

For the dropout family (:class:`~pyrobnn.models.distributions.UnitNoiseWeights`) all three draw the
noise per example on the layer's inputs, which is exact: it *is* a weight sample per example.

Each example's output has exactly the distribution it has under plain weight sampling; only
the correlation between examples (and hence the gradient variance) changes. The KL terms are
untouched (analytic, or the registered approximation, as the ELBO decides). Nothing global is
replaced: ``torch.nn.functional`` is not patched; only the model's own random layers route
through the handler, and any other torch code in the context runs as usual.

The handler records the distribution of each weight site when the site is drawn inside it
(by the guide during SVI and ``Predictive``, by the prior when the model runs alone), so run
the guide and the model inside the same handler, as a context manager does. A layer whose
weights were not drawn inside the handler (a shape probe, a guide run outside it) uses the
weights it was given, i.e. plain weight sampling; a posterior the estimator cannot use (the
``Delta`` sites of Pyro's autoguides, a log-uniform prior) is an error.

Usage::

    with pyrobnn.local_reparameterization():
        svi.step(x, y)
        samples = Predictive(model, guide=guide, num_samples=100, parallel=True)(x_test)
    pyrobnn.fit(model, guide, x, y, estimator="local")
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import effectful
from torch import nn

from pyrobnn.models.distributions import UnitNoiseWeights
from pyrobnn.models.kl import base_distribution

__all__ = [
    "Estimator",
    "layer_forward",
    "LocalReparameterization",
    "Flipout",
    "PerExampleWeights",
    "local_reparameterization",
    "flipout",
    "per_example_weights",
    "ESTIMATORS",
    "SUPPORTED_LAYERS",
    "estimator_active",
    "apply_layer",
    "Factor",
    "squeeze_sample_dims",
    "unit_noise_shape",
]

#: layer types whose forward the estimators can compute from weight distributions
SUPPORTED_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)

#: variance floor inside the square root, so that zero variances give finite gradients
_TINY_VARIANCE = 1e-16

_active = [0]


def estimator_active() -> bool:
    """Whether any estimator handler is on Pyro's stack (the model routes its layers only then)."""
    return _active[0] > 0


def _default_layer(module, x, sites, values):
    # the ordinary forward, with the sampled parameters already swapped into the module
    return type(module).forward(module, x)


#: the effect a random layer sends; without a handler it is the layer's own forward
apply_layer = effectful(_default_layer, type="pyrobnn_layer")


class Factor:
    """The variational factor of one parameter tensor as an estimator sees it."""

    __slots__ = ("kind", "mean", "std", "dist")

    def __init__(self, kind, mean, std=None, dist=None):
        self.kind, self.mean, self.std, self.dist = kind, mean, std, dist

    @property
    def var(self):
        return self.std.square()


def squeeze_sample_dims(t, shape):
    # a factor expanded by Pyro's plates (vectorized particles / Predictive) varies only in
    # its sample dimensions by broadcasting; its moments are those of the first slice
    extra = t.dim() - len(shape)
    return t[(0,) * extra] if extra > 0 else t


def layer_forward(module, x, weight, bias):
    """``module``'s own operation (a linear map or a convolution) with the given weight and bias."""
    if isinstance(module, nn.Linear):
        return F.linear(x, weight, bias)
    return module._conv_forward(x, weight, bias)


class Estimator(Messenger):
    """Base class: records the distribution that draws each sample site, and computes the
    outputs of random layers from those distributions."""

    name = "estimator"

    def __init__(self):
        super().__init__()
        self._generators = {}

    def __enter__(self):
        _active[0] += 1
        return super().__enter__()

    def __exit__(self, *args):
        _active[0] -= 1
        return super().__exit__(*args)

    def _pyro_sample(self, msg):
        # a site whose value is not yet set is about to be drawn from msg["fn"]; replayed or
        # conditioned sites (the model's, during SVI and Predictive) keep the guide's record
        if msg["value"] is None and not msg["is_observed"] and msg["name"] is not None:
            self._generators[msg["name"]] = msg["fn"]

    def _factor(self, site, value):
        fn = self._generators.get(site.name)
        if fn is None:
            # not drawn inside this handler (a Predictive shape probe, a guide run outside
            # it): the layer uses the value it was given, i.e. plain weight sampling
            return Factor("point", value)
        base = base_distribution(fn)
        if isinstance(base, UnitNoiseWeights):
            return Factor("units", squeeze_sample_dims(base.loc, site.shape), dist=base)
        if isinstance(base, torch.distributions.Normal):
            mean = squeeze_sample_dims(base.loc, site.shape).expand(site.shape)
            std = squeeze_sample_dims(base.scale, site.shape).expand(site.shape)
            return Factor("gaussian", mean, std, base)
        raise ValueError(
            f"{self.name} needs a factorized Gaussian or dropout-style posterior at site "
            f"{site.name!r}; got {type(base).__name__}"
            + (
                " (Pyro's autoguides place Delta distributions at the sites; use a guide from pyrobnn.guides)"
                if type(base).__name__ == "Delta"
                else ""
            )
        )

    def _factors(self, module, sites, values):
        factors = {}
        for pname in ("weight", "bias"):
            if pname in sites:
                factors[pname] = self._factor(sites[pname], values[pname])
            else:
                param = module._parameters.get(pname)
                factors[pname] = None if param is None else Factor("point", param)
        return factors

    def _pyro_pyrobnn_layer(self, msg):
        module, x, sites, values = msg["args"]
        factors = self._factors(module, sites, values)
        w, b = factors["weight"], factors["bias"]
        if w is not None and w.kind == "units":
            # dropout-style noise per example on the layer's inputs: exact for every estimator
            x = x * w.dist.noise(unit_noise_shape(module, x))
            w = Factor("point", w.mean)
        if b is not None and b.kind == "units":
            b = Factor("point", b.mean)
        msg["value"] = self.layer_output(module, x, w, b)

    def layer_output(self, module, x, w, b):
        raise NotImplementedError


def unit_noise_shape(module, x):
    """Shape of the per-example noise a layer draws: one value per example and feature
    (``Linear``) or per example and channel (convolutions), broadcast over the rest."""
    if isinstance(module, nn.Linear):
        return x.shape[:1] + (1,) * (x.dim() - 2) + x.shape[-1:]
    return x.shape[:2] + (1,) * (x.dim() - 2)


def _mean(f):
    return None if f is None else f.mean


def _var(f):
    return None if f is None or f.kind != "gaussian" else f.var


class _GaussianSample(torch.autograd.Function):
    """``mean + sqrt(var) * eps`` with ``eps ~ N(0, 1)``, in as few passes over the
    activations as autograd allows: the backward needs only ``eps / (2 sqrt(var))``, which
    the forward stores instead of ``eps`` and ``sqrt(var)``. (At large batches these passes,
    not the products, are what local reparameterization adds.)"""

    @staticmethod
    def forward(ctx, mean, var):
        std = torch.sqrt(var)
        eps = torch.randn_like(mean)
        out = torch.addcmul(mean, std, eps)
        ctx.save_for_backward(eps.div_(std.mul_(2.0)))
        return out

    @staticmethod
    def backward(ctx, grad):
        (ratio,) = ctx.saved_tensors
        return grad, grad * ratio


def gaussian_sample(mean, var):
    """A draw from ``N(mean, var)`` element-wise, reparameterized."""
    if torch._C._are_functorch_transforms_active():
        # inside vmap (vectorized prediction): plain operations, which vmap batches
        return mean + torch.sqrt(var) * torch.randn_like(mean)
    return _GaussianSample.apply(mean, var)


class LocalReparameterization(Estimator):
    r"""Sample pre-activations instead of weights (Kingma, Salimans & Welling 2015):

    .. math:: b \sim N\big(x\mu_W^\top + \mu_b,\; x^2 (\sigma_W^2)^\top + \sigma_b^2\big)

    independently for every example and output unit (for convolutions the same with the
    convolution in place of the product). One extra matrix product per layer; the gradient
    variance falls because examples no longer share a weight sample.
    """

    name = "local reparameterization"

    def layer_output(self, module, x, w, b):
        mean = layer_forward(module, x, _mean(w), _mean(b))
        w_var, b_var = _var(w), _var(b)
        if w_var is None and b_var is None:
            return mean
        # the variance floor keeps gradients finite at zero variance; added through the
        # bias term of the product, it costs no pass of its own
        floor = torch.full(mean.shape[1:2], _TINY_VARIANCE, dtype=mean.dtype, device=mean.device)
        b_var = floor if b_var is None else b_var + _TINY_VARIANCE
        if w_var is None:
            var = b_var.reshape((-1,) + (1,) * (mean.dim() - 2)).expand_as(mean)
        else:
            var = layer_forward(module, x * x, w_var, b_var)
        return gaussian_sample(mean, var)


def _rademacher(shape, like):
    return torch.randint(0, 2, shape, device=like.device).to(like.dtype).mul_(2).sub_(1)


def _channel_shape(module, t):
    # per example and channel, broadcast over the feature / spatial dimensions
    if isinstance(module, nn.Linear):
        return t.shape
    return t.shape[:2] + (1,) * (t.dim() - 2)


class Flipout(Estimator):
    r"""Flipout (Wen, Vicol, Ba, Tran & Grosse 2018): one perturbation
    :math:`\Delta W = \sigma_W \odot \epsilon` per minibatch, made pseudo-independent across
    examples by random signs :math:`s_n` on the inputs and :math:`r_n` on the outputs:

    .. math:: y_n = x_n\mu_W^\top + \mu_b + \big((x_n \odot s_n)\,\Delta W^\top + \Delta b\big) \odot r_n

    with :math:`\Delta b = \sigma_b \odot \epsilon_b`, also shared and sign-flipped. Every
    example's output is distributed exactly as under a weight sample of its own (the
    perturbation is symmetric), at the cost of one extra product per layer; no per-example
    weights are formed. For convolutions the signs are per example and channel.
    """

    name = "flipout"

    def layer_output(self, module, x, w, b):
        out = layer_forward(module, x, _mean(w), _mean(b))
        perturbation = None
        if _var(w) is not None:
            # scales, not square roots of variances: a zero scale keeps a finite gradient
            delta = w.std * torch.randn_like(w.std)
            s = _rademacher(_channel_shape(module, x), x)
            perturbation = layer_forward(module, x * s, delta, None)
        if _var(b) is not None:
            delta_b = b.std * torch.randn_like(b.std)
            if not isinstance(module, nn.Linear):
                delta_b = delta_b.reshape((-1,) + (1,) * (out.dim() - 2))
            perturbation = delta_b.expand_as(out) if perturbation is None else perturbation + delta_b
        if perturbation is None:
            return out
        return out + perturbation * _rademacher(_channel_shape(module, out), out)


class PerExampleWeights(Estimator):
    """A fresh weight sample for every example: the exact but slow estimator (Kingma et al.
    2015's "separate weight sample per data point"). Memory grows with batch x weights."""

    name = "per-example weights"

    def layer_output(self, module, x, w, b):
        n = x.shape[0]

        def draw(f):
            if f is None:
                return None
            if f.kind != "gaussian":
                return f.mean.expand((n,) + f.mean.shape)
            return f.mean + f.std * torch.randn((n,) + f.mean.shape, dtype=f.mean.dtype, device=f.mean.device)

        weights, biases = draw(w), draw(b)
        if isinstance(module, nn.Linear):
            flat = x.reshape(n, -1, x.shape[-1])
            out = torch.bmm(flat, weights.transpose(1, 2))
            if biases is not None:
                out = out + biases.unsqueeze(1)
            return out.reshape(x.shape[:-1] + (weights.shape[1],))
        # convolution per example as one grouped convolution over the batch
        if module.padding_mode != "zeros":
            x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
            padding = 0
        else:
            padding = module.padding
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[x.dim() - 2]
        grouped = x.reshape((1, n * x.shape[1]) + x.shape[2:])
        kernels = weights.reshape((n * weights.shape[1],) + weights.shape[2:])
        out = conv(
            grouped,
            kernels,
            None if biases is None else biases.reshape(-1),
            module.stride,
            padding,
            module.dilation,
            module.groups * n,
        )
        return out.reshape((n, weights.shape[1]) + out.shape[2:])


#: the estimators ``fit(..., estimator=name)`` accepts, by name
ESTIMATORS = {"local": LocalReparameterization, "flipout": Flipout, "per_example": PerExampleWeights}


def _handler(cls, fn=None):
    msngr = cls()
    return msngr(fn) if fn is not None else msngr


def local_reparameterization(fn=None):
    """Handler (context manager or wrapper of a callable) for :class:`LocalReparameterization`."""
    return _handler(LocalReparameterization, fn)


def flipout(fn=None):
    """Handler (context manager or wrapper of a callable) for :class:`Flipout`."""
    return _handler(Flipout, fn)


def per_example_weights(fn=None):
    """Handler (context manager or wrapper of a callable) for :class:`PerExampleWeights`."""
    return _handler(PerExampleWeights, fn)
