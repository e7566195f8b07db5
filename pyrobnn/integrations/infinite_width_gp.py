r"""A BNN's infinite-width limit as a BoTorch GP, and the finite network's prior chosen by it.

:class:`InfiniteWidthKernel` is the NNGP kernel of a fully connected network
(:mod:`pyrobnn.models.infinite_width`; Lee et al. 2018) as a GPyTorch kernel whose
hyperparameters are the network's prior scales: the inputs' inverse length scales (one per
feature, ARD, or one shared), the biases' scale, the hidden weights' scale and the output weights'
scale. :func:`infinite_width_gp` fits it by BoTorch's exact marginal likelihood
(``fit_gpytorch_mll``, maximum a posteriori under weak hyperpriors, from several starts: the
posterior over the scales has a mode that calls the data noise), and chooses the activation (erf
or ReLU by default; a cosine network, whose kernel is stationary, on request) by the same
objective and, below 10 points per feature, one input scale per feature or one shared by that
objective less Schwarz's penalty for the extra scales, in a
``SingleTaskGP``: a surrogate with a BNN's prior and exact inference (Li et al. 2024 find the
infinite-width BNN strong in high dimensions; BoTorch's ``InfiniteWidthBNNKernel`` is the ReLU
one with fixed scales).

:func:`calibrated_model` is empirical Bayes for the finite network (type-II maximum likelihood
through its limit): the kernel's fitted scales become the weight priors of a width-``width``
network of the same architecture and its fitted noise the likelihood's fixed noise scale (below
10 points per feature, one input scale per feature or one shared by how each shape's previous fit
predicted the points added since: :func:`calibration_fit`). The marginal likelihood of a finite
BNN has no closed form; its infinite-width limit's has, and at width 50 the finite prior is close
to the limit. At 10-50 points this is what lets the samplers
and the Laplace approximation fit the data instead of sitting at their prior, and keeps them from
being confident away from it (``benchmarks/bo_calibration.py``; docs/bayesopt.md).
"""

from __future__ import annotations

import copy
import math

import torch

from pyrobnn.models.infinite_width import ACTIVATIONS, COS_PHASE_SCALE, InfiniteWidthMLP, infinite_width_of, nngp_covariance
from pyrobnn.models.likelihoods import GaussianLikelihood

try:
    import warnings

    with warnings.catch_warnings():  # GPyTorch's modules call torch.jit.script at import, which torch deprecates
        warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=FutureWarning)
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.transforms.outcome import Standardize
        from botorch.models.utils.gpytorch_modules import MIN_INFERRED_NOISE_LEVEL
        from gpytorch.constraints import GreaterThan, Interval
        from gpytorch.kernels import Kernel
        from gpytorch.likelihoods import GaussianLikelihood as NoiseLikelihood
        from gpytorch.mlls import ExactMarginalLogLikelihood
        from gpytorch.priors import LogNormalPrior
        from linear_operator.utils.cholesky import psd_safe_cholesky
    from threadpoolctl import threadpool_limits
except ImportError as error:  # pragma: no cover - the optional extra is missing
    raise ImportError("pyrobnn.integrations.infinite_width_gp needs BoTorch: pip install 'pyrobnn[bo]'") from error

__all__ = ["InfiniteWidthKernel", "infinite_width_gp", "calibrated_model", "calibration_fit", "finite_model", "checked_activations",
           "ARD_POINTS_PER_FEATURE", "SCALE_BOUNDS", "SCALE_HYPERPRIOR", "DEFAULT_ACTIVATIONS",
           "FIT_STARTS", "FIT_START_NOISE", "WARM_START_NOISE_LIMIT", "NOISE_HYPERPRIOR"]

#: one length scale per input feature (ARD) from this many training points per feature on. Below
#: it :func:`infinite_width_gp` fits both shapes and keeps ARD only where its fit beats the shared
#: scale's by more than Schwarz's penalty, (d - 1)/2 log n nats per outcome (the fit's objective
#: is a maximum: with d - 1 more scales it is higher even where they explain nothing), and
#: :func:`calibration_fit` (the finite networks' prior) by each shape's prequential score, the log
#: density its previous fits gave the points added since. The threshold was chosen on the
#: development problems of ``benchmarks/bo_calibration.py``: on Branin at n = 50 (25 per feature)
#: ARD's held-out NLL was -2.6 against -1.2 shared; on Levy-20 at n = 20 (1 per feature) ARD
#: over-fitted (NLL 7.5 against 2.3 shared), though in 2 of 3 Sobol designs its fit was the more
#: probable (by 0.7 and 1.3 nats, far less than the penalty's 28). Below it, for the finite
#: networks (docs/bayesopt.md, 2026-11-29): one shared scale put most of them behind random search
#: in Branin embedded in 40-D; Schwarz's criterion put them ahead there but cost Laplace and the
#: ensemble on the development problem Hartmann-6 (it chose ARD at 42 points in two of three Sobol
#: designs, where the shared scale's held-out NLL was the lower: ``benchmarks/bo_input_scales.py``);
#: the prequential score keeps every development problem's medians within their seeds' range and
#: puts the ensemble, IVON, SWAG and MCLMC ahead of random search in 40-D (docs/bayesopt.md, "The finite
#: networks' input scales chosen by how each shape predicted the next points").
ARD_POINTS_PER_FEATURE = 10

#: every prior scale of the kernel lies in this interval, under a LogNormal(0, 1.5) hyperprior
#: (median 1, 95% within [0.05, 19]): at 10-20 points the plain marginal likelihood can run a
#: scale to 0 or to the thousands (on Hartmann-6 at n = 20: biases 0, hidden weights 2236), which
#: no finite network can take as its prior
SCALE_BOUNDS = (1e-2, 1e2)
#: the (location, scale) of the LogNormal hyperprior on every prior scale of the kernel
SCALE_HYPERPRIOR = (0.0, 1.5)

#: the starting points of the marginal-likelihood fit, ``(input, bias, hidden, output)`` scales,
#: fitted side by side as one batch (the best fit is kept; the first is replaced by a given
#: network's scales). At 10-40 points the posterior over these scales has two modes: the data as
#: signal (noise variance near its prior's mode, 7e-3 in standardized units) and the data as noise
#: (every scale near 0.1, noise variance 0.5-0.8: a nearly constant function). Chosen on the
#: development problems (Branin, Hartmann-6, Ackley-10, Levy-20; 3 Sobol designs of n = 10, 20
#: and 40 each; ``benchmarks/bo_fit_starts.py``, a grid of 33 starts per case), with the noise on
#: BoTorch's raw coordinate (measured again at 5754098): the first start alone ended in the noise
#: mode though a signal mode was more probable in 8 of the 36 cases, and the first four starts
#: short of that grid's best in 4.
#: On the noise's softplus coordinate (``_noise_likelihood``, 2026-12-01) the noise mode traps
#: no signal start, and the last start, every scale at 0.1, is the one that finds the noise mode
#: where it is the more probable (three cases of Ackley-10 at n = 20 and 40, by 0.36-0.81 nats):
#: against the best fit of both coordinates' grids the four starts fell short in 4 of 36 cases,
#: these five in 1 (Hartmann-6 at n = 40, 0.006 nats per point; the four on the raw coordinate
#: in 5), and in none of the 36 held-out cases (Rosenbrock-5, Levy-4, Griewank-8,
#: Styblinski-Tang-10). A finite network given the noise mode as its prior predicts a nearly
#: constant function, and BO with it is close to random search (:data:`WARM_START_NOISE_LIMIT`).
FIT_STARTS = ((1.0, 1.0, 1.5, 1.5), (2.0, 1.0, 2.0, 2.0), (4.0, 0.1, 1.0, 1.0), (0.5, 0.1, 1.0, 1.0), (0.1, 0.1, 0.1, 0.1))
#: the noise variance (standardized units) every start of :data:`FIT_STARTS` begins from
FIT_START_NOISE = 1e-2
#: a warm start (``infinite_width_gp(..., warm_start=gp)``) is taken only from a fit whose noise
#: variance (standardized units, every outcome's) is below this; from one above it the fit is
#: cold. The fit from :data:`FIT_STARTS` has two modes (above): the data as signal, noise
#: variance near 7e-3, and as noise, 0.5-0.8. L-BFGS-B from a fit in the noise mode stays
#: there: on Ackley-10 (seed 0 of ``benchmarks/bayesopt.py``) warm refits kept the noise mode
#: from 18 points to the end while at 38 a cold fit found the signal mode 25 nats more probable;
#: seed 4 ended level with random search (log10 regret +1.31) warm-started from the noise mode
#: and at +0.59 with this rule.
WARM_START_NOISE_LIMIT = 0.1
#: the (location, scale) of the LogNormal prior on the noise variance (standardized units):
#: BoTorch's for ``SingleTaskGP`` (Hvarfner et al. 2024, "Vanilla Bayesian optimization performs
#: great in high dimensions"), over BoTorch's floor ``MIN_INFERRED_NOISE_LEVEL`` (1e-4)
NOISE_HYPERPRIOR = (-4.0, 1.0)
#: the kernel's scales, in the order of :data:`FIT_STARTS`
SCALE_NAMES = ("input_scale", "bias_scale", "hidden_scale", "output_scale")
#: the activations the fits choose among where none is named: erf and ReLU, whose choice the
#: defaults and every figure in docs/bayesopt.md were measured with. The stationary ``"cos"``
#: kernel is offered (``activation=("erf", "relu", "cos")``), not chosen by default: measured on
#: the development problems and the non-stationary regime (docs/bayesopt.md, "A stationary
#: network prior"), not yet in regret on every problem for every surrogate
DEFAULT_ACTIVATIONS = ("erf", "relu")


def _scales_of(net: InfiniteWidthMLP) -> tuple:
    """A network's prior as the kernel's ``(input, bias, hidden, output)`` scales: input scale 1
    (the network's own input scaling becomes the kernel's frame), the geometric mean of its bias
    scales (a cosine network's after its first layer, whose phases the kernel fixes at
    :data:`~pyrobnn.models.infinite_width.COS_PHASE_SCALE`), its first hidden-to-hidden and its
    output weight scale."""
    biases = net.bias_scales[1:] if net.activation == "cos" else net.bias_scales
    return (1.0, math.exp(sum(map(math.log, biases)) / len(biases)),
            net.weight_scales[1] if net.depth > 1 else 1.0, net.weight_scales[-1])


def _layer_scales(activation, depth, bias, hidden, output, one):
    """The kernel's network, layer by layer from the first linear layer to the last: its weight
    scales (the first layer's ``one``, the input scale carrying it; ``hidden`` between hidden
    layers; ``output`` last) and bias scales (``bias`` everywhere but a cosine network's first
    layer, whose phases are :data:`~pyrobnn.models.infinite_width.COS_PHASE_SCALE`: its kernel
    stationary). Numbers or tensors alike; ``one`` is the unit of their kind."""
    weights = [one] + [hidden] * (depth - 1) + [output]
    biases = [COS_PHASE_SCALE * one if activation == "cos" else bias] + [bias] * depth
    return weights, biases


class InfiniteWidthKernel(Kernel):
    r"""The NNGP kernel of an MLP with ``depth`` hidden layers of ``activation`` (``"erf"``,
    ``"relu"`` or ``"cos"``), hyperparameters the network's prior scales (each in
    :data:`SCALE_BOUNDS` under a LogNormal hyperprior, :data:`SCALE_HYPERPRIOR`): ``input_scale``
    :math:`s` (``(*batch, 1, d)`` with ``ard``, else ``(*batch, 1, 1)``), ``bias_scale``
    :math:`\sigma_b` (every layer's; a cosine network's first layer has its phases at
    :data:`~pyrobnn.models.infinite_width.COS_PHASE_SCALE` instead, which makes its kernel
    stationary), ``hidden_scale`` :math:`\sigma_w` (the weights between
    hidden layers) and ``output_scale`` :math:`\sigma_o` (the last layer's weights); the first
    layer's weights have scale 1 on the scaled inputs :math:`z = (x - c) \odot s_0 \odot s`, with
    :math:`c` ``center`` and :math:`s_0` ``base_scale`` fixed (the training inputs' mid-range and
    2 / range, so that :math:`s = 1` maps them onto [-1, 1]). The scales start at
    :data:`FIT_STARTS`' first."""

    has_lengthscale = False

    def __init__(self, d: int, *, depth: int = 2, activation: str = "erf", ard: bool = False, center=None, base_scale=None,
                 batch_shape=torch.Size([]), **kwargs):
        super().__init__(batch_shape=batch_shape, **kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if not (isinstance(depth, int) and depth >= 1):
            raise ValueError(f"depth must be an integer >= 1 (hidden layers), got {depth!r}")
        self.activation, self.depth, self.ard = activation, depth, bool(ard)
        dtype = torch.get_default_dtype() if center is None else center.dtype
        device = None if center is None else center.device
        self.register_buffer("center", torch.zeros(d, dtype=dtype, device=device) if center is None else center.clone())
        self.register_buffer("base_scale", torch.ones(d, dtype=dtype, device=device) if base_scale is None else base_scale.clone())
        start = dict(zip(SCALE_NAMES, FIT_STARTS[0]))  # infinite_width_gp sets its starts
        low, high = SCALE_BOUNDS
        for name, value in start.items():
            shape = (*batch_shape, 1, d if (name == "input_scale" and self.ard) else 1)
            # GPyTorch makes the bounds in the default dtype; in the kernel's they do the transform's arithmetic
            # in it before a SingleTaskGP moves the kernel there (a scale set before and after differed by 3e-8)
            constraint = Interval(low, high).to(dtype=dtype, device=device)
            value = min(max(float(value), 2 * low), high / 2)
            raw = constraint.inverse_transform(torch.full(shape, value, dtype=dtype, device=device))
            self.register_parameter(f"raw_{name}", torch.nn.Parameter(raw))
            self.register_constraint(f"raw_{name}", constraint)
            self.register_prior(f"{name}_prior", LogNormalPrior(*SCALE_HYPERPRIOR), lambda module, name=name: module._scale(name),
                                lambda module, value, name=name: module._set_scale(name, value))

    def _scale(self, name):
        return getattr(self, f"raw_{name}_constraint").transform(getattr(self, f"raw_{name}"))

    def _set_scale(self, name, value, margin: float = 0.01):
        """Set a scale (broadcast to its shape), clamped to ``[(1 + margin) low, (1 - margin)
        high]`` of :data:`SCALE_BOUNDS`, strictly inside them: BoTorch's ``fit_gpytorch_mll``
        restarts a failed fit from draws of the hyperpriors, whose tails reach past the bounds, and
        a start at a bound would not move (the transform's slope vanishes there). A fitted scale is
        set again with a margin of 1e-12 (its fit can end at a bound)."""
        raw = getattr(self, f"raw_{name}")
        low, high = SCALE_BOUNDS
        value = torch.as_tensor(value, dtype=raw.dtype, device=raw.device).clamp((1 + margin) * low, (1 - margin) * high)
        raw.data.copy_(getattr(self, f"raw_{name}_constraint").inverse_transform(value.expand_as(raw)))

    @property
    def input_scale(self):
        return self._scale("input_scale")

    @property
    def bias_scale(self):
        return self._scale("bias_scale")

    @property
    def hidden_scale(self):
        return self._scale("hidden_scale")

    @property
    def output_scale(self):
        return self._scale("output_scale")

    def forward(self, x1, x2, diag: bool = False, last_dim_is_batch: bool = False, **params):
        if last_dim_is_batch:
            raise NotImplementedError("InfiniteWidthKernel does not take last_dim_is_batch")
        return self._covariance(x1, None if x2 is x1 else x2, self.activation,
                                [self.input_scale, self.bias_scale, self.hidden_scale, self.output_scale], diag)

    def _covariance(self, x1, x2, activation, scales, diag):
        """The NNGP covariance of ``activation`` with ``scales`` (``input, bias, hidden, output``);
        ``x2=None``: at ``x1`` against itself."""
        input_scale, bias_scale, hidden_scale, output_scale = scales
        scale = self.base_scale * input_scale  # (*batch, 1, d)
        z1 = (x1 - self.center) * scale
        z2 = None if x2 is None else (x2 - self.center) * scale
        weights, biases = _layer_scales(activation, self.depth, bias_scale, hidden_scale, output_scale, torch.ones_like(bias_scale))
        return nngp_covariance(z1, z2, activation=activation, weight_scales=weights, bias_scales=biases, diag=diag)

    def network(self, output: int = 0) -> InfiniteWidthMLP:
        """The finite network's description with these scales (of output ``output`` in a batch
        of kernels, one per outcome)."""
        def value(t):
            t = t.detach()
            return t.reshape(-1, t.shape[-1])[output] if t.dim() > 2 else t.reshape(-1)

        scales = [float(value(s)) for s in (self.bias_scale, self.hidden_scale, self.output_scale)]  # bias, hidden, output
        weights, biases = _layer_scales(self.activation, self.depth, *scales, 1.0)
        return InfiniteWidthMLP(self.activation, tuple(weights), tuple(biases), self.center.detach().clone(),
                                (self.base_scale * value(self.input_scale)).detach().clone())


class _StartsKernel(InfiniteWidthKernel):
    """:class:`InfiniteWidthKernel` batched over ``activations`` and input-scale ``shapes`` as
    well: its leading batch dimension holds one equal block per activation, block ``i`` the kernel
    of ``activations[i]``, and each block one equal part per shape, in ``shapes``' order (``True``:
    a scale per feature; ``False``: one scale shared by every feature, held as the first feature's
    coordinate, the others unused), so that one L-BFGS-B run fits every activation and shape from
    every start (the fit's cost is then about the longest of theirs, not their sum: a coordinate
    whose gradient is always 0 never moves under L-BFGS-B). :meth:`counted_hyperprior` counts a
    shared scale's hyperprior once."""

    def __init__(self, d: int, *, activations, shapes, batch_shape, **kwargs):
        parts = len(activations) * len(shapes)
        if batch_shape[0] % parts:
            raise ValueError(f"the leading batch size {batch_shape[0]} is not a multiple of {len(activations)} activations "
                             f"times {len(shapes)} shapes")
        super().__init__(d, activation=activations[0], ard=any(shapes), batch_shape=batch_shape, **kwargs)
        self.activations = tuple(activations)
        tied = None
        if self.ard and not all(shapes):  # per batch element: its input scales are one shared scale
            shared = torch.tensor([not shape for shape in shapes], device=self.center.device)
            shared = shared.repeat_interleave(batch_shape[0] // parts).repeat(len(activations))
            tied = shared.reshape(-1, *(1,) * len(batch_shape), 1)  # (a s k, *1, 1, 1)
        self.register_buffer("tied", tied)

    def _scale(self, name):
        scale = super()._scale(name)
        if name == "input_scale" and self.tied is not None:
            scale = torch.where(self.tied, scale[..., :1], scale)
        return scale

    def counted_hyperprior(self, name: str, density):
        """``density``, the log hyperprior density of each coordinate of the scale ``name``, with
        the unused coordinates of a shared input scale (copies of its first) at 0."""
        if name != "input_scale" or self.tied is None:
            return density
        return density.masked_fill(self.tied & (torch.arange(density.shape[-1], device=density.device) > 0), 0.0)

    def forward(self, x1, x2, diag: bool = False, last_dim_is_batch: bool = False, **params):
        if last_dim_is_batch:
            raise NotImplementedError("InfiniteWidthKernel does not take last_dim_is_batch")
        blocks = len(self.activations)
        same = x2 is x1
        x1 = x1.expand(*self.batch_shape, *x1.shape[-2:]).chunk(blocks)
        x2 = [None] * blocks if same else x2.expand(*self.batch_shape, *x2.shape[-2:]).chunk(blocks)
        scales = [s.chunk(blocks) for s in (self.input_scale, self.bias_scale, self.hidden_scale, self.output_scale)]
        return torch.cat([self._covariance(x1[i], x2[i], activation, [s[i] for s in scales], diag)
                          for i, activation in enumerate(self.activations)])


def _fit_mll(gp) -> None:
    """Fit ``gp``'s hyperparameters by BoTorch's ``fit_gpytorch_mll`` with the BLAS libraries
    (scipy's and numpy's OpenBLAS; not torch's) on one thread.

    A batched GP is fitted by BoTorch's batched L-BFGS-B, one ``setulb`` call per batch element
    and iteration; since scipy 1.15 ``setulb`` is C calling LAPACK, and on a problem of a few
    parameters with bounds OpenBLAS's threads cost more than the step's arithmetic (scipy issue
    #22438). BoTorch limits the threads around its own unbatched fits and its candidate
    generation, not around this batched fit. The fits are bit-identical either way; the time
    saved is measured by ``benchmarks/bo_blas_threads.py`` (docs/bayesopt.md, "The calibration's
    L-BFGS-B on one BLAS thread")."""
    with threadpool_limits(limits=1, user_api="blas"):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp), optimizer_kwargs=dict(bounds=_NOISE_COORDINATE_BOUNDS))


#: L-BFGS-B's bound on the noise's softplus coordinate (:func:`_noise_likelihood`): the
#: variance at least a millionth of the floor above it. Without a bound, a fit whose optimum is
#: the floor (noiseless data) runs the coordinate toward minus infinity until its line search
#: fails (scipy's ABNORMAL); at the bound it stops, as at BoTorch's bound on the raw variance.
_NOISE_COORDINATE_BOUNDS = {"likelihood.noise_covar.raw_noise": (math.log(math.expm1(1e-6 * MIN_INFERRED_NOISE_LEVEL)), None)}


def _noise_likelihood(batch_shape) -> NoiseLikelihood:
    r"""The fits' Gaussian likelihood: BoTorch's ``SingleTaskGP`` default (noise variance above
    ``MIN_INFERRED_NOISE_LEVEL`` under the LogNormal :data:`NOISE_HYPERPRIOR`) with the variance
    optimized through GPyTorch's default softplus, :math:`\sigma^2 = 10^{-4} +
    \log(1 + e^{r})`, instead of BoTorch's untransformed variance. The objective is the same
    function of the variance; what changes is the optimizer's coordinate. Near-noiseless fits sit at
    variances of 1e-4 to 1e-2, a thousandth of the scales' range, and near the floor the softplus
    coordinate is the log of the variance's excess over it. Over 9 BO-like steps on six problems
    (``benchmarks/bo_calibration_steps.py``, 2 designs each) L-BFGS-B took 61-460 evaluations
    per warm step on the raw variance (median per design) and 49-98 on this coordinate, and
    ended at most 4e-6 nats below the raw coordinate's optimum and up to 7.1 nats above it where
    the raw coordinate's had stopped short (docs/bayesopt.md, "The calibration's noise on a log
    scale")."""
    prior = LogNormalPrior(*NOISE_HYPERPRIOR)
    return NoiseLikelihood(noise_prior=prior, batch_shape=torch.Size(batch_shape),
                           noise_constraint=GreaterThan(MIN_INFERRED_NOISE_LEVEL, initial_value=prior.mode))


def _map_objective(gp) -> torch.Tensor:
    r"""Per batch element of the GP ``gp`` (a ``SingleTaskGP`` with this module's kernel, no
    outcome transform), the log marginal likelihood of its training targets plus the log density
    of its hyperparameters under their priors,

    .. math:: \log N(y;\ \mu 1,\ K + \sigma^2 I) + \sum_j \log p(\theta_j),

    what BoTorch's ``fit_gpytorch_mll`` maximizes (GPyTorch's ``ExactMarginalLogLikelihood``,
    times the number of points), computed on plain tensors: the kernel matrix by
    :func:`~pyrobnn.models.infinite_width.nngp_covariance` of the inputs against themselves, one
    Cholesky factor (GPyTorch's ``psd_safe_cholesky``: the same jitter, and the same error where
    none helps), LogNormal priors by their closed form, a shared input scale's once where the
    batch holds both shapes (:class:`_StartsKernel`; GPyTorch's objective would count its
    unused copies too). At 10-50 points an evaluation's cost is
    its operations' dispatch, not their arithmetic; GPyTorch's lazy tensors and distributions add
    their own (an evaluation of value and gradient took 5.7-7.6 ms through them, the kernel's
    variances computed beside its matrix, and 3.8-5.3 ms so, in
    ``benchmarks/bo_calibration_steps.py``; docs/bayesopt.md).
    ``tests/test_infinite_width.py`` checks value and gradient against GPyTorch's."""
    x, y = gp.train_inputs[0], gp.train_targets  # (*batch, n, d), (*batch, n)
    n = y.shape[-1]
    covariance = gp.covar_module.forward(x, x)
    covariance = covariance + torch.diag_embed(gp.likelihood.noise.expand(*covariance.shape[:-1]))
    factor = psd_safe_cholesky(covariance)
    residual = (y - gp.mean_module.constant.unsqueeze(-1)).unsqueeze(-1)
    whitened = torch.linalg.solve_triangular(factor, residual, upper=False)
    value = (-0.5 * whitened.square().sum((-2, -1)) - factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)
             - 0.5 * n * math.log(2 * math.pi))
    for name, module, prior, closure, _ in gp.named_priors():
        theta = closure(module)
        if isinstance(prior, LogNormalPrior) and prior._transform is None:
            log_theta = theta.log()
            density = (-0.5 * ((log_theta - prior.loc) / prior.scale).square() - prior.scale.log() - 0.5 * math.log(2 * math.pi)
                       - log_theta)
        else:
            density = prior.log_prob(theta)
        if isinstance(module, _StartsKernel):  # a shared input scale's hyperprior once
            density = module.counted_hyperprior(name.rsplit(".", 1)[-1].removesuffix("_prior"), density)
        value = value + density.reshape(*density.shape[:value.dim()], -1).sum(-1)
    return value


class _StartsGP(SingleTaskGP):
    """The GP of :func:`_fit_from_starts`, batched over activations, input-scale shapes and starts: a
    ``SingleTaskGP`` whose loss in BoTorch's fit is :func:`_map_objective` divided by the number
    of points (``compute_custom_loss``, BoTorch's hook for a model's own loss): GPyTorch's
    ``ExactMarginalLogLikelihood``, by fewer operations."""

    def compute_custom_loss(self, mll, **kwargs):
        return -_map_objective(self) / self.train_targets.shape[-1]


def _inputs_frame(train_X):
    """The training inputs' mid-range and 2 / range per feature (1 where a feature is constant)."""
    low, high = train_X.min(0).values, train_X.max(0).values
    spread = high - low
    base = torch.where(spread > 0, 2 / spread.clamp_min(torch.finfo(train_X.dtype).tiny), torch.ones_like(spread))
    return (low + high) / 2, base


def _checked_starts(starts) -> list:
    try:
        checked = [tuple(float(value) for value in start) for start in starts]
    except (TypeError, ValueError):
        checked = []
    if not checked or not all(len(start) == 4 and all(math.isfinite(v) and v > 0 for v in start) for start in checked):
        raise ValueError(f"starts must be a non-empty list of positive, finite (input, bias, hidden, output) scales, got {starts!r}")
    return checked


def checked_activations(activation) -> tuple:
    """``activation`` (one name or a sequence) as a tuple of known activations without repeats,
    refused by name when it is not one."""
    activations = (activation,) if isinstance(activation, str) else activation
    try:
        activations = tuple(activations)
    except TypeError:
        activations = ()
    if not activations or not all(isinstance(a, str) and a in ACTIVATIONS for a in activations):
        raise ValueError(f"activation must be one of {ACTIVATIONS} or a non-empty sequence of them, got {activation!r}")
    return tuple(dict.fromkeys(activations))


def infinite_width_gp(train_X, train_Y, *, model=None, depth=None, activation=None, ard=None,
                      outcome_transform="standardize", input_transform=None, starts=None, warm_start=None) -> SingleTaskGP:
    """A ``SingleTaskGP`` with the :class:`InfiniteWidthKernel` of an MLP, its prior scales and
    noise fitted by the exact marginal likelihood (BoTorch's ``fit_gpytorch_mll``) from each of
    :data:`FIT_STARTS`, side by side in one batch, the most probable fit kept per outcome; with
    several activations, the kernel of each is fitted so, all in the same batch, and the
    activation whose fit is the most probable (its objective summed over the outcomes) is kept:
    the network's nonlinearity chosen by the data like its scales (type-II maximum a posteriori
    over a discrete hyperparameter); and so, below :data:`ARD_POINTS_PER_FEATURE` points per
    feature, is the input scales' shape (``ard``).

    :param model: a :class:`~pyrobnn.models.BayesianModel` whose architecture and prior give the
        kernel (:func:`~pyrobnn.models.infinite_width.infinite_width_of`: its activation and depth,
        its scales as the starting point); default: ``depth`` hidden layers (default 2) of
        ``activation``.
    :param activation: ``"erf"``, ``"relu"``, ``"cos"``, or several of them to choose among
        (default: :data:`DEFAULT_ACTIVATIONS`, erf and ReLU). The cosine network's kernel is
        stationary, a squared-exponential one passed through its later layers
        (:mod:`pyrobnn.models.infinite_width`); erf's and ReLU's depend on where the inputs lie.
        With erf units and small biases the prior is nearly odd about the data's center (every
        function it believes in is largest on the boundary, opposite its smallest); ReLU units add
        an even part (a bowl). docs/bayesopt.md says which the fit chose on the development
        problems and what that did to the regret.
    :param ard: one input scale per feature (``True``) or one shared (``False``); default: ARD
        from :data:`ARD_POINTS_PER_FEATURE` points per feature on, below it the one the data
        choose (the ARD fit kept where it is more probable than the shared one by more than
        Schwarz's penalty, (d - 1)/2 log n nats per outcome: Schwarz 1978, "Estimating the
        dimension of a model"). With a few relevant features among many (Branin in 40-D) ARD is
        what finds them; where every feature matters alike it over-fits.
    :param outcome_transform: ``"standardize"`` (BoTorch's ``Standardize``), a BoTorch outcome
        transform, or ``None``.
    :param starts: the ``(input, bias, hidden, output)`` scales the fit starts from, each a
        positive 4-tuple; default :data:`FIT_STARTS` (the first replaced by ``model``'s scales).
    :param warm_start: a GP this function returned before, on data these extend (the previous
        step of a BO loop): each activation it fitted is fitted again from its own fit there
        alone (its scales, noise and constant mean, the input scales carried into these inputs'
        frame, for each shape ``ard`` allows: per feature, or their geometric mean for one shared
        scale), and the choice among activations and shapes made again; its depth is kept. A
        cold fit runs one L-BFGS-B over 10 batch elements per input-scale shape (2 activations
        from 5 starts; both shapes in the same run below :data:`ARD_POINTS_PER_FEATURE` points per
        feature); a warm one over one element per activation and shape, each from its previous
        optimum. What the other starts would find is not looked at (a mode the previous fit missed stays missed),
        and from a previous fit in the noise mode (noise variance from
        :data:`WARM_START_NOISE_LIMIT` on) the fit is cold (from :data:`FIT_STARTS`, with its
        activations and depth). BoTorch's tutorials warm-start each step from the previous
        model's state the same way. Not with ``model``, ``depth``, ``activation`` or ``starts``.

    The GP returned carries ``warm_started`` (whether it was fitted from ``warm_start``) and
    ``infinite_width_fits``: for each ``(activation, ard)`` fitted, the
    kept start's ``objective`` (log marginal likelihood plus log hyperprior density, summed over
    the outcomes), ``scales`` (the input scales per feature and unit of input), ``noise``
    (variance) and constant ``mean`` (both in the outcome transform's units).
    """
    return _infinite_width_gp(train_X, train_Y, model=model, depth=depth, activation=activation, ard=ard,
                              outcome_transform=outcome_transform, input_transform=input_transform, starts=starts,
                              warm_start=warm_start, choose_ard=_schwarz_choice)


def _schwarz_choice(fits, best, n, d, m) -> bool:
    """Whether the ARD fit (``fits[best[True], True]``; ``best``: the most probable activation per
    shape) beats the shared scale's by more than Schwarz's penalty, d - 1 more scales per outcome."""
    return fits[best[True], True]["objective"] - m * (d - 1) / 2 * math.log(n) > fits[best[False], False]["objective"]


def _infinite_width_gp(train_X, train_Y, *, model, depth, activation, ard, outcome_transform, input_transform, starts, warm_start,
                       choose_ard) -> SingleTaskGP:
    """:func:`infinite_width_gp`, choosing between the input-scale shapes (where both are fitted)
    by ``choose_ard(fits, best, n, d, m)``: ``fits`` by ``(activation, ard)``, ``best`` the most
    probable activation per shape; whether to keep the ARD fit."""
    if not isinstance(train_X, torch.Tensor) or train_X.dim() != 2 or train_X.shape[0] < 1:
        raise ValueError(f"train_X must be an (n, d) tensor with n >= 1, got {getattr(train_X, 'shape', type(train_X).__name__)}")
    if not isinstance(train_Y, torch.Tensor):
        raise ValueError(f"train_Y must be a tensor, got {type(train_Y).__name__}")
    train_Y = train_Y.unsqueeze(-1) if train_Y.dim() == 1 else train_Y
    if train_Y.dim() != 2 or train_Y.shape[0] != train_X.shape[0]:
        raise ValueError(f"train_Y must be (n, m) with n = {train_X.shape[0]}, got {tuple(train_Y.shape)}")
    if not bool(torch.isfinite(train_X).all() and torch.isfinite(train_Y).all()):
        raise ValueError("train_X and train_Y must be finite")
    if starts is not None:
        starts = _checked_starts(starts)
    activations = checked_activations(DEFAULT_ACTIVATIONS if activation is None else activation)
    if ard not in (None, True, False):
        raise ValueError(f"ard must be True, False or None (the data choose), got {ard!r}")
    n, d = train_X.shape
    m = train_Y.shape[-1]
    if warm_start is not None:
        _check_warm_start(warm_start, d, m, model=model, depth=depth, activation=activation, starts=starts)
        depth, activations = warm_start.covar_module.depth, tuple(dict.fromkeys(a for a, _ in warm_start.infinite_width_fits))
        if float(warm_start.likelihood.noise.detach().max()) >= WARM_START_NOISE_LIMIT:
            warm_start = None  # a fit in the noise mode: refit cold (with its activations and depth)
    depth = 2 if depth is None else depth
    init = None
    if model is not None:
        init = infinite_width_of(model)
        depth, activations = init.depth, (init.activation,)
    if ard is None:  # below the points per feature where ARD is always right, the data choose (choose_ard)
        shapes = (True,) if n >= ARD_POINTS_PER_FEATURE * d else (False, True) if d > 1 else (False,)
    else:
        shapes = (bool(ard),)
    x = train_X
    if input_transform is not None:
        input_transform.train()
        with torch.no_grad():  # the inputs' frame and the starts' fit hold a learnable transform at its initial value
            x = input_transform.preprocess_transform(train_X)
    center, base = _inputs_frame(x)
    if isinstance(outcome_transform, str):
        if outcome_transform != "standardize":
            raise ValueError(f"outcome_transform must be a BoTorch OutcomeTransform, 'standardize' or None, got {outcome_transform!r}")
        outcome_transform = Standardize(m=m)
    y = train_Y
    if outcome_transform is not None:
        y, _ = copy.deepcopy(outcome_transform)(train_Y, X=x)
    if starts is None:
        starts = list(FIT_STARTS)
        if init is not None:
            starts[0] = _scales_of(init)
    start = _warm_starts(warm_start, activations, shapes, base) if warm_start is not None else _cold_starts(starts, activations, shapes, m, x)
    fits = _fit_from_starts(x, y, start, activations, shapes, depth=depth, center=center, base_scale=base)  # (activation, shape): the kept start's fit
    best = {shape: max(activations, key=lambda a, shape=shape: fits[a, shape]["objective"]) for shape in shapes}  # the first among equals
    ard = bool(choose_ard(fits, best, n, d, m)) if len(shapes) == 2 else shapes[0]
    activation = best[ard]
    fitted = fits[activation, ard]["parameters"]
    kernel = InfiniteWidthKernel(d, depth=depth, activation=activation, ard=ard, center=center, base_scale=base,
                                 batch_shape=torch.Size([m]) if m > 1 else torch.Size([]))
    gp = SingleTaskGP(train_X, train_Y, covar_module=kernel, outcome_transform=outcome_transform, input_transform=input_transform,
                      likelihood=_noise_likelihood(kernel.batch_shape))
    learnable_transform = False
    with torch.no_grad():
        for name, parameter in gp.named_parameters():
            if name in fitted:
                parameter.copy_(fitted[name])
            else:  # an input transform's own parameters (e.g. BoTorch's Warp)
                learnable_transform = True
    if learnable_transform:  # fitted with the kernel, from the best start's fit
        _fit_mll(gp)
    gp.warm_started = warm_start is not None
    gp.infinite_width_fits = {key: {"objective": fit["objective"], "scales": {name: value * base if name == "input_scale" else value
                                                                            for name, value in fit["scales"].items()},
                                    "noise": fit["noise"], "mean": fit["mean"]} for key, fit in fits.items()}
    return gp.eval()


def _cold_starts(starts, activations, shapes, m, x) -> dict:
    """Every activation and input-scale shape from every one of ``starts`` (``(input, bias,
    hidden, output)`` 4-tuples), in :func:`_fit_from_starts`' batch order: one tensor per scale,
    ``(a s k, 1, 1)`` (``(a s k, 1, 1, 1)`` with ``m > 1`` outcomes: a scalar per start, broadcast
    over the outcomes and the features), the ``noise`` variance :data:`FIT_START_NOISE` for each,
    ``(a s k, 1)`` (``(a s k, 1, 1)``), and a constant ``mean`` of 0, ``(a s k)`` (``(a s k, 1)``)."""
    values = torch.tensor(starts, dtype=x.dtype, device=x.device).repeat(len(activations) * len(shapes), 1)  # (a s k, 4)
    outcomes = (1,) if m > 1 else ()
    start = {name: values[:, column].reshape(-1, *outcomes, 1, 1) for column, name in enumerate(SCALE_NAMES)}
    start["noise"] = torch.full((len(values), *outcomes, 1), FIT_START_NOISE, dtype=x.dtype, device=x.device)
    start["mean"] = torch.zeros((len(values), *outcomes), dtype=x.dtype, device=x.device)
    return start


def _check_warm_start(warm_start, d, m, **not_with):
    kernel = getattr(warm_start, "covar_module", None)
    if not isinstance(warm_start, SingleTaskGP) or type(kernel) is not InfiniteWidthKernel or not hasattr(warm_start, "infinite_width_fits"):
        raise ValueError(f"warm_start must be a GP infinite_width_gp returned, got {type(warm_start).__name__}")
    fitted_m = warm_start.num_outputs
    if kernel.center.shape[-1] != d or fitted_m != m:
        raise ValueError(f"warm_start was fitted to {kernel.center.shape[-1]} features and {fitted_m} outcomes; "
                         f"these data have {d} and {m}")
    given = [name for name, value in not_with.items() if value is not None]
    if given:
        raise ValueError(f"warm_start starts from the previous fit and keeps its activations and depth: "
                         f"{', '.join(given)} cannot be given with it")


def _warm_starts(gp, activations, shapes, base) -> dict:
    """For each of ``activations`` and input-scale ``shapes``, in :func:`_fit_from_starts`' batch
    order (one start each), the fit ``gp`` (an :func:`infinite_width_gp`) made of it with that
    shape (or, where it fitted only the other shape, that one) as a start in the frame whose
    ``base_scale`` is ``base``: input scales that map each feature as the fitted ones did (per
    feature, or their geometric mean for one shared scale, repeated per feature where ``shapes``
    holds both), the other scales, the noise and the constant mean as fitted (the mean matters:
    the kernel's bias variance leaves it weakly determined, and L-BFGS-B takes hundreds of
    evaluations to walk it back from 0); ``{name: (a s, *shape)}``."""
    start = {name: [] for name in SCALE_NAMES + ("noise", "mean")}
    for activation in activations:
        for ard in shapes:
            fit = gp.infinite_width_fits.get((activation, ard), gp.infinite_width_fits.get((activation, not ard)))
            for name in SCALE_NAMES:
                value = fit["scales"][name]
                if name == "input_scale":  # the fitted scale per unit of input, in this frame
                    value = value / base if ard else (value / base).log().mean(-1, keepdim=True).exp()
                    value = value.expand(*value.shape[:-1], len(base) if any(shapes) else 1)
                start[name].append(value)
            start["noise"].append(fit["noise"])
            start["mean"].append(fit["mean"])
    return {name: torch.stack(values) for name, values in start.items()}


def _fit_from_starts(x, y, starts, activations, shapes, **kernel_options) -> dict:
    r"""Maximum a posteriori scales and noise of the :class:`InfiniteWidthKernel` GP on
    (transformed) inputs ``x`` ``(n, d)`` and outcomes ``y`` ``(n, m)``, for each of
    ``activations`` and input-scale ``shapes`` (``True``: one scale per feature, ``False``: one
    shared) from each of ``k`` starts at once (``starts``: a tensor ``(a s k, ...)`` for each
    scale, the ``noise`` variance and the constant ``mean``, broadcastable to its shape;
    activation ``i``'s and shape ``j``'s starts at ``(i s + j) k`` to ``(i s + j) k + k - 1``): one GP
    batched over the activations, the shapes, the starts (and the outcomes), which BoTorch's
    ``fit_gpytorch_mll`` fits element by element in one batched L-BFGS-B run (each element's fit
    can end a few hundredths of a nat from its fit alone). Per activation, shape and outcome the
    start whose fit has the highest log marginal likelihood plus log hyperprior density is kept (a
    fit that broke down scores ``-inf``). Returns, per ``(activation, shape)``, that fit: its
    ``objective`` (summed over the outcomes), the ``parameters`` of an unbatched GP of that shape
    (batched over outcomes where ``m > 1``) by name, its ``scales``, ``noise`` (variance) and
    constant ``mean``."""
    n, d = x.shape
    m = y.shape[-1]
    a, s = len(activations), len(shapes)
    k = len(starts["noise"]) // (a * s)
    outcomes = torch.Size([m]) if m > 1 else torch.Size([])
    kernel = _StartsKernel(d, activations=activations, shapes=shapes, batch_shape=torch.Size([a * s * k]) + outcomes, **kernel_options)
    for name in SCALE_NAMES:
        kernel._set_scale(name, starts[name])
    # no outcome transform: ``y`` is in the units the fit is for (BoTorch would standardize it by default)
    gp = _StartsGP(x.expand(a * s * k, n, d), y.expand(a * s * k, n, m), covar_module=kernel, outcome_transform=None,
                   likelihood=_noise_likelihood(torch.Size([a * s * k]) + outcomes))
    gp.likelihood.noise = starts["noise"].expand_as(gp.likelihood.noise).clone()
    gp.mean_module.constant = starts["mean"].expand_as(gp.mean_module.constant).clone()
    _fit_mll(gp)
    gp.train()
    with torch.no_grad():  # per activation, shape, start (and outcome): log p(y | scales, noise) + log p(scales, noise)
        objective = _map_objective(gp)
    kept, best = objective.nan_to_num(nan=-math.inf).reshape(a * s, k, *outcomes).max(1)  # (a s,) or (a s, m); a broken fit is never kept
    totals = kept.reshape(a * s, -1).sum(-1).tolist()
    pick = (lambda t, index: t[index, torch.arange(m, device=index.device)]) if m > 1 else (lambda t, index: t[index])
    fits = {}
    with torch.no_grad():
        for i, activation in enumerate(activations):
            for j, ard in enumerate(shapes):
                part = i * s + j
                index = part * k + best[part]  # () or (m,): the kept start's place in the batch
                shared = () if ard else ("input_scale", "covar_module.raw_input_scale")  # held as their first coordinate
                fits[activation, ard] = {
                    "objective": totals[part],
                    "parameters": {name: pick(p.detach(), index)[..., :1] if name in shared else pick(p.detach(), index)
                                   for name, p in gp.named_parameters()},
                    "scales": {name: pick(kernel._scale(name).detach(), index)[..., :1] if name in shared
                               else pick(kernel._scale(name).detach(), index) for name in SCALE_NAMES},
                    "noise": pick(gp.likelihood.noise.detach(), index),
                    "mean": pick(gp.mean_module.constant.detach(), index)}
    return fits


def calibration_fit(train_X, train_Y, *, depth: int = 2, activation=DEFAULT_ACTIVATIONS, ard=None, warm_start=None) -> SingleTaskGP:
    r"""The fit :func:`calibrated_model` makes: :func:`infinite_width_gp` of ``(train_X, train_Y)``
    without an outcome transform (the outcomes in the units the network will be fitted in).

    ``ard`` (one input scale per feature, or one shared) by default: ARD from
    :data:`ARD_POINTS_PER_FEATURE` points per feature on; below it both shapes are fitted and the
    data choose by their **prequential** score (Dawid 1984), the log predictive density each shape's
    previous fit gave the points every warm refit added,

    .. math:: S_{\text{shape}} = \sum_t \log p\left(y_{t} \mid y_{<t},\ \hat\theta_{\text{shape}}(y_{<t})\right),

    summed over the refits (the outcomes of every step in the current step's units): ARD where
    :math:`S_{\text{ARD}} > S_{\text{shared}}`, so one shared scale at a cold fit (no refit yet,
    a tie). Each term predicts points the fit had not seen, so it does not favour the shape with
    more scales as the fitted objective does; Schwarz's penalty, :func:`infinite_width_gp`'s
    criterion, helped the finite networks in 40-D and cost them on Hartmann-6
    (:data:`ARD_POINTS_PER_FEATURE`), and the leave-one-out density at the fitted scales chose
    ARD on Hartmann-6 at every n though its held-out NLL was the worse (docs/bayesopt.md).
    Below the threshold the returned GP keeps both shapes' fits in ``infinite_width_fits`` and the
    scores in ``shape_scores`` (``{False: shared, True: ARD}``, nats; zeros at a cold fit, or
    where ``warm_start`` has none or the data do not extend its data). With several outcomes each
    term is the outcomes' joint density, and the shape is one for all of them.

    ``warm_start``: a GP this function returned on data these extend (the previous step of a BO
    loop), fitted again from its own fit as :func:`infinite_width_gp`'s ``warm_start`` (its
    activations and depth kept, so ``depth`` and ``activation`` are not used with it); a
    surrogate's warm refit calibrates so.

    The fit runs in float64 whatever the data's floating dtype (the returned GP is float64), as
    BoTorch advises for its GPs: in float32 the kernel matrix of a near-noiseless fit is not
    positive definite to working precision; on Branin at 40 Sobol points the fit failed from every
    start and retry (BoTorch's ``ModelFittingError``) in each of 5 designs, and at 20 points 2 of
    5 designs chose the other activation than the same numbers in float64 (docs/bayesopt.md).
    :func:`finite_model` builds the network in the caller's dtype."""
    shape = dict(warm_start=warm_start) if warm_start is not None else dict(depth=depth, activation=activation)
    train_X, train_Y = (t.to(torch.float64) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t for t in (train_X, train_Y))
    if ard is not None or not (isinstance(train_X, torch.Tensor) and train_X.dim() == 2):  # else infinite_width_gp says what is wrong
        return infinite_width_gp(train_X, train_Y, ard=ard, outcome_transform=None, **shape)
    n, d = train_X.shape
    if d == 1 or n >= ARD_POINTS_PER_FEATURE * d:
        return infinite_width_gp(train_X, train_Y, ard=n >= ARD_POINTS_PER_FEATURE * d, outcome_transform=None, **shape)
    scores = {False: 0.0, True: 0.0}

    def prequential_choice(fits, best, n, d, m):  # called once warm_start is checked
        step = _prequential_step(warm_start, train_X, train_Y) if warm_start is not None else None
        before = getattr(warm_start, "shape_scores", None)
        if step is not None and before is not None:
            scores.update({s: before[s] + step[s] for s in (False, True)})
        return scores[True] > scores[False]

    gp = _infinite_width_gp(train_X, train_Y, model=None, ard=None, outcome_transform=None, input_transform=None, starts=None,
                            warm_start=warm_start, choose_ard=prequential_choice,
                            **(dict(depth=None, activation=None) if warm_start is not None else dict(depth=depth, activation=activation)))
    gp.shape_scores = scores
    return gp


def _prequential_step(warm_start, train_X, train_Y):
    """``{ard: log p(new | old)}`` for both input-scale shapes: the joint log predictive density
    (noise included) of the points ``(train_X, train_Y)`` add to ``warm_start``'s training inputs,
    given the old points' outcomes as ``train_Y`` has them, under ``warm_start``'s best fit of
    each shape (its scales, noise and constant mean, in its inputs' frame); ``None`` where the data
    do not extend ``warm_start``'s or it lacks a fit of either shape."""
    fits = warm_start.infinite_width_fits
    old_X = warm_start.train_inputs[0]
    old_X = old_X.reshape(-1, *old_X.shape[-2:])[0]  # (n0, d): one copy per outcome where m > 1
    n0 = old_X.shape[0]
    if train_X.shape[0] <= n0 or not torch.equal(train_X[:n0], old_X):
        return None
    kernel = warm_start.covar_module
    step = {}
    for ard in (False, True):
        keys = [key for key in fits if key[1] == ard]
        if not keys:
            return None
        activation, _ = max(keys, key=lambda key: fits[key]["objective"])
        gp = _gp_of_fit(train_X[:n0], train_Y[:n0], fits[activation, ard], activation=activation, depth=kernel.depth,
                        center=kernel.center, base=kernel.base_scale)
        with torch.no_grad():
            predictive = gp.posterior(train_X[n0:], observation_noise=True).distribution
            new = train_Y[n0:]
            step[ard] = float(predictive.log_prob(new if new.shape[-1] > 1 else new.squeeze(-1)).sum())
    return step


def _gp_of_fit(train_X, train_Y, fit, *, activation, depth, center, base) -> SingleTaskGP:
    """The GP (no outcome transform) of one entry of ``infinite_width_fits`` on ``(train_X,
    train_Y)``, in the inputs' frame ``(center, base)`` it was fitted in: its scales (the input
    scales per feature, which holds a shared one too), noise variance and constant mean."""
    m = train_Y.shape[-1]
    kernel = InfiniteWidthKernel(train_X.shape[-1], depth=depth, activation=activation, ard=True, center=center, base_scale=base,
                                 batch_shape=torch.Size([m]) if m > 1 else torch.Size([]))
    for name in SCALE_NAMES:
        value = fit["scales"][name]
        kernel._set_scale(name, value / base if name == "input_scale" else value, margin=1e-12)  # as fitted, a bound included
    gp = SingleTaskGP(train_X, train_Y, covar_module=kernel, outcome_transform=None, likelihood=_noise_likelihood(kernel.batch_shape))
    with torch.no_grad():
        gp.likelihood.noise = fit["noise"].expand_as(gp.likelihood.noise).clone()
        gp.mean_module.constant = fit["mean"].expand_as(gp.mean_module.constant).clone()
    return gp.eval()


def finite_model(gp: SingleTaskGP, *, width: int = 50, output_mean: bool = True, dtype=None):
    r"""The width-``width`` :class:`~pyrobnn.models.BayesianModel` whose infinite-width limit is
    ``gp`` (a :func:`calibration_fit` or an :func:`infinite_width_gp` without an outcome
    transform): its kernel's scales as the weight priors of ``InputScaling -> (Linear,
    activation) x depth -> Linear`` (:meth:`InfiniteWidthMLP.bayesian_model`), its constant mean
    as the network's :class:`~pyrobnn.models.infinite_width.OutputMean` (``output_mean=False``
    leaves it out), and its noise standard deviation as the Gaussian likelihood's fixed scale.
    With several outcomes, the scales are the geometric means of the per-outcome fits (the
    network's hidden layers are shared) and the mean is per outcome.

    The offset is the prior's mean, not where a fit starts: the last layer's bias starts at minus
    it, so that the network at its initialization computes PyTorch's small function about zero
    (in standardized units the data's mean), as it would without the offset. Where the data leave
    the GP's mean undetermined (an erf kernel with a large bias variance: on Branin at 22 points
    -11.8 standardized units) a fit started at the offset had that far to go, and IVON's clipped
    steps did not get there (docs/bayesopt.md); a method that starts from prior draws or anchors
    (NUTS, MCLMC, the anchored ensemble) does not use this start.

    ``dtype``: the network's floating dtype (default: the GP's; :func:`calibration_fit`'s is
    float64 whatever the data's)."""
    if not (isinstance(width, int) and width >= 1):
        raise ValueError(f"width must be a positive integer, got {width!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
    kernel = getattr(gp, "covar_module", None)
    if not isinstance(gp, SingleTaskGP) or not isinstance(kernel, InfiniteWidthKernel):
        raise ValueError(f"gp must be a GP infinite_width_gp or calibration_fit returned, got {type(gp).__name__}")
    if getattr(gp, "outcome_transform", None) is not None:
        raise ValueError("gp must be fitted without an outcome transform (calibration_fit's): "
                         "its mean and noise are in the transformed units")
    m = gp.num_outputs
    nets = [kernel.network(i) for i in range(m)]

    def geometric(values):
        return math.exp(sum(math.log(v) for v in values) / len(values))

    first = nets[0]
    net = InfiniteWidthMLP(
        kernel.activation,
        tuple(geometric([n.weight_scales[i] for n in nets]) for i in range(len(first.weight_scales))),
        tuple(geometric([n.bias_scales[i] for n in nets]) for i in range(len(first.bias_scales))),
        first.input_center,
        torch.exp(torch.stack([n.input_scale.log() for n in nets]).mean(0)),
        gp.mean_module.constant.detach().reshape(-1).clone() if output_mean else None,  # (m,), or (1,) for one outcome
    )
    noise = float(gp.likelihood.noise.detach().log().mean().exp().sqrt())
    likelihood = GaussianLikelihood(scale=noise)
    model = net.bayesian_model(likelihood, out_features=m, width=width, dtype=dtype or gp.train_inputs[0].dtype)
    if output_mean:  # the network starts where a fit from its initialization starts: at the data's mean
        with torch.no_grad():
            model.net[-2].bias.copy_(-model.net[-1].mean.expand_as(model.net[-2].bias))
    return model


def calibrated_model(train_X, train_Y, *, width: int = 50, depth: int = 2, activation=DEFAULT_ACTIVATIONS, ard=None, output_mean: bool = True):
    r"""A :class:`~pyrobnn.models.BayesianModel` for ``(train_X, train_Y)`` (in the units it will
    be fitted in: BO surrogates fit standardized outcomes) whose prior was chosen by the data:
    :func:`finite_model` of :func:`calibration_fit`, that is :func:`infinite_width_gp` fitted
    without an outcome transform, and the network whose infinite-width limit is that GP: its
    scales as the weight priors, its constant mean as the network's
    :class:`~pyrobnn.models.infinite_width.OutputMean`, and its noise standard deviation as the
    Gaussian likelihood's fixed scale (BoTorch's floor, a variance of 1e-4, holds it off zero on
    noiseless objectives).

    The mean matters: with the ReLU kernel the fitted mean lies above every observation where the
    data have a bowl (on Levy-20 at 40 Sobol points 2.9 standardized units, the best point 2.6),
    and the GP's prediction at the design's centre follows it; a network without it predicts the
    data's mean there, whatever its inference (docs/bayesopt.md). ``output_mean=False`` leaves it
    out (the network of every default surrogate before 2026-11-27, and of the methods whose
    ``MethodSpec.bo_limit_network`` is false).

    ``activation``: :func:`infinite_width_gp`'s, one, or several for the fit to choose among
    (default: :data:`DEFAULT_ACTIVATIONS`, as there). ``ard``: one input scale per feature; default as
    :func:`calibration_fit`'s. The network is in ``train_X``'s floating dtype; the fit runs in
    float64 (:func:`calibration_fit`)."""
    if not (isinstance(width, int) and width >= 1):  # before the fit, as finite_model would after it
        raise ValueError(f"width must be a positive integer, got {width!r}")
    dtype = train_X.dtype if isinstance(train_X, torch.Tensor) and train_X.dtype.is_floating_point else None
    return finite_model(calibration_fit(train_X, train_Y, depth=depth, activation=activation, ard=ard), width=width, output_mean=output_mean,
                        dtype=dtype)
