r"""Stochastic-gradient MCMC on a BayesianModel: SGLD and SGHMC, with a constant or cyclical
step size.

Both use the minibatch estimate of the log joint's gradient in the unconstrained space of
:class:`~pyrobnn.infer.core.potential.FlatPotential`,

.. math:: \hat g(w) = \nabla \log p(w) + \frac{N}{B} \sum_{n \in \mathcal B} \nabla \log p(y_n \mid x_n, w),

unbiased for :math:`\nabla \log p(w \mid \mathcal D)`, and run all chains as one batch.

- **SGLD** (Welling & Teh 2011): :math:`w \leftarrow w + \frac\epsilon2 \hat g(w) + \sqrt\epsilon\, \xi`,
  :math:`\xi \sim N(0, I)`.
- **SGHMC** (Chen, Fox & Guestrin 2014, eq. 15, with the noise estimate :math:`\hat\beta = 0`):
  :math:`v \leftarrow (1 - \alpha) v + \eta \hat g(w) + \sqrt{2 \alpha \eta}\, \xi`,
  :math:`w \leftarrow w + v`, with learning rate :math:`\eta` and friction :math:`\alpha`.
- **Cyclical schedule** (Zhang et al. 2020, ICLR, eq. 1): over :math:`K` steps in :math:`M`
  cycles, :math:`\epsilon_k = \frac{\epsilon_0}{2}\big[\cos\big(\pi \frac{(k-1) \bmod \lceil K/M \rceil}{\lceil K/M \rceil}\big) + 1\big]`;
  in the first ``exploration`` fraction of each cycle the noise is off (optimization), in the
  rest draws are kept every ``thinning`` steps.

With a constant step size, draws are kept every ``thinning`` steps after ``num_burnin``. Neither
sampler has a Metropolis correction: the draws are biased by the step size (for SGLD on a
Gaussian of precision :math:`\lambda` the stationary variance is
:math:`1 / (\lambda (1 - \epsilon\lambda/4))`, which the tests check).
"""

from __future__ import annotations

import math
import time

import torch

from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint, watching
from pyrobnn.infer.core.curvature import largest_curvature
from pyrobnn.infer.core.minibatch import MinibatchLoop, minibatch_log_joint_grad
from pyrobnn.infer.core.problem import flat_problem
from pyrobnn.infer.core.starts import chain_starts
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.sgmcmc.kernels import SCHEDULES, cyclical_step_size, sghmc_step, sgld_step
from pyrobnn.methods import MethodSpec, check_budget, latent_only_support, refuse_unsupported, register
from pyrobnn.utils.progress import tqdm

__all__ = ["sgld", "sghmc", "chain_starts", "AUTO_STEP"]

#: ``step_size="auto"``: this constant over the largest curvature at the start (SGLD's step,
#: SGHMC's learning rate); a tenth of SGLD's stability limit on a Gaussian, so that the
#: discretization bias is a few percent there (1 / (1 - eps lambda / 4))
AUTO_STEP = 0.1


def _run(model, x, y, kind, *, step_size, friction, num_steps, num_burnin, thinning, schedule, num_cycles, exploration,
         batch_size, num_chains, init, seed, progress, checkpoint=None):
    refuse_unsupported(kind, model)
    checkpoint = Checkpointing.of(checkpoint)
    settings_given = dict(
        step_size=step_size, friction=friction, num_steps=num_steps, num_burnin=num_burnin, thinning=thinning, schedule=schedule,
        num_cycles=num_cycles, exploration=exploration, batch_size=batch_size, num_chains=num_chains, seed=seed,
    )
    if step_size != "auto" and not (isinstance(step_size, (int, float)) and step_size > 0 and math.isfinite(step_size)):
        raise ValueError(f"step_size must be a positive number or 'auto', got {step_size!r}")
    if kind == "sghmc" and not 0.0 < friction <= 1.0:
        raise ValueError(f"friction must be in (0, 1], got {friction!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, value in (("num_steps", num_steps), ("thinning", thinning), ("num_cycles", num_cycles), ("batch_size", batch_size)):
        check_budget(kind, name, value)
    if init is None:
        check_budget(kind, "num_chains", num_chains)
    if num_burnin is None:
        num_burnin = num_steps // 2
    if schedule == "constant" and (not isinstance(num_burnin, int) or num_burnin < 0 or num_burnin >= num_steps):
        raise ValueError(f"num_burnin must be an integer in [0, num_steps), got {num_burnin!r}")
    if not 0.0 <= exploration < 1.0:
        raise ValueError(f"exploration must be a fraction in [0, 1), got {exploration!r}")
    if schedule == "cyclical" and num_cycles > num_steps:
        raise ValueError(f"num_cycles ({num_cycles}) exceeds num_steps ({num_steps})")
    with flat_problem(model, x, y, seed) as problem:
        x, y, potential, generator = problem.x, problem.y, problem.potential, problem.generator
        z = chain_starts(model, potential, init, num_chains, seed, generator)
        if step_size == "auto":
            step_size = AUTO_STEP / float(largest_curvature(potential, z, generator=generator).max())
        v = torch.zeros_like(z)
        n = x.shape[0]
        loop = MinibatchLoop(n, batch_size, seed, x.device, advice=f"Lower step_size (now {step_size:.3g}).")
        per_epoch = math.ceil(n / loop.batch_size)  # steps between the checks for a failed step
        period = math.ceil(num_steps / num_cycles)
        draws, steps_kept, first = [], [], 0
        run = None
        if checkpoint is not None:
            run = RunCheckpoint.of_run(checkpoint, kind.upper(), settings_given, model, (x, y), z)
            saved = run.load()
            if saved is not None:
                z, v = saved["z"].to(z.device), saved["v"].to(z.device)
                generator.set_state(saved["generator"])
                loop.load_state_dict(saved["loop"])
                draws = list(saved["draws"].to(z.device).unbind(1)) if saved["draws"] is not None else []
                steps_kept, first = list(saved["steps_kept"]), int(saved["step"])
        start = time.perf_counter()
        bar = tqdm(total=num_steps, initial=first, disable=not progress, desc=kind.upper(), unit="step", dynamic_ncols=True)
        with watching(run):
            try:
                for k in range(first, num_steps):
                    idx = loop.next_batch()
                    if schedule == "cyclical":
                        eps = cyclical_step_size(k, num_steps, num_cycles, step_size)
                        sampling = (k % period) >= exploration * period
                    else:
                        eps, sampling = step_size, True
                    grad = minibatch_log_joint_grad(potential, z, x[idx], y[idx], n)
                    if kind == "sgld":
                        z_new, v_new = sgld_step(z, grad, eps, generator, noise=sampling), v
                    else:
                        z_new, v_new = sghmc_step(z, v, grad, eps, friction, generator, noise=sampling)
                    # from a failed step on, the chains stay where they were (no host sync here)
                    failed = loop.record(grad=grad, new=z_new)
                    z, v = torch.where(failed, z, z_new), torch.where(failed, v, v_new)
                    if (k + 1) % per_epoch == 0 or k + 1 == num_steps:
                        loop.check([z])
                    keep = sampling and (k + 1) % thinning == 0
                    if schedule == "constant":
                        keep = keep and k >= num_burnin
                    if keep:
                        draws.append(z.detach().clone())
                        steps_kept.append(k + 1)
                    bar.update(1)
                    if run is not None:
                        def state():
                            loop.check([z])  # a failed step is never saved
                            return {
                                "step": k + 1, "z": z.cpu(), "v": v.cpu(), "generator": generator.get_state(), "loop": loop.state_dict(),
                                "draws": torch.stack(draws, 1).cpu() if draws else None, "steps_kept": list(steps_kept),
                            }
                        run.after(k + 1, state, last=k + 1 == num_steps, unit="steps")
            finally:
                bar.close()
        seconds = time.perf_counter() - start
        if not draws:
            raise ValueError(f"no draws kept: num_steps={num_steps} with thinning={thinning} keeps none after burn-in")
        samples = potential.unpack_draws(torch.stack(draws, 1))
        chains = z.shape[0]
    label = f"{kind.upper()}" + (" (cyclical)" if schedule == "cyclical" else "")
    stats = {"step": torch.tensor(steps_kept), "step_size": torch.full((chains,), float(step_size))}
    settings = dict(settings_given, num_chains=chains, init=init)
    return Posterior(samples, stats, seconds, label, "sgmcmc", settings, model)


def sgld(
    model, x, y, *, step_size: float = 1e-4, num_steps: int = 10_000, num_burnin=None, thinning: int = 50,
    schedule: str = "constant", num_cycles: int = 4, exploration: float = 0.5, batch_size: int = 128, num_chains: int = 1,
    init=None, seed: int = 0, progress: bool = True, checkpoint=None,
) -> Posterior:
    """SGLD draws from ``model``'s posterior given ``(x, y)``, as an
    :class:`~pyrobnn.infer.results.posterior.Posterior` (``predict``, ``Predictive`` and ArviZ take it).

    :param step_size: :math:`\\epsilon` (the initial one with ``schedule="cyclical"``), or
        ``"auto"``: ``AUTO_STEP`` over the largest curvature of the log joint at the starting
        points (:func:`largest_curvature`, the largest over chains).
    :param num_burnin: steps before the first kept draw (constant schedule; default half of
        ``num_steps``).
    :param schedule: ``"constant"`` or ``"cyclical"`` (cSGLD; ``num_cycles``, ``exploration``).
    :param num_chains: chains run as one batch, each started at the network's own initialization
        under seed ``seed + k`` (as deep-ensemble members are), or from ``init``.
    :param checkpoint: a file to write the chains' state to (positions, momenta, random
        generators, data order, draws so far), or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` steps or ``seconds``
        seconds), and at the end; the same call with the same file resumes
        from it and gives the uninterrupted run's draws (:mod:`pyrobnn.infer.core.checkpoints`).

    A step whose gradient or new position is not finite is handled by the one policy of
    :mod:`pyrobnn.infer.core.minibatch`: from it on the chains stay where they were, and at the end
    of the epoch (``ceil(N / batch_size)`` steps) a
    :class:`~pyrobnn.infer.core.failures.NonFiniteLossError` names the step.
    """
    return _run(model, x, y, "sgld", step_size=step_size, friction=None, num_steps=num_steps, num_burnin=num_burnin,
                thinning=thinning, schedule=schedule, num_cycles=num_cycles, exploration=exploration, batch_size=batch_size,
                num_chains=num_chains, init=init, seed=seed, progress=progress, checkpoint=checkpoint)


def sghmc(
    model, x, y, *, step_size: float = 1e-5, friction: float = 0.1, num_steps: int = 10_000, num_burnin=None,
    thinning: int = 50, schedule: str = "constant", num_cycles: int = 4, exploration: float = 0.5, batch_size: int = 128,
    num_chains: int = 1, init=None, seed: int = 0, progress: bool = True, checkpoint=None,
) -> Posterior:
    """SGHMC draws (learning rate ``step_size`` :math:`= \\eta`, or ``"auto"`` as in :func:`sgld`;
    ``friction`` :math:`= \\alpha`); otherwise as :func:`sgld`. With ``schedule="cyclical"`` this
    is cSGHMC."""
    return _run(model, x, y, "sghmc", step_size=step_size, friction=friction, num_steps=num_steps, num_burnin=num_burnin,
                thinning=thinning, schedule=schedule, num_cycles=num_cycles, exploration=exploration, batch_size=batch_size,
                num_chains=num_chains, init=init, seed=seed, progress=progress, checkpoint=checkpoint)


_SG_BUDGETS = {"num_steps": 1, "thinning": 1, "num_cycles": 1, "batch_size": 1, "num_chains": 1}
_SG_QUICK = {"num_steps": 6, "thinning": 2, "batch_size": 16, "num_chains": 2, "step_size": "auto", "progress": False}
register(MethodSpec("sgld", "SGLD: Langevin dynamics on minibatch gradients (constant or cyclical steps)", "sgmcmc", sgld,
                    latent_only_support(), budgets=_SG_BUDGETS, quick=_SG_QUICK))
register(MethodSpec("sghmc", "SGHMC: Hamiltonian dynamics with friction on minibatch gradients", "sgmcmc", sghmc,
                    latent_only_support(), budgets=_SG_BUDGETS, quick=_SG_QUICK))
