"""Full-batch samplers on a BayesianModel, as top-level methods: NUTS (a fast batched path, and
Pyro's MCMC as the reference) and MCLMC, from random starts or from given positions (a deep
ensemble's members). Each is a kernel with its adaptation (:mod:`~pyrobnn.infer.mcmc.nuts_kernel`,
:mod:`~pyrobnn.infer.mcmc.mclmc_kernel`) run by the one runner (:mod:`pyrobnn.infer.core.runner`)
on the whole data set, on the code path the rule of :mod:`~pyrobnn.infer.mcmc.backend` takes."""

from __future__ import annotations

import math
import time

import pyro
import torch

from pyrobnn.infer.core.checkpoints import Checkpointing
from pyrobnn.infer.core.kernel import FullBatch
from pyrobnn.infer.core.runner import RunSettings, Sampler, sample
from pyrobnn.infer.mcmc import native as native_kernels
from pyrobnn.infer.mcmc.backend import BACKENDS, choose_path
from pyrobnn.infer.mcmc.mclmc_kernel import MCLMC, MCLMCAdaptation
from pyrobnn.infer.mcmc.nuts_kernel import NUTS, WindowAdaptation
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.methods import CHAIN_WARM_START, MethodSpec, checked, latent_only_support, register, samples_cover_thinning
from pyrobnn.utils.constraints import Either, Interval, OneOf, Phases, Positive, PositiveInt
from pyrobnn.utils.modes import eval_mode
from pyrobnn.utils.runtime import tensor_defaults
from pyrobnn.utils.validation import validate_training_data

__all__ = ["nuts", "mclmc", "pyro_nuts", "FullBatchSampler", "mile_decoherence_length"]


class FullBatchSampler(Sampler):
    """A full-batch kernel and its adaptation as the runner takes them on a model: chains from the
    box or from ``init``, the whole data set at every step, the code path by the rule of
    :func:`~pyrobnn.infer.mcmc.backend.choose_path` (``bound``: the kernel's evaluations per step
    are a most, as NUTS's trees)."""

    def __init__(self, kernel, adaptation, settings: dict, bound: bool = False):
        super().__init__(kernel.name, "mcmc", settings)
        self.kernel, self.adaptation, self.bound = kernel, adaptation, bound

    def choose_path(self, potential, z0, run: RunSettings):
        evaluations = (self.adaptation.num_steps + run.num_samples) * self.kernel.evaluations_per_step
        return choose_path(potential, z0, run.backend, self.name, evaluations, self.bound)

    def parts(self, problem, z0, path):
        return self.kernel, self.adaptation, FullBatch(path.target(problem.potential))

    def label(self, run: RunSettings) -> str:
        """How the chains started, when not in the box: ``"pyrobnn NUTS"``, ``"pyrobnn NUTS
        (prior-initialized)"``, ``"pyrobnn MCLMC (ensemble-initialized)"`` (a deep ensemble's
        members), ``"pyrobnn NUTS (from given starts)"`` (a sampler's last draws, positions)."""
        if run.init is None:
            return f"pyrobnn {self.name}"
        if isinstance(run.init, str):
            return f"pyrobnn {self.name} ({run.init}-initialized)"
        if getattr(run.init, "family", None) == "ensemble":
            return f"pyrobnn {self.name} (ensemble-initialized)"
        return f"pyrobnn {self.name} (from given starts)"

    def before_processes(self, model, x, run: RunSettings) -> None:
        if run.backend in ("auto", "native") and native_kernels.unsupported_reason(model, x) is None:
            try:  # built once here, so that the processes load it instead of each building its own
                native_kernels.library()
            except native_kernels.NativeUnavailable:
                pass  # each process will say why in its stats


@checked("nuts")
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
    (one vmapped network pass for all chains, no Pyro tracing), and the transitions from the
    :class:`~pyrobnn.infer.mcmc.nuts_kernel.NUTS` kernel (multinomial NUTS) with Stan's warm-up
    (:class:`~pyrobnn.infer.mcmc.nuts_kernel.WindowAdaptation`: per-chain step sizes and
    diagonal mass matrices). The samples are of the model's latent sites and go straight into
    ``pyro.infer.Predictive(model, posterior_samples=result.flat_samples())`` or
    :func:`pyrobnn.predict`.

    :param num_samples: draws per chain, after the warm-up (at least 1).
    :param num_warmup: warm-up iterations per chain, in which the step size and the mass matrix
        adapt; none of them is kept (0: the step size of the first search, a unit mass matrix).
    :param num_chains: the chains. On the native path (below) each chain builds its own tree,
        and groups of chains run on ``torch.get_num_threads()`` threads; on the torch paths the
        chains run in lockstep as one batch.
    :param max_tree_depth: the most doublings of a trajectory (at most ``2**max_tree_depth - 1``
        leapfrog steps per iteration).
    :param target_accept: the mean acceptance statistic the step size adapts to, in (0, 1).
    :param seed: seeds the starting positions and every random number of the run.
    :param init_radius: chains start from uniform draws on ``[-init_radius, init_radius]`` in
        unconstrained space, as Pyro's and Stan's do (unless ``init`` gives the starts).
    :param backend: which code runs the transitions (:mod:`pyrobnn.infer.mcmc.backend`):
        ``"auto"`` (default) takes, by a rule on the model and the run, the native kernels of
        :mod:`pyrobnn.infer.mcmc.native` (stacks of ``nn.Linear`` with Normal priors and a Gaussian,
        heteroscedastic or categorical likelihood; built once per machine in about 2 s), else
        ``torch.compile`` for a run long enough to pay its 10-16 s, else eager torch code;
        ``"native"``, ``"compile"`` or ``"eager"`` names one. ``stats["path"]`` and
        ``stats["path_reason"]`` say which ran and why. If ``torch.compile`` fails, the run falls
        back to eager code with a warning. The same call with the same seed gives the same draws.
    :param progress: show a progress bar (the phase, the mean step size and the deepest tree).
    :param init: ``"prior"``: each of the ``num_chains`` chains starts at its own draw from the
        prior (Pyro's ``init_to_sample``; :func:`~pyrobnn.infer.core.starts.prior_draws`, where
        a network's weights start at their prior's scale instead of the box's). Or starting
        positions, one chain each: a
        :class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior` (ensemble-initialized NUTS, Sommer
        et al. 2024), any other :class:`~pyrobnn.infer.results.posterior.Posterior` (its last draws) or
        unconstrained vectors ``(chains, dim)``;
        ``num_chains`` is then their number.
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
    :returns: a :class:`~pyrobnn.infer.results.posterior.Posterior` with ``num_samples`` draws per
        chain; its stats hold per draw ``accept_prob``, ``tree_depth``, ``num_steps``,
        ``diverging`` and the potential (``energy``), and per chain the adapted ``step_size`` and
        ``inv_mass``.
    """
    settings = dict(
        num_samples=num_samples, num_warmup=num_warmup, num_chains=num_chains, max_tree_depth=max_tree_depth,
        target_accept=target_accept, seed=seed, init_radius=init_radius, backend=backend, init=init, num_processes=num_processes,
    )
    sampler = FullBatchSampler(NUTS(max_tree_depth), WindowAdaptation(num_warmup, target_accept), settings, bound=True)
    run = RunSettings(num_samples=num_samples, num_chains=num_chains, init=init, init_radius=init_radius, seed=seed, backend=backend,
                      progress=progress, checkpoint=Checkpointing.of(checkpoint), num_processes=num_processes)
    return sample(model, x, y, sampler, run)


def mile_decoherence_length(dim: int) -> float:
    """MILE's initial decoherence length, :math:`\\max(\\sqrt d, 15)` (Sommer et al. 2025)."""
    return max(math.sqrt(dim), 15.0)


def _phases(num_warmup) -> tuple:
    """MCLMC's three tuning phases: as given, or one number split 80/10/10."""
    if isinstance(num_warmup, (tuple, list)):
        return tuple(int(v) for v in num_warmup)
    first, second = round(0.8 * num_warmup), round(0.1 * num_warmup)
    return first, second, num_warmup - first - second


@checked("mclmc")
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

    :param num_samples: steps after the tuning (at least ``thinning``).
    :param num_warmup: the steps of the three tuning phases, or one number split 80/10/10 (a
        third phase shorter than 4 steps, too short for an effective sample size, is skipped: L
        keeps the second phase's value).
    :param num_chains: chains, each tuned on its own (unless ``init`` gives the starts).
    :param thinning: every ``thinning``-th step after the tuning is kept.
    :param step_size: the initial step size of every chain (``None``: BlackJAX's ``sqrt(d) / 4``).
    :param L: the initial momentum decoherence length (default MILE's ``max(sqrt(d), 15)``).
    :param energy_variance: the target variance of the energy error per dimension, a number or a
        ``(start, end)`` pair scheduled linearly over the first phase.
    :param diagonal_preconditioning: a diagonal preconditioner from the second phase's position
        variances (then ``L = sqrt(d)`` and a third of the second phase's steps again to re-tune
        the step size).
    :param seed: seeds the starting positions and every random number of the run.
    :param init_radius: chains start from uniform draws on ``[-init_radius, init_radius]`` in
        unconstrained space (unless ``init`` gives the starts).
    :param init: ``"prior"`` or starting positions, as in :func:`nuts`.
    :param backend: which code runs each step, by the rule of :func:`nuts` (``"auto"``,
        ``"native"``, ``"compile"``, ``"eager"``).
    :param progress: show a progress bar.
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
    phases = _phases(num_warmup)
    options = dict(
        num_samples=num_samples, num_warmup=phases, thinning=thinning, step_size=step_size, L=L,
        energy_variance=energy_variance, diagonal_preconditioning=diagonal_preconditioning, backend=backend,
    )
    settings = dict(options, num_chains=num_chains, seed=seed, init_radius=init_radius, init=init, num_processes=num_processes)
    adaptation = MCLMCAdaptation(
        phases, step_size=step_size, L=mile_decoherence_length if L is None else L, energy_variance=energy_variance,
        diagonal_preconditioning=diagonal_preconditioning,
    )
    sampler = FullBatchSampler(MCLMC(), adaptation, settings)
    run = RunSettings(num_samples=num_samples, thinning=thinning, num_chains=num_chains, init=init, init_radius=init_radius, seed=seed,
                      backend=backend, progress=progress, checkpoint=Checkpointing.of(checkpoint), num_processes=num_processes)
    return sample(model, x, y, sampler, run)


@checked("pyro_nuts")
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
    diagnostics, which report the divergences, split each chain in halves). Chain ``c`` is
    seeded with ``seed + c``; ``jit_compile`` is Pyro's; the other arguments are as in
    :func:`nuts`."""
    x, y = validate_training_data(model, x, y)
    names = [s.name for s in model.sites] + list(model.likelihood.latent_sites())
    chains, stats = [], {"diverging": []}
    start = time.perf_counter()
    # Pyro makes its momenta and mass matrices on torch's defaults: held at the model's
    with eval_mode(model), tensor_defaults(model.dtype, model.device):
        for c in range(num_chains):
            pyro.set_rng_seed(seed + c)
            kernel = pyro.infer.NUTS(
                model, max_tree_depth=max_tree_depth, target_accept_prob=target_accept, jit_compile=jit_compile, ignore_jit_warnings=True
            )
            mcmc = pyro.infer.MCMC(kernel, num_samples=num_samples, warmup_steps=num_warmup, num_chains=1, disable_progbar=not progress)
            mcmc.run(x, y)
            chains.append(mcmc.get_samples())
            # Pyro lists the draws (counted after warm-up) whose transition diverged; the flags
            # are made on the host, as Pyro's samples are
            diverging = torch.zeros(num_samples, dtype=torch.bool, device="cpu")
            diverging[[i for i in mcmc.diagnostics().get("divergences", {}).get("chain 0", []) if 0 <= i < num_samples]] = True
            stats["diverging"].append(diverging)
    seconds = time.perf_counter() - start
    samples = {k: torch.stack([c[k] for c in chains]) for k in names}
    settings = dict(num_samples=num_samples, num_warmup=num_warmup, num_chains=num_chains, max_tree_depth=max_tree_depth,
                    target_accept=target_accept, seed=seed, jit_compile=jit_compile)
    return Posterior(samples, {"diverging": torch.stack(stats["diverging"])}, seconds, "pyro NUTS", "mcmc", settings, model)


#: how the full-batch samplers run the chains (the constraints of both)
_RUN_CONSTRAINTS = {
    "init_radius": Positive(), "backend": OneOf(BACKENDS), "num_processes": PositiveInt(),
}

register(MethodSpec(
    "nuts", "NUTS, all chains batched (native, compiled or eager backend)", "mcmc", nuts, latent_only_support(),
    budgets={"num_samples": 1, "num_warmup": 0, "num_chains": 1, "max_tree_depth": 1},
    constraints={"target_accept": Interval(0.0, 1.0), **_RUN_CONSTRAINTS},
    quick={"num_samples": 4, "num_warmup": 4, "num_chains": 2, "max_tree_depth": 3, "progress": False},
    # as a surrogate: chains from the prior's draws, not the box, whose networks a 200-step warm-up
    # did not bring back (predictive sds of thousands away from the data on Levy-20); so started,
    # the calibrated limit's whole network (its units and mean), as MCLMC and the ensemble have
    # (docs/bayesopt.md, "Where the chains start", 2026-11-28)
    bo_options=dict(num_samples=64, num_warmup=200, num_chains=4, max_tree_depth=6, init="prior"),
    bo_limit_network=True,
    warm_start=CHAIN_WARM_START,
))
register(MethodSpec(
    "mclmc", "MCLMC (unadjusted microcanonical Langevin), per-chain tuning", "mcmc", mclmc, latent_only_support(),
    budgets={"num_samples": 1, "num_warmup": 0, "num_chains": 1, "thinning": 1},
    constraints={
        "num_warmup": Phases(3, least=0), "step_size": Either(Positive(), None), "L": Either(Positive(), None), **_RUN_CONSTRAINTS,
    },
    rules=(samples_cover_thinning("mclmc"),),
    quick={"num_samples": 8, "num_warmup": 12, "num_chains": 2, "thinning": 2, "progress": False},
    bo_options=dict(num_samples=64, num_warmup=(1000, 200, 200), num_chains=4, thinning=5, init="prior"),
    # as a surrogate, the calibrated limit's whole network (its units and mean), chains from the
    # prior's draws: held-out NLL at 20 points within 1.5x of the GP's on 6 of 8 problems (3 of 8
    # from the box, too wide on the bowls) and Levy-20's regret +2.06 to +0.97 (docs/bayesopt.md,
    # "Where the chains start")
    bo_limit_network=True,
    warm_start=CHAIN_WARM_START,
))
register(MethodSpec(
    "pyro_nuts", "Pyro's own NUTS (MCMC(NUTS(model))), the reference", "mcmc", pyro_nuts, latent_only_support(),
    budgets={"num_samples": 4, "num_warmup": 0, "num_chains": 1, "max_tree_depth": 1},
    constraints={"target_accept": Interval(0.0, 1.0)},
    quick={"num_samples": 4, "num_warmup": 2, "max_tree_depth": 2, "progress": False},
    bounded_memory=False, unbounded_because="Pyro's MCMC evaluates the model on all the data at once",
))
