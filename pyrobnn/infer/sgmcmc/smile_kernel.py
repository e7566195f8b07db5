r"""Stochastic-gradient microcanonical Langevin dynamics (SMILE) for several chains at once.

Sommer, Diao, Robnik, Seljak & Rügamer (2026, ICML), "Can Microcanonical Langevin Dynamics
Leverage Mini-Batch Gradient Noise?" (arXiv 2602.06500; the authors' JAX code is
EmanuelSommer/SMILE, ``src/kernels/smile.py``). This module is written from the paper's
description and that code's update rules, in torch, for chains batched on the leading dimension.

**Dynamics.** MCLMC's isokinetic dynamics (:mod:`pyrobnn.infer.mcmc.mclmc_kernel`: a unit
velocity :math:`u`, :math:`\dot x = S u`, :math:`\dot u = (I - u u^\top) S \nabla \log p(x) /
(d - 1)`, with a diagonal scaling :math:`S`), integrated by McLachlan's minimal-norm scheme
:math:`V(b_1\epsilon)\,T(\epsilon/2)\,V((1-2b_1)\epsilon)\,T(\epsilon/2)\,V(b_1\epsilon)` with the
exact ESH velocity update :math:`V`, but on the minibatch estimate

.. math:: \hat g(x) = \nabla \log p(x) + \frac{N}{B} \sum_{n \in \mathcal B_k} \nabla \log p(y_n \mid x_n, x)

of step :math:`k`'s batch :math:`\mathcal B_k` (two gradient evaluations per step: the first
kick reuses the gradient computed at the end of the previous step, as the authors' code does).
There is no velocity refresh: the gradient noise :math:`\hat g - \nabla \log p` perturbs the
velocity direction at every kick, which plays the part of MCLMC's partial refresh. For
isotropic noise this perturbation leaves the uniform distribution of :math:`u` on the sphere
invariant (it is MCLMC's refresh with an effective decoherence length); anisotropic noise does
not, which is the bias the paper derives.

**Gradient-noise preconditioning (pSMILE).** Per coordinate, exponential moving averages with
weight :math:`\beta_g = 0.01` track the gradient, :math:`\bar g \leftarrow (1-\beta_g)\bar g +
\beta_g \hat g`, and its spread, :math:`s^2 \leftarrow (1-\beta_g) s^2 + \beta_g (\hat g - \bar
g)^2` (floored at :math:`10^{-7}`). The scaling is :math:`S = 1/\tilde s` with :math:`\tilde s =
\mathrm{clip}(s, 10^{-2}, 10^4)` divided by its root mean square over the coordinates, so that
the scaled gradient :math:`S \hat g` has noise of about equal size in every coordinate. The
scaling is held fixed within a step, and from the end of warm-up on: a scaling that follows the
recent gradients makes each step depend on the chain's path: adapted throughout, as the
reference code does, it made a 20-dimensional standard Gaussian's variance 12% too large here
(``tests/test_smile.py`` checks both ways).

**Energy-variance tuner and guardrail (SMILET).** The energy error of a step,
:math:`\Delta E = \Delta K + \log \hat p_{k-1}(x) - \log \hat p_k(x')` (kinetic change of the
three kicks, minibatch log densities), feeds moving averages of :math:`|\Delta E|`: its mean
:math:`\mu` and standard deviation :math:`\sigma` (weight :math:`\beta = 0.01`, the variance
bias-corrected over the first steps). A gamma distribution with that mean and variance gives
quantiles :math:`q(\cdot)` (Wilson-Hilferty approximation). After ten steps:

- a step with :math:`|\Delta E| > q(p_{reset})` is undone: the position is kept and the
  velocity set to zero (the next kick then points it along the gradient);
- the step size is multiplied by :math:`1 - \delta` when :math:`|\Delta E| > q(1 - 2a/3)` and by
  :math:`1 + \delta` when :math:`|\Delta E| < q(a/3)` (:math:`a = 0.05`, :math:`\delta = 0.02`),
  and kept in :math:`[10^{-8}, 10]`.

The tuner is relative: it reads each error against the chain's own recent errors, not against
an absolute target. Where the gamma law fits, a step shrinks with probability :math:`2a/3` and
grows with :math:`a/3`, a drift of about :math:`-0.03\%` per step; the lag of the averages
balances it only where the energy error follows the step size. In the energy error above, the
two minibatch log densities differ by the batches' noise, which does not shrink with the step:
on concrete (MILE's UCI protocol, batch 64) 50,000 tuning steps took the step size from
:math:`10^{-3}` to :math:`2 \cdot 10^{-6}` and froze the chains. The method therefore tunes only
when asked (:func:`pyrobnn.smile`'s ``tune``), as the paper's own UCI and LeNet runs keep a fixed
step size.

Gradients are made safe as in the authors' code (NaN to 0, clipped to :math:`\pm 10^6`); a step
that still gives a non-finite position or energy is undone like a reset and counted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import torch

from pyrobnn.infer.core.graphs import RecordedFunction
from pyrobnn.infer.core.integrators import MCLACHLAN_B1, esh_velocity_update, partial_refresh
from pyrobnn.infer.core.kernel import Kernel
from pyrobnn.infer.core.minibatch import MinibatchTarget

__all__ = ["SMILEState", "SMILESettings", "SMILEInfo", "SMILE", "smile_init", "smile_step", "gamma_quantile", "preconditioner", "MAX_GRAD"]

#: gradients are clipped to this magnitude before use (the authors' guard)
MAX_GRAD = 1e6


@dataclass
class SMILESettings:
    """The kernel's fixed settings: the tuner's reset quantile ``reset_prob``, tail mass
    ``adaptation_prob`` (:math:`a`) and factor ``adaptation_strength`` (:math:`\\delta`), the
    moving averages' weight ``smoothing``, whether the step size adapts in warm-up (``tune``),
    whether the scaling follows the gradient noise (``precondition``), and an optional velocity refresh length ``L`` (``None``: none, as in the
    paper)."""

    reset_prob: float = 0.99
    adaptation_prob: float = 0.05
    adaptation_strength: float = 0.02
    smoothing: float = 0.01
    tune: bool = False
    precondition: bool = True
    L: float | None = None


class SMILEState(NamedTuple):
    """Per-chain state; tensors of shape ``(C, D)`` or ``(C,)``. ``u`` is a unit vector or zero
    (after a reset); ``grad`` and ``log_density`` are the minibatch estimates at ``z`` on the
    batch of the last step; ``grad_mean``/``grad_sd`` the preconditioner's averages;
    ``energy_mean``/``energy_sd`` the tuner's; ``time`` counts steps from 1."""

    z: torch.Tensor
    u: torch.Tensor
    grad: torch.Tensor
    log_density: torch.Tensor
    step_size: torch.Tensor
    grad_mean: torch.Tensor
    grad_sd: torch.Tensor
    energy_mean: torch.Tensor
    energy_sd: torch.Tensor
    time: torch.Tensor


class SMILEInfo(NamedTuple):
    """Per chain, of one step: the energy error (0 for an undone step), whether the guardrail
    undid the step (``reset``) and whether it was ``finite``."""

    energy_change: torch.Tensor
    reset: torch.Tensor
    finite: torch.Tensor


def _safe(grad):
    return torch.nan_to_num(grad, nan=0.0, posinf=MAX_GRAD, neginf=-MAX_GRAD).clamp(-MAX_GRAD, MAX_GRAD)


def smile_init(z, log_density_and_grad, step_size) -> SMILEState:
    """The state at positions ``z`` (``(C, D)``): zero velocity, the first batch's estimates,
    unit noise scales and the initial ``step_size`` (a number or ``(C,)``).

    :param log_density_and_grad: ``z -> (log p̂ (C,), ∇ log p̂ (C, D))`` on the first batch.
    """
    if z.dim() != 2 or z.shape[-1] < 2:
        raise ValueError(f"SMILE needs positions of shape (chains, dim) with dim >= 2, got {tuple(z.shape)}")
    log_density, grad = log_density_and_grad(z)
    chains = z.shape[0]
    zeros = z.new_zeros(chains)
    return SMILEState(
        z=z, u=torch.zeros_like(z), grad=_safe(grad), log_density=log_density, step_size=torch.as_tensor(step_size, dtype=z.dtype, device=z.device).expand(chains).clone(),
        grad_mean=torch.zeros_like(z), grad_sd=torch.ones_like(z), energy_mean=zeros, energy_sd=zeros.clone(), time=torch.ones_like(zeros),
    )


def preconditioner(grad_sd) -> torch.Tensor:
    """The scale :math:`\\tilde s` of each coordinate (``(C, D)``): the gradient noise's standard
    deviation clipped to :math:`[10^{-2}, 10^4]` and divided by its root mean square per chain."""
    s = grad_sd.clamp(1e-2, 1e4)
    return s / s.square().mean(-1, keepdim=True).sqrt()


def gamma_quantile(prob: float, mean, sd):
    """The ``prob`` quantile of the gamma distribution with this ``mean`` and standard deviation
    ``sd`` by the Wilson-Hilferty cube-root normal approximation (shape :math:`k = \\mu^2/\\sigma^2`,
    scale :math:`\\sigma^2/\\mu`; :math:`10^{-6}` is added to :math:`\\sigma^2` as in the paper's code)."""
    var = sd.square() + 1e-6
    shape, scale = mean.square() / var, var / mean
    if prob >= 1.0:
        return torch.full_like(mean, math.inf)
    if prob <= 0.0:
        return torch.zeros_like(mean)
    z = NormalDist().inv_cdf(prob)
    root = 1.0 - 1.0 / (9.0 * shape) + z / (3.0 * shape.sqrt())
    return scale * shape * root.pow(3)


def smile_step(state: SMILEState, log_density_and_grad, settings: SMILESettings, warmup: bool, noise=None):
    """One SMILE step of every chain on one minibatch.

    :param log_density_and_grad: ``z -> (log p̂ (C,), ∇ log p̂ (C, D))`` on this step's batch.
    :param warmup: whether the step size (``settings.tune``) and the preconditioner adapt; the
        reset guardrail and the energy-error averages it reads run in every step.
    :param noise: ``(C, D)`` standard normal draws for the optional refresh (``settings.L``).
    :returns: ``(state, energy_change, reset, finite)``, the last three of shape ``(C,)``.
    """
    z, u = state.z, state.u
    scale = 1.0 / preconditioner(state.grad_sd) if settings.precondition else torch.ones_like(z)
    eps = state.step_size.unsqueeze(-1)
    if settings.L is not None and noise is not None:  # optional refresh, over the whole step
        moving = u.norm(dim=-1, keepdim=True) > 0
        u = torch.where(moving, partial_refresh(u, eps, settings.L, noise), u)

    def kick(u, grad, coefficient):
        # esh_velocity_update takes grad U = -grad log p
        return esh_velocity_update(u, -grad, coefficient * eps, scale)

    u1, dk1 = kick(u, state.grad, MCLACHLAN_B1)
    z1 = z + 0.5 * eps * scale * u1
    _, g1 = log_density_and_grad(z1)
    g1 = _safe(g1)
    u2, dk2 = kick(u1, g1, 1.0 - 2.0 * MCLACHLAN_B1)
    z2 = z1 + 0.5 * eps * scale * u2
    log_density, g2 = log_density_and_grad(z2)
    g2 = _safe(g2)
    u3, dk3 = kick(u2, g2, MCLACHLAN_B1)
    energy_change = dk1 + dk2 + dk3 + state.log_density - log_density
    finite = torch.isfinite(energy_change) & torch.isfinite(z2).all(-1) & torch.isfinite(u3).all(-1)
    abs_change = torch.where(finite, energy_change.abs(), torch.zeros_like(energy_change))

    # the tuner's quantiles from the averages before this step
    t = state.time
    started = t >= 10.0
    mean = state.energy_mean.clamp_min(1e-6)
    reset = started & (abs_change > gamma_quantile(settings.reset_prob, mean, state.energy_sd))
    undo = reset | ~finite
    keep = (~undo).unsqueeze(-1)
    z_new = torch.where(keep, z2, z)
    u_new = torch.where(keep, u3, torch.zeros_like(u3))
    log_density = torch.where(undo, state.log_density, log_density)
    grad_new = torch.where(keep, g2, state.grad)

    beta = settings.smoothing
    energy_mean = torch.where(t < 3.0, abs_change, (1 - beta) * state.energy_mean + beta * abs_change).clamp(1e-6, 1e6)
    energy_var = torch.where(t == 1.0, torch.zeros_like(t), (1 - beta) * state.energy_sd.square()) + beta * (abs_change - energy_mean).square()
    bias_correction = torch.where(t < 5.0, torch.ones_like(t), 1.0 - 0.5 ** (t - 4.0))
    energy_sd = (energy_var / bias_correction).sqrt().clamp(1e-6, 1e7)

    step_size = state.step_size
    if warmup and settings.tune:
        a, delta = settings.adaptation_prob, settings.adaptation_strength
        upper = gamma_quantile(1.0 - 2.0 * a / 3.0, mean, state.energy_sd)
        lower = gamma_quantile(a / 3.0, mean, state.energy_sd)
        tuned = torch.where(abs_change > upper, step_size * (1 - delta), step_size)
        tuned = torch.where(abs_change < lower, tuned * (1 + delta), tuned).clamp(1e-8, 10.0)
        step_size = torch.where(started & finite, tuned, step_size)

    if settings.precondition and warmup:  # the noise averages, from the new (unscaled) gradient
        g = torch.where(keep, g2, state.grad)
        grad_mean = ((1 - beta) * state.grad_mean + beta * g).clamp(-MAX_GRAD, MAX_GRAD)
        grad_sd = ((1 - beta) * state.grad_sd.square() + beta * (g - grad_mean).square()).clamp_min(1e-7).sqrt()
    else:
        grad_mean, grad_sd = state.grad_mean, state.grad_sd
    new = SMILEState(z_new, u_new, grad_new, log_density, step_size, grad_mean, grad_sd, energy_mean, energy_sd, t + 1.0)
    return new, torch.where(finite, energy_change, torch.zeros_like(energy_change)), reset & finite, finite


def _smile_arrays(settings, warmup, potential, dataset_size, per_row, noisy, *arrays):
    """:func:`smile_step` as a function of tensors alone (a state's fields, the batch ``x`` and
    ``y``, and the refresh noise where ``noisy``), returning the new state's fields and the
    step's energy change, reset and finiteness: the form a CUDA graph records."""
    fields = len(SMILEState._fields)
    state, (x, y) = SMILEState(*arrays[:fields]), arrays[fields : fields + 2]
    noise = arrays[fields + 2] if noisy else None
    new, change, reset, finite = smile_step(state, MinibatchTarget(potential, x, y, dataset_size, per_row), settings, warmup, noise=noise)
    return (*new, change, reset, finite)


class SMILE(Kernel):
    """The SMILE kernel with fixed ``settings`` (:class:`SMILESettings`), on minibatch targets
    ``z -> (log p̂, grad log p̂)``, a batch per chain and step; the runner's settings of a step
    say whether it adapts (the warm-up: the preconditioner, and with ``settings.tune`` the step
    size). ``step_size`` is every chain's initial step size."""

    name, unit = "SMILE", "steps"
    State = SMILEState
    tallies = ("resets", "nonfinite")
    evaluations_per_step = 2

    def __init__(self, settings: SMILESettings, step_size: float, graphs=None):
        self.settings, self.step_size = settings, step_size
        #: whether the step (both gradient evaluations and the tuner) is recorded once as a CUDA
        #: graph per phase, warm-up and sampling, and replayed with each step's batches as inputs
        #: (:class:`~pyrobnn.infer.core.graphs.RecordedFunction`); ``None``: on a CUDA device
        self.graphs = graphs

    def init(self, position, data, generator) -> SMILEState:
        return smile_init(position, data.next_target(), self.step_size)

    def randoms(self, state: SMILEState, adapting: bool, generator):
        if self.settings.L is None:
            return None
        z = state.z
        return torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)

    def step(self, state, target, noise, adapting: bool):
        state, change, reset, finite = smile_step(state, target, self.settings, warmup=adapting, noise=noise)
        return state, SMILEInfo(change, reset, finite)

    def stepper(self, path, target):
        """Eager :meth:`step`; on a CUDA device (see ``graphs``) recorded once per phase and
        replayed, the step's minibatches given as inputs."""
        eager = super().stepper(path, target)
        recorded = {}

        def step(state, target, noise, adapting):
            graphs = self.graphs if self.graphs is not None else state.z.device.type == "cuda"
            if not graphs or not isinstance(target, MinibatchTarget):
                return eager(state, target, noise, adapting)
            if adapting not in recorded:
                recorded[adapting] = RecordedFunction(functools.partial(_smile_arrays, self.settings, adapting, target.potential, target.dataset_size,
                                                                        target.per_row, noise is not None))
            out = recorded[adapting](*state, target.x, target.y, *(() if noise is None else (noise,)))
            return SMILEState(*out[:-3]), SMILEInfo(*out[-3:])

        return step

    def record(self, state: SMILEState, info: SMILEInfo) -> dict:
        return {"z": state.z, "energy_change": info.energy_change}

    def tally(self, info: SMILEInfo) -> dict:
        return {"resets": info.reset.long(), "nonfinite": (~info.finite).long()}

    def final(self, state: SMILEState) -> dict:
        return {"step_size": state.step_size}
