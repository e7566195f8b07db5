r"""Every pyrobnn posterior as a BoTorch surrogate for Bayesian optimization.

:func:`fit_surrogate` fits a :class:`~pyrobnn.models.BayesianModel` to ``(train_X, train_Y)``
with any registered method (:mod:`pyrobnn.methods`) and returns a BoTorch ``Model``. Unless a
model is given, its prior is chosen by the data at every fit: the scales and noise that maximize
the marginal likelihood of the network's infinite-width limit
(:func:`~pyrobnn.integrations.infinite_width_gp.calibrated_model`), and for the methods whose
``MethodSpec.bo_limit_network`` is set (NUTS, MCLMC, the deep ensemble, SWAG, IVON) the limit's whole network: the
activation its fit chose (among the method's ``MethodSpec.bo_activations``: erf and ReLU, and for
NUTS the stationary cosine network too; or among ``activations``) and its constant mean as an
output offset. The surrogates:

- :class:`PosteriorSurrogate` (every method): BoTorch's ``EnsembleModel`` over ``S`` weight
  draws of the result, :math:`f_s(x) = f(x, w_s)`. Each member is one whole function (the same
  weights at every point), so ``posterior([x, x])`` has equal values in both slots and a joint
  acquisition (qLogNEI's baseline and candidates) is exact for the mixture; the values are
  differentiable in ``X``; the members are chosen once, under ``seed``
  (``result.as_draws(num_samples, seed=seed)``), so an acquisition value is repeatable. With
  ``observation_noise=True`` each member adds its own noise scale (the likelihood's
  :math:`\sigma`, or member ``s``'s draw of a noise scale with a prior) times a standard normal
  drawn under ``seed``.
- :class:`LaplaceSurrogate` (``method="laplace"``, the forms ``"joint"`` and ``"bounded"``): the linearized
  (GLM) predictive of the Laplace approximation as a Gaussian over the ``q`` points of each batch,
  mean :math:`f(x, \hat w)` and joint covariance :math:`J(x)\,\Sigma\,J(x)^\top` (Immer et al.
  2021), :math:`J` the network's Jacobian in the covered weights and :math:`\Sigma` laplace-torch's
  posterior covariance (full, diagonal or Kronecker-factored); a full GGN's with fewer training
  values than weights in function space, from the training Jacobians
  (:class:`~pyrobnn.infer.modes.laplace.FunctionSpaceLaplace`: exact, no ``P x P`` matrix at
  prediction), and for a perceptron (the default network) with the tangent kernel in closed form
  (:class:`~pyrobnn.infer.modes.tangent_kernel.TangentKernelLaplace`: the same numbers without a
  Jacobian, memory ``b q (h + N) m`` for width ``h``). Otherwise the Jacobians are formed for a
  chunk of batches at a time, so memory grows with ``b q P`` (``P`` weights) and never with
  :math:`(b q)^2` as a covariance over all ``b x q`` points would. With the default model the
  form is ``"bounded"``: the network is its calibration's whole network (as for the methods with
  ``MethodSpec.bo_limit_network``) and each point's standard deviation is at most the
  calibration's posterior standard deviation there,
  :math:`C \mapsto D C D`, :math:`D_{ii} = \min(1, \sigma_\infty(x_i) / \sqrt{C_{ii}})`, the
  correlations :math:`J \Sigma J^\top`'s. The linearized network's standard deviation at the
  cube's corners, which 20-40 points inform little through the MAP's Jacobian, was 1.7-2.2x its
  value inside the cube and qLogNEI spent its batches there; the infinite-width limit's
  posterior under the same prior, which is exact, grew 1.0-1.5x (docs/bayesopt.md, "Laplace's
  spread bounded by its limit's"); its ReLU units are linearized through a smooth step
  (:data:`RELU_TEMPERATURE`), so that its variance does not jump where a unit turns on or off,
  where an acquisition's line search failed. ``laplace_form="samples"`` gives the linearized
  predictive at the result's weight draws as an ensemble instead.

``condition_on_observations(X, Y)`` (and ``surrogate.refit(X, Y)``) refits on the old
and new data **warm-started** from the previous posterior (each method's
:class:`~pyrobnn.methods.WarmStart`, declared beside it: a sampler's last draws as starting
positions, an ensemble's members, the MAP of Laplace and SWAG) with a stated fraction
``warm_fraction`` of the cold fit's tuning or training budget; a default surrogate's prior is
calibrated again from the previous fit's calibration
(:func:`~pyrobnn.integrations.infinite_width_gp.calibration_fit`'s ``warm_start``), not from
scratch. Each method's options as a
surrogate (budgets for tens to hundreds of points, full batch) are its ``bo_options``, declared
beside it too (:class:`~pyrobnn.methods.MethodSpec`). The input and outcome
transforms of BoTorch apply as in its own models (the outcome transform, ``Standardize`` by
default, is fitted to the training targets; the model is fitted in transformed units).

Li, Rudner, Wilson et al. (2024), "A Study of Bayesian Neural Network Surrogates for Bayesian
Optimization", ICLR: the benchmark ``benchmarks/bayesopt.py`` runs these surrogates against
BoTorch's GP and laplace-bayesopt.

This module needs BoTorch: ``pip install 'pyrobnn[bo]'``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import time
from typing import Optional

import torch

import warnings

try:
    with warnings.catch_warnings():  # GPyTorch's modules call torch.jit.script at import, which torch deprecates
        warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=FutureWarning)
        import botorch  # noqa: F401
        import gpytorch  # noqa: F401
    from botorch.acquisition.objective import ScalarizedPosteriorTransform
    from botorch.exceptions.errors import UnsupportedError
    from botorch.models.ensemble import EnsembleModel
    from botorch.models.model import Model
    from botorch.models.transforms.outcome import Standardize
    from botorch.posteriors.ensemble import EnsemblePosterior
    from botorch.posteriors.gpytorch import GPyTorchPosterior
    from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
except ImportError as error:  # pragma: no cover - the optional extra is missing
    raise ImportError("pyrobnn.integrations.botorch needs BoTorch: pip install 'pyrobnn[bo]'") from error

from pyrobnn import methods
from pyrobnn.infer.modes.laplace import (LaplacePosterior, effective_noise_variance, function_space_posterior, linearized_outputs,
                                         parameter_jacobians)
from pyrobnn.infer.modes.tangent_kernel import MLPTangentKernel, TangentKernelLaplace
from pyrobnn.infer.results.protocol import Result
from pyrobnn.models import BayesianModel
from pyrobnn.integrations.infinite_width_gp import InfiniteWidthKernel, calibration_fit, checked_activations, finite_model
from pyrobnn.models.functional import call_with_weights
from pyrobnn.models.infinite_width import InfiniteWidthMLP, NNGPCrossCovariance, infinite_width_of
from pyrobnn.models.likelihoods import GaussianLikelihood, HeteroscedasticGaussianLikelihood
from pyrobnn.utils.modes import eval_mode

__all__ = [
    "Surrogate", "PosteriorSurrogate", "LaplaceSurrogate", "BNNSurrogate", "fit_surrogate", "site_order", "default_model",
    "JACOBIAN_CHUNK_BYTES", "DEFAULT_METHOD", "takes_limit_network", "ExactGPVariance", "RELU_TEMPERATURE",
]

#: the temperature of the smooth step through which the ``"bounded"`` Laplace surrogate
#: linearizes its ReLU units (:class:`LaplaceSurrogate`'s ``relu_temperature``), in the units of
#: their pre-activations, whose prior scale the calibration sets near 1: with steps, qLogNEI's
#: L-BFGS-B failed its line search and started again at 22 of 24 steps (docs/bayesopt.md, "Why
#: Laplace's acquisition takes more evaluations"; this value's measurement in "Laplace's
#: acquisition without Jacobians or jumps")
RELU_TEMPERATURE = 0.1

#: the most bytes of Jacobians the joint Laplace covariance forms at once (a chunk of batches)
JACOBIAN_CHUNK_BYTES = 64 << 20

#: the method :func:`fit_surrogate`, :class:`BNNSurrogate` and :mod:`pyrobnn.integrations.ax`
#: fit unless told: NUTS, chosen on the development problems (Branin, Hartmann-6, Ackley-10,
#: Levy-20), where its median regret was the lowest of the finite BNNs on average and Laplace's,
#: the default before, the highest on all four. Held out it was ahead of random search in every
#: seed on Rosenbrock-5, Levy-4 and Griewank-8 and behind it on Styblinski-Tang-10, and its
#: predictive NLL at n = 20 within 1.5x of the GP's on all eight problems (docs/bayesopt.md,
#: "NUTS, the default surrogate; its rows with today's defaults")
DEFAULT_METHOD = "nuts"


def default_model(d: int, m: int = 1, *, width: int = 50, depth: int = 2, dtype=torch.float64) -> BayesianModel:
    r"""The surrogate network where none is given, before its prior is fitted: an MLP ``d -> 50
    -> 50 -> m`` with erf activations (smooth like tanh, with a closed-form infinite-width
    kernel) behind an :class:`~pyrobnn.models.infinite_width.InputScaling` of the unit cube onto
    [-1, 1], Gaussian priors scaled by fan-in, and a fixed noise scale of 0.1. :func:`fit_surrogate`
    replaces its scales and noise at every fit (and, per method, its activation and an output
    mean) by those of
    :func:`~pyrobnn.integrations.infinite_width_gp.calibrated_model` (empirical Bayes through the
    network's infinite-width limit); this model is the shape a surrogate has before its first fit
    (e.g. a :class:`BNNSurrogate` that reloads a saved state)."""
    device = torch.get_default_device()
    description = InfiniteWidthMLP("erf", (1.0,) + (1.5,) * depth, (1.0,) * (depth + 1), torch.full((d,), 0.5, dtype=dtype, device=device),
                                   torch.full((d,), 2.0, dtype=dtype, device=device))
    return description.bayesian_model(GaussianLikelihood(scale=0.1), out_features=m, width=width, dtype=dtype)


@dataclasses.dataclass
class SurrogateFit:
    """How a surrogate was fitted, so that a refit can repeat it on more data."""

    method: str
    model: BayesianModel
    options: dict
    num_samples: int
    seed: int
    warm_fraction: float
    laplace_form: str
    train_X: torch.Tensor
    train_Y: torch.Tensor
    input_transform: object
    outcome_transform: object
    #: the fit's seconds: the prior's calibration (``calibration_seconds`` of them), a warm
    #: start's preparation and the method's run
    seconds: float = 0.0
    calibration_seconds: float = 0.0
    warm: bool = False
    calibrate: bool = False
    #: a default surrogate's last calibration (:func:`calibration_fit`), which its warm refit's
    #: calibration starts from
    calibration: object = None
    #: the activations a default surrogate's calibration chooses among (the call's, else its method's
    #: ``MethodSpec.bo_activations``; ``None``: the calibration's default, erf and ReLU)
    activations: Optional[tuple] = None


# -- the models -----------------------------------------------------------------------------------
def _check_regression(model):
    if not isinstance(model.likelihood, (GaussianLikelihood, HeteroscedasticGaussianLikelihood)):
        raise ValueError(f"a BO surrogate needs a Gaussian likelihood (real-valued outcomes); the model has {type(model.likelihood).__name__}")


def _locations(model, outputs):
    """The mean function's values from the network's outputs (a heteroscedastic likelihood's
    first half)."""
    if isinstance(model.likelihood, HeteroscedasticGaussianLikelihood):
        return model.likelihood.split(outputs)[0]
    return outputs


def site_order(model) -> list:
    """The latent sites of ``model`` in the order of its members' buffers: the weight sites,
    then the likelihood's latent sites."""
    return [s.name for s in model.sites] + list(model.likelihood.latent_sites())


class Surrogate:
    """What every pyrobnn BoTorch surrogate shares: its fit record (the method, options and
    training data), refitting on more data, and BoTorch's conditioning as a warm refit."""

    fit_record: SurrogateFit

    @property
    def batch_shape(self) -> torch.Size:
        """A pyrobnn surrogate is one model (no batch of models): ``torch.Size([])``."""
        return torch.Size([])

    @property
    def num_outputs(self) -> int:
        return self.fit_record.train_Y.shape[-1]

    @property
    def fit_seconds(self) -> float:
        """Seconds the fit that made this surrogate took: the prior's calibration (a default
        surrogate's; ``fit_record.calibration_seconds``), a warm start's preparation (Laplace's MAP)
        and the method's run."""
        return self.fit_record.seconds

    @property
    def warm(self) -> bool:
        """Whether this surrogate was refitted from a previous one."""
        return self.fit_record.warm

    def refit(self, X=None, Y=None, *, warm: bool = True):
        """A new surrogate fitted to the training data plus ``(X, Y)`` (in original units), from this
        one's posterior when ``warm`` (its method's :class:`~pyrobnn.methods.WarmStart`), else
        from scratch as the first fit. A default surrogate's warm refit calibrates its prior from
        the previous calibration too; one whose new data choose the other activation refits its
        weights from scratch: its previous posterior is another network's."""
        record = self.fit_record
        train_X, train_Y = record.train_X, record.train_Y
        if X is not None:
            X, Y = _check_xy(X, Y, train_X.shape[-1], train_Y.shape[-1])
            train_X, train_Y = torch.cat([train_X, X.to(train_X)]), torch.cat([train_Y, Y.to(train_Y)])
        return _fit(record, train_X, train_Y, previous=self.result if warm else None)

    def condition_on_observations(self, X, Y, **kwargs):
        """BoTorch's conditioning: the surrogate refitted, warm-started, with ``(X, Y)`` added.
        Fantasy batches (``Y`` with batch dimensions) would mean one refit per fantasy and are
        refused."""
        if Y.dim() > 2 or X.dim() > 2:
            raise UnsupportedError("a pyrobnn surrogate conditions on (n, d) inputs and (n, m) outcomes, not on fantasy batches")
        return self.refit(X, Y, warm=True)

    # BoTorch's models transform stored training inputs; a pyrobnn surrogate was fitted on the
    # transformed inputs already and keeps none to transform
    def _set_transformed_inputs(self) -> None:
        pass

    def _revert_to_original_inputs(self) -> None:
        pass

    def subset_output(self, idcs):
        raise UnsupportedError("a pyrobnn surrogate is one network over all outcomes: subset_output is not supported")


def _check_xy(X, Y, d=None, m=None):
    if not isinstance(X, torch.Tensor) or not isinstance(Y, torch.Tensor):
        raise TypeError(f"train_X and train_Y must be tensors, got {type(X).__name__} and {type(Y).__name__}")
    if X.dim() != 2 or X.shape[0] == 0:
        raise ValueError(f"train_X must be (n, d) with n >= 1, got shape {tuple(X.shape)}")
    if Y.dim() == 1:
        Y = Y.unsqueeze(-1)
    if Y.dim() != 2 or Y.shape[0] != X.shape[0]:
        raise ValueError(f"train_Y must be (n, m) with n = {X.shape[0]} as train_X, got shape {tuple(Y.shape)}")
    if d is not None and X.shape[-1] != d:
        raise ValueError(f"X has {X.shape[-1]} features; the surrogate was fitted on {d}")
    if m is not None and Y.shape[-1] != m:
        raise ValueError(f"Y has {Y.shape[-1]} outcomes; the surrogate was fitted on {m}")
    if not (torch.isfinite(X).all() and torch.isfinite(Y).all()):
        raise ValueError("train_X and train_Y must be finite")
    return X, Y


class PosteriorSurrogate(Surrogate, EnsembleModel):
    """A pyrobnn result as BoTorch's ``EnsembleModel``: one member per weight draw (the module
    docstring says how). Build it with :func:`fit_surrogate`, or from a result directly:
    ``PosteriorSurrogate(result, train_X, train_Y)``, ``train_Y`` then in the units the model was
    fitted in unless an ``outcome_transform`` is given (the one that was applied, in eval mode).

    The draws are buffers (``draws.<i>``), so ``state_dict`` holds the members and
    ``load_state_dict`` restores them."""

    def __init__(self, result: Result, train_X, train_Y, *, num_samples: Optional[int] = 64, seed: int = 0,
                 input_transform=None, outcome_transform=None, linearized: bool = False, _record: SurrogateFit = None):
        if not isinstance(result, Result):
            raise TypeError(f"result must be a pyrobnn Result, got {type(result).__name__}")
        super().__init__()
        model = result.model
        _check_regression(model)
        train_X, train_Y = _check_xy(train_X, train_Y)
        self.result = result
        self.model = model
        self.fit_record = _record or SurrogateFit(
            result.method, model, {}, num_samples, seed, 1.0, "samples", train_X, train_Y, input_transform, outcome_transform,
        )
        if input_transform is not None:
            self.input_transform = input_transform
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform.eval()
        self.seed = int(seed)
        self._num_outputs = train_Y.shape[-1]
        self.linearized = bool(linearized)
        if self.linearized and not isinstance(result, LaplacePosterior):
            raise ValueError(f"linearized members need a Laplace result, got {type(result).__name__}")
        self._set_members(result, num_samples)

    def _set_members(self, result, num_samples):
        """The members: ``num_samples`` draws of ``result`` chosen under the seed, as buffers
        ``draw_<i>`` in the order of :func:`site_order`."""
        self.result = result
        draws = result.as_draws(num_samples, seed=self.seed)
        flat = {k: v.reshape((-1,) + tuple(v.shape[2:])).detach() for k, v in draws.samples.items()}
        self._site_names = site_order(self.model)
        for i, name in enumerate(self._site_names):
            self.register_buffer(f"draw_{i}", flat[name])
        if self.linearized:  # the MAP, around which Laplace's predictive is linear
            for i, site in enumerate(self.model.sites):
                self.register_buffer(f"linearization_{i}", result.map_values[site.name].detach().reshape(site.shape))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state (``state_dict()`` of a surrogate of the same model): the members are
        replaced whole, whatever their number (an unfitted :class:`BNNSurrogate` has none)."""
        draws = {k: v for k, v in state_dict.items() if k.startswith(("draw_", "linearization_"))}
        expected = [f"draw_{i}" for i in range(len(self._site_names))]
        if self.linearized:
            expected += [f"linearization_{i}" for i in range(len(self.model.sites))]
        if strict and sorted(draws) != sorted(expected):
            raise KeyError(f"the state holds the members {sorted(draws)}; this surrogate's model needs {expected}")
        for k, v in draws.items():
            self.register_buffer(k, v.detach().clone())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def get_extra_state(self) -> dict:
        """What of the network a state must carry besides tensors: its activation (a default
        surrogate's units are chosen at every fit and hold no tensor) and whether it has an
        :class:`~pyrobnn.models.infinite_width.OutputMean`; nothing for a network that is no
        :func:`~pyrobnn.models.infinite_width.infinite_width_of` MLP."""
        try:
            description = infinite_width_of(self.model)
        except ValueError:
            return {}
        return {"activation": description.activation, "output_mean": description.output_mean is not None}

    def set_extra_state(self, state: dict):
        """Rebuild the network as the state's was (called by ``load_state_dict`` before the
        network's own buffers, which then fill it: an unfitted :class:`BNNSurrogate` holds the
        shape of :func:`default_model`, erf and no output mean)."""
        if not state:
            return
        description = infinite_width_of(self.model)
        if (description.activation, description.output_mean is not None) == (state["activation"], state["output_mean"]):
            return
        linears = [module for module in self.model.net if isinstance(module, torch.nn.Linear)]
        m, width = linears[-1].out_features, linears[0].out_features
        like = description.input_center
        mean = torch.zeros(m, dtype=like.dtype, device=like.device) if state["output_mean"] else None  # its values are loaded next
        rebuilt = dataclasses.replace(description, activation=state["activation"], output_mean=mean)
        self.model = rebuilt.bayesian_model(self.model.likelihood, out_features=m, width=width, dtype=self.model.dtype)

    @property
    def num_members(self) -> int:
        return getattr(self, "draw_0").shape[0]

    def draws(self) -> dict:
        """The members' weights, ``{site: (S, *shape)}``."""
        return {name: getattr(self, f"draw_{i}") for i, name in enumerate(self._site_names)}

    def forward(self, X):
        """The members' values at ``X`` (``batch x n x d``): ``batch x S x n x m``."""
        model = self.model
        batch, (n, d) = X.shape[:-2], X.shape[-2:]
        x = X.reshape(-1, d).to(model.dtype)
        draws = self.draws()
        with eval_mode(model.net):
            if self.linearized:
                point = {site.name: getattr(self, f"linearization_{i}") for i, site in enumerate(model.sites)}
                out = linearized_outputs(model.net, point, {n: draws[n] - point[n] for n in point}, x)
            else:
                weights = {s.name: draws[s.name] for s in model.sites}
                out = call_with_weights(model.net, model.sites, weights, x)
        out = _locations(model, out)  # (S, B n, m)
        out = out.reshape((out.shape[0],) + batch + (n, out.shape[-1])).movedim(0, -3)
        return out.to(X.dtype)

    def posterior(self, X, output_indices=None, observation_noise=False, posterior_transform=None, **kwargs):
        """BoTorch's posterior at ``X`` (``batch x q x d``): an ``EnsemblePosterior`` over the
        members, ``batch x S x q x m``; ``observation_noise=True`` adds each member's noise."""
        self.eval()
        X = self.transform_inputs(X)
        values = self.forward(X)
        if isinstance(observation_noise, torch.Tensor):
            raise UnsupportedError("observation_noise as a tensor of variances is not supported: pass True for the model's own noise")
        if observation_noise:
            values = values + self._noise(values)
        if hasattr(self, "outcome_transform"):
            values, _ = self.outcome_transform.untransform(values, X=X)
        if output_indices is not None:
            values = values[..., output_indices]
        if isinstance(posterior_transform, ScalarizedPosteriorTransform):
            # BoTorch scalarizes only Gaussian posteriors; members are scalarized member by member
            values = (values @ posterior_transform.weights.to(values)).unsqueeze(-1) + posterior_transform.offset
            posterior_transform = None
        posterior = EnsemblePosterior(values=values, weights=self.ensemble_weights)
        return posterior if posterior_transform is None else posterior_transform(posterior=posterior, X=X)

    def _noise(self, values):
        """Each member's observation noise, drawn under the surrogate's seed: ``sigma_s * eps``."""
        likelihood = self.model.likelihood
        # drawn on the host: one seed gives the same noise on every device
        generator = torch.Generator(device="cpu").manual_seed(self.seed)
        eps = torch.randn(values.shape, generator=generator, dtype=values.dtype, device="cpu").to(values.device)
        if isinstance(likelihood, HeteroscedasticGaussianLikelihood):
            raise UnsupportedError("observation_noise=True with a heteroscedastic likelihood is not supported")
        latents = list(likelihood.latent_sites())
        if latents:
            scale = self.draws()[latents[0]].reshape(-1, 1, 1).to(values)
        else:
            scale = likelihood.scale().detach().reshape(1, 1, 1).to(values)
        return scale * eps


class LaplaceSurrogate(Surrogate, Model):
    r"""The Laplace approximation's linearized predictive as BoTorch's ``GPyTorchPosterior``, with
    the joint covariance over each batch's points (the module docstring gives the math). Needs the
    fitted laplace-torch object: a result fitted in this session, not a reloaded one.

    ``spread_bound``, a GP in the network's units (inputs as the network sees them, outcomes
    transformed), bounds each point's standard deviation by that GP's posterior standard
    deviation there (the correlations kept; ``fit_surrogate``'s ``"bounded"`` form passes the
    calibration, the network's infinite-width limit fitted to the same data).

    ``relu_temperature`` :math:`\tau` (for a perceptron, whose tangent kernel is taken in closed
    form): its ReLU units' slopes in the linearization are :math:`\mathrm{sigmoid}(z/\tau)`, a
    softplus's, instead of steps, so the variance is continuous in ``X`` (with steps it jumps
    wherever a unit turns on or off, and an acquisition's L-BFGS-B line search fails there); the
    mean is the ReLU network's. ``fit_surrogate``'s ``"bounded"`` form passes
    :data:`RELU_TEMPERATURE`."""

    def __init__(self, result: LaplacePosterior, train_X, train_Y, *, input_transform=None, outcome_transform=None,
                 spread_bound=None, relu_temperature: Optional[float] = None, _record: SurrogateFit = None):
        if not isinstance(result, LaplacePosterior):
            raise TypeError(f"result must be a LaplacePosterior, got {type(result).__name__}")
        if result.approximation is None:
            raise ValueError("this Laplace result was loaded from a file and has no curvature: use "
                             "PosteriorSurrogate(result, ..., linearized=True) (its draws), or refit")
        if spread_bound is not None and not isinstance(spread_bound, Model):
            raise TypeError(f"spread_bound must be a BoTorch Model (a GP in the network's units), got {type(spread_bound).__name__}")
        super().__init__()
        _check_regression(result.model)
        train_X, train_Y = _check_xy(train_X, train_Y)
        self.result = result
        self.fit_record = _record or SurrogateFit(
            "laplace", result.model, {}, result.num_draws, 0, 1.0, "joint", train_X, train_Y, input_transform, outcome_transform,
        )
        if input_transform is not None:
            self.input_transform = input_transform
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform.eval()
        self._train_inputs = _network_inputs(input_transform, train_X)
        self._kernel = None
        self._tangent = None  # the closed form's posterior; False where the network has not its form
        self._bound_factor = None  # the spread bound's variance, factorized once; False where it is not an exact GP
        self.spread_bound = spread_bound
        self.relu_temperature = relu_temperature
        if relu_temperature is not None:
            if not (isinstance(relu_temperature, (int, float)) and 0 < relu_temperature < math.inf):
                raise ValueError(f"relu_temperature must be a positive finite number, got {relu_temperature!r}")
            if self._closed_form() is None:
                raise ValueError("relu_temperature smooths the closed-form tangent kernel of a perceptron's full GGN posterior "
                                 "under a Gaussian likelihood; this network or posterior has not that form")

    def _mean_and_jacobians(self, x):
        """``f(x, w_MAP)`` ``(n, m)`` and the Jacobians ``(n, m, P)`` in the covered weights, in
        laplace-torch's order of the parameter vector; both differentiable in ``x``."""
        result = self.result
        return parameter_jacobians(result.map_net, {n: result.map_values[n] for n in result.covered_names}, x)

    def posterior(self, X, output_indices=None, observation_noise=False, posterior_transform=None, **kwargs):
        """A Gaussian over the ``q`` points of each batch of ``X`` (``batch x q x d``): for a
        perceptron in function space, from the tangent kernel in closed form (``_closed_form``;
        memory grows with ``b q (h + N) m``), else from the Jacobians, formed for a chunk of batches
        at a time (:data:`JACOBIAN_CHUNK_BYTES`)."""
        self.eval()
        X = self.transform_inputs(X)
        model = self.result.model
        batch, (q, d) = X.shape[:-2], X.shape[-2:]
        flat = X.reshape(-1, q, d).to(model.dtype)
        b, m = flat.shape[0], self.num_outputs
        closed_form = self._closed_form()
        if closed_form is not None:  # its layers behave alike in training and evaluation: no modes to set
            outputs, cov = closed_form.predict(flat)
            mean = _locations(model, outputs.reshape(b * q, -1)).reshape(b, q, m)
        else:
            with eval_mode(model.net, self.result.map_net):
                mean, cov = self._from_jacobians(flat)
        mean, cov = mean.to(X.dtype), cov.to(X.dtype)
        if self.spread_bound is not None:
            bound_x = flat.to(self.spread_bound.train_inputs[0].dtype)  # a float32 network's calibration is float64
            cov = _bounded_spread(cov, self._bound_variance(bound_x).reshape(b, q * m).to(cov))
        if isinstance(observation_noise, torch.Tensor):
            raise UnsupportedError("observation_noise as a tensor of variances is not supported: pass True for the model's own noise")
        if observation_noise:
            cov = cov + self._noise_variance().to(cov) * torch.eye(q * m, dtype=cov.dtype, device=cov.device)
        cov = cov + 1e-10 * torch.eye(q * m, dtype=cov.dtype, device=cov.device)  # rounding: a PSD Cholesky
        mean = mean.reshape(batch + (q, m))
        cov = cov.reshape(batch + (q * m, q * m))
        if m == 1:
            dist = MultivariateNormal(mean.squeeze(-1), covariance_matrix=cov)
        else:
            dist = MultitaskMultivariateNormal(mean, covariance_matrix=cov)
        posterior = GPyTorchPosterior(dist)
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=X)
        if output_indices is not None:
            raise UnsupportedError("output_indices: a Laplace surrogate's posterior covers all outcomes jointly")
        return posterior if posterior_transform is None else posterior_transform(posterior)

    def _bound_variance(self, x):
        """The spread bound's posterior variances at ``x`` ``(b, q, d)``: ``(b, q, m)``, from its
        factorization formed once where it is a one-outcome exact GP (:class:`ExactGPVariance`)."""
        if self._bound_factor is None:
            self._bound_factor = ExactGPVariance.of(self.spread_bound) or False
        if self._bound_factor:
            return self._bound_factor(x).unsqueeze(-1)
        return self.spread_bound.posterior(x).variance

    def _from_jacobians(self, flat):
        """The mean ``(b, q, m)`` and joint covariances ``(b, q m, q m)`` at ``flat``
        ``(b, q, d)`` from the Jacobians, a chunk of batches at a time."""
        model, la = self.result.model, self.result.approximation
        b, q, d = flat.shape
        m = self.num_outputs
        weights = sum(self.result.map_values[n].numel() for n in self.result.covered_names)
        chunk = max(1, JACOBIAN_CHUNK_BYTES // max(q * m * weights * flat.element_size(), 1))
        means, covs = [], []
        for i in range(0, b, chunk):
            part = flat[i : i + chunk]
            c = part.shape[0]
            mean, Js = self._mean_and_jacobians(part.reshape(-1, d))
            Js = Js[:, :m].reshape(c, q * m, -1)
            kernel = self._training_kernel()
            if kernel is not None:
                cov = kernel.posterior_covariance(Js)
            else:
                cov = _joint_covariances(la, Js, self._full_covariance())
            means.append(_locations(model, mean).reshape(c, q, m))
            covs.append(cov)
        return torch.cat(means), torch.cat(covs)

    def _in_function_space(self) -> bool:
        """Whether the posterior is taken in function space: a full GGN under a Gaussian
        likelihood, from fewer training values than weights (where the weight space is the
        cheaper form)."""
        la = self.result.approximation
        return _full_regression_ggn(la) and self._train_inputs.shape[0] * self.num_outputs < la.n_params

    def _training_kernel(self):
        """The full GGN's posterior in function space
        (:class:`~pyrobnn.infer.modes.laplace.FunctionSpaceLaplace`), formed once
        from the training Jacobians; ``None`` for another structure or likelihood, or from as
        many training values as weights on (where the weight space is the cheaper form)."""
        la = self.result.approximation
        if not self._in_function_space():
            return None
        if self._kernel is None:
            m = self.num_outputs
            x = self._train_inputs.to(self.result.model.dtype)
            with torch.no_grad(), eval_mode(self.result.model.net, self.result.map_net):
                _, J = self._mean_and_jacobians(x)
            J = J[:, :m].reshape(x.shape[0] * m, -1)
            self._kernel = function_space_posterior(la, J)
        return self._kernel

    def _closed_form(self):
        """The function-space posterior of :meth:`_training_kernel` with its kernel in closed form
        (:class:`~pyrobnn.infer.modes.tangent_kernel.TangentKernelLaplace`), formed once; ``None``
        where that posterior is not the form or the network is not a perceptron whose layers'
        prior variances are one per weight matrix and bias (then the Jacobians are formed). The
        same numbers; an acquisition's evaluation and its gradient without a reverse pass per
        point. With a ``relu_temperature`` it is taken from as many training values as weights
        too (an ``N x N`` Cholesky once), the one form that has the smooth step."""
        if self._tangent is None:
            self._tangent = False
            result, la = self.result, self.result.approximation
            if self._in_function_space() or (self.relu_temperature is not None and _full_regression_ggn(la)):
                kernel = _perceptron_kernel(result, self.relu_temperature)
                if kernel is not None:
                    with eval_mode(result.model.net, result.map_net):
                        self._tangent = TangentKernelLaplace(kernel, self._train_inputs.to(result.model.dtype),
                                                             effective_noise_variance(la), self.num_outputs)
        return self._tangent or None

    def _full_covariance(self):
        """A full Laplace's weight-space posterior covariance, formed once (where the function
        space is not the cheaper form): laplace-torch's ``posterior_covariance`` multiplies its
        P x P scale factors at every access (seconds at P = 3000, at every step of an
        acquisition's optimizer); ``None`` for another structure."""
        from laplace.baselaplace import FullLaplace

        if not isinstance(self.result.approximation, FullLaplace):
            return None
        if getattr(self, "_covariance", None) is None:
            self._covariance = self.result.approximation.posterior_covariance.detach()
        return self._covariance

    def _noise_variance(self):
        result = self.result
        if result.latent_names:
            return result.map_values[result.latent_names[0]].detach() ** 2
        return result.model.likelihood.scale().detach() ** 2


def _full_regression_ggn(la) -> bool:
    """Whether the laplace-torch approximation ``la`` is a full GGN under a Gaussian likelihood."""
    from laplace.baselaplace import FullLaplace
    from laplace.utils.enums import Likelihood

    return isinstance(la, FullLaplace) and la.likelihood == Likelihood.REGRESSION


def _perceptron_kernel(result: LaplacePosterior, relu_temperature=None):
    """The closed-form tangent kernel of ``result``'s network at its MAP under its prior
    precisions (:meth:`MLPTangentKernel.of`), or ``None`` where the network is not a perceptron."""
    la = result.approximation
    point = {n: result.map_values[n].detach() for n in result.covered_names}
    return MLPTangentKernel.of(result.map_net, point, 1.0 / la.prior_precision_diag.detach().to(result.model.dtype),
                               relu_temperature=relu_temperature)


class ExactGPVariance:
    r"""The posterior variance of an exact GP with Gaussian noise of one variance,
    :math:`v(x) = k(x, x) - k_{xX} (K_{XX} + \sigma^2 I)^{-1} k_{Xx}`, with the Cholesky factor
    of :math:`K_{XX} + \sigma^2 I` formed once: what ``gp.posterior(x).variance`` gives (GPyTorch's
    floor on a variance rounded below it included), without forming the test points' joint
    covariance or GPyTorch's lazy tensors at each call. :meth:`of` says whether ``gp`` has the form:
    a one-outcome BoTorch ``SingleTaskGP`` without transforms. With pyrobnn's infinite-width kernel
    (the calibration's) the kernel's two parts, :math:`k(x, x)` and :math:`k_{xX}`, come from one
    pass over its layers with the training inputs' layer variances formed once
    (:class:`~pyrobnn.models.infinite_width.NNGPCrossCovariance`): a call and its gradient 2.4
    times faster at a ReLU calibration of 30 points (``docs/bayesopt.md``, "Laplace's step within
    3x of the GP's")."""

    def __init__(self, gp):
        from gpytorch import settings

        self._kernel = gp.covar_module
        self._train = gp.train_inputs[0]
        with torch.no_grad():
            k = _dense(self._kernel(self._train))
            noise = gp.likelihood.noise.reshape(())
            eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
            self._cholesky = torch.linalg.cholesky(k + noise * eye)
        self._floor = settings.min_variance.value(k.dtype)
        self._against_train = None
        if type(self._kernel) is InfiniteWidthKernel:  # not a subclass: a batch of kernels is another function
            self._against_train = NNGPCrossCovariance(self._kernel.network(), self._train)

    @classmethod
    def of(cls, gp) -> Optional["ExactGPVariance"]:
        from botorch.models import SingleTaskGP
        from gpytorch.likelihoods import GaussianLikelihood as NoiseLikelihood
        from gpytorch.likelihoods.noise_models import HomoskedasticNoise

        if type(gp) is not SingleTaskGP or hasattr(gp, "input_transform") or hasattr(gp, "outcome_transform"):
            return None
        if gp.num_outputs != 1 or gp.train_inputs[0].dim() != 2 or len(gp.covar_module.batch_shape) != 0:
            return None
        if type(gp.likelihood) is not NoiseLikelihood or type(gp.likelihood.noise_covar) is not HomoskedasticNoise:
            return None
        return cls(gp)

    def __call__(self, x) -> torch.Tensor:
        """The variances at ``x`` ``(..., d)``: ``(...)``."""
        d = self._train.shape[-1]
        if x.dim() == 0 or x.shape[-1] != d:
            raise ValueError(f"x must be (..., {d}): points by the GP's {d} inputs, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, x.shape[-1])
        if self._against_train is not None:
            prior, cross = self._against_train(flat)
            cross = cross.T
        else:
            prior = _dense(self._kernel.forward(flat, flat, diag=True))
            cross = _dense(self._kernel.forward(self._train, flat))
        v = torch.linalg.solve_triangular(self._cholesky, cross, upper=False)
        variance = prior - (v * v).sum(-2)
        return torch.where(variance < self._floor, torch.full_like(variance, self._floor), variance).reshape(x.shape[:-1])


def _dense(values) -> torch.Tensor:
    return values.to_dense() if hasattr(values, "to_dense") else values


def _bounded_spread(cov, variance):
    """``cov`` ``(b, k, k)`` with each point's standard deviation lowered to at most
    ``sqrt(variance)`` ``(b, k)``: :math:`D C D`, :math:`D = \\mathrm{diag}(\\min(1, \\sqrt{v / C_{ii}}))`,
    the correlations kept."""
    scale = (variance / cov.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(cov.dtype).tiny)).sqrt().clamp(max=1.0)
    return scale.unsqueeze(-1) * cov * scale.unsqueeze(-2)


def _joint_covariances(la, Js, full_covariance=None):
    """:math:`J_b \\Sigma J_b^\\top` for each batch ``b`` of Jacobians ``Js`` ``(c, q m, P)``:
    laplace-torch's ``functional_covariance``, batched over ``b`` for its full, diagonal and
    Kronecker-factored posteriors (one product instead of ``c``), looped for any other; a full
    posterior's :math:`\\Sigma` is ``full_covariance`` when given (formed once by the caller)."""
    from laplace.baselaplace import DiagLaplace, FullLaplace, KronLaplace

    if isinstance(la, KronLaplace):
        return la.posterior_precision.inv_square_form(Js)
    if isinstance(la, FullLaplace):
        sigma = la.posterior_covariance if full_covariance is None else full_covariance
        return Js @ sigma @ Js.transpose(-1, -2)
    if isinstance(la, DiagLaplace):
        return (Js * la.posterior_variance) @ Js.transpose(-1, -2)
    return torch.stack([la.functional_covariance(J.unsqueeze(1)) for J in Js])


class BNNSurrogate(PosteriorSurrogate):
    """A surrogate built from data and fitted by :meth:`fit`, as BoTorch's own model classes are:
    what Ax's modular BoTorch generator constructs (``construct_inputs`` gives ``train_X`` and
    ``train_Y``; :mod:`pyrobnn.integrations.ax` registers :meth:`fit` as its fit function). The
    members are buffers, so a state saved with ``state_dict`` reloads into a new, unfitted one
    (Ax's cross-validation) and predicts without refitting. The keywords are those of
    :func:`fit_surrogate`; Laplace runs in its ``"samples"`` form (an ensemble)."""

    # the transforms are positional-or-keyword: Ax passes them only to a class whose positional
    # arguments name them
    def __init__(self, train_X, train_Y, train_Yvar=None, input_transform=None, outcome_transform="standardize", *,
                 method: str = DEFAULT_METHOD, model=None, options=None, num_samples: int = 32, seed: int = 0,
                 warm_fraction: float = 0.25, activations=None):
        EnsembleModel.__init__(self)
        record = _record(train_X, train_Y, method, model, options, num_samples, seed, input_transform, outcome_transform,
                         warm_fraction, "samples", activations)
        self.fit_record = record
        self.model = record.model
        self.result = None
        self.seed = int(seed)
        self.linearized = method == "laplace"
        self._num_outputs = record.train_Y.shape[-1]
        self._site_names = site_order(self.model)
        if record.input_transform is not None:
            self.input_transform = record.input_transform
        if record.outcome_transform is not None:
            self.outcome_transform = record.outcome_transform
            with torch.no_grad():  # fitted to the data now, so that a reloaded state predicts in its units
                record.outcome_transform.train()
                record.outcome_transform(record.train_Y)
                record.outcome_transform.eval()

    @classmethod
    def construct_inputs(cls, training_data, **options) -> dict:
        """BoTorch's inputs from a ``SupervisedDataset`` (``train_X``, ``train_Y``; a
        ``train_Yvar`` is accepted and not used: the likelihood's noise is the model's) with the
        surrogate's keywords passed through (Ax's ``model_options``)."""
        return {**Model.construct_inputs.__func__(cls, training_data), **options}

    @property
    def fitted(self) -> bool:
        return hasattr(self, "draw_0")

    def fit(self, previous=None) -> "BNNSurrogate":
        """Run the method on the training data (from ``previous``'s posterior, a result, when
        given) and take its members; returns ``self``."""
        result, record, input_transform, outcome_transform = _fit_result(self.fit_record, self.fit_record.train_X,
                                                                         self.fit_record.train_Y, previous)
        self.fit_record = record
        self.model = record.model  # a calibrated fit's model has the data's prior and noise
        if input_transform is not None:
            self.input_transform = input_transform
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform
        self._set_members(result, record.num_samples)
        return self

    def forward(self, X):
        if not self.fitted:
            raise RuntimeError("this BNNSurrogate has no members yet: call fit() or load_state_dict()")
        return super().forward(X)


# -- fitting --------------------------------------------------------------------------------------
def fit_surrogate(
    train_X,
    train_Y,
    method: str = DEFAULT_METHOD,
    *,
    model=None,
    options: Optional[dict] = None,
    num_samples: int = 64,
    seed: int = 0,
    input_transform=None,
    outcome_transform="standardize",
    warm_fraction: float = 0.25,
    laplace_form: Optional[str] = None,
    activations=None,
):
    """Fit a BNN surrogate to ``(train_X, train_Y)`` with ``method`` and return it as a BoTorch model.

    :param train_X: ``(n, d)`` inputs (e.g. in the unit cube).
    :param train_Y: ``(n, m)`` outcomes (or ``(n,)``).
    :param method: a registered method's key (:mod:`pyrobnn.methods`): ``"nuts"`` (the default,
        :data:`DEFAULT_METHOD`), ``"mclmc"``, ``"deep_ensemble"``, ``"laplace"``, ``"ivon"``,
        ``"swag"``, ``"sgld"``, a guide's...
    :param model: a :class:`~pyrobnn.models.BayesianModel`, or ``model(d, m) -> BayesianModel``;
        default: at every fit, :func:`~pyrobnn.integrations.infinite_width_gp.calibrated_model` of
        the (transformed) training data, a ``d-50-50-m`` network whose prior scales and noise
        are fitted by the marginal likelihood of its infinite-width limit (the shape of
        :func:`default_model`), and for a method whose ``MethodSpec.bo_limit_network`` is set,
        its activation (erf or ReLU, or one of ``activations``) and output mean too; otherwise
        erf. Its dtype is the
        surrogate's working precision.
    :param options: the method's options, merged over its ``bo_options``
        (:class:`~pyrobnn.methods.MethodSpec`).
    :param num_samples: ensemble members (weight draws) of a :class:`PosteriorSurrogate`.
    :param seed: seeds the fit and the choice of members.
    :param input_transform: a BoTorch input transform (e.g. ``Normalize(d)``), applied as in
        BoTorch's models.
    :param outcome_transform: a BoTorch outcome transform, ``"standardize"`` (``Standardize(m)``,
        the default, as BoTorch's GPs) or ``None``.
    :param warm_fraction: the fraction of the cold fit's tuning or training budget a warm refit
        (``condition_on_observations``, ``refit``) spends.
    :param laplace_form: for ``method="laplace"``: ``"bounded"`` (the default with the default
        model: a :class:`LaplaceSurrogate` whose standard deviation at each point is at most its
        calibration's posterior standard deviation there, the network its calibration's whole
        network, its ReLU units linearized through a smooth step, :data:`RELU_TEMPERATURE`, where
        the posterior is a full GGN), ``"joint"`` (the default with a given model: a :class:`LaplaceSurrogate`,
        Gaussian with laplace-torch's joint covariance) or ``"samples"`` (a
        :class:`PosteriorSurrogate` over the linearized predictive at the result's draws).
    :param activations: for the default model of a method whose ``MethodSpec.bo_limit_network``
        is set (or of Laplace's ``"bounded"`` form): the activations its calibration chooses among
        (default: the method's ``MethodSpec.bo_activations``, for NUTS erf, ReLU and the cosine
        network, whose prior is stationary; for the others
        :data:`~pyrobnn.integrations.infinite_width_gp.DEFAULT_ACTIVATIONS`, erf and ReLU), e.g.
        ``("erf", "relu", "cos")`` to offer the cosine network to another method.
    """
    record = _record(train_X, train_Y, method, model, options, num_samples, seed, input_transform, outcome_transform,
                     warm_fraction, laplace_form, activations)
    return _fit(record, record.train_X, record.train_Y, previous=None)


def _record(train_X, train_Y, method, model, options, num_samples, seed, input_transform, outcome_transform,
            warm_fraction, laplace_form, activations=None) -> SurrogateFit:
    """Check a surrogate's arguments and gather them (the model built, the options merged)."""
    if method not in methods.METHODS:
        raise ValueError(f"method must be one of {list(methods.METHODS)}, got {method!r}")
    if laplace_form is None:
        laplace_form = "bounded" if model is None else "joint"
    if laplace_form not in ("joint", "bounded", "samples"):
        raise ValueError(f"laplace_form must be 'joint', 'bounded' or 'samples', got {laplace_form!r}")
    if laplace_form == "bounded" and model is not None:
        raise ValueError("laplace_form='bounded' bounds the spread by the default model's calibration, which a given model has not")
    if activations is not None:
        if model is not None:
            raise ValueError("activations choose the default model's network; with a model given there is none to choose")
        if not takes_limit_network(method, laplace_form):
            hint = " (laplace_form='bounded' takes its limit's)" if method == "laplace" else ""
            raise ValueError(f"activations: the default surrogate of {method!r} is an erf network (its MethodSpec.bo_limit_network "
                             f"is false){hint}, whose activation the calibration does not choose")
        source = "activations"
    elif model is None and takes_limit_network(method, laplace_form):
        activations = methods.spec(method).bo_activations  # None: the calibration's default
        source = f"MethodSpec.bo_activations of {method!r}"
    if activations is not None:
        try:
            activations = checked_activations(activations)
        except ValueError as error:  # named by where the set came from, not by the fit
            raise ValueError(f"{source}: {error}") from None
    if not 0.0 < float(warm_fraction) <= 1.0:
        raise ValueError(f"warm_fraction must be in (0, 1], got {warm_fraction!r}")
    train_X, train_Y = _check_xy(train_X, train_Y)
    d, m = train_X.shape[-1], train_Y.shape[-1]
    calibrate = model is None
    if calibrate:
        model = default_model(d, m, dtype=train_X.dtype if train_X.dtype.is_floating_point else torch.float64)
    elif not isinstance(model, BayesianModel):
        if not callable(model):
            raise TypeError(f"model must be a BayesianModel or a callable (d, m) -> BayesianModel, got {type(model).__name__}")
        model = model(d, m)
        if not isinstance(model, BayesianModel):
            raise TypeError(f"model(d, m) must return a BayesianModel, got {type(model).__name__}")
    _check_regression(model)
    if isinstance(outcome_transform, str):
        if outcome_transform != "standardize":
            raise ValueError(f"outcome_transform must be a BoTorch OutcomeTransform, 'standardize' or None, got {outcome_transform!r}")
        outcome_transform = Standardize(m=m)
    merged = {**methods.spec(method).bo_options, **(options or {})}
    if "progress" in _parameters(method):
        merged.setdefault("progress", False)
    return SurrogateFit(method, model, merged, num_samples, seed, float(warm_fraction), laplace_form, train_X, train_Y,
                        input_transform, outcome_transform, calibrate=calibrate, activations=activations)


def takes_limit_network(method: str, laplace_form: str = "bounded") -> bool:
    """Whether ``method``'s default surrogate's network is its limit's whole network (the
    activation and constant mean its calibration chose, among ``activations``): its
    ``MethodSpec.bo_limit_network``, or Laplace's ``"bounded"`` form (its default with the
    default model), whose spread is bounded by that limit's posterior."""
    return methods.spec(method).bo_limit_network or (method == "laplace" and laplace_form == "bounded")


def _parameters(method) -> tuple:
    return tuple(inspect.signature(methods.spec(method).run).parameters)


def _network_inputs(input_transform, train_X):
    """The training inputs as the network sees them: ``input_transform``'s preprocessing, as
    BoTorch's models apply it at training."""
    if input_transform is None:
        return train_X
    with torch.no_grad():
        input_transform.train()
        x = input_transform.preprocess_transform(train_X)
        input_transform.eval()
    return x


def _fit_result(record: SurrogateFit, train_X, train_Y, previous=None):
    """Run ``record``'s method on ``(train_X, train_Y)`` (original units, transformed here), from
    ``previous``'s posterior when given: the result, the new record and the fitted transforms."""
    input_transform = copy.deepcopy(record.input_transform)
    outcome_transform = copy.deepcopy(record.outcome_transform)
    x = _network_inputs(input_transform, train_X)
    with torch.no_grad():
        y = train_Y
        if outcome_transform is not None:
            outcome_transform.train()
            y, _ = outcome_transform(train_Y)
            outcome_transform.eval()
    model = record.model
    x, y = x.to(model.dtype), y.to(model.dtype)
    start = time.perf_counter()
    method = methods.spec(record.method)
    calibration, calibration_seconds = None, 0.0
    if record.calibrate:  # the prior and noise chosen by these data (empirical Bayes), at every fit
        limit_network = takes_limit_network(record.method, record.laplace_form)
        if not limit_network:
            activation = dict(activation="erf")
        else:  # the limit's network: the activation the calibration chooses, among the default's or the record's
            activation = {} if record.activations is None else dict(activation=record.activations)
        from_previous = previous is not None and method.warm_start is not None and record.calibration is not None
        calibration = calibration_fit(x, y, depth=infinite_width_of(record.model).depth, **activation,
                                      warm_start=record.calibration if from_previous else None)
        calibration_seconds = time.perf_counter() - start
        model = finite_model(calibration, width=_width(record.model), output_mean=limit_network, dtype=model.dtype)
    y_fit = y.reshape(-1) if y.shape[-1] == 1 and _one_output(model, x) else y
    options = dict(record.options)
    options.setdefault("seed", record.seed)
    warm = previous is not None and method.warm_start is not None
    if warm and record.calibrate and infinite_width_of(previous.model).activation != infinite_width_of(model).activation:
        warm = False  # the data chose the other activation: the previous posterior is another network's
    if warm:
        options = method.warm_start.options(method, model, previous, x, y_fit, options, record.warm_fraction, record.seed)
    result = method.run(model, x, y_fit, **options)
    seconds = time.perf_counter() - start
    new = dataclasses.replace(record, model=model, train_X=train_X, train_Y=train_Y, seconds=seconds, calibration_seconds=calibration_seconds,
                              warm=warm, calibration=calibration,
                              input_transform=record.input_transform, outcome_transform=record.outcome_transform)
    return result, new, input_transform, outcome_transform


def _fit(record: SurrogateFit, train_X, train_Y, previous=None):
    """Fit ``record``'s method to ``(train_X, train_Y)`` (original units), from ``previous``'s
    posterior when given, and wrap the result."""
    result, new, input_transform, outcome_transform = _fit_result(record, train_X, train_Y, previous)
    if record.method == "laplace" and record.laplace_form in ("joint", "bounded"):
        bound = new.calibration if record.laplace_form == "bounded" else None
        # the bounded form's smooth ReLU step, where its posterior has the closed form it smooths: a full GGN (its network
        # is always the default perceptron); with another Hessian the steps stay
        smooth = bound is not None and _full_regression_ggn(result.approximation)
        return LaplaceSurrogate(result, train_X, train_Y, input_transform=input_transform, outcome_transform=outcome_transform,
                                spread_bound=bound, relu_temperature=RELU_TEMPERATURE if smooth else None, _record=new)
    return PosteriorSurrogate(result, train_X, train_Y, num_samples=record.num_samples, seed=record.seed,
                              input_transform=input_transform, outcome_transform=outcome_transform,
                              linearized=record.method == "laplace", _record=new)


def _width(model) -> int:
    """The hidden width of a :func:`default_model`-shaped network (its first linear layer's outputs)."""
    return model.net[1].out_features


def _one_output(model, x) -> bool:
    with torch.no_grad(), eval_mode(model.net):
        return model.net(x[:1]).shape[-1] == 1

