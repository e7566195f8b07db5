"""SMILE as a posterior method on a BayesianModel: stochastic-gradient microcanonical Langevin
sampling (the kernel and its math: :mod:`pyrobnn.infer.sgmcmc.smile_kernel`) over the minibatch
log joint that SGLD and SGHMC use, with every chain in one batch."""

from __future__ import annotations

import math
import time

import torch

from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint, watching
from pyrobnn.infer.core.minibatch import MinibatchLoop, per_row_minibatch_log_joint_value_and_grad
from pyrobnn.infer.core.problem import flat_problem, training_data
from pyrobnn.infer.core.starts import chain_starts
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.sgmcmc.smile_kernel import SMILESettings, SMILEState, smile_init, smile_step
from pyrobnn.methods import MethodSpec, check_budget, latent_only_support, refuse_unsupported, register
from pyrobnn.utils.progress import tqdm

__all__ = ["smile"]


def _check_fraction(name, value, low_open=True, high_closed=True):
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > 0 if low_open else value >= 0) and (value <= 1 if high_closed else value < 1)
    if not ok:
        raise ValueError(f"{name} must be a fraction in {'(' if low_open else '['}0, 1{']' if high_closed else ')'}, got {value!r}")


def smile(
    model, x, y, *, num_samples: int = 10_000, num_warmup: int = 10_000, thinning: int = 10, step_size: float = 1e-3,
    batch_size: int = 128, precondition: bool = True, tune: bool = False, reset_prob: float = 0.99, adaptation_prob: float = 0.05,
    adaptation_strength: float = 0.02, L=None, num_chains: int = 4, init=None, seed: int = 0, progress: bool = True,
    checkpoint=None,
) -> Posterior:
    """Stochastic-gradient microcanonical Langevin draws (SMILE; Sommer et al. 2026, ICML) from
    ``model``'s posterior given ``(x, y)``, as a :class:`~pyrobnn.infer.results.posterior.Posterior`.

    ``num_warmup`` steps in which the gradient-noise preconditioner (``precondition``: pSMILE;
    ``False``: plain SMILE) and, with ``tune``, each chain's step size adapt, then
    ``num_samples`` steps with both fixed, keeping every ``thinning``-th position; each step uses
    one minibatch of ``batch_size`` points per chain and two gradient evaluations. The reset
    guardrail (``reset_prob``) acts throughout.

    :param step_size: the initial step size of every chain (the authors' default, 1e-3).
    :param precondition: scale each coordinate by the spread of its minibatch gradients (pSMILE).
        A coordinate whose gradient barely varies (a weight into a dead ReLU unit) then takes
        steps thousands of times longer than the others. On MILE's UCI protocol this went with
        half the chains diverging (``docs/logs/reproductions.md``), which ``precondition=False`` avoided.
    :param tune: adapt the step size by the energy-error tuner while warming up (SMILET). Off by
        default, as in the paper's UCI and LeNet runs: the tuner is relative and drifts the step
        down over long warm-ups (:mod:`pyrobnn.infer.sgmcmc.smile_kernel` says why).
    :param reset_prob: the quantile of the energy errors beyond which a step is undone (1.0: never).
    :param L: ``None`` (the paper's sampler: the minibatch noise alone moves the velocity) or a
        velocity decoherence length for an added partial refresh, as MCLMC's.
    :param num_chains: chains started at the network's own initialization under seeds
        ``seed + k`` (as deep-ensemble members are), unless ``init`` gives the starts: a
        :class:`Posterior` (a deep ensemble: one chain per member, SMILE's ensemble
        initialization; or a sampler's result: its last draws) or a ``(chains, dim)`` tensor.
    :param checkpoint: a file to write the chains' state to, or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` steps or ``seconds``
        seconds), and at the end; the same call resumes from it to the
        uninterrupted run's draws (:mod:`pyrobnn.infer.core.checkpoints`).

    ``stats``: the final ``step_size`` per chain, the ``energy_change`` of each kept step, and per
    chain the steps undone by the guardrail (``resets``, ``resets_warmup``) and for a non-finite
    value (``nonfinite``, ``nonfinite_warmup``).
    """
    refuse_unsupported("smile", model)
    checkpoint = Checkpointing.of(checkpoint)
    settings_given = dict(
        num_samples=num_samples, num_warmup=num_warmup, thinning=thinning, step_size=step_size, batch_size=batch_size,
        precondition=precondition, tune=tune, reset_prob=reset_prob, adaptation_prob=adaptation_prob,
        adaptation_strength=adaptation_strength, L=L, num_chains=num_chains, seed=seed,
    )
    for name, value in (("num_samples", num_samples), ("num_warmup", num_warmup), ("thinning", thinning), ("batch_size", batch_size)):
        check_budget("smile", name, value)
    if init is None:
        check_budget("smile", "num_chains", num_chains)
    if num_samples < thinning:
        raise ValueError(f"num_samples ({num_samples}) must be at least thinning ({thinning}): no draw would be kept")
    if not (isinstance(step_size, (int, float)) and 0 < step_size <= 10 and math.isfinite(step_size)):
        raise ValueError(f"step_size must be a number in (0, 10], got {step_size!r}")
    _check_fraction("reset_prob", reset_prob)
    _check_fraction("adaptation_prob", adaptation_prob, low_open=False, high_closed=False)
    _check_fraction("adaptation_strength", adaptation_strength, low_open=False, high_closed=False)
    if L is not None and not (isinstance(L, (int, float)) and L > 0 and math.isfinite(L)):
        raise ValueError(f"L must be None or a positive number, got {L!r}")
    x, y = training_data(model, x, y)
    n = x.shape[0]
    if L is None and batch_size >= n:
        raise ValueError(
            f"batch_size={batch_size} covers all {n} points, so the gradients carry no noise and SMILE's velocity would never "
            "be randomized: use pyrobnn.mclmc for full-batch sampling, a smaller batch_size, or pass L for a velocity refresh"
        )
    settings = SMILESettings(reset_prob, adaptation_prob, adaptation_strength, 0.01, bool(tune), bool(precondition), L)
    with flat_problem(model, x, y, seed) as problem:
        y, potential, generator = problem.y, problem.potential, problem.generator
        z = chain_starts(model, potential, init, num_chains, seed, generator)
        loop = MinibatchLoop(n, batch_size, seed, x.device)

        chains = z.shape[0]

        def on_batch(idx):  # idx: (chains, batch_size), a batch per chain
            xb, yb = x[idx], y[idx]
            return lambda w: per_row_minibatch_log_joint_value_and_grad(potential, w, xb, yb, n)

        counts = {k: torch.zeros(chains, dtype=torch.long, device=z.device) for k in ("resets", "resets_warmup", "nonfinite", "nonfinite_warmup")}
        draws, changes, first = [], [], 0
        run = None
        saved = None
        if checkpoint is not None:
            run = RunCheckpoint.of_run(checkpoint, "SMILE", settings_given, model, (x, y), z)
            saved = run.load()
        if saved is not None:
            state = SMILEState.from_state_dict(saved["state"], z.device)
            generator.set_state(saved["generator"])
            loop.load_state_dict(saved["loop"])
            counts = {k: v.to(z.device) for k, v in saved["counts"].items()}
            if saved["draws"] is not None:
                draws, changes = (list(saved[k].to(z.device).unbind(1)) for k in ("draws", "changes"))
            first = int(saved["step"])
        else:
            state = smile_init(z, on_batch(loop.next_batches(chains)), float(step_size))
        total = num_warmup + num_samples
        start = time.perf_counter()
        bar = tqdm(total=total, initial=first, disable=not progress, desc="SMILE", unit="step", dynamic_ncols=True, mininterval=0.5)
        with watching(run):
            try:
                for t in range(first, total):
                    warm = t < num_warmup
                    noise = None
                    if L is not None:
                        noise = torch.randn(state.z.shape, generator=generator, dtype=z.dtype, device=z.device)
                    state, change, reset, finite = smile_step(state, on_batch(loop.next_batches(chains)), settings, warmup=warm, noise=noise)
                    suffix = "_warmup" if warm else ""
                    counts["resets" + suffix].add_(reset.long())
                    counts["nonfinite" + suffix].add_((~finite).long())
                    if not warm and (t - num_warmup + 1) % thinning == 0:
                        draws.append(state.z)
                        changes.append(change)
                    bar.update(1)
                    if run is not None:
                        def snapshot():
                            stack = (lambda xs: torch.stack(xs, 1).cpu()) if draws else (lambda xs: None)
                            return {
                                "step": t + 1, "state": state.state_dict(), "generator": generator.get_state(), "loop": loop.state_dict(),
                                "counts": {k: v.cpu() for k, v in counts.items()}, "draws": stack(draws), "changes": stack(changes),
                            }
                        run.after(t + 1, snapshot, last=t + 1 == total, unit="steps")
            finally:
                bar.close()
        seconds = time.perf_counter() - start
        samples = potential.unpack_draws(torch.stack(draws, 1))
    stats = {"step_size": state.step_size, "energy_change": torch.stack(changes, 1), **counts}
    label = ("pSMILE" if precondition else "SMILE") + (" (tuned step size)" if tune else "")
    return Posterior(samples, stats, seconds, label, "sgmcmc", dict(settings_given, num_chains=chains, init=init), model)


register(MethodSpec(
    "smile", "SMILE: stochastic-gradient microcanonical Langevin ensembles (pSMILE by default)", "sgmcmc", smile,
    latent_only_support(), budgets={"num_samples": 1, "num_warmup": 0, "thinning": 1, "batch_size": 1, "num_chains": 1},
    quick={"num_samples": 4, "num_warmup": 4, "thinning": 2, "batch_size": 16, "num_chains": 2, "progress": False},
))
