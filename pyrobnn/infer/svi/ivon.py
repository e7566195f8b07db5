r"""IVON: variational learning by the Improved Variational Online Newton method (Shen, Daheim,
Cong, Nickl, Marconi, Bazan, Yokota, Gurevych, Cremers, Khan & Möllenhoff 2024, ICML, "Variational
Learning is Effective for Large Deep Networks", Algorithm 1), on a BayesianModel.

IVON fits a diagonal Gaussian :math:`q(w) = N(m, \mathrm{diag}(\sigma^2))` to the posterior by
natural-gradient steps at about Adam's cost. With :math:`\bar\ell(w)` the average negative
log-likelihood per training point, :math:`\lambda` the effective sample size (the number of
training points) and :math:`\delta` the prior precision per point (a Gaussian prior
:math:`N(\mu_0, s^2)` on a weight has :math:`\delta = 1/(\lambda s^2)`, IVON's weight decay),
each step draws :math:`w = m + \sigma \odot \xi`, :math:`\xi \sim N(0, I)`,
:math:`\sigma = 1/\sqrt{\lambda (h + \delta)}` and updates

.. math::
    \hat g = \nabla \bar\ell_{\mathcal B}(w), \qquad \hat h = \hat g \odot \xi / \sigma, \\
    g \leftarrow \beta_1 g + (1 - \beta_1) \hat g, \qquad
    h \leftarrow \beta_2 h + (1 - \beta_2) \hat h + \tfrac12 (1 - \beta_2)^2 (h - \hat h)^2 / (h + \delta), \\
    m \leftarrow m - \alpha\, \big(g / (1 - \beta_1^t) + \delta (m - \mu_0)\big) / (h + \delta),

where :math:`\hat h` is the reparameterization (Price/Stein) estimate of the diagonal Hessian,
the third term of :math:`h`'s update keeps it positive, and :math:`\alpha` is the learning
rate times :math:`h_0 + \delta` (the reference implementation's default rescaling, so that the
first steps move like a gradient step of size ``lr``), ramped up linearly over the first steps
and decayed along a cosine by default, as in the paper's experiments. With ``mc_samples`` above
1 the estimates are averaged over that many draws per step.

At a fixed point :math:`m` solves :math:`E_q[\nabla \bar\ell] + \delta (m - \mu_0) = 0` and
:math:`h = E_q[\mathrm{diag}\, \nabla^2 \bar\ell]`; for a Gaussian posterior of precision
:math:`\Lambda` this is the mean-field optimum: the exact mean and variances
:math:`1/\mathrm{diag}(\Lambda)` (the test suite checks it on conjugate regression).

The reference implementation is ``ivon-opt`` (a ``torch.optim.Optimizer``); this module writes
the update itself on the model's flat weight vector, so that the prior maps per weight, the
random draws come from a seeded generator, and the state saves and loads whole; the tests
compare it with ``ivon-opt`` step by step where that package is installed. The result is a
:class:`~pyrobnn.guides.MeanFieldNormal` guide at :math:`(m, \sigma)`, wrapped in a
:class:`~pyrobnn.infer.svi.variational.VariationalPosterior`.
"""

from __future__ import annotations

import math
import time

import torch

from pyrobnn.guides.base import inverse_softplus, site_key
from pyrobnn.guides.mean_field import MeanFieldNormal
from pyrobnn.infer.core.minibatch import MinibatchLoop
from pyrobnn.infer.core.problem import flat_problem, training_data
from pyrobnn.infer.svi.history import History
from pyrobnn.infer.svi.variational import VariationalPosterior
from pyrobnn.methods import MethodSpec, WarmStart, checked, latent_only_support, register
from pyrobnn.utils.constraints import Either, Interval, OneOf, Positive
from pyrobnn.models.distributions import ScalarNormal
from pyrobnn.utils.progress import tqdm

__all__ = ["ivon", "IVONState", "ivon_update", "default_beta2", "warmup_cosine_factor"]


def default_beta2(num_steps: int) -> float:
    """:math:`\beta_2` when none is given: :math:`1 - 1/T` for a run of :math:`T` steps, kept in
    :math:`[0.999, 0.99999]`, so that the Hessian's average spans the run (the paper's 0.99999 is
    for runs of a hundred thousand steps and more; with fewer, :math:`h` would stay near
    ``hess_init``). A much shorter average lets :math:`h` follow the noise of its one-sample
    estimates down toward zero on weights the data barely constrain, their draws then widen to
    the prior's, and the network breaks: on MNIST with LeNet-300-100 a time constant of 190 steps
    did so within six epochs, while 1,000 steps and more trained stably."""
    return min(max(1.0 - 1.0 / max(num_steps, 1), 0.999), 0.99999)


class IVONState:
    """The variational parameters and optimizer state on the flat vector: mean ``m``, Hessian
    estimate ``h``, gradient momentum ``g`` (all ``(D,)``) and the step count ``t``."""

    def __init__(self, m, hess_init: float):
        self.m = m.clone()
        self.h = torch.full_like(m, float(hess_init))
        self.g = torch.zeros_like(m)
        self.t = 0

    def std(self, ess: float, delta) -> torch.Tensor:
        """:math:`\\sigma = 1/\\sqrt{\\lambda (h + \\delta)}`."""
        return (ess * (self.h + delta)).rsqrt()


def ivon_update(state: IVONState, grad, hess, *, lr, beta1, beta2, delta, prior_loc, hess_init, clip_radius=math.inf) -> None:
    """One IVON update of ``state`` in place from the step's averaged gradient and Hessian
    estimates (the module docstring's equations)."""
    state.t += 1
    state.g = beta1 * state.g + (1 - beta1) * grad
    h = state.h
    state.h = beta2 * h + (1 - beta2) * hess + 0.5 * (1 - beta2) ** 2 * (h - hess).square() / (h + delta)
    alpha = lr * (hess_init + delta)
    debias = 1.0 - beta1**state.t
    direction = (state.g / debias + delta * (state.m - prior_loc)) / (state.h + delta)
    if clip_radius != math.inf:
        direction = direction.clamp(-clip_radius, clip_radius)
    state.m = state.m - alpha * direction


def _prior_map(potential, device):
    """Per coordinate of the flat vector: the Gaussian prior's mean and scale on the weights,
    and a mask of the latent sites' coordinates (whose prior enters the loss instead); refuses
    what IVON cannot take."""
    locs, scales = [], []
    for site, prior in zip(potential.sites, potential.priors):
        base = getattr(prior, "base_dist", prior)
        if not isinstance(base, ScalarNormal):
            raise ValueError(
                f"ivon maps a Normal prior to its weight decay; site {site.name!r} has a {type(base).__name__} prior "
                "(use pyrobnn.NormalPrior, or a variational guide with pyrobnn.fit for this prior)"
            )
        n = site.shape.numel()
        locs.append(torch.full((n,), base.loc_value, device=device))
        scales.append(torch.full((n,), base.scale_value, device=device))
    probe = torch.tensor([-2.0, 0.0, 1.5], dtype=torch.float64, device="cpu")  # a probe of the transform
    for (name, prior), transform in zip(potential.latents, potential.transforms):
        if not torch.allclose(transform(probe), probe.exp()):  # the guide's factor is log-normal
            raise ValueError(f"ivon fits a log-normal factor to a latent scale; site {name!r} has support {prior.support}")
    weights = sum(t.numel() for t in locs)
    latent = torch.zeros(potential.dim, dtype=torch.bool, device=device)
    latent[weights:] = True
    fill = potential.dim - weights  # latent coordinates: no weight decay, unit scale unused
    return torch.cat(locs + [torch.zeros(fill, device=device)]), torch.cat(scales + [torch.ones(fill, device=device)]), latent


def _gaussian_log_prior(w, loc, scale):
    return (-0.5 * ((w - loc) / scale).square() - scale.log() - 0.5 * math.log(2 * math.pi)).sum(-1)


@checked("ivon")
def ivon(
    model, x, y, *, epochs: int = 100, batch_size: int = 128, lr: float = 0.1, hess_init: float = 1.0, beta1: float = 0.9,
    beta2: float | None = None, mc_samples: int = 1, ess: float | None = None, clip_radius: float = math.inf,
    warmup: float = 0.05, schedule: str = "cosine", seed: int = 0, progress: bool = True, init=None,
) -> VariationalPosterior:
    r"""Fit a diagonal Gaussian posterior to ``model``'s weights given ``(x, y)`` by IVON (Shen et
    al. 2024; the math is in the module docstring), as a :class:`MeanFieldNormal` guide in a
    :class:`~pyrobnn.infer.svi.variational.VariationalPosterior`: ``predict``, ``pyro.infer.Predictive``,
    ArviZ, ``compare`` and save/load take it as they take any trained guide.

    The weights' priors must be :class:`~pyrobnn.models.priors.NormalPrior` s (each maps to IVON's
    weight decay :math:`\delta = 1/(\lambda s^2)` per weight, with its mean). A latent noise scale
    with a prior is fitted too, as a Gaussian on its logarithm (a log-normal factor in the
    guide): its prior and log-Jacobian enter the loss, divided by :math:`\lambda`, with no weight
    decay. The history's ``kl`` is the weights' KL to their prior.

    :param epochs: passes over the data and the minibatch size.
    :param batch_size: see ``epochs``.
    :param lr: the learning rate :math:`\alpha / (h_0 + \delta)` (the reference's default 0.1).
    :param hess_init: :math:`h_0`, the initial Hessian estimate (the posterior's initial
        standard deviation is :math:`1/\sqrt{\lambda (h_0 + \delta)}`).
    :param beta1: the gradient's momentum (the reference's 0.9).
    :param beta2: the Hessian's averaging weight; default :func:`default_beta2` of the run's steps.
    :param ess: :math:`\lambda`, default the number of training points (the Bayesian posterior;
        larger values temper it).
    :param clip_radius: elementwise bound on the preconditioned direction
        :math:`(g/(1-\beta_1^t) + \delta (m - \mu_0))/(h + \delta)` (the reference's option).
    :param mc_samples: weight draws per step, their estimates averaged.
    :param warmup: the learning rate ramps up linearly over the first ``warmup``
        fraction of the steps, then stays (``"constant"``) or decays to zero along a cosine
        (``"cosine"``), as in the paper's experiments. Without the ramp, the first steps on a
        regression with a small noise scale overshoot (the Hessian estimate starts at
        ``hess_init``, far below the likelihood's curvature) and the fit may not recover.
    :param schedule: see ``warmup``.
    :param seed: seeds the weight draws and the data order.
    :param progress: show a progress bar.
    :param init: a previous fit to start from (a :class:`VariationalPosterior` whose guide is a
        :class:`MeanFieldNormal` of this model, e.g. an IVON result on fewer points): the mean
        starts at its means and the Hessian estimate at the value its standard deviations imply,
        :math:`h = 1/(\lambda \sigma^2) - \delta` (at least ``hess_init``), so that a refit
        after new data arrive needs fewer epochs.
    """
    if init is not None and not (isinstance(init, VariationalPosterior) and isinstance(init.guide, MeanFieldNormal)):
        raise TypeError(f"init must be a VariationalPosterior with a MeanFieldNormal guide (an IVON result), got {type(init).__name__}")
    x, y = training_data(model, x, y)
    n = x.shape[0]
    if ess is None:
        ess = float(n)
    with flat_problem(model, x, y, seed) as problem:
        y, potential, generator = problem.y, problem.potential, problem.generator
        prior_loc, prior_scale, latent = _prior_map(potential, model.device)
        prior_loc, prior_scale = prior_loc.to(model.dtype), prior_scale.to(model.dtype)
        weight = ~latent
        delta = torch.where(latent, 0.0, 1.0 / (ess * prior_scale.square()))
        initial = {s.name: model.init_value(s).detach().unsqueeze(0) for s in model.sites}
        guide_start = MeanFieldNormal(model)  # its latent factors start at the log of the prior's mean
        for name, *_, shape in potential.blocks[len(potential.sites):]:
            initial[name] = guide_start.latent_loc[site_key(name)].detach().exp().reshape((1,) + tuple(shape))
        m0 = potential.pack(initial)[0]
        state = IVONState(m0, hess_init)
        if init is not None:
            mean, sigma = _flat_guide(init.guide, potential)
            state.m = mean.to(m0)
            state.h = torch.clamp(1.0 / (ess * sigma.to(m0).square()) - delta, min=hess_init)
        loop = MinibatchLoop(n, batch_size, seed, x.device, advice=f"Lower lr (now {lr:.3g}).")
        steps = epochs * math.ceil(n / loop.batch_size)
        b2 = default_beta2(steps) if beta2 is None else float(beta2)
        history = History()
        start = time.perf_counter()
        bar = tqdm(total=epochs, disable=not progress, desc="IVON", unit="epoch", dynamic_ncols=True)
        try:
            for epoch in range(epochs):
                total_nll, batches = 0.0, 0
                for idx in loop.epoch_batches():
                    xb, yb = x[idx], y[idx]
                    sigma = state.std(ess, delta)
                    grad = torch.zeros_like(state.m)
                    hess = torch.zeros_like(state.m)
                    nll = torch.zeros((), dtype=state.m.dtype, device=state.m.device)
                    for _ in range(mc_samples):
                        xi = torch.randn(state.m.shape, generator=generator, dtype=state.m.dtype, device=state.m.device)
                        with torch.enable_grad():
                            w = (state.m + sigma * xi).unsqueeze(0).requires_grad_(True)
                            log_prior, log_lik = potential.log_joint_terms(w, xb, yb)
                            loss = -log_lik.sum() / xb.shape[0]
                            if latent.any():  # the latent sites' prior (and Jacobian), per point
                                other = log_prior - _gaussian_log_prior(w[:, weight], prior_loc[weight], prior_scale[weight])
                                loss = loss - other.sum() / ess
                            (g,) = torch.autograd.grad(loss, w)
                        g = g[0]
                        grad += g / mc_samples
                        hess += g * xi / sigma / mc_samples
                        nll += loss.detach() / mc_samples
                    failed = loop.record(loss=nll, grad=grad)
                    before = (state.m, state.h, state.g, state.t)
                    ivon_update(state, grad, hess, lr=lr * warmup_cosine_factor(loop.step - 1, steps, warmup, schedule), beta1=beta1, beta2=b2, delta=delta, prior_loc=prior_loc, hess_init=hess_init,
                                clip_radius=clip_radius)
                    # a failed step leaves the state as it was (no host sync here)
                    state.m, state.h, state.g = (torch.where(failed, old, new) for old, new in zip(before[:3], (state.m, state.h, state.g)))
                    total_nll += nll
                    batches += 1
                loop.end_epoch([state.m])
                sigma = state.std(ess, delta)
                kl = _kl(state.m[weight], sigma[weight], prior_loc[weight], prior_scale[weight])
                data_nll = float(total_nll) / batches * n
                history.epoch.append(epoch + 1)
                history.nll.append(data_nll)
                history.kl.append(kl)
                history.kl_weight.append(1.0)
                history.loss.append(data_nll + kl)
                history.seconds.append(time.perf_counter() - start)
                bar.update(1)
                bar.set_postfix(loss=f"{data_nll + kl:.4g}")
        finally:
            bar.close()
        history.steps = loop.step
        seconds = time.perf_counter() - start
        guide = _guide(model, potential, state.m, state.std(ess, delta))
    settings = dict(epochs=epochs, batch_size=batch_size, lr=lr, hess_init=hess_init, beta1=beta1, beta2=b2, mc_samples=mc_samples,
                    ess=ess, clip_radius=clip_radius, warmup=warmup, schedule=schedule, seed=seed, init=init)
    return VariationalPosterior(model, guide, history, seconds=seconds, settings=settings, trainer="IVON")


def warmup_cosine_factor(step: int, steps: int, warmup: float, schedule: str) -> float:
    """The learning rate's factor at ``step`` (0-based) of ``steps``: a linear ramp over the first
    ``warmup`` fraction, then constant or a cosine decay to zero."""
    ramp = warmup * steps
    if step < ramp:
        return (step + 1) / ramp
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - ramp) / max(steps - ramp, 1.0)))


def _kl(m, sigma, prior_loc, prior_scale) -> float:
    ratio = sigma / prior_scale
    return float(0.5 * (ratio.square() + ((m - prior_loc) / prior_scale).square() - 1.0 - 2.0 * ratio.log()).sum())


def _flat_guide(guide: MeanFieldNormal, potential):
    """A mean-field guide's means and standard deviations on the flat vector of ``potential``
    (the inverse of :func:`_guide`): the weights' own, and for a latent site the Gaussian on its
    logarithm."""
    means, stds = [], []
    sites = {s.name for s in potential.sites}
    for name, start, stop, _ in potential.blocks:
        key = site_key(name)
        loc, rho = (guide.loc[key], guide.rho[key]) if name in sites else (guide.latent_loc[key], guide.latent_rho[key])
        means.append(loc.detach().reshape(-1))
        stds.append(torch.nn.functional.softplus(rho.detach()).reshape(-1))
    return torch.cat(means), torch.cat(stds)


@torch.no_grad()
def _guide(model, potential, m, sigma) -> MeanFieldNormal:
    guide = MeanFieldNormal(model)
    means = potential.unpack(m.unsqueeze(0))
    stds = potential.unpack(sigma.unsqueeze(0))
    for site in model.sites:
        key = site_key(site.name)
        guide.loc[key].copy_(means[site.name][0])
        guide.rho[key].copy_(inverse_softplus(stds[site.name][0]))
    blocks = {name: (start, stop) for name, start, stop, _ in potential.blocks}
    for name in guide.latent_priors:  # a Normal on log(scale) is a log-normal factor on the scale
        key = site_key(name)
        start, stop = blocks[name]
        guide.latent_loc[key].copy_(m[start:stop].reshape(guide.latent_loc[key].shape))
        guide.latent_rho[key].copy_(inverse_softplus(sigma[start:stop]).reshape(guide.latent_rho[key].shape))
    return guide


_POSITIVE = Positive(description="a positive finite number")
register(MethodSpec(
    "ivon", "IVON: a diagonal Gaussian by natural-gradient variational learning (returns a MeanFieldNormal guide)", "variational",
    ivon, latent_only_support(priors=("normal",), reasons={"prior": "a Normal prior is IVON's weight decay"}),
    budgets={"epochs": 1, "batch_size": 1, "mc_samples": 1},
    constraints={
        "lr": _POSITIVE, "hess_init": _POSITIVE, "ess": Either(_POSITIVE, None), "beta1": Interval(0.0, 1.0, "left"),
        "beta2": Either(Interval(0.0, 1.0, "left"), None), "schedule": OneOf(("cosine", "constant")),
        "warmup": Interval(0.0, 1.0, "left", "a fraction of the run"), "clip_radius": Positive(finite=False),
    },
    quick={"epochs": 2, "batch_size": 16, "progress": False},
    # 0.1 overflowed on Hartmann-6 from 6 points under the calibrated surrogate prior (noise down to 0.01)
    # as a surrogate: full batch on tens of points under the calibrated prior, the first steps are
    # gradient steps of size lr on a stiff loss (the Hessian estimate starts at hess_init, far
    # below the likelihood's curvature) and overflowed on Hartmann-6 at lr 0.1 and 0.03; the
    # reference's clip_radius bounds each preconditioned step while the estimate grows
    bo_options=dict(epochs=1000, lr=0.03, ess=None, clip_radius=1.0),
    # the limit's network, started at the data's mean (finite_model), moved the median regret (5 seeds,
    # 42 evaluations): Ackley-10 +1.28 to +1.01, Levy-20 +2.11 to +0.49, Branin -0.28 to -0.26,
    # Hartmann-6 +0.22 to +0.32 (docs/bayesopt.md, "IVON and SWAG take their limit's network")
    bo_limit_network=True,
    warm_start=WarmStart(init="init", scaled=("epochs",)),
))
