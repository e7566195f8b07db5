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

The functions take a potential returning ``(U, grad U)`` for ``z`` of shape ``(chains, dim)``;
:func:`pyrobnn.infer.mcmc.samplers.mclmc` connects them to a model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from pyrobnn.infer.core.checkpoints import watching
from pyrobnn.infer.core.integrators import MCLACHLAN_B1, esh_velocity_update, partial_refresh, unit_vector
from pyrobnn.infer.mcmc.autocorrelation import MIN_ESS_DRAWS, effective_sample_size
from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.runtime import compiled, raised_recompile_limits

__all__ = ["MCLMCState", "MCLMCTuning", "mclmc_init", "mclmc_step", "Stepper", "StepSizeAdapter", "MCLMCAdaptation", "sample_mclmc"]

@dataclass
class MCLMCState:
    z: torch.Tensor  # positions (C, D)
    u: torch.Tensor  # unit velocities (C, D)
    energy: torch.Tensor  # potential U (C,)
    grad: torch.Tensor  # grad U (C, D)


@dataclass
class MCLMCTuning:
    """Per-chain sampler settings: ``step_size`` and ``L`` of shape ``(C,)``, ``inv_mass`` the
    diagonal preconditioner ``(C, D)``."""

    step_size: torch.Tensor
    L: torch.Tensor
    inv_mass: torch.Tensor


def mclmc_init(potential, z, generator=None) -> MCLMCState:
    """The state at positions ``z``: energies, gradients and uniformly random unit velocities."""
    if z.shape[-1] < 2:
        raise ValueError("MCLMC needs at least two dimensions (the velocity lives on a sphere)")
    energy, grad = potential(z)
    u = unit_vector(torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device))
    return MCLMCState(z, u, energy, grad)


def mclmc_step(potential, z, u, energy, grad, step_size, L, sqrt_inv_mass, noise):
    """One MCLMC step for every chain: half a refresh, the McLachlan step, half a refresh.

    Pure tensor code (the Gaussian ``noise``, ``(3, C, D)``, is drawn by the caller), so that one
    compiled graph serves every step. A chain whose step gives a non-finite position, energy,
    gradient or energy error stays where it was with a fresh random velocity (``noise[2]``).

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
    u_out = torch.where(keep, u5, unit_vector(noise[2]))
    energy_out = torch.where(finite, e3, energy)
    grad_out = torch.where(keep, g3, grad)
    d_energy = torch.where(finite, d_energy, torch.zeros_like(d_energy))
    return z_out, u_out, energy_out, grad_out, d_energy, finite


class Stepper:
    """Draws the noise and calls the (possibly compiled) step function, or the native kernels'
    step (:mod:`pyrobnn.infer.mcmc.native`) on the same noise."""

    def __init__(self, potential, generator, compile, native=None):
        fn = functools.partial(mclmc_step, potential)
        self.fn = compiled(fn, dynamic=False) if compile and native is None else fn
        self.generator = generator
        self.native = native

    def __call__(self, state: MCLMCState, tuning: MCLMCTuning):
        z = state.z
        noise = torch.randn((3,) + tuple(z.shape), generator=self.generator, dtype=z.dtype, device=z.device)
        if self.native is not None:
            z, u, energy, grad = z.clone(), state.u.clone(), state.energy.clone(), state.grad.clone()
            d_energy, finite = self.native.mclmc(
                z, u, energy, grad, tuning.step_size.contiguous(), tuning.L.contiguous(), tuning.inv_mass.sqrt(),
                noise.transpose(0, 1).contiguous(),
            )
            return MCLMCState(z, u, energy, grad), d_energy, finite
        z, u, energy, grad, d_energy, finite = self.fn(
            state.z, state.u, state.energy, state.grad, tuning.step_size, tuning.L, tuning.inv_mass.sqrt(), noise
        )
        return MCLMCState(z, u, energy, grad), d_energy, finite


class StepSizeAdapter:
    """The running step-size estimate of phases 1 and 2 (per chain)."""

    def __init__(self, chains, dtype, device, num_effective_samples: float = 150.0, trust_in_estimate: float = 1.5):
        self.decay = (num_effective_samples - 1.0) / (num_effective_samples + 1.0)
        self.trust = trust_in_estimate
        self.time = torch.zeros(chains, dtype=dtype, device=device)
        self.x_average = torch.zeros(chains, dtype=dtype, device=device)
        self.step_max = torch.full((chains,), math.inf, dtype=dtype, device=device)

    def update(self, step_size, d_energy, finite, dim, target_var):
        self.step_max = torch.where(finite, self.step_max, 0.8 * step_size)
        xi = d_energy.square() / (dim * target_var) + 1e-8
        weight = torch.exp(-0.5 * (torch.log(xi) / (6.0 * self.trust)).square())
        self.x_average = self.decay * self.x_average + weight * xi / step_size.pow(6)
        self.time = self.decay * self.time + weight
        new = (self.x_average / self.time).pow(-1.0 / 6.0)
        new = torch.where(torch.isfinite(new), new, step_size)
        return torch.minimum(new, self.step_max)

    def state_dict(self) -> dict:
        return {"time": self.time.cpu(), "x_average": self.x_average.cpu(), "step_max": self.step_max.cpu()}

    def load_state_dict(self, state: dict) -> None:
        device = self.time.device
        self.time, self.x_average, self.step_max = (state[k].to(device) for k in ("time", "x_average", "step_max"))


class MCLMCAdaptation:
    """The three tuning phases of the module docstring as the kernel's warm-up (BlackJAX's
    ``mclmc_find_L_and_step_size``), one step at a time: :meth:`update` takes the result of
    warm-up step ``t``, and ``tuning`` is what the next step uses. Its state (the step-size
    adapter, phase 2's moments, the tuning) is a plain dict, so a run can stop and go on; phase
    3 keeps its positions for their autocorrelation, so a run resumes only at its ends
    (:meth:`resumable_after`).

    :param step_size: initial values, per chain or scalars (default BlackJAX's,
        ``sqrt(d) / 4`` and ``sqrt(d)``; :func:`pyrobnn.infer.mcmc.samplers.mclmc` passes MILE's).
    :param L: see ``step_size``.
    :param energy_variance: target variance of the energy error per dimension, a number or a
        ``(start, end)`` pair scheduled linearly over phase 1 (MILE: ``(0.5, 0.1)``).
    """

    def __init__(self, z, num_warmup, *, step_size=None, L=None, energy_variance=(0.5, 0.1), diagonal_preconditioning=False, l_factor=0.4):
        self.n1, self.n2, self.n3 = (int(v) for v in num_warmup)
        if min(self.n1, self.n2, self.n3) < 0:
            raise ValueError(f"num_warmup must be three non-negative step counts, got {num_warmup}")
        chains, self.dim = z.shape
        self.chains, self.dtype, self.device = chains, z.dtype, z.device
        if isinstance(energy_variance, (int, float)):
            energy_variance = (energy_variance, energy_variance)
        self.start_var, self.end_var = energy_variance
        self.diagonal_preconditioning, self.l_factor = diagonal_preconditioning, l_factor
        # the steps of each stretch: phases 1 and 2, the step-size re-tuning after a new
        # preconditioner, phase 3
        self.adapt_end = self.n1 + self.n2
        self.precond_end = self.adapt_end + (round(self.n2 / 3) if diagonal_preconditioning and self.n2 > 1 else 0)
        # phase 3 needs an effective sample size: a shorter phase is skipped (L keeps phase 2's value)
        self.num_steps = self.precond_end + (self.n3 if self.n3 >= MIN_ESS_DRAWS else 0)

        def per_chain(v, default):
            v = default if v is None else v
            return torch.as_tensor(v, dtype=self.dtype, device=self.device).expand(chains).clone()

        self.tuning = MCLMCTuning(
            per_chain(step_size, math.sqrt(self.dim) * 0.25), per_chain(L, math.sqrt(self.dim)), torch.ones_like(z)
        )
        self.adapter = StepSizeAdapter(chains, self.dtype, self.device)
        self.weight_sum, self.m1, self.m2 = torch.zeros(chains, dtype=self.dtype, device=self.device), torch.zeros_like(z), torch.zeros_like(z)
        self._positions = []

    def _scheduled_variance(self, t):
        if self.n1 <= 1:
            return self.end_var
        return self.start_var + (self.end_var - self.start_var) * min(t / (self.n1 - 1), 1.0)

    def update(self, t: int, state: MCLMCState, d_energy, finite) -> None:
        """After warm-up step ``t`` (0-based, below ``num_steps``) to ``state``."""
        tuning = self.tuning
        if t < self.adapt_end:  # phases 1 and 2: tune the step size, and in phase 2 gather moments
            tuning.step_size = self.adapter.update(tuning.step_size, d_energy, finite, self.dim, self._scheduled_variance(t))
            if self.n2 > 1 and t >= self.n1:
                w = (tuning.step_size * finite).unsqueeze(-1)
                self.weight_sum.add_(w.squeeze(-1))
                self.m1.add_(w * state.z)
                self.m2.add_(w * state.z.square())
            if t + 1 == self.adapt_end and self.n2 > 1:
                w = self.weight_sum.clamp_min(1e-30).unsqueeze(-1)
                mean = self.m1 / w
                variance = (self.m2 / w - mean.square()).clamp_min(1e-12)
                if self.diagonal_preconditioning:
                    tuning.inv_mass = variance
                    tuning.L = torch.full((self.chains,), math.sqrt(self.dim), dtype=self.dtype, device=self.device)
                    self.adapter = StepSizeAdapter(self.chains, self.dtype, self.device)
                else:
                    tuning.L = variance.sum(-1).sqrt()
        elif t < self.precond_end:  # the step size again, for the new preconditioner
            tuning.step_size = self.adapter.update(tuning.step_size, d_energy, finite, self.dim, self.end_var)
        else:  # phase 3: L from the effective sample size
            self._positions.append(state.z)
            if t + 1 == self.num_steps:
                ess = effective_sample_size(torch.stack(self._positions, 1))  # (C, D)
                self._positions = []
                tau = (self.num_steps - self.precond_end) / ess
                finite_tau = torch.isfinite(tau)
                mean_tau = torch.where(finite_tau, tau, 0.0).sum(-1) / finite_tau.sum(-1).clamp_min(1)
                tuning.L = torch.where(finite_tau.any(-1), self.l_factor * tuning.step_size * mean_tau, tuning.L)

    def resumable_after(self, steps: int) -> bool:
        """Whether the run can be saved after ``steps`` steps (not inside phase 3)."""
        return not self.precond_end <= steps < self.num_steps

    def state_dict(self) -> dict:
        t = self.tuning
        return {
            "tuning": {"step_size": t.step_size.cpu(), "L": t.L.cpu(), "inv_mass": t.inv_mass.cpu()},
            "adapter": self.adapter.state_dict(),
            "moments": {"weight_sum": self.weight_sum.cpu(), "m1": self.m1.cpu(), "m2": self.m2.cpu()},
        }

    def load_state_dict(self, state: dict) -> None:
        d = self.device
        self.tuning = MCLMCTuning(*(state["tuning"][k].to(d) for k in ("step_size", "L", "inv_mass")))
        self.adapter.load_state_dict(state["adapter"])
        self.weight_sum, self.m1, self.m2 = (state["moments"][k].to(d) for k in ("weight_sum", "m1", "m2"))


def sample_mclmc(
    potential,
    z_init,
    num_samples: int,
    num_warmup=(40_000, 5_000, 5_000),
    *,
    thinning: int = 1,
    step_size=None,
    L=None,
    energy_variance=(0.5, 0.1),
    diagonal_preconditioning: bool = False,
    l_factor: float = 0.4,
    generator=None,
    progress: bool = True,
    compile: bool = False,
    native=None,
    checkpoint=None,
):
    """Tune (:class:`MCLMCAdaptation`, ``num_warmup`` = the steps of its three phases) and then
    run ``num_samples`` steps of MCLMC from ``z_init`` (``(C, D)``), keeping every
    ``thinning``-th position.

    :param native: a :class:`~pyrobnn.infer.mcmc.native.NativeMLP` of ``potential``: each step runs
        in its native code, on the same noise (``compile`` is then not used).
    :param checkpoint: a :class:`~pyrobnn.infer.core.checkpoints.RunCheckpoint`: the run starts
        from its saved state if there is one and writes its state when due (never inside phase
        3) and at the end.

    :returns: the draws ``(C, num_samples // thinning, D)`` and statistics: ``energy`` (the
        potential at each draw, ``(C, S)``), ``energy_change`` (the energy error of each kept
        step), ``step_size`` and ``L`` (``(C,)``), ``inv_mass`` (``(C, D)``), ``nonfinite``
        (steps undone per chain while sampling) and ``nonfinite_warmup``.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be a positive number of steps, got {num_samples}")
    if not isinstance(thinning, int) or thinning < 1:
        raise ValueError(f"thinning must be a positive integer, got {thinning!r}")
    if num_samples < thinning:
        raise ValueError(f"num_samples ({num_samples}) must be at least thinning ({thinning}): no draw would be kept")
    chains, dim = z_init.shape
    device = z_init.device
    warmup = MCLMCAdaptation(
        z_init, num_warmup, step_size=step_size, L=L, energy_variance=energy_variance,
        diagonal_preconditioning=diagonal_preconditioning, l_factor=l_factor,
    )
    total = warmup.num_steps + num_samples
    stepper = Stepper(potential, generator, compile, native)
    state = mclmc_init(potential, z_init, generator)
    nonfinite_warmup = torch.zeros(chains, dtype=torch.long, device=device)
    nonfinite = torch.zeros(chains, dtype=torch.long, device=device)
    draws, energies, changes = [], [], []
    first = 0
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        state = MCLMCState(*(saved["state"][k].to(device) for k in ("z", "u", "energy", "grad")))
        warmup.load_state_dict(saved["warmup"])
        nonfinite_warmup, nonfinite = saved["nonfinite_warmup"].to(device), saved["nonfinite"].to(device)
        if saved["draws"] is not None:
            draws, energies, changes = (list(saved[k].to(device).unbind(1)) for k in ("draws", "energies", "changes"))
        generator.set_state(saved["generator"])
        first = int(saved["step"])

    def snapshot(done):
        stack = (lambda xs: torch.stack(xs, 1).cpu()) if draws else (lambda xs: None)
        return {
            "step": done, "generator": generator.get_state(), "warmup": warmup.state_dict(),
            "state": {"z": state.z.cpu(), "u": state.u.cpu(), "energy": state.energy.cpu(), "grad": state.grad.cpu()},
            "nonfinite_warmup": nonfinite_warmup.cpu(), "nonfinite": nonfinite.cpu(),
            "draws": stack(draws), "energies": stack(energies), "changes": stack(changes),
        }

    bar = tqdm(total=total, initial=first, disable=not progress, desc="MCLMC", unit="step", dynamic_ncols=True, mininterval=0.5)
    # the step is compiled for each potential (see raised_recompile_limits)
    with raised_recompile_limits(enabled=compile and native is None), watching(checkpoint):
        try:
            for t in range(first, total):
                state, d_energy, finite = stepper(state, warmup.tuning)
                if t < warmup.num_steps:
                    nonfinite_warmup.add_((~finite).long())
                    warmup.update(t, state, d_energy, finite)
                else:
                    nonfinite.add_((~finite).long())
                    if (t - warmup.num_steps + 1) % thinning == 0:
                        draws.append(state.z)
                        energies.append(state.energy)
                        changes.append(d_energy)
                if progress:
                    bar.update(1)
                if checkpoint is not None:
                    # phase 3 cannot be written: the state before it always is, so that a stop
                    # inside it goes back no further
                    resumable = warmup.resumable_after(t + 1)
                    if resumable and t + 2 <= total and not warmup.resumable_after(t + 2):
                        checkpoint.try_save(lambda: snapshot(t + 1), t + 1, "steps")
                    checkpoint.after(t + 1, lambda: snapshot(t + 1), last=t + 1 == total, resumable=resumable, unit="steps")
        finally:
            bar.close()
    tuning = warmup.tuning
    stats = {
        "energy": torch.stack(energies, 1) if energies else z_init.new_zeros(chains, 0),
        "energy_change": torch.stack(changes, 1) if changes else z_init.new_zeros(chains, 0),
        "step_size": tuning.step_size,
        "L": tuning.L,
        "inv_mass": tuning.inv_mass,
        "nonfinite": nonfinite,
        "nonfinite_warmup": nonfinite_warmup,
    }
    samples = torch.stack(draws, 1) if draws else z_init.new_zeros(chains, 0, dim)
    return samples, stats
