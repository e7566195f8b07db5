"""Full-batch samplers on a BayesianModel, as top-level methods: NUTS (a fast batched path, and
Pyro's MCMC as the reference), MCLMC, and ensemble-initialized sampling (MILE), from random
starts or from given positions (a deep ensemble's members). Each is a kernel
(:mod:`~pyrobnn.infer.mcmc.nuts_kernel`, :mod:`~pyrobnn.infer.mcmc.mclmc_kernel`) run by the one
model-level runner (:mod:`~pyrobnn.infer.mcmc.runner`)."""

from __future__ import annotations

import math
import time

import pyro
import torch

from pyrobnn.infer.core.checkpoints import Checkpointing
from pyrobnn.infer.mcmc.backend import resolve_backend
from pyrobnn.infer.mcmc.mclmc_kernel import sample_mclmc
from pyrobnn.infer.mcmc.nuts_kernel import sample_nuts
from pyrobnn.infer.mcmc.runner import run_in_process_groups, run_sampler
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.methods import MethodSpec, check_budget, latent_only_support, refuse_unsupported, register
from pyrobnn.utils.validation import check_positive_number, validate_training_data

__all__ = ["nuts", "mclmc", "pyro_nuts"]


def nuts(
    model,
    x,
    y,
    *,
    num_samples: int = 500,
    num_warmup: int = 500,
    num_chains: int = 4,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    seed: int = 0,
    init_radius: float = 2.0,
    backend: str = "auto",
    progress: bool = True,
    init=None,
    num_processes: int = 1,
    checkpoint=None,
) -> Posterior:
    """NUTS for ``model`` conditioned on ``(x, y)``, all chains in one batched computation.

    The potential and its gradient come from :class:`~pyrobnn.infer.core.potential.FlatPotential`
    (one vmapped network pass for all chains, no Pyro tracing), and the sampler from
    :func:`~pyrobnn.infer.mcmc.nuts_kernel.sample_nuts` (multinomial NUTS, Stan's warm-up, per-chain step
    sizes and diagonal mass matrices). Chains start from uniform draws on
    ``[-init_radius, init_radius]`` in unconstrained space, as Pyro's and Stan's do, or from
    ``init``.

    The samples are of the model's latent sites and go straight into
    ``pyro.infer.Predictive(model, posterior_samples=result.flat_samples())`` or
    :func:`pyrobnn.predict`.

    :param num_chains: the chains. On the native path (below) each chain builds its own tree,
        and groups of chains run on ``torch.get_num_threads()`` threads; on the torch paths the
        chains run in lockstep as one batch.
    :param init: starting positions, one chain each: a
        :class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior` (ensemble-initialized NUTS, Sommer
        et al. 2024), any other :class:`~pyrobnn.infer.results.posterior.Posterior` (its last draws) or
        unconstrained vectors ``(chains, dim)``;
        ``num_chains`` is then their number.
    :param backend: which code runs the transitions (:mod:`pyrobnn.infer.mcmc.backend`):
        ``"auto"`` (default) takes, by a rule on the model and the run, the native kernels of
        :mod:`pyrobnn.infer.mcmc.native` (stacks of ``nn.Linear`` with Normal priors and a Gaussian,
        heteroscedastic or categorical likelihood; built once per machine in about 2 s), else
        ``torch.compile`` for a run long enough to pay its 10-16 s, else eager torch code;
        ``"native"``, ``"compile"`` or ``"eager"`` names one. ``stats["path"]`` and
        ``stats["path_reason"]`` say which ran and why. If ``torch.compile`` fails, the run falls
        back to eager code with a warning. The same call with the same seed gives the same draws.
    :param num_processes: split the chains into this many groups, each run in its own process
        (:mod:`pyrobnn.infer.core.processes`): a group no longer waits for another group's longest
        trajectory, and each uses its own core. Group ``i`` draws from the seed ``seed + i``
        (the starting positions are drawn here from ``seed``, so they do not change). The native
        kernels are built here first, so the processes load them instead of building their own.
    :param checkpoint: a file to write the run's state to (the chains, the warm-up's adaptation,
        the random generator and the draws so far), or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` saying also how often (by default
        every 60 seconds), and at the end. The same call with the same file resumes
        from it and gives the uninterrupted run's draws (on the same code path;
        :mod:`pyrobnn.infer.core.checkpoints`); with ``num_processes``, group ``i`` of ``k`` writes
        ``<checkpoint>.group<i>-of-<k>``.
    """
    refuse_unsupported("nuts", model)
    for name, value in (("num_samples", num_samples), ("num_warmup", num_warmup), ("max_tree_depth", max_tree_depth)):
        check_budget("nuts", name, value)
    if init is None:
        check_budget("nuts", "num_chains", num_chains)
    if not (isinstance(target_accept, (int, float)) and 0 < target_accept < 1):
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept!r}")
    backend = resolve_backend(backend)
    run_checkpoint = Checkpointing.of(checkpoint)
    settings = dict(
        num_samples=num_samples, num_warmup=num_warmup, num_chains=num_chains, max_tree_depth=max_tree_depth,
        target_accept=target_accept, seed=seed, init_radius=init_radius, backend=backend, init=init, num_processes=num_processes,
    )

    if num_processes != 1:
        options = dict(num_samples=num_samples, num_warmup=num_warmup, max_tree_depth=max_tree_depth, target_accept=target_accept, backend=backend)
        return run_in_process_groups(
            nuts, "NUTS", model, x, y, init, num_chains, init_radius, seed, num_processes, options, progress, settings, run_checkpoint,
        )

    def run(potential_fn, z0, generator, path, checkpoint_):
        return sample_nuts(
            potential_fn, z0, num_samples=num_samples, num_warmup=num_warmup, max_tree_depth=max_tree_depth,
            target_accept=target_accept, generator=generator, progress=progress, compile=path.kind == "torch.compile",
            native=path.native, checkpoint=checkpoint_,
        )

    evaluations = (num_warmup + num_samples) * (2**max_tree_depth - 1)
    return run_sampler(
        model, x, y, run, "NUTS", init, num_chains, init_radius, seed, backend, evaluations, bound=True, settings=settings,
        checkpoint=run_checkpoint,
    )


def mclmc(
    model,
    x,
    y,
    *,
    num_samples: int = 10_000,
    num_warmup=(40_000, 5_000, 5_000),
    num_chains: int = 4,
    thinning: int = 10,
    step_size: float = 1e-3,
    L=None,
    energy_variance=(0.5, 0.1),
    diagonal_preconditioning: bool = False,
    seed: int = 0,
    init_radius: float = 2.0,
    init=None,
    backend: str = "auto",
    progress: bool = True,
    num_processes: int = 1,
    checkpoint=None,
) -> Posterior:
    """Unadjusted MCLMC (:mod:`pyrobnn.infer.mcmc.mclmc_kernel`) for ``model`` conditioned on ``(x, y)``, all
    chains in one batched computation, each chain tuned on its own.

    The defaults are the MILE protocol (Sommer et al. 2025, ICLR): 50,000 tuning steps split
    40,000 / 5,000 / 5,000 over the three phases, a target energy variance per dimension
    scheduled from 0.5 to 0.1, initial step size ``1e-3`` and ``L = max(sqrt(d), 15)``, then
    ``num_samples`` steps of which every ``thinning``-th is kept. Start the chains from a deep
    ensemble (``init=deep_ensemble(...)``; :func:`pyrobnn.infer.ensemble_sampling.ensemble_sampling` does
    both), as MILE does: from random starts the chains spend their tuning climbing.

    :param num_warmup: the steps of the three tuning phases, or one number split 80/10/10 (a
        third phase shorter than 4 steps, too short for an effective sample size, is skipped: L
        keeps the second phase's value).
    :param backend: which code runs each step, by the rule of :func:`nuts` (``"auto"``,
        ``"native"``, ``"compile"``, ``"eager"``).
    :param num_processes: run the chains in this many groups, one process each, as in
        :func:`nuts`.
    :param checkpoint: a file to write the run's state to, or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` steps or ``seconds``
        seconds; in the tuning phases as well, except inside the third,
        whose positions are kept for their autocorrelation: a run killed there goes on from the
        phase's start) and at the end; the same call with the same file resumes from it, as in
        :func:`nuts`.
    :returns: a :class:`~pyrobnn.infer.results.posterior.Posterior` with ``num_samples // thinning`` draws per chain; its stats
        hold the potential at each draw (``energy``), the energy errors, the tuned ``step_size``,
        ``L`` and ``inv_mass``, and the steps undone for a non-finite result (``nonfinite``).
    """
    refuse_unsupported("mclmc", model)
    for name, value in (("step_size", step_size), ("L", L)):
        if value is not None:  # None: BlackJAX's initial value (sample_mclmc)
            check_positive_number(name, value)
    for name, value in (("num_samples", num_samples), ("thinning", thinning)):
        check_budget("mclmc", name, value)
    if init is None:
        check_budget("mclmc", "num_chains", num_chains)
    if num_samples < thinning:
        raise ValueError(f"mclmc: num_samples ({num_samples}) must be at least thinning ({thinning}): no draw would be kept")
    backend = resolve_backend(backend)
    if isinstance(num_warmup, (tuple, list)):
        if len(num_warmup) != 3:
            raise ValueError(f"mclmc: num_warmup must be a number of steps or the steps of the three tuning phases, got {num_warmup!r}")
        for phase in num_warmup:
            check_budget("mclmc", "num_warmup", phase)
        num_warmup = tuple(int(v) for v in num_warmup)
    else:
        check_budget("mclmc", "num_warmup", num_warmup)
        num_warmup = (round(0.8 * num_warmup), round(0.1 * num_warmup), num_warmup - round(0.8 * num_warmup) - round(0.1 * num_warmup))

    options = dict(
        num_samples=num_samples, num_warmup=num_warmup, thinning=thinning, step_size=step_size, L=L,
        energy_variance=energy_variance, diagonal_preconditioning=diagonal_preconditioning, backend=backend,
    )
    settings = dict(options, num_chains=num_chains, seed=seed, init_radius=init_radius, init=init, num_processes=num_processes)
    run_checkpoint = Checkpointing.of(checkpoint)
    if num_processes != 1:
        return run_in_process_groups(
            mclmc, "MCLMC", model, x, y, init, num_chains, init_radius, seed, num_processes, options, progress, settings, run_checkpoint,
        )

    def run(potential_fn, z0, generator, path, checkpoint_):
        L0 = max(math.sqrt(z0.shape[1]), 15.0) if L is None else L
        return sample_mclmc(
            potential_fn, z0, num_samples, num_warmup, thinning=thinning, step_size=step_size, L=L0, energy_variance=energy_variance,
            diagonal_preconditioning=diagonal_preconditioning, generator=generator, progress=progress,
            compile=path.kind == "torch.compile", native=path.native, checkpoint=checkpoint_,
        )

    steps = sum(num_warmup) + (round(num_warmup[1] / 3) if diagonal_preconditioning else 0) + num_samples
    return run_sampler(
        model, x, y, run, "MCLMC", init, num_chains, init_radius, seed, backend, 2 * steps, settings=settings, checkpoint=run_checkpoint,
    )


def pyro_nuts(
    model,
    x,
    y,
    *,
    num_samples: int = 500,
    num_warmup: int = 500,
    num_chains: int = 1,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    seed: int = 0,
    jit_compile: bool = False,
    progress: bool = True,
) -> Posterior:
    """The reference path: ``pyro.infer.MCMC(pyro.infer.NUTS(model))``, one chain after the
    other in this process, the samples stacked by chain (at least 4 draws per chain: Pyro's
    diagnostics, which report the divergences, split each chain in halves)."""
    refuse_unsupported("pyro_nuts", model)
    for name, value in (("num_samples", num_samples), ("num_warmup", num_warmup), ("num_chains", num_chains), ("max_tree_depth", max_tree_depth)):
        check_budget("pyro_nuts", name, value)
    x, y = validate_training_data(model, x, y)
    names = [s.name for s in model.sites] + list(model.likelihood.latent_sites())
    chains, stats = [], {"diverging": []}
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for c in range(num_chains):
            pyro.set_rng_seed(seed + c)
            kernel = pyro.infer.NUTS(
                model, max_tree_depth=max_tree_depth, target_accept_prob=target_accept, jit_compile=jit_compile, ignore_jit_warnings=True
            )
            mcmc = pyro.infer.MCMC(kernel, num_samples=num_samples, warmup_steps=num_warmup, num_chains=1, disable_progbar=not progress)
            mcmc.run(x, y)
            chains.append(mcmc.get_samples())
            # Pyro lists the draws (counted after warm-up) whose transition diverged
            diverging = torch.zeros(num_samples, dtype=torch.bool)
            diverging[[i for i in mcmc.diagnostics().get("divergences", {}).get("chain 0", []) if 0 <= i < num_samples]] = True
            stats["diverging"].append(diverging)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    samples = {k: torch.stack([c[k] for c in chains]) for k in names}
    settings = dict(num_samples=num_samples, num_warmup=num_warmup, num_chains=num_chains, max_tree_depth=max_tree_depth,
                    target_accept=target_accept, seed=seed, jit_compile=jit_compile)
    return Posterior(samples, {"diverging": torch.stack(stats["diverging"])}, seconds, "pyro NUTS", "mcmc", settings, model)


register(MethodSpec(
    "nuts", "NUTS, all chains batched (native, compiled or eager backend)", "mcmc", nuts, latent_only_support(),
    budgets={"num_samples": 1, "num_warmup": 0, "num_chains": 1, "max_tree_depth": 1},
    quick={"num_samples": 4, "num_warmup": 4, "num_chains": 2, "max_tree_depth": 3, "progress": False},
))
register(MethodSpec(
    "mclmc", "MCLMC (unadjusted microcanonical Langevin), per-chain tuning", "mcmc", mclmc, latent_only_support(),
    budgets={"num_samples": 1, "num_warmup": 0, "num_chains": 1, "thinning": 1},
    quick={"num_samples": 8, "num_warmup": 12, "num_chains": 2, "thinning": 2, "progress": False},
))
register(MethodSpec(
    "pyro_nuts", "Pyro's own NUTS (MCMC(NUTS(model))), the reference", "mcmc", pyro_nuts, latent_only_support(),
    budgets={"num_samples": 4, "num_warmup": 0, "num_chains": 1, "max_tree_depth": 1},
    quick={"num_samples": 4, "num_warmup": 2, "max_tree_depth": 2, "progress": False},
    bounded_memory=False, unbounded_because="Pyro's MCMC evaluates the model on all the data at once",
))
