r"""The Laplace approximation of a BayesianModel's posterior, with laplace-torch's curvature.

Around the MAP :math:`\hat w = \arg\max_w \log p(y \mid x, w) + \log p(w)` of the model's own
log joint (its prior, not only a weight decay), the posterior is approximated by

.. math:: q(w) = N\!\left(\hat w,\; \big(H + \Lambda_0\big)^{-1}\right), \qquad
          H \approx -\nabla^2_w \log p(y \mid x, w)\big|_{\hat w},

with :math:`\Lambda_0` the prior precision (Denker & LeCun 1991; MacKay 1992) and :math:`H` the
generalized Gauss-Newton matrix in full, diagonal or Kronecker-factored (KFAC) form, over all
random weights or the last layer only ("Laplace Redux", Daxberger et al. 2021). The curvature,
the marginal likelihood

.. math:: \log p(y \mid x) \approx \log p(y \mid x, \hat w) + \log p(\hat w)
          - \tfrac12 \log\det\big((H + \Lambda_0)/(2\pi)\big)

and the linearized (GLM) predictive :math:`f(x, w) \approx f(x, \hat w) + J(x)(w - \hat w)`
(Immer et al. 2021) come from laplace-torch (Daxberger et al. 2021), on a deterministic copy of
the network at the MAP; this module maps the model's priors and likelihood onto it and maps its
weight samples back onto the model's sites, so that the result is a posterior sample container
like NUTS's (:func:`pyrobnn.predict`, ``pyro.infer.Predictive``, :mod:`pyrobnn.infer.results.diagnostics`).

With a full GGN under a Gaussian likelihood and fewer training values :math:`N` than covered
weights :math:`P` (a surrogate for Bayesian optimization: tens of points, thousands of weights),
the draws and the prior tuning are computed in function space instead
(:class:`FunctionSpaceLaplace`; Khan et al. 2019, Immer et al. 2021): the same posterior and the
same marginal likelihood, exactly, with ``N x N`` factorizations where laplace-torch factors
``P x P`` ones at every tuning step.

Supported (its declaration in :mod:`pyrobnn.methods`): Gaussian priors
(:class:`~pyrobnn.models.priors.NormalPrior`, one precision per site; the marginal likelihood can tune
them per site), a Gaussian likelihood with a fixed noise scale or a noise scale with a prior (held
at its MAP value: the approximation covers the weights), a categorical likelihood, and a Bernoulli
likelihood with one output (handed to laplace-torch as the two-class logits :math:`(0, f)`, whose
softmax is :math:`(1 - \sigma(f), \sigma(f))`, so its categorical GGN is the Bernoulli one). Other
priors have no Gaussian precision to hand over, and laplace-torch has no heteroscedastic
likelihood: both are refused at the call. The network is evaluated in eval mode (dropout off,
batch normalization on its running statistics), as by every method that builds a potential.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

from pyrobnn.infer.modes.ensemble import EnsemblePosterior, deep_ensemble, warm_map
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.results.protocol import evenly_spaced
from pyrobnn.methods import LATENT_ONLY, MethodSpec, Support, WarmStart, checked, register
from pyrobnn.models.likelihoods import BernoulliLikelihood, GaussianLikelihood
from pyrobnn.utils import memory
from pyrobnn.utils.constraints import Budget, Either, OneOf
from pyrobnn.utils.runtime import tensor_defaults
from pyrobnn.utils.validation import as_tensor, check_finite, check_forward, check_positive_int, validate_training_data

__all__ = ["LaplacePosterior", "laplace", "linearized_outputs", "parameter_jacobians", "FunctionSpaceLaplace", "function_space_posterior", "effective_noise_variance", "tune_prior_in_function_space", "tune_prior_precisions", "TwoClassLogits", "SUBSETS", "HESSIANS", "CURVATURE_BATCH"]

SUBSETS = ("all", "last_layer")
HESSIANS = ("full", "diag", "kron")
#: the most points per batch of the curvature pass where ``batch_size`` is not given
CURVATURE_BATCH = 256


@dataclass
class LaplacePosterior(Posterior):
    """Draws from the Laplace posterior as one chain (``{site: (1, S, *shape)}``), with the
    fitted laplace-torch object (``approximation``) for the linearized predictive and the
    marginal likelihood. With ``subset="last_layer"`` the other sites sit at the MAP in every
    draw."""

    approximation: object = None
    map_values: dict = None
    map_net: object = None  # the network at the MAP (deterministic copy), for the linearized predictive
    likelihood: object = None
    covered_names: tuple = ()  # the sites with a Gaussian posterior; the others sit at the MAP
    latent_names: tuple = ()
    family: str = "laplace"
    saved_fit: dict = None  # the prior precision and marginal likelihood of a loaded posterior

    @property
    def log_marginal_likelihood(self) -> float:
        """The Laplace approximation of :math:`\\log p(y \\mid x)` at the current prior precision
        (for a loaded posterior, at the precision it was saved with)."""
        if self.approximation is None:
            return self.saved_fit["log_marginal_likelihood"]
        with torch.no_grad():
            return float(self.approximation.log_marginal_likelihood())

    @property
    def prior_precision(self) -> torch.Tensor:
        """One prior precision per site covered, or one for the last layer where its sites
        share theirs (after tuning, if it was tuned)."""
        if self.approximation is None:
            return self.saved_fit["prior_precision"].clone()
        precision = self.approximation.prior_precision.detach().clone()
        sizes = [self.map_values[n].numel() for n in self.covered_names]
        if len(sizes) > 1 and precision.numel() == sum(sizes) > len(sizes):  # the last layer's, spread over its weights
            precision = precision[torch.as_tensor([0] + sizes[:-1], device=precision.device).cumsum(0)]
        return precision

    def _extra_state(self) -> dict:
        # laplace-torch's object holds code (its curvature backends), not only tensors: what the
        # verbs need is saved instead; the curvature itself is not
        return {
            "map_values": {k: v.detach().cpu() for k, v in self.map_values.items()},
            "covered_names": list(self.covered_names),
            "latent_names": list(self.latent_names),
            "prior_precision": self.prior_precision.cpu(),
            "log_marginal_likelihood": self.log_marginal_likelihood,
        }

    @classmethod
    def _from_saved(cls, fields, extra, model):
        values = {k: v.to(model.device) for k, v in extra["map_values"].items()}
        fit = {"prior_precision": extra["prior_precision"], "log_marginal_likelihood": extra["log_marginal_likelihood"]}
        return cls(
            **fields, model=model, map_values=values, map_net=model.deterministic_net(values).eval(), likelihood=model.likelihood,
            covered_names=tuple(extra["covered_names"]), latent_names=tuple(extra["latent_names"]), saved_fit=fit,
        )

    def _diagnostics(self) -> list:
        out = super()._diagnostics()
        out.append(f"log marginal likelihood (Laplace): {self.log_marginal_likelihood:.4g}")
        out.append(f"prior precision: {[round(v, 4) for v in self.prior_precision.reshape(-1).tolist()]}")
        weights = len(self.samples) - len(self.latent_names)
        out.append(f"Gaussian over {len(self.covered_names)} of {weights} weight sites; the others, and any noise scale, at the MAP")
        return out

    def predict(self, x, num_samples=None, *, seed=None, batch_size=None, sample_batch_size=None, linearized: bool = True):
        """The posterior predictive at ``x``: the linearized (GLM) predictive by default
        (:meth:`linearized_predict`, which Daxberger et al. 2021 recommend for the Laplace
        approximation: the network itself at Gaussian weight draws underfits), or with
        ``linearized=False`` the network at each draw (:func:`~pyrobnn.infer.results.predictive.predict_draws`,
        which takes ``sample_batch_size``). ``num_samples`` draws of the result are used, spread
        over them (``None``: all); ``batch_size`` points per pass (default: from the memory budget);
        ``seed`` is accepted for the protocol (both predictives use the stored draws)."""
        if not linearized:
            return super().predict(x, num_samples, seed=seed, batch_size=batch_size, sample_batch_size=sample_batch_size)
        if sample_batch_size is not None:
            raise TypeError("the linearized predictive runs every draw in one pass: sample_batch_size is for linearized=False")
        model = self._require_model("predict")
        x = as_tensor(x, "x", model.dtype)
        model.check_x(x)
        check_finite(x, "x")
        chosen = None
        if num_samples is not None:
            check_positive_int("num_samples", num_samples)
            chosen = evenly_spaced(self.num_draws, num_samples)
        return self.linearized_predict(x.to(self.map_values[self.covered_names[0]].device), batch_size, draws=chosen)

    def linearized_predict(self, x, batch_size=None, draws=None):
        """The GLM predictive (Immer et al. 2021): for each draw :math:`w_s` of this result the
        linearized network :math:`f(x, \\hat w) + J(x)(w_s - \\hat w)`, computed by forward-mode
        differentiation (one Jacobian-vector product per draw, all draws in one vmapped pass,
        never the Jacobian itself), summarized by the model's likelihood: a
        :class:`~pyrobnn.evaluation.predictions.RegressionPrediction` or a
        :class:`~pyrobnn.evaluation.predictions.ClassificationPrediction`. The points go through in chunks of
        ``batch_size`` (default: as many as the memory budget allows, :mod:`pyrobnn.utils.memory`)."""
        net = self.map_net
        rows = self.num_draws if draws is None else len(draws)
        per_point = memory.activation_bytes(net, x)
        if batch_size is None:
            batch_size = memory.points_per_chunk(x.shape[0], rows, per_point, memory.GRADIENT_FACTOR)
        else:
            check_positive_int("batch_size", batch_size)
            points = min(batch_size, x.shape[0])
            memory.check_fits(rows * points * per_point * memory.GRADIENT_FACTOR,
                              f"a linearized-predictive chunk of {points} points x {rows} draws", "batch_size")
        # only the sites the approximation covers vary (the last layer's, with subset="last_layer")
        primals = {n: self.map_values[n] for n in self.covered_names}
        chosen = slice(None) if draws is None else draws
        tangents = {n: self.samples[n][0, chosen] - self.map_values[n] for n in self.covered_names}
        outputs = []
        # torch's forward-mode AD loads its JVP decompositions on first use through torch.jit.script
        with torch.no_grad(), jit_script_deprecation_quiet():
            for i in range(0, x.shape[0], batch_size):
                outputs.append(linearized_outputs(net, primals, tangents, x[i : i + batch_size]))
        latents = {k: self.samples[k][0, chosen] for k in self.latent_names}
        return self.likelihood.summarize(torch.cat(outputs, 1), latents)


def linearized_outputs(net, point: dict, tangents: dict, x) -> torch.Tensor:
    """The linearized network :math:`f(x, \\hat w) + J(x)\\,t_s` for each row ``s`` of
    ``tangents`` (``{parameter: (S, *shape)}``) around ``point`` (``{parameter: value}``; the
    network's other parameters as they are), ``(S, N, ...)``: forward-mode products, all rows in
    one vmapped pass, never the Jacobian itself; differentiable in ``x``."""
    params = {n: p.detach() for n, p in net.named_parameters()}

    def f(values):
        return torch.func.functional_call(net, {**params, **values}, (x,))

    def linear(t):
        out, change = torch.func.jvp(f, (point,), (t,))
        return out + change

    return torch.func.vmap(linear)(tangents)


def parameter_jacobians(net, point: dict, x):
    r"""``f(x, w)`` ``(N, m)`` and its Jacobians ``(N, m, P)`` in the parameters of ``point``
    (``{name: value}``, in that order, flattened; the network's other parameters as they are),
    one reverse pass per point, vmapped; differentiable in ``x``."""
    params = {n: p.detach() for n, p in net.named_parameters()}

    def f(values, row):
        return torch.func.functional_call(net, {**params, **values}, (row.unsqueeze(0),)).squeeze(0)

    jac = torch.func.vmap(torch.func.jacrev(f), in_dims=(None, 0))(point, x)
    mean = torch.func.functional_call(net, {**params, **point}, (x,))
    n, m = x.shape[0], mean.shape[-1]
    return mean, torch.cat([jac[name].reshape(n, m, -1) for name in point], -1)


class FunctionSpaceLaplace:
    r"""The Laplace posterior of a full GGN under a Gaussian likelihood, in function space.

    With the training Jacobians :math:`J` (``(N, P)``: points times outcomes, weights), the prior
    covariance :math:`\Sigma_0 = \mathrm{diag}(s)` and the noise variance :math:`\sigma^2`, the
    GGN posterior :math:`\Sigma = (\Sigma_0^{-1} + J^\top J / \sigma^2)^{-1}` is, by the
    Woodbury identity and the matrix determinant lemma,

    .. math:: J_* \Sigma J_*^\top = K_{**} - K_{*X} (K_{XX} + \sigma^2 I)^{-1} K_{X*}, \qquad
              \log\det(\Sigma_0 \Sigma^{-1}) = \log\det(I + K_{XX} / \sigma^2),
              \qquad K_{ab} = J_a \Sigma_0 J_b^\top:

    a GP whose kernel is the network's prior-weighted tangent kernel at the MAP (Khan et al.
    2019, "Approximate Inference Turns Deep Networks into Gaussian Processes"; Immer et al.
    2021). Exact, at :math:`O(N^2 P + N^3)` once and :math:`O(q N P)` per batch of ``q`` points,
    where the weight space costs :math:`O(P^3)` and :math:`O(q P^2)`: the cheaper form while
    :math:`N < P` (tens to hundreds of points, thousands of weights). laplace-torch's
    ``FunctionalLaplace`` is this GP but takes one prior precision for all weights and forms the
    training Jacobians again at every prediction. ``prior_variance`` may carry gradients (the
    marginal likelihood's)."""

    def __init__(self, J, prior_variance, noise_variance):
        self.J, self.prior_variance = J, prior_variance
        self.noise_variance = torch.as_tensor(noise_variance, dtype=J.dtype, device=J.device)
        self.scaled = J * prior_variance  # J Sigma_0, (N, P)
        eye = torch.eye(J.shape[0], dtype=J.dtype, device=J.device)
        self.cholesky = torch.linalg.cholesky(self.scaled @ J.T + noise_variance * eye)

    @property
    def log_det_ratio(self) -> torch.Tensor:
        r""":math:`\log\det(\Sigma_0 \Sigma^{-1}) = \log\det(K_{XX} + \sigma^2 I) - N \log \sigma^2`."""
        n = self.J.shape[0]
        return 2 * self.cholesky.diagonal().log().sum() - n * torch.log(self.noise_variance)

    def sample(self, mean, num_samples: int, generator=None) -> torch.Tensor:
        r"""``num_samples`` draws ``(S, P)`` from :math:`N(\hat w, \Sigma)`, ``mean`` :math:`\hat w`,
        by Matheron's rule: with :math:`\epsilon_0 \sim N(0, \Sigma_0)` and
        :math:`\epsilon \sim N(0, \sigma^2 I)`,
        :math:`\hat w + \epsilon_0 - \Sigma_0 J^\top (K_{XX} + \sigma^2 I)^{-1} (J \epsilon_0 + \epsilon)`
        has covariance :math:`\Sigma_0 - \Sigma_0 J^\top (K_{XX} + \sigma^2 I)^{-1} J \Sigma_0 = \Sigma`
        (Wilson et al. 2020, "Efficiently Sampling Functions from Gaussian Process Posteriors"):
        exact, :math:`O(S N P)`, no ``P x P`` factor."""
        J = self.J
        prior = torch.randn((num_samples, J.shape[1]), generator=generator, dtype=J.dtype, device=J.device) * self.prior_variance.sqrt()
        noise = torch.randn((num_samples, J.shape[0]), generator=generator, dtype=J.dtype, device=J.device)
        residual = prior @ J.T + noise * self.noise_variance.sqrt()  # (S, N)
        solved = torch.cholesky_solve(residual.T, self.cholesky)  # (N, S)
        return mean + prior - (self.scaled.T @ solved).T

    def posterior_covariance(self, Js) -> torch.Tensor:
        r""":math:`J_b \Sigma J_b^\top` for each batch of Jacobians ``Js`` ``(c, r, P)``: ``(c, r, r)``."""
        prior = (Js * self.prior_variance) @ Js.transpose(-1, -2)
        v = torch.linalg.solve_triangular(self.cholesky, self.scaled @ Js.transpose(-1, -2), upper=False)  # (c, N, r)
        return prior - v.transpose(-1, -2) @ v


def effective_noise_variance(la) -> torch.Tensor:
    """laplace-torch's Gaussian noise variance as its GGN scales it: :math:`\\sigma^2 T`."""
    return la.sigma_noise.detach() ** 2 * la.temperature


def function_space_posterior(la, J) -> FunctionSpaceLaplace:
    """The fitted full-GGN approximation ``la`` (Gaussian likelihood) in function space, from
    its training Jacobians ``J`` ``(N, P)``, at its current prior precisions."""
    return FunctionSpaceLaplace(J, 1.0 / la.prior_precision_diag.detach().to(J), effective_noise_variance(la).to(J))


def tune_prior_precisions(la, sizes, init, steps: int, lr: float = 0.1, J=None) -> torch.Tensor:
    r"""laplace-torch's ``optimize_prior_precision(method="marglik")`` for a full GGN under a
    Gaussian likelihood, one precision per block of ``sizes`` weights: the same objective
    (:math:`\log p(y \mid \hat w) - \tfrac12 [\log\det(\Sigma_0\Sigma^{-1}) + (\hat w - \mu_0)^\top
    \Sigma_0^{-1} (\hat w - \mu_0)]`) and the same optimizer (Adam over the log precisions,
    ``steps`` steps at ``lr``), from ``init``. With ``J``, the training Jacobians ``(N, P)``, the
    log determinant is taken in function space (:class:`FunctionSpaceLaplace`: an ``N x N``
    Cholesky per step, not laplace-torch's ``P x P``); without, in weight space,
    :math:`\log\det(I_P + \Sigma_0^{1/2} H \Sigma_0^{1/2} / \sigma^2)` on ``la``'s full GGN
    :math:`H` (Sylvester's identity makes the two equal): for a last layer's sites at ``N >= P``,
    one precision per site, which laplace-torch's own tuning offers only over all weights.
    Returns the precisions."""
    noise = effective_noise_variance(la)
    delta = la.mean - la.prior_mean
    reference = J if J is not None else la.H
    noise, delta = noise.to(reference), delta.detach().to(reference)
    counts = torch.as_tensor(sizes, device=reference.device)
    squares = torch.zeros(len(sizes), dtype=reference.dtype, device=reference.device).index_add_(
        0, torch.repeat_interleave(torch.arange(len(sizes), device=reference.device), counts), delta**2)
    if J is None:
        curvature = la.H.detach() / noise
        eye = torch.eye(curvature.shape[0], dtype=curvature.dtype, device=curvature.device)
    log_precision = init.detach().to(reference).log().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([log_precision], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        precision = log_precision.exp()
        prior_variance = torch.repeat_interleave(1.0 / precision, counts)
        if J is not None:
            log_det_ratio = FunctionSpaceLaplace(J, prior_variance, noise).log_det_ratio
        else:
            sd = prior_variance.sqrt()
            log_det_ratio = 2 * torch.linalg.cholesky(eye + sd[:, None] * curvature * sd[None, :]).diagonal().log().sum()
        loss = 0.5 * (log_det_ratio + (precision * squares).sum())  # the negative log evidence, less constants
        loss.backward()
        optimizer.step()
    return log_precision.detach().exp()


def tune_prior_in_function_space(la, J, sizes, init, steps: int, lr: float = 0.1) -> torch.Tensor:
    """:func:`tune_prior_precisions` with the log determinant in function space, from the
    training Jacobians ``J`` ``(N, P)``: the cheaper form while there are fewer training values
    than weights."""
    return tune_prior_precisions(la, sizes, init, steps, lr, J=J)


class TwoClassLogits(torch.nn.Module):
    """A one-output Bernoulli network's logit :math:`f` as the two-class logits :math:`(0, f)`,
    whose softmax is :math:`(1 - \\sigma(f), \\sigma(f))`: laplace-torch's categorical
    likelihood on it is the Bernoulli one, curvature included (the GGN's logit block
    :math:`\\sigma(f)(1 - \\sigma(f))`)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        f = self.net(x)
        return torch.cat([torch.zeros_like(f), f], -1)


def _last_linear(net):
    name = None
    for n, module in net.named_modules():
        if isinstance(module, torch.nn.Linear):
            name = n
    if name is None:
        raise ValueError("subset='last_layer' needs a network with an nn.Linear layer")
    return name


def _map_values(model, map_estimate, x, y, seed, map_options):
    if map_estimate is None:
        options = {"progress": False, **(map_options or {})}
        map_estimate = deep_ensemble(model, x, y, num_members=1, objective="map", seed=seed, **options)
    if isinstance(map_estimate, EnsemblePosterior):
        if map_estimate.num_chains != 1:
            raise ValueError(f"map_estimate must be one member, got an ensemble of {map_estimate.num_chains}")
        return {k: v[0, 0].detach() for k, v in map_estimate.samples.items()}
    if isinstance(map_estimate, dict):
        missing = [s.name for s in model.sites if s.name not in map_estimate]
        missing += [name for name in model.likelihood.latent_sites() if name not in map_estimate]
        if missing:
            raise ValueError(f"map_estimate lacks the sites {missing}")
        for s in model.sites:
            if tuple(map_estimate[s.name].shape) != tuple(s.shape):
                raise ValueError(f"map_estimate[{s.name!r}] has shape {tuple(map_estimate[s.name].shape)}, the site {tuple(s.shape)}")
        values = {s.name: map_estimate[s.name].detach() for s in model.sites}
        values.update({name: torch.as_tensor(map_estimate[name], device=model.device).detach().reshape(()) for name in model.likelihood.latent_sites()})
        return values
    raise TypeError(f"map_estimate must be an EnsemblePosterior or a dict of site values, got {type(map_estimate).__name__}")


@contextlib.contextmanager
def jit_script_deprecation_quiet():
    """Silence torch 2.14's FutureWarning that ``torch.jit.script`` is deprecated, matched by its
    message and category: raised by code that scripts functions on our behalf (laplace-torch's
    curvature backends; torch's own JVP decompositions, loaded at the first ``jvp``), which no
    user of ours can change."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        yield


def _check_curvature_fits(net, covered, hessian: str, dtype) -> None:
    """Refuse, before it is built, a curvature that cannot fit in free memory, naming the options
    that shrink it. Copies counted: the full Hessian, the posterior precision and its
    Cholesky factor (:math:`3 D^2`); each Kronecker factor four times (the factors, their
    eigendecompositions); the diagonal four times."""
    shapes = [net.get_parameter(n).shape for n in covered]
    d = sum(math.prod(s) for s in shapes)
    if hessian == "full":
        entries = 3 * d * d
    elif hessian == "kron":
        entries = 4 * sum((math.prod(s[1:]) ** 2 if len(s) > 1 else 0) + s[0] ** 2 for s in shapes)
    else:
        entries = 4 * d
    memory.check_fits(
        entries * torch.finfo(dtype).bits // 8, f"the {hessian} Hessian of {d:,} weights",
        "its size: hessian='kron' or 'diag', or subset='last_layer'", chunks=False,
    )


@contextlib.contextmanager
def laplace_torch_quiet():
    """Silence, while laplace-torch works for us, the two warnings it raises that no user of
    :func:`laplace` can act on (each matched by its message and category, nothing else):

    - its curvature backends (asdfghjkl, loaded lazily at import and at the first fit) decorate
      functions with ``torch.jit.script``, which torch 2.14 deprecates (a FutureWarning about
      laplace-torch's code);
    - for a classifier, ``optimize_prior_precision`` reminds its caller that laplace-torch's own
      predictive defaults to the probit link; the marginal likelihood uses no link, and the
      predictive here is ours (:meth:`LaplacePosterior.predict`).
    """
    with jit_script_deprecation_quiet(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"By default `link_approx` is `probit`", category=UserWarning)
        yield


@checked("laplace")
def laplace(
    model,
    x,
    y,
    *,
    subset: str = "all",
    hessian: str = "kron",
    tune_prior: bool = True,
    tune_steps: int = 100,
    prior_precision=None,
    num_samples: int = 100,
    map_estimate=None,
    map_options=None,
    batch_size=None,
    seed: int = 0,
) -> LaplacePosterior:
    """The Laplace approximation of ``model``'s posterior given ``(x, y)``.

    :param subset: ``"all"`` random sites, or ``"last_layer"`` (the last ``nn.Linear``; the
        other sites stay at the MAP).
    :param hessian: ``"full"``, ``"diag"`` or ``"kron"`` (KFAC) generalized Gauss-Newton.
    :param tune_prior: maximize the Laplace marginal likelihood over one prior precision per
        site, starting from the model's (laplace-torch's ``optimize_prior_precision``, or the
        same objective in function or weight space, :func:`tune_prior_precisions`); with
        ``subset="last_layer"`` one for the layer where its sites' priors agree, else (a full
        GGN only) one per site; if false, the model's prior precisions are used as they are.
    :param tune_steps: Adam steps of that maximization (laplace-torch's ``n_steps``).
    :param prior_precision: the precisions to start from (or to use, without ``tune_prior``)
        instead of the model's: one per covered site (one for ``subset="last_layer"`` where its
        sites' priors agree), e.g. a
        previous fit's ``prior_precision`` to warm-start a refit on more data.
    :param num_samples: draws from the Gaussian posterior kept in the result.
    :param map_estimate: the MAP, as a one-member :class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior`
        or ``{site: value}``; default: trained here by :func:`~pyrobnn.infer.modes.ensemble.deep_ensemble`
        with ``objective="map"`` and ``map_options`` (e.g. ``{"max_epochs": 200}``).
    :param seed: seeds the MAP trained here and the posterior's draws.
    :param batch_size: points per batch for the curvature (default: as many as the memory budget
        of :mod:`pyrobnn.utils.memory` allows a pass with gradients, at most :data:`CURVATURE_BATCH`).
    """
    x, y = validate_training_data(model, x, y)
    x, y = x.to(model.device), y.to(model.device)
    outputs = check_forward(model.net, x)[-1]
    y = model.likelihood.check_targets(y, (x.shape[0], outputs))
    kind = "regression" if isinstance(model.likelihood, GaussianLikelihood) else "classification"
    bernoulli = isinstance(model.likelihood, BernoulliLikelihood)
    if bernoulli:
        if outputs != 1:
            raise ValueError(f"laplace takes a Bernoulli likelihood with one output (laplace-torch has one label per point); the network has {outputs}")
        y = y.reshape(-1).long()
    with laplace_torch_quiet():
        from laplace import (
            Laplace,  # imported on use: laplace-torch loads its curvature backends (seconds)
        )
        from laplace.baselaplace import FullLaplace

    start = time.perf_counter()
    values = _map_values(model, map_estimate, x, y, seed, map_options)
    net = model.deterministic_net(values).eval()  # dropout off, batch normalization on its running statistics
    fitted = TwoClassLogits(net).eval() if bernoulli else net
    prefix = "net." if bernoulli else ""
    site_names = {s.name for s in model.sites}
    covered = []
    for name, p in net.named_parameters():
        p.requires_grad_(name in site_names)
        if name in site_names:
            covered.append(name)
    kwargs = {}
    if subset == "last_layer":
        layer = _last_linear(net)
        covered = [n for n in covered if n.rsplit(".", 1)[0] == layer]
        layer_params = [n for n, _ in net.get_submodule(layer).named_parameters()]
        if len(covered) != len(layer_params):
            raise ValueError(f"subset='last_layer' needs every parameter of the last layer {layer!r} to be random")
        kwargs["last_layer_name"] = prefix + layer
    precisions = torch.tensor(
        [1.0 / model.site_prior(model.site(n)).site_scale(model.site(n)) ** 2 for n in covered], dtype=model.dtype, device=model.device
    )
    structure = "layerwise"  # one precision per site
    sizes = [net.get_parameter(n).numel() for n in covered]
    if subset == "last_layer" and torch.allclose(precisions, precisions[:1]):
        precisions, structure = precisions[:1], "scalar"
    elif subset == "last_layer" and hessian != "full":
        # laplace-torch's last-layer classes take one precision for the layer or one per weight;
        # its Kronecker form only the first, and only the full form's tuning is ours (below)
        raise ValueError(
            f"subset='last_layer' with hessian={hessian!r} needs one prior precision for the last layer's sites, got {precisions.tolist()} "
            "(e.g. NormalPrior without fan_in); hessian='full' takes one per site"
        )
    # the last layer's sites' precisions, one per site, reach laplace-torch spread over their weights
    per_weight = subset == "last_layer" and structure == "layerwise"

    def handed(per_site):
        return torch.repeat_interleave(per_site, torch.as_tensor(sizes, device=per_site.device)) if per_weight else per_site
    if prior_precision is not None:
        given = torch.as_tensor(prior_precision, dtype=model.dtype, device=model.device).reshape(-1)
        if given.shape != precisions.shape or not bool((torch.isfinite(given) & (given > 0)).all()):
            raise ValueError(f"prior_precision must hold {precisions.numel()} positive finite values (one per covered site), got {given.tolist()}")
        precisions = given
    latents = list(model.likelihood.latent_sites())
    if kind == "regression":
        noise = values[latents[0]] if latents else model.likelihood.scale()
        kwargs["sigma_noise"] = float(noise.detach())
    _check_curvature_fits(net, covered, hessian, model.dtype)
    if hessian == "full":
        # laplace-torch's own Jacobian GGN (torch.func): its default backend (curvlinops) forms a
        # full GGN by P matrix-vector products, 0.48 s against 0.01 s for 42 points and 2951
        # weights, the same matrix
        from laplace.curvature import GGNInterface

        kwargs["backend"] = GGNInterface
    with laplace_torch_quiet():
        la = Laplace(fitted, kind, subset_of_weights=subset, hessian_structure=hessian, prior_precision=handed(precisions.clone()), **kwargs)
        if batch_size is None:
            per_point = memory.activation_bytes(net, x)
            batch_size = min(CURVATURE_BATCH, memory.points_per_chunk(x.shape[0], 1, per_point, memory.GRADIENT_FACTOR))
        # laplace-torch's full GGN multiplies by torch.eye in the default dtype: a float64 model's
        # curvature was formed in float32 (eigenvalues of -0.06 beside 1.7e7, a failed Cholesky)
        with tensor_defaults(model.dtype, model.device):
            # a fresh full Laplace holds its zero P x P Hessian from construction (in the network's dtype): fit's
            # override would zero another (0.03 s at P = 2,951, 0.06 s at P = 4,651; the peak memory, which the
            # curvature's own products set, is the same either way)
            la.fit(DataLoader(TensorDataset(x, y), batch_size=batch_size), override=type(la) is not FullLaplace)
        J = None
        if hessian == "full" and kind == "regression" and x.shape[0] * outputs < sum(sizes):
            # fewer training values than weights: the posterior in function space (N x N, not P x P)
            with torch.no_grad():
                J = parameter_jacobians(net, {n: net.get_parameter(n) for n in covered}, x)[1].reshape(-1, sum(sizes))
        if tune_prior:
            if J is not None:  # the same maximization with an N x N log determinant per step
                blocks = [sum(sizes)] if structure == "scalar" else sizes  # one precision for all, or one per site
                la.prior_precision = handed(tune_prior_in_function_space(la, J, blocks, precisions, tune_steps))
            elif per_weight:  # the same, with the P x P determinant: one precision per site, which laplace-torch's tuning lacks
                la.prior_precision = handed(tune_prior_precisions(la, sizes, precisions, tune_steps))
            else:
                la.optimize_prior_precision(method="marglik", pred_type="glm", init_prior_prec=precisions.clone(), prior_structure=structure,
                                            n_steps=tune_steps)
    generator = torch.Generator(device=model.device).manual_seed(seed)
    with torch.no_grad():
        if J is not None:
            draws = function_space_posterior(la, J).sample(la.mean.to(J), num_samples, generator)
        else:
            draws = la.sample(num_samples, generator=generator)
    samples, offset = {}, 0
    for name in covered:
        site = model.site(name)
        size = site.shape.numel()
        samples[name] = draws[:, offset : offset + size].reshape((1, num_samples) + tuple(site.shape))
        offset += size
    if offset != draws.shape[1]:
        raise RuntimeError(f"laplace-torch returned {draws.shape[1]} parameters per draw, the sites cover {offset}")
    for site in model.sites:
        if site.name not in samples:
            samples[site.name] = values[site.name].expand((1, num_samples) + tuple(site.shape)).clone()
    ordered = {s.name: samples[s.name] for s in model.sites}
    for name in latents:  # the noise scale at its MAP in every draw
        ordered[name] = values[name].reshape(1, 1).expand(1, num_samples).clone()
    seconds = time.perf_counter() - start
    for p in net.parameters():
        p.requires_grad_(False)
    settings = dict(
        subset=subset, hessian=hessian, tune_prior=tune_prior, tune_steps=tune_steps, prior_precision=prior_precision, num_samples=num_samples, map_estimate=map_estimate,
        map_options=map_options, batch_size=batch_size, seed=seed,
    )
    return LaplacePosterior(
        ordered, {}, seconds, f"Laplace ({hessian}, {subset.replace('_', ' ')})", settings=settings, model=model, approximation=la,
        map_values=values, map_net=net, likelihood=model.likelihood, covered_names=tuple(covered), latent_names=tuple(latents),
    )


def _warm_start(model, previous, x, y, options, fraction, seed):
    """A refit from the previous MAP (trained on from it for ``fraction`` of the cold fit's
    epochs) with the previous prior precision (its tuning steps are scaled by the declaration)."""
    start = Posterior({k: v.detach().reshape((1, 1) + tuple(v.shape)) for k, v in previous.map_values.items()}, method="warm start",
                      model=model)
    map_estimate = warm_map(model, x, y, start, 1, options.get("map_options"), fraction, seed)
    return dict(options, map_estimate=map_estimate, prior_precision=previous.prior_precision)


register(MethodSpec(
    "laplace", "Laplace approximation at the MAP (laplace-torch's GGN: KFAC, diagonal or full), GLM predictive", "laplace", laplace,
    Support(
        likelihoods=("gaussian", "gaussian_prior", "categorical", "bernoulli"), priors=("normal",),
        reasons={
            "heteroscedastic": "laplace-torch has no heteroscedastic likelihood",
            "gaussian_learned": LATENT_ONLY,
            "custom": "laplace-torch knows Gaussian and categorical likelihoods only",
            "prior": "the approximation hands laplace-torch one Gaussian prior precision per site, which only a NormalPrior has",
        },
    ),
    budgets={"num_samples": 1, "batch_size": 1, "tune_steps": 1},
    constraints={"batch_size": Either(Budget(1), None), "subset": OneOf(SUBSETS), "hessian": OneOf(HESSIANS)},
    quick={"num_samples": 4, "map_options": {"max_epochs": 2, "progress": False}},
    # as a surrogate: a full GGN (KFAC was over-confident away from the data at 10-50 points),
    # its prior precisions tuned by the marginal likelihood from the data-chosen prior (the
    # calibrated model of pyrobnn.integrations.infinite_width_gp), in function space while there
    # are fewer points than weights: held-out NLL at n = 20 within 1.5x of the GP's on 7 of 8
    # problems, 6 of 8 untuned (benchmarks/bo_calibration.py, docs/bayesopt.md). Over the last
    # layer alone it was ahead of random search on all four development problems, but its 90%
    # intervals held a median 7-42% of held-out points at n = 20 (docs/bayesopt.md, 2026-11-28)
    bo_options=dict(hessian="full", tune_prior=True, num_samples=64,
                    map_options=dict(max_epochs=1000, lr=1e-2, batch_size=None, patience=1000)),
    warm_start=WarmStart(init=None, prepare=_warm_start, scaled=("tune_steps",), names=("map_estimate", "prior_precision", "map_options")),
))
