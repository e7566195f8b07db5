"""Distributions over network weights that Pyro and torch do not ship.

Priors
    :class:`LogUniform`          improper, scale-invariant p(w) proportional to 1/``|w|``
    :class:`ScaleMixtureNormal`  pi N(0, s1^2) + (1 - pi) N(0, s2^2) (Blundell et al. 2015)
    :class:`ARDNormal`           N(0, lambda) with a per-weight variance (automatic relevance determination)

Variational posteriors
    :class:`MultiplicativeNormal`   N(theta, alpha theta^2), independent per weight
                                    (Kingma et al. 2015; Molchanov et al. 2017)
    :class:`UnitNoiseWeights`       W = theta * xi with one noise variable xi per *input unit*,
                                    shared by every weight leaving that unit:
                                    Bernoulli (MC dropout, Gal & Ghahramani 2016),
                                    relaxed Bernoulli (concrete dropout, Gal et al. 2017),
                                    Gaussian N(1, alpha) (Gaussian / variational dropout, type A).

Every class here is element-wise over its batch shape; a weight site of shape ``S`` uses
``d.expand(S).to_event(len(S))``, so KL divergences registered in :mod:`pyrobnn.models.kl` for the
base classes apply to whole weight tensors through torch's ``Independent`` rule.

All constructors default to ``validate_args=False``: they are built on every training step
over tensors of hundreds of thousands of elements, and torch's argument validation would
cost several passes over them. Non-finite parameters are caught by the training loop instead.
"""

from __future__ import annotations

import copy
import math

import torch
from pyro.distributions import LogNormal, Normal, TorchDistribution
from torch.distributions import TransformedDistribution, constraints
from torch.distributions.transforms import ExpTransform
from torch.distributions.utils import broadcast_all

__all__ = [
    "ScalarNormal",
    "SampleAwareNormal",
    "LogUniform",
    "ScaleMixtureNormal",
    "ARDNormal",
    "MultiplicativeNormal",
    "UnitNoiseWeights",
    "BernoulliUnitNoise",
    "ConcreteUnitNoise",
    "GaussianUnitNoise",
    "without_validation",
    "unchecked_log_normal",
]


def unchecked_log_normal(loc, scale):
    """Pyro's ``LogNormal(loc, scale)`` built without torch's argument checks, for a scale that
    is positive by construction: Pyro's constructor makes its base ``Normal`` with the default
    checks, which read the scale back to the host (a synchronization per step on a GPU)."""
    out = LogNormal.__new__(LogNormal)
    TransformedDistribution.__init__(out, Normal(loc, scale, validate_args=False), ExpTransform(), validate_args=False)
    return out


def without_validation(d):
    """``d`` (a shallow copy) with torch's argument and sample checks off, its base
    distributions' included (Pyro's ``LogNormal`` passes no ``validate_args`` to its base
    ``Normal``). For a distribution scored at every training step at values in its support by
    construction (a draw of a LogNormal guide, scored under the LogNormal prior): each check
    reads a value back to the host, a synchronization per step on a GPU."""
    if not isinstance(d, torch.distributions.Distribution):
        raise TypeError(f"without_validation takes a torch distribution, got {type(d).__name__}")
    out = copy.copy(d)
    out._validate_args = False
    if hasattr(out, "base_dist"):
        out.base_dist = without_validation(out.base_dist)
    return out


def distribution_to(d, device):
    """``d`` (a copy) with every tensor it holds on ``device``: its parameters, its base
    distribution's and its transforms'. torch distributions have no ``.to``; a prior given as a
    distribution (a noise scale's ``LogNormal(-2, 1)``, made on the CPU) must sample and score on
    the device of the model that holds it."""
    device = torch.device(device)

    def moved(obj):
        if isinstance(obj, torch.Tensor):
            return obj.to(device)
        if isinstance(obj, (list, tuple)):
            return type(obj)(moved(o) for o in obj)
        if isinstance(obj, (torch.distributions.Distribution, torch.distributions.Transform)):
            out = copy.copy(obj)
            for name, value in vars(obj).items():
                if isinstance(value, (torch.Tensor, list, tuple, torch.distributions.Distribution, torch.distributions.Transform)):
                    setattr(out, name, moved(value))
            return out
        return obj

    return moved(d)


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class ScalarNormal(Normal):
    r"""A Normal with one scalar mean and scale broadcast over its batch shape, the shape of
    an i.i.d. Gaussian prior over a weight tensor.

    ``log_prob`` uses the scalars directly, :math:`-\tfrac12 ((w - m)/s)^2 - \log s -
    \tfrac12\log 2\pi`, instead of broadcasting expanded ``loc`` and ``scale`` tensors
    through every operation: two passes over the weights instead of six. Everything else
    (and the registered KLs) is the ordinary ``Normal``.
    """

    def __init__(self, loc: float, scale: float, batch_shape=torch.Size(), dtype=None, device=None, validate_args=False):
        self.loc_value, self.scale_value = float(loc), float(scale)
        loc_t = torch.tensor(self.loc_value, dtype=dtype, device=device).expand(batch_shape)
        scale_t = torch.tensor(self.scale_value, dtype=dtype, device=device).expand(batch_shape)
        super().__init__(loc_t, scale_t, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ScalarNormal, _instance)
        new.loc_value, new.scale_value = self.loc_value, self.scale_value
        return super().expand(batch_shape, _instance=new)

    def log_prob(self, value):
        z = value if self.loc_value == 0.0 else value - self.loc_value
        const = -math.log(self.scale_value) - _HALF_LOG_2PI
        out = z.square().mul(-0.5 / self.scale_value**2).add(const)
        if value.shape[max(0, value.dim() - len(self.batch_shape)) :] != self.batch_shape:
            out = out.expand(torch.broadcast_shapes(value.shape, self.batch_shape))
        return out


class SampleAwareNormal(Normal):
    r"""A Normal that remembers the standard noise of its latest ``rsample``,
    :math:`w = \mu + \sigma\epsilon`, and evaluates ``log_prob`` at that very sample as
    :math:`-\log\sigma - \epsilon^2/2 - \tfrac12\log 2\pi`.

    That is the same number as the general formula, and the same total gradient with respect
    to :math:`\mu` and :math:`\sigma` through :math:`w` (the terms that the general formula
    computes and then cancels are never formed): the Monte Carlo KL of Bayes by Backprop
    costs three passes over the weights instead of eight. At any other value it is the
    ordinary Normal density.
    """

    _last = None

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SampleAwareNormal, _instance)
        new._last = None
        return super().expand(batch_shape, _instance=new)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        value = self.loc + eps * self.scale
        self._last = (value, eps)
        return value

    def log_prob(self, value):
        last = self._last
        if last is not None and value is last[0]:
            return -torch.log(self.scale) - 0.5 * last[1].square() - _HALF_LOG_2PI
        return super().log_prob(value)


class LogUniform(TorchDistribution):
    r"""The improper log-uniform prior :math:`p(w) \propto 1/|w|` (Kingma et al. 2015).

    It is the only prior that makes variational dropout's objective independent of the
    weights' scale, and together with :class:`MultiplicativeNormal` it gives sparse
    variational dropout (Molchanov et al. 2017).

    ``log_prob(w) = -log|w| + c`` is the log-density up to the (infinite) normalizing
    constant of an improper prior. It does not affect gradients; we fix it by the convention
    of the registered KL approximation (Molchanov et al. 2017), under which
    :math:`KL(N(\theta, \alpha\theta^2) \| p) \to 0` as :math:`\alpha \to \infty`:

    .. math:: c = -\tfrac12\log(2\pi e) + E\log|\epsilon|
              = -\tfrac12\log(2\pi e) - \tfrac12(\gamma + \log 2) \approx -2.0541,

    so that a Monte Carlo KL (``Trace_ELBO``) and the registered approximation
    (``TraceMeanField_ELBO``) estimate the same number, not two numbers a constant apart.

    An improper density has no samples. ``sample()`` draws from its restriction to
    ``sample_range[0] <= |w| <= sample_range[1]`` with a random sign, whose unnormalized
    log-density is exactly ``log_prob`` on that range. This exists so that code that probes a
    model by sampling its prior (``pyro.infer.Predictive``, Pyro's ``init_to_sample``) runs;
    prior predictive draws from it mean little.

    :param batch_shape: shape of the weight tensor.
    :param sample_range: magnitudes between which ``sample()`` draws.
    :param dtype: of the samples.
    :param device: see ``dtype``.
    """

    arg_constraints: dict = {}
    support = constraints.real
    has_rsample = False

    def __init__(
        self,
        batch_shape=torch.Size(),
        sample_range=(1e-4, 1.0),
        dtype=None,
        device=None,
        validate_args=False,
    ):
        low, high = sample_range
        if not 0 < low < high:
            raise ValueError(f"sample_range must satisfy 0 < low < high, got {sample_range}")
        self.sample_range = (float(low), float(high))
        self._dtype = dtype if dtype is not None else torch.get_default_dtype()
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        super().__init__(torch.Size(batch_shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LogUniform, _instance)
        new.sample_range = self.sample_range
        new._dtype, new._device = self._dtype, self._device
        super(LogUniform, new).__init__(torch.Size(batch_shape), validate_args=False)
        return new

    #: c above: -log(2 pi e)/2 + E log|N(0, 1)|
    log_normalizer = -0.5 * math.log(2 * math.pi * math.e) - 0.5 * (0.5772156649015329 + math.log(2.0))

    def log_prob(self, value):
        return self.log_normalizer - torch.log(value.abs())

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        low, high = math.log(self.sample_range[0]), math.log(self.sample_range[1])
        with torch.no_grad():
            u = torch.rand(shape, dtype=self._dtype, device=self._device)
            magnitude = torch.exp(low + (high - low) * u)
            sign = torch.randint(0, 2, shape, device=self._device).to(self._dtype) * 2 - 1
            return magnitude * sign


class ScaleMixtureNormal(TorchDistribution):
    r"""Scale mixture of two zero-mean Normals, the prior of Bayes by Backprop:

    .. math:: p(w) = \pi N(w; 0, \sigma_1^2) + (1 - \pi) N(w; 0, \sigma_2^2)

    (Blundell et al. 2015, eq. 7). A wide component (``sigma1``) and a narrow one
    (``sigma2 << 1``) give a heavy-tailed, spike-at-zero prior. There is no closed-form KL
    against a Normal posterior, so it is always estimated by Monte Carlo.
    """

    arg_constraints = {
        "mixture_weight": constraints.unit_interval,
        "scale1": constraints.positive,
        "scale2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(self, mixture_weight, scale1, scale2, validate_args=False):
        self.mixture_weight, self.scale1, self.scale2 = broadcast_all(
            mixture_weight, scale1, scale2
        )
        super().__init__(self.scale1.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ScaleMixtureNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.mixture_weight = self.mixture_weight.expand(batch_shape)
        new.scale1 = self.scale1.expand(batch_shape)
        new.scale2 = self.scale2.expand(batch_shape)
        super(ScaleMixtureNormal, new).__init__(batch_shape, validate_args=False)
        return new

    @property
    def mean(self):
        return torch.zeros_like(self.scale1)

    @property
    def variance(self):
        pi = self.mixture_weight
        return pi * self.scale1**2 + (1 - pi) * self.scale2**2

    def log_prob(self, value):
        log_norm = -0.5 * math.log(2 * math.pi)
        lp1 = log_norm - torch.log(self.scale1) - 0.5 * (value / self.scale1) ** 2
        lp2 = log_norm - torch.log(self.scale2) - 0.5 * (value / self.scale2) ** 2
        return torch.logaddexp(
            torch.log(self.mixture_weight) + lp1, torch.log1p(-self.mixture_weight) + lp2
        )

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            wide = torch.rand(shape, dtype=self.scale1.dtype, device=self.scale1.device)
            scale = torch.where(wide < self.mixture_weight, self.scale1, self.scale2)
            return scale * torch.randn(shape, dtype=scale.dtype, device=scale.device)


class ARDNormal(Normal):
    r"""Zero-mean Normal with its own variance per weight, :math:`N(0, \lambda)`.

    Automatic relevance determination: :math:`\lambda` is set by empirical Bayes, i.e. by
    maximizing the ELBO. For a Normal posterior :math:`N(\mu, \sigma^2)` the optimum is
    :math:`\lambda^* = \mu^2 + \sigma^2`, where

    .. math:: KL(N(\mu, \sigma^2) \| N(0, \lambda^*)) = \tfrac12 \log(1 + \mu^2 / \sigma^2)
              = \tfrac12 \log(1 + 1/\alpha),

    which is what :mod:`pyrobnn.models.kl` registers for the analytic ELBO (Molchanov et al. 2017,
    sec. 4.4 discuss the same objective). With a Monte Carlo ELBO :math:`\lambda` is a learned
    model parameter and gradient ascent moves it to that optimum.
    """

    def __init__(self, log_variance, validate_args=False):
        self.log_variance = log_variance
        super().__init__(
            torch.zeros_like(log_variance), torch.exp(0.5 * log_variance), validate_args=validate_args
        )

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ARDNormal, _instance)
        new.log_variance = self.log_variance.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)


class MultiplicativeNormal(Normal):
    r"""Gaussian multiplicative-noise posterior :math:`q(w) = N(\theta, \alpha\theta^2)`,
    i.e. :math:`w = \theta (1 + \sqrt{\alpha}\,\epsilon)` with independent noise per weight
    (Kingma et al. 2015, variational dropout type B).

    Build it with :meth:`from_log_sigma2`, the *additive reparameterization* of Molchanov
    et al. 2017: the free parameters are :math:`\theta` and :math:`\log\sigma^2`, so that
    :math:`w = \theta + \sigma\epsilon` and the gradient with respect to :math:`\theta` carries
    no multiplicative noise; :math:`\log\alpha = \log\sigma^2 - \log\theta^2`.

    :math:`\log\alpha` is clipped to ``[log_alpha_min, log_alpha_max]`` (default ``[-8, 8]``,
    the range over which the KL approximation was fitted) and the variance is computed from
    the *clipped* value, so that the KL and the samples always describe the same
    distribution. Where the clip binds, :math:`\sigma^2 = \alpha_{clip}\,\theta^2`.
    """

    def __init__(self, loc, scale, log_alpha, validate_args=False):
        self.log_alpha = log_alpha
        super().__init__(loc, scale, validate_args=validate_args)

    #: added to theta^2 inside logarithms so that theta = 0 gives a finite log alpha
    eps = 1e-16

    @classmethod
    def from_log_sigma2(cls, loc, log_sigma2, log_alpha_min=-8.0, log_alpha_max=8.0, mean_clip=None):
        r"""``mean_clip``: if given, the mean of every weight whose (clipped) :math:`\log\alpha`
        is at least this value is zero, its variance unchanged: the family that Molchanov et
        al.'s code trains (``train_clip``, at the pruning threshold 3), so that a weight about
        to be pruned contributes only noise and pruning it at the end changes the mean network
        by nothing."""
        log_theta2 = torch.log(loc * loc + cls.eps)
        log_alpha = torch.clamp(log_sigma2 - log_theta2, log_alpha_min, log_alpha_max)
        # Unclipped, the theta terms cancel and d(scale)/d(theta) = 0 exactly (additive
        # reparameterization); clipped, scale = sqrt(alpha_clip) |theta|.
        scale = torch.exp(0.5 * (log_alpha + log_theta2))
        if mean_clip is not None:
            loc = torch.where(log_alpha >= mean_clip, torch.zeros_like(loc), loc)
        return cls(loc, scale, log_alpha)

    @classmethod
    def from_log_alpha(cls, loc, log_alpha):
        """Direct parameterization: ``scale = exp(log_alpha / 2) |loc|``."""
        log_alpha = torch.as_tensor(log_alpha, dtype=loc.dtype, device=loc.device)
        return cls(loc, loc.abs() * torch.exp(0.5 * log_alpha), log_alpha.expand(loc.shape))

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultiplicativeNormal, _instance)
        new.log_alpha = self.log_alpha.expand(batch_shape)
        return super().expand(batch_shape, _instance=new)


class UnitNoiseWeights(TorchDistribution):
    r"""Weights with multiplicative noise shared along the input-unit axis:

    .. math:: W = M \odot \xi, \qquad \xi_u \sim r(\xi), \; E[\xi] = 1,

    one noise variable per input unit ``u`` (the column of a ``Linear`` weight, the input
    channel of a convolution), broadcast over the weights that read from it. Dropping input
    unit ``u`` of a layer is the same as zeroing column ``u`` of its weight, so this is the
    distribution over weights that dropout on a layer's input induces (Gal & Ghahramani 2016,
    sec. 3). With ``E[xi] = 1`` (inverted-dropout scaling) the mean of ``W`` is ``M``.

    The weights of a row are perfectly correlated, so this distribution has no density on
    weight space and the KL against the prior is an approximation registered in
    :mod:`pyrobnn.models.kl`. So that a Monte Carlo ELBO (``Trace_ELBO``) optimizes the same
    objective as an analytic one, ``log_prob`` is defined against the ``prior`` the factor
    was built for as

    .. math:: \log \tilde q(w) := \log p(w) + KL_{approx}(q \| p),

    (per element), which makes the Monte Carlo term :math:`\log p(w) - \log\tilde q(w)` equal
    to :math:`-KL_{approx}` exactly, with no sampling noise. It is not a density; it exists
    for that identity. Without a ``prior``, ``log_prob`` raises.

    Sampling is reparameterized with respect to ``M`` (and the noise parameters where the
    noise is continuous), which is what the pathwise gradient needs.

    :param loc: ``M``, the weights' mean, of the site's shape.
    :param noise_shape: shape of the noise tensor, broadcastable to ``loc`` (for example
        ``(1, in_features)`` for a ``Linear`` weight); ``()`` means no noise (a bias).
    :param prior: the prior of the site (batch shape ``loc.shape``), for ``log_prob``.
    """

    arg_constraints: dict = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, noise_shape, prior=None, validate_args=False):
        self.loc = loc
        self.noise_shape = torch.Size(noise_shape)
        self.prior = prior
        super().__init__(loc.shape, validate_args=validate_args)

    @property
    def num_units(self):
        """Number of independent noise variables (input units) per weight sample."""
        return self.noise_shape.numel() if len(self.noise_shape) else 0

    def noise(self, shape):
        """Draw noise of ``shape`` with mean 1."""
        raise NotImplementedError

    @property
    def noise_variance(self):
        """Var[xi] per unit, broadcastable to ``noise_shape``."""
        raise NotImplementedError

    def _noise_batch_shape(self, sample_shape):
        extra = self.batch_shape[: len(self.batch_shape) - len(self.loc.shape)]
        if not len(self.noise_shape):
            return None
        noise = torch.Size((1,) * (len(self.loc.shape) - len(self.noise_shape))) + self.noise_shape
        return torch.Size(sample_shape) + extra + noise

    def rsample(self, sample_shape=torch.Size()):
        shape = self._noise_batch_shape(sample_shape)
        loc = self.loc.expand(self._extended_shape(sample_shape))
        if shape is None:
            return loc
        return loc * self.noise(shape)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)

    @property
    def mean(self):
        return self.loc.expand(self.batch_shape)

    @property
    def variance(self):
        if not len(self.noise_shape):
            return torch.zeros_like(self.mean)
        return (self.loc**2 * self.noise_variance).expand(self.batch_shape)

    def log_prob(self, value):
        if self.prior is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no density over weights; built without its prior, it "
                "has no pseudo-density either. Build it with prior=... (pyrobnn's guides do)."
            )
        from torch.distributions import kl_divergence

        return self.prior.log_prob(value) + kl_divergence(self, self.prior)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        if batch_shape[len(batch_shape) - len(self.loc.shape):] != self.loc.shape:
            raise NotImplementedError(
                f"{type(self).__name__} only expands by leading (sample) dimensions"
            )
        new = self._get_checked_instance(type(self), _instance)
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_batch_shape"})
        super(UnitNoiseWeights, new).__init__(batch_shape, validate_args=False)
        return new


class BernoulliUnitNoise(UnitNoiseWeights):
    r"""MC dropout weights: :math:`\xi_u = z_u / (1 - p)`, :math:`z_u \sim Bernoulli(1 - p)`,
    with a fixed dropout probability ``p`` (Gal & Ghahramani 2016)."""

    def __init__(self, loc, noise_shape, dropout_prob, prior=None, validate_args=False):
        self.dropout_prob = torch.as_tensor(dropout_prob, dtype=loc.dtype, device=loc.device)
        super().__init__(loc, noise_shape, prior, validate_args)

    def noise(self, shape):
        keep = 1 - self.dropout_prob
        mask = torch.rand(shape, dtype=self.loc.dtype, device=self.loc.device) < keep
        return mask.to(self.loc.dtype) / keep

    @property
    def noise_variance(self):
        return self.dropout_prob / (1 - self.dropout_prob)


class ConcreteUnitNoise(UnitNoiseWeights):
    r"""Concrete dropout weights (Gal, Hron & Kendall 2017): the Bernoulli mask is replaced by
    its relaxation at temperature ``t``,

    .. math:: \tilde z = \mathrm{sigmoid}\big((\log p - \log(1-p) + \log u - \log(1-u)) / t\big),
              \qquad \xi = (1 - \tilde z) / (1 - p),

    which is differentiable in the dropout probability ``p``, so ``p`` can be learned."""

    def __init__(self, loc, noise_shape, dropout_prob, temperature=0.1, prior=None, validate_args=False):
        self.dropout_prob = dropout_prob
        self.temperature = temperature
        super().__init__(loc, noise_shape, prior, validate_args)

    _tiny = 1e-7

    def noise(self, shape):
        p = self.dropout_prob
        u = torch.rand(shape, dtype=self.loc.dtype, device=self.loc.device)
        tiny = self._tiny
        logit = (
            torch.log(p + tiny) - torch.log1p(-p + tiny) + torch.log(u + tiny) - torch.log1p(-u + tiny)
        )
        drop = torch.sigmoid(logit / self.temperature)
        return (1 - drop) / (1 - p)

    @property
    def noise_variance(self):
        # the Bernoulli limit (temperature -> 0)
        return self.dropout_prob / (1 - self.dropout_prob)


class GaussianUnitNoise(UnitNoiseWeights):
    r"""Gaussian dropout on input units: :math:`\xi_u \sim N(1, \alpha_u)`
    (Srivastava et al. 2014; variational dropout type A of Kingma et al. 2015 when
    :math:`\alpha` is learned). Marginally :math:`W_{ij} \sim N(M_{ij}, \alpha_u M_{ij}^2)`."""

    def __init__(self, loc, noise_shape, log_alpha, prior=None, validate_args=False):
        self.log_alpha = log_alpha
        super().__init__(loc, noise_shape, prior, validate_args)

    def noise(self, shape):
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        return 1 + torch.exp(0.5 * self.log_alpha) * eps

    @property
    def noise_variance(self):
        return torch.exp(self.log_alpha)
