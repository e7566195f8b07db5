r"""Microcanonical Langevin Monte Carlo (MCLMC) for several chains as one batched computation.

MCLMC (Robnik, De Luca, Silverstein & Seljak 2023, "Microcanonical Hamiltonian Monte Carlo",
JMLR 24; Robnik & Seljak 2024, "Fluctuation without dissipation: Microcanonical Langevin Monte
Carlo") moves a position :math:`x \in \mathbb{R}^d` with a velocity :math:`u` of unit norm
(isokinetic dynamics) whose stationary distribution, with :math:`u` marginalized out, is the
target :math:`p(x) \propto e^{-U(x)}`:

.. math:: \dot x = \sqrt{M^{-1}}\, u, \qquad
          \dot u = (I - u u^\top)\, \frac{g(x)}{d - 1}, \qquad
          g = -\sqrt{M^{-1}}\, \nabla U(x),

with a diagonal preconditioner :math:`M^{-1}`. The velocity update of a step :math:`\epsilon`
has a closed form (Steeg & Galstyan 2021): with :math:`e = g / |g|`,
:math:`\delta = \epsilon |g| / (d - 1)` and :math:`\zeta = e^{-\delta}`,

.. math:: u' \propto e\,(1 - \zeta)\bigl(1 + \zeta + (u \cdot e)(1 - \zeta)\bigr) + 2 \zeta u,
          \qquad \Delta K = (d - 1)\bigl(\delta - \log 2
          + \log(1 + u \cdot e + (1 - u \cdot e)\zeta^2)\bigr).

A step composes the velocity updates V and position updates
:math:`T(\epsilon): x \leftarrow x + \epsilon \sqrt{M^{-1}} u` in the minimal-norm
second-order scheme of McLachlan (1995), as BlackJAX does:
:math:`V(b_1 \epsilon)\,T(\epsilon/2)\,V((1 - 2 b_1)\epsilon)\,T(\epsilon/2)\,V(b_1 \epsilon)`
with :math:`b_1 = 0.1931833275037836` (two gradient evaluations per step). Between steps the
velocity is partially refreshed (the Langevin part), half a step before and half after:
:math:`u \leftarrow (u + \nu \xi) / |u + \nu \xi|`, :math:`\xi \sim N(0, I_d)`,
:math:`\nu = \sqrt{(e^{2 (\epsilon/2) / L} - 1) / d}`, where :math:`L` is the momentum
decoherence length. The sampler is unadjusted (no Metropolis step): its bias is controlled by
the energy error :math:`\Delta E = \Delta K + U(x') - U(x)`, which the step-size tuning keeps
at a target variance per dimension.

Tuning, as in Robnik et al. (2023) and BlackJAX's ``mclmc_find_L_and_step_size``, with the
schedule of Sommer et al. (2025, ICLR, "Microcanonical Langevin Ensembles", MILE):

1. **step size** (``num_steps1`` steps): after every step,
   :math:`\xi = \Delta E^2 / (d\, \mathrm{Var}_{target}) + 10^{-8}`,
   :math:`w = \exp(-\tfrac12 (\log \xi / (6 \cdot 1.5))^2)`, and the step size is the
   :math:`w`-weighted, exponentially decayed (decay :math:`(150 - 1)/(150 + 1)`) estimate
   :math:`\epsilon = (\overline{\xi / \epsilon^6})^{-1/6}` (since :math:`\mathrm{Var}[\Delta E]
   \propto \epsilon^6`); MILE schedules the target energy variance per dimension linearly from
   0.5 to 0.1 over this phase. A non-finite step is undone and caps the step size at 0.8 times
   the current one.
2. **L from the parameter variances** (``num_steps2`` steps, step-size tuning going on):
   :math:`L = \sqrt{\sum_i \mathrm{Var}[x_i]}` from :math:`\epsilon`-weighted running moments;
   with diagonal preconditioning :math:`M^{-1} = \mathrm{diag}(\mathrm{Var}[x])`,
   :math:`L = \sqrt d` and a third as many steps again to re-tune the step size.
3. **L from the effective sample size** (``num_steps3`` steps at fixed settings):
   :math:`L = 0.4\, \epsilon\, \mathrm{mean}_i(n / \mathrm{ESS}_i)`.

Each chain is tuned on its own (step size, :math:`L` and preconditioner per chain): in
ensemble-initialized sampling every chain explores its own region.

The kernel (:class:`MCLMC`) is its state record (:class:`MCLMCState`), ``init``, the noise of one
step and the pure step :func:`mclmc_step` over a potential returning ``(U, grad U)`` for ``z`` of
shape ``(chains, dim)``; the tuning is :class:`MCLMCAdaptation` over
:class:`MCLMCAdaptationState`, as BlackJAX's ``mclmc_find_L_and_step_size``, run step by step by
the one runner (:mod:`pyrobnn.infer.core.runner`). :func:`pyrobnn.infer.mcmc.samplers.mclmc`
connects them to a model.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from pyrobnn.infer.core.graphs import RecordedFunction
from pyrobnn.infer.core.integrators import MCLACHLAN_B1, esh_velocity_update, partial_refresh, unit_vector
from pyrobnn.infer.core.kernel import Adaptation, Kernel
from pyrobnn.infer.mcmc.autocorrelation import MIN_ESS_DRAWS, effective_sample_size
from pyrobnn.utils.runtime import compiled

__all__ = [
    "MCLMCState", "MCLMCTuning", "MCLMCInfo", "MCLMC", "mclmc_init", "mclmc_step", "native_mclmc_step", "StepSizeAdapter",
    "step_size_adapter_init", "step_size_adapter_update", "MCLMCAdaptationState", "MCLMCAdaptation",
]


class MCLMCState(NamedTuple):
    """Positions ``z`` ``(C, D)``, unit velocities ``u`` ``(C, D)``, the potential ``energy``
    ``(C,)`` and its gradient ``grad`` ``(C, D)``."""

    z: torch.Tensor
    u: torch.Tensor
    energy: torch.Tensor
    grad: torch.Tensor


class MCLMCTuning(NamedTuple):
    """Per-chain sampler settings: ``step_size`` and ``L`` of shape ``(C,)``, ``inv_mass`` the
    diagonal preconditioner ``(C, D)``."""

    step_size: torch.Tensor
    L: torch.Tensor
    inv_mass: torch.Tensor


class MCLMCInfo(NamedTuple):
    """Per chain, of one step: the energy error ``energy_change`` (0 for an undone step) and
    whether the step was ``finite`` (else undone)."""

    energy_change: torch.Tensor
    finite: torch.Tensor


def mclmc_init(potential, z, generator=None) -> MCLMCState:
    """The state at positions ``z``: energies, gradients and uniformly random unit velocities."""
    if z.shape[-1] < 2:
        raise ValueError("MCLMC needs at least two dimensions (the velocity lives on a sphere)")
    energy, grad = potential(z)
    u = unit_vector(torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device))
    return MCLMCState(z, u, energy, grad)


def mclmc_step(potential, z, u, energy, grad, step_size, L, sqrt_inv_mass, noise):
    """One MCLMC step for every chain: half a refresh, the McLachlan step, half a refresh.

    Pure tensor code (the Gaussian ``noise``, ``(2, C, D)``, is drawn by the caller), so that one
    compiled graph serves every step. A chain whose step gives a non-finite position, energy,
    gradient or energy error stays where it was with a fresh random velocity, the direction of
    ``noise[1]``: the second half refresh's noise enters after the step's last gradient, so
    whether the step was finite does not depend on it, and it is a uniform direction independent
    of the chain's state.

    :returns: ``(z, u, energy, grad, energy_change, finite)``.
    """
    eps = step_size.unsqueeze(-1)
    L_ = L.unsqueeze(-1)
    u1 = partial_refresh(u, 0.5 * eps, L_, noise[0])
    u2, dk1 = esh_velocity_update(u1, grad, MCLACHLAN_B1 * eps, sqrt_inv_mass)
    z2 = z + 0.5 * eps * sqrt_inv_mass * u2
    e2, g2 = potential(z2)
    u3, dk2 = esh_velocity_update(u2, g2, (1 - 2 * MCLACHLAN_B1) * eps, sqrt_inv_mass)
    z3 = z2 + 0.5 * eps * sqrt_inv_mass * u3
    e3, g3 = potential(z3)
    u4, dk3 = esh_velocity_update(u3, g3, MCLACHLAN_B1 * eps, sqrt_inv_mass)
    u5 = partial_refresh(u4, 0.5 * eps, L_, noise[1])
    d_energy = dk1 + dk2 + dk3 + e3 - energy
    finite = torch.isfinite(d_energy) & torch.isfinite(z3).all(-1) & torch.isfinite(g3).all(-1) & torch.isfinite(u5).all(-1)
    keep = finite.unsqueeze(-1)
    z_out = torch.where(keep, z3, z)
    u_out = torch.where(keep, u5, unit_vector(noise[1]))
    energy_out = torch.where(finite, e3, energy)
    grad_out = torch.where(keep, g3, grad)
    d_energy = torch.where(finite, d_energy, torch.zeros_like(d_energy))
    return z_out, u_out, energy_out, grad_out, d_energy, finite


def native_mclmc_step(native, state: MCLMCState, noise, tuning: MCLMCTuning):
    """:func:`mclmc_step` in the native kernels (:class:`~pyrobnn.infer.core.native.NativeMLP` of
    the same potential), on the same noise."""
    z, u, energy, grad = state.z.clone(), state.u.clone(), state.energy.clone(), state.grad.clone()
    d_energy, finite = native.mclmc(
        z, u, energy, grad, tuning.step_size.contiguous(), tuning.L.contiguous(), tuning.inv_mass.sqrt(), noise.contiguous(),
    )
    return MCLMCState(z, u, energy, grad), MCLMCInfo(d_energy, finite)


def _kernel_step(fn, state: MCLMCState, noise, tuning: MCLMCTuning):
    """``fn`` (:func:`mclmc_step` bound to a potential, possibly compiled) on records."""
    z, u, energy, grad, d_energy, finite = fn(*state, tuning.step_size, tuning.L, tuning.inv_mass.sqrt(), noise)
    return MCLMCState(z, u, energy, grad), MCLMCInfo(d_energy, finite)


class MCLMC(Kernel):
    """The MCLMC kernel: the noise of a step is ``(2, C, D)`` standard normal draws (the two half
    refreshes; the second is also the fresh velocity of an undone step); the settings are an
    :class:`MCLMCTuning`."""

    name, unit = "MCLMC", "steps"
    State = MCLMCState
    tallies = ("nonfinite",)
    evaluations_per_step = 2

    def __init__(self, graphs=None):
        #: whether the torch step (eager or compiled) is recorded once as a CUDA graph and
        #: replayed (:class:`~pyrobnn.infer.core.graphs.RecordedFunction`: one launch a step
        #: instead of the hundreds of kernels of an eager step); ``None``: on a CUDA device
        self.graphs = graphs

    def init(self, position, data, generator) -> MCLMCState:
        return mclmc_init(data.next_target(), position, generator)

    def randoms(self, state: MCLMCState, settings, generator):
        # drawn in float32 and widened to the chains' dtype: torch's CPU normals are vectorized in
        # float32 only (3.6 ns each against 17 ns in float64: for 4 chains of 2,751 weights and the
        # three rows a step drew until 2026-12-07, 0.12 ms a step against 0.56 ms, more than the
        # step's own two gradients on the native path). The noise of an unadjusted sampler needs no
        # more than float32's 24 bits.
        z = state.z
        return torch.randn((2,) + tuple(z.shape), generator=generator, dtype=torch.float32, device=z.device).to(z.dtype)

    def step(self, state, target, noise, tuning):
        return _kernel_step(functools.partial(mclmc_step, target), state, noise, tuning)

    def stepper(self, path, target):
        """Native: :func:`native_mclmc_step`; compiled: :func:`mclmc_step` with the potential,
        compiled whole by ``torch.compile``; eager: :func:`mclmc_step`. On a CUDA device (see
        ``graphs``) the torch step is recorded as a CUDA graph after three eager steps; where the
        recording fails it runs as it is."""
        if path.kind == "native":
            native = path.native
            return lambda state, target, noise, tuning: native_mclmc_step(native, state, noise, tuning)
        fn = functools.partial(mclmc_step, target)
        if path.compiled:
            fn = compiled(fn, dynamic=False)
        recorded = RecordedFunction(fn)

        def step(state, target, noise, tuning):
            graphs = self.graphs if self.graphs is not None else state.z.device.type == "cuda"
            return _kernel_step(recorded if graphs else fn, state, noise, tuning)

        return step

    def record(self, state: MCLMCState, info: MCLMCInfo) -> dict:
        return {"z": state.z, "energy": state.energy, "energy_change": info.energy_change}

    def tally(self, info: MCLMCInfo) -> dict:
        return {"nonfinite": (~info.finite).long()}


class StepSizeAdapter(NamedTuple):
    """The running step-size estimate of tuning phases 1 and 2, per chain: the decayed weight sum
    ``time``, the decayed weighted mean of :math:`\\xi / \\epsilon^6` (``x_average``) and the cap
    ``step_max`` a non-finite step sets."""

    time: torch.Tensor
    x_average: torch.Tensor
    step_max: torch.Tensor


def step_size_adapter_init(chains: int, dtype, device) -> StepSizeAdapter:
    zeros = torch.zeros(chains, dtype=dtype, device=device)
    return StepSizeAdapter(zeros, zeros.clone(), torch.full((chains,), math.inf, dtype=dtype, device=device))


def step_size_adapter_update(state: StepSizeAdapter, step_size, d_energy, finite, dim: int, target_var: float,
                             num_effective_samples: float = 150.0, trust_in_estimate: float = 1.5):
    """The estimate after one more step's energy error (the module docstring's phase 1): the new
    state and the step size it gives."""
    decay = (num_effective_samples - 1.0) / (num_effective_samples + 1.0)
    step_max = torch.where(finite, state.step_max, 0.8 * step_size)
    xi = d_energy.square() / (dim * target_var) + 1e-8
    weight = torch.exp(-0.5 * (torch.log(xi) / (6.0 * trust_in_estimate)).square())
    x_average = decay * state.x_average + weight * xi / step_size.pow(6)
    time = decay * state.time + weight
    new = (x_average / time).pow(-1.0 / 6.0)
    new = torch.where(torch.isfinite(new), new, step_size)
    return StepSizeAdapter(time, x_average, step_max), torch.minimum(new, step_max)


class MCLMCAdaptationState(NamedTuple):
    """The tuning's state: the ``tuning`` the next step uses, the step-size ``adapter``, phase 2's
    weighted moments of the positions (``weight_sum``, ``m1``, ``m2``) and phase 3's positions
    so far (empty outside phase 3, which is never written to a checkpoint)."""

    tuning: MCLMCTuning
    adapter: StepSizeAdapter
    weight_sum: torch.Tensor
    m1: torch.Tensor
    m2: torch.Tensor
    positions: tuple


class MCLMCAdaptation(Adaptation):
    """The three tuning phases of the module docstring as the kernel's warm-up (BlackJAX's
    ``mclmc_find_L_and_step_size``), one step at a time; phase 3 keeps its positions for their
    autocorrelation, so a run resumes only at its ends (:meth:`resumable_after`).

    :param num_warmup: the steps of the three phases.
    :param step_size: the initial step size, per chain or a scalar (default BlackJAX's,
        ``sqrt(d) / 4``).
    :param L: the initial decoherence length: per chain, a scalar, a function of the dimension
        ``d`` (:func:`pyrobnn.infer.mcmc.samplers.mclmc` passes MILE's ``max(sqrt(d), 15)``), or
        ``None`` (BlackJAX's ``sqrt(d)``).
    :param energy_variance: target variance of the energy error per dimension, a number or a
        ``(start, end)`` pair scheduled linearly over phase 1 (MILE: ``(0.5, 0.1)``).
    """

    State = MCLMCAdaptationState

    def __init__(self, num_warmup=(40_000, 5_000, 5_000), *, step_size=None, L=None, energy_variance=(0.5, 0.1),
                 diagonal_preconditioning=False, l_factor=0.4):
        self.n1, self.n2, self.n3 = (int(v) for v in num_warmup)
        if min(self.n1, self.n2, self.n3) < 0:
            raise ValueError(f"num_warmup must be three non-negative step counts, got {num_warmup}")
        if isinstance(energy_variance, (int, float)):
            energy_variance = (energy_variance, energy_variance)
        self.start_var, self.end_var = energy_variance
        self.initial_step_size, self.initial_L = step_size, L
        self.diagonal_preconditioning, self.l_factor = diagonal_preconditioning, l_factor
        # the steps of each stretch: phases 1 and 2, the step-size re-tuning after a new
        # preconditioner, phase 3
        self.adapt_end = self.n1 + self.n2
        self.precond_end = self.adapt_end + (round(self.n2 / 3) if diagonal_preconditioning and self.n2 > 1 else 0)
        # phase 3 needs an effective sample size: a shorter phase is skipped (L keeps phase 2's value)
        self.num_steps = self.precond_end + (self.n3 if self.n3 >= MIN_ESS_DRAWS else 0)

    def init(self, state: MCLMCState, data, generator) -> MCLMCAdaptationState:
        z = state.z
        chains, dim = z.shape

        def per_chain(name, v, default):
            v = default if v is None else v(dim) if callable(v) else v
            v = torch.as_tensor(v, dtype=z.dtype, device=z.device)
            if tuple(v.shape) not in ((), (chains,)):
                raise ValueError(f"{name} must be a number or have shape ({chains},) (one per chain), got shape {tuple(v.shape)}")
            return v.expand(chains).clone()

        tuning = MCLMCTuning(per_chain("step_size", self.initial_step_size, math.sqrt(dim) * 0.25), per_chain("L", self.initial_L, math.sqrt(dim)),
                             torch.ones_like(z))
        zeros = torch.zeros(chains, dtype=z.dtype, device=z.device)
        return MCLMCAdaptationState(tuning, step_size_adapter_init(chains, z.dtype, z.device), zeros, torch.zeros_like(z), torch.zeros_like(z), ())

    def _scheduled_variance(self, t):
        if self.n1 <= 1:
            return self.end_var
        return self.start_var + (self.end_var - self.start_var) * min(t / (self.n1 - 1), 1.0)

    def update(self, tuning: MCLMCAdaptationState, t, state: MCLMCState, info: MCLMCInfo, target, generator) -> MCLMCAdaptationState:
        settings, dim = tuning.tuning, state.z.shape[1]
        if t < self.adapt_end:  # phases 1 and 2: tune the step size, and in phase 2 gather moments
            adapter, step_size = step_size_adapter_update(tuning.adapter, settings.step_size, info.energy_change, info.finite, dim, self._scheduled_variance(t))
            settings = MCLMCTuning(step_size, settings.L, settings.inv_mass)
            if self.n2 > 1 and t >= self.n1:
                w = (step_size * info.finite).unsqueeze(-1)
                tuning = MCLMCAdaptationState(settings, adapter, tuning.weight_sum + w.squeeze(-1), tuning.m1 + w * state.z,
                                              tuning.m2 + w * state.z.square(), tuning.positions)
            else:
                tuning = MCLMCAdaptationState(settings, adapter, tuning.weight_sum, tuning.m1, tuning.m2, tuning.positions)
            if t + 1 == self.adapt_end and self.n2 > 1:
                w = tuning.weight_sum.clamp_min(1e-30).unsqueeze(-1)
                mean = tuning.m1 / w
                variance = (tuning.m2 / w - mean.square()).clamp_min(1e-12)
                if self.diagonal_preconditioning:
                    L = torch.full((state.z.shape[0],), math.sqrt(dim), dtype=state.z.dtype, device=state.z.device)
                    z = state.z
                    tuning = tuning._replace(tuning=tuning.tuning._replace(inv_mass=variance, L=L),
                                             adapter=step_size_adapter_init(z.shape[0], z.dtype, z.device))
                else:
                    tuning = tuning._replace(tuning=tuning.tuning._replace(L=variance.sum(-1).sqrt()))
        elif t < self.precond_end:  # the step size again, for the new preconditioner
            adapter, step_size = step_size_adapter_update(tuning.adapter, settings.step_size, info.energy_change, info.finite, dim, self.end_var)
            tuning = tuning._replace(tuning=settings._replace(step_size=step_size), adapter=adapter)
        else:  # phase 3: L from the effective sample size
            positions = tuning.positions + (state.z,)
            if t + 1 < self.num_steps:
                return tuning._replace(positions=positions)
            ess = effective_sample_size(torch.stack(positions, 1))  # (C, D)
            tau = (self.num_steps - self.precond_end) / ess
            finite_tau = torch.isfinite(tau)
            mean_tau = torch.where(finite_tau, tau, 0.0).sum(-1) / finite_tau.sum(-1).clamp_min(1)
            L = torch.where(finite_tau.any(-1), self.l_factor * settings.step_size * mean_tau, settings.L)
            tuning = tuning._replace(tuning=settings._replace(L=L), positions=())
        return tuning

    def settings(self, tuning: MCLMCAdaptationState, i) -> MCLMCTuning:
        return tuning.tuning

    def final(self, tuning: MCLMCAdaptationState) -> dict:
        t = tuning.tuning
        return {"step_size": t.step_size, "L": t.L, "inv_mass": t.inv_mass}

    def resumable_after(self, steps: int) -> bool:
        """Whether the run can be saved after ``steps`` steps: not inside phase 3 (after its
        first step and before its last, while it holds positions)."""
        return not self.precond_end < steps < self.num_steps
