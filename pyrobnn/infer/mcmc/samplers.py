"""Full-batch samplers on a BayesianModel, as top-level methods: NUTS (a fast batched path, and
Pyro's MCMC as the reference) and MCLMC, from random starts or from given positions (a deep
ensemble's members). Each is a kernel with its adaptation (:mod:`~pyrobnn.infer.mcmc.nuts_kernel`,
:mod:`~pyrobnn.infer.mcmc.mclmc_kernel`) run by the one runner (:mod:`pyrobnn.infer.core.runner`)
on the whole data set, on the code path the rule of :mod:`~pyrobnn.infer.mcmc.backend` takes."""

from __future__ import annotations

import inspect
import math
import time

import pyro
import torch

from pyrobnn.infer.core.checkpoints import Checkpointing, digest
from pyrobnn.infer.core.kernel import FullBatch
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.runner import RunSettings, Sampler, sample
from pyrobnn.infer.core import native as native_kernels
from pyrobnn.infer.mcmc.backend import BACKENDS, choose_path
from pyrobnn.infer.mcmc.mclmc_kernel import MCLMC, MCLMCAdaptation
from pyrobnn.infer.mcmc.nuts_kernel import NUTS, WindowAdaptation, draws_variance
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.methods import (CHAIN_WARM_START, MethodSpec, WarmStart, checked, latent_only_support, register, samples_cover_thinning,
                             scaled_budget)
from pyrobnn.utils.constraints import Either, Flag, Interval, OneOf, Phases, Positive, PositiveInt, PositiveValues
from pyrobnn.utils.modes import eval_mode
from pyrobnn.utils.runtime import tensor_defaults
from pyrobnn.utils.validation import validate_training_data

__all__ = ["nuts", "mclmc", "pyro_nuts", "FullBatchSampler", "mile_decoherence_length", "nuts_adaptation_of",
           "mclmc_tuning_of"]


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
    step_size=None,
    inv_mass=None,
    adapt_mass_matrix: bool = True,
    seed: int = 0,
    init_radius: float = 2.0,
    backend: str = "auto",
    progress: bool = True,
    init=None,
    num_processes: int = 1,
    checkpoint=None,
    dtype=None,
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
    :param step_size: the step size the warm-up starts from, one for all chains or one per chain
        (``(num_chains,)``); ``None`` (default): found by halving and doubling (Hoffman & Gelman
        2014, algorithm 4). With ``num_warmup=0`` the run keeps it.
    :param inv_mass: the diagonal inverse mass matrix the warm-up starts from, one number, ``(D,)``
        for all chains or ``(num_chains, D)`` (``D``: the model's unconstrained parameters);
        ``None`` (default): the unit matrix. NumPyro's ``inverse_mass_matrix``.
    :param adapt_mass_matrix: whether the warm-up estimates the matrix in Stan's windows (the
        default); ``False`` holds it, adapting only the step size. A run on more data can start
        from a previous result's adaptation (:func:`nuts_adaptation_of`).
    :param seed: seeds the starting positions and every random number of the run.
    :param init_radius: chains start from uniform draws on ``[-init_radius, init_radius]`` in
        unconstrained space, as Pyro's and Stan's do (unless ``init`` gives the starts).
    :param backend: which code runs the transitions (:mod:`pyrobnn.infer.mcmc.backend`):
        ``"auto"`` (default) takes, by a rule on the model and the run, the native kernels of
        :mod:`pyrobnn.infer.core.native` (stacks of ``nn.Linear`` with Normal priors and a Gaussian,
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
    :param dtype: the floating dtype the chains run in, ``torch.float32`` or ``torch.float64``
        (``None``, the default: the model's). Another than the model's runs them on a copy of
        the model in that dtype and hands the draws and statistics back in the model's
        (:func:`~pyrobnn.infer.core.runner.sample`): a float64 model (BoTorch's) can sample in
        single precision, which NumPyro and BlackJAX take by default, where a native NUTS
        transition on the BO surrogates' network is 1.5-1.8x faster (docs/logs/benchmarks.md);
        its draws carry single precision's rounding.
    :returns: a :class:`~pyrobnn.infer.results.posterior.Posterior` with ``num_samples`` draws per
        chain; its stats hold per draw ``accept_prob``, ``tree_depth``, ``num_steps``,
        ``diverging`` and the potential (``energy``), and per chain the adapted ``step_size`` and
        ``inv_mass``.
    """
    step_size, inv_mass = _host_tensor(step_size), _host_tensor(inv_mass)
    settings = dict(
        num_samples=num_samples, num_warmup=num_warmup, num_chains=num_chains, max_tree_depth=max_tree_depth,
        target_accept=target_accept, step_size=_recorded(step_size), inv_mass=_recorded(inv_mass),
        adapt_mass_matrix=adapt_mass_matrix, seed=seed, init_radius=init_radius, backend=backend, init=init,
        num_processes=num_processes, dtype=_dtype_name(dtype),
    )
    adaptation = WindowAdaptation(num_warmup, target_accept, step_size=step_size, inv_mass=inv_mass, adapt_mass_matrix=adapt_mass_matrix)
    sampler = FullBatchSampler(NUTS(max_tree_depth), adaptation, settings, bound=True)
    run = RunSettings(num_samples=num_samples, num_chains=num_chains, init=init, init_radius=init_radius, seed=seed, backend=backend,
                      progress=progress, checkpoint=Checkpointing.of(checkpoint), num_processes=num_processes, dtype=dtype)
    return sample(model, x, y, sampler, run)


def _host_tensor(value):
    """A step size, ``L`` or mass matrix the constraints took (a number, an array, a tensor) as a
    detached floating tensor; ``None`` stays ``None``. A tensor stays on its device, a number or
    an array is made on the host in float64 (a list of Python floats is not rounded to float32):
    the adaptation moves it to the chains' device and dtype."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return t if t.is_floating_point() else t.to(torch.get_default_dtype())
    return torch.as_tensor(value, dtype=torch.float64, device="cpu")


def _per_chain_in_one_process(method: str, dims: dict):
    """The rule of a sampler that takes a tuning value per chain (``dims``: ``{option: the
    dimensions of its per-chain form}``): such a value is for one process (its chains are not
    split among processes)."""

    def rule(options):
        per_chain = [name for name, d in dims.items() if options.get(name) is not None and _host_tensor(options[name]).dim() == d]
        if per_chain and options.get("num_processes", 1) != 1:
            one = "a number; a (D,) inv_mass" if "inv_mass" in dims else "a number"
            return (f"{method}: {' and '.join(per_chain)} per chain cannot be split over num_processes={options['num_processes']}: "
                    f"give one for all chains ({one}) or run in one process")
        return None

    return rule


def _dtype_name(dtype):
    """How the settings record the chains' dtype: ``"float32"``, ``"float64"``, or ``None`` (the model's)."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _recorded(value):
    """How the settings record a given step size or mass matrix: a number as itself, a tensor by
    its SHA-256 (a checkpoint's identity compares it; the values are in the result's stats)."""
    if value is None or value.dim() == 0:
        return None if value is None else float(value)
    return f"sha256:{digest(value)}"


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
    dtype=None,
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
    :param step_size: the initial step size, one for all chains or one per chain
        (``(num_chains,)``; ``None``: BlackJAX's ``sqrt(d) / 4``).
    :param L: the initial momentum decoherence length, one or one per chain (default MILE's
        ``max(sqrt(d), 15)``). A run on more data can start its tuning where a previous result's
        ended (:func:`mclmc_tuning_of`).
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
    :param dtype: the floating dtype the chains run in, as in :func:`nuts`.
    :returns: a :class:`~pyrobnn.infer.results.posterior.Posterior` with ``num_samples // thinning`` draws per chain; its stats
        hold the potential at each draw (``energy``), the energy errors, the tuned ``step_size``,
        ``L`` and ``inv_mass``, and the steps undone for a non-finite result (``nonfinite``).
    """
    phases = _phases(num_warmup)
    step_size, L = _host_tensor(step_size), _host_tensor(L)
    options = dict(
        num_samples=num_samples, num_warmup=phases, thinning=thinning, step_size=_recorded(step_size), L=_recorded(L),
        energy_variance=energy_variance, diagonal_preconditioning=diagonal_preconditioning, backend=backend,
    )
    settings = dict(options, num_chains=num_chains, seed=seed, init_radius=init_radius, init=init, num_processes=num_processes,
                    dtype=_dtype_name(dtype))
    adaptation = MCLMCAdaptation(
        phases, step_size=step_size, L=mile_decoherence_length if L is None else L, energy_variance=energy_variance,
        diagonal_preconditioning=diagonal_preconditioning,
    )
    sampler = FullBatchSampler(MCLMC(), adaptation, settings)
    run = RunSettings(num_samples=num_samples, thinning=thinning, num_chains=num_chains, init=init, init_radius=init_radius, seed=seed,
                      backend=backend, progress=progress, checkpoint=Checkpointing.of(checkpoint), num_processes=num_processes,
                      dtype=dtype)
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
    "dtype": Either(OneOf((torch.float32, torch.float64)), None),
}


def nuts_adaptation_of(posterior, model=None) -> dict:
    """The adaptation a NUTS run on more data can start from (:func:`nuts`'s ``step_size`` and
    ``inv_mass``), one per chain of ``posterior`` (a :func:`nuts` result): the step size each
    chain ended its run with, and a diagonal inverse mass matrix, the variance of each chain's
    draws in the unconstrained coordinates of ``model`` (default: the posterior's own), regularized
    as Stan's windows are (:func:`~pyrobnn.infer.mcmc.nuts_kernel.draws_variance`).

    Not the run's own ``stats["inv_mass"]``: that is the matrix the run *used*, which for a run
    that held a given one is the one it was given, so refits that carried it would hold the
    first fit's matrix while the posterior narrows with the data (on Branin the step sizes fell
    from 0.010 to 0.0007 over seven refits; docs/bayesopt.md, "NUTS's refits from the previous
    adaptation"). The draws' variance is the latest posterior's own."""
    step_size = posterior.stats.get("step_size")
    if step_size is None or step_size.dim() != 1 or step_size.shape[0] != posterior.num_chains:
        raise ValueError(f"posterior must be a NUTS result with one step size per chain in its stats (stats['step_size'] of shape "
                         f"({posterior.num_chains},)), got {None if step_size is None else tuple(step_size.shape)}")
    draws = FlatPotential(posterior.model if model is None else model).pack_draws(posterior.samples)
    return {"step_size": step_size.detach().clone(), "inv_mass": draws_variance(draws.detach())}


def mclmc_tuning_of(posterior) -> dict:
    """The tuning an MCLMC run on more data can start from (:func:`mclmc`'s ``step_size`` and
    ``L``), one per chain of ``posterior`` (a :func:`mclmc` result): the step size and
    decoherence length each chain's tuning ended at."""
    tuned = {name: posterior.stats.get(name) for name in ("step_size", "L")}
    for name, value in tuned.items():
        if value is None or value.dim() != 1 or value.shape[0] != posterior.num_chains:
            raise ValueError(f"posterior must be an MCLMC result with one {name} per chain in its stats (stats[{name!r}] of shape "
                             f"({posterior.num_chains},)), got {None if value is None else tuple(value.shape)}")
    return {name: value.detach().clone() for name, value in tuned.items()}


#: the share of a warm refit's tuning fraction that MCLMC's first phase (the step size's) keeps
#: when the step size is carried over from the previous run
MCLMC_CARRIED_STEP_SHARE = 0.1


def _mclmc_warm_tuning(model, previous, x, y, options, fraction, seed):
    """MCLMC's refit tuning (its :class:`~pyrobnn.methods.WarmStart` ``prepare``): each chain's
    tuning starts from the step size and ``L`` its previous run ended at
    (:func:`mclmc_tuning_of`), at the target energy variance that run's schedule ended at, with
    ``fraction`` of the cold fit's second and third phases (``L``'s) and a tenth of that of its
    first (the step size's, which starts where it was tuned)."""
    defaults = inspect.signature(mclmc).parameters
    energy_variance = options.get("energy_variance", defaults["energy_variance"].default)
    n1, n2, n3 = _phases(options.get("num_warmup", defaults["num_warmup"].default))
    num_warmup = (scaled_budget(n1, fraction * MCLMC_CARRIED_STEP_SHARE), scaled_budget(n2, fraction), scaled_budget(n3, fraction))
    return dict(options, **mclmc_tuning_of(previous), num_warmup=num_warmup,
                energy_variance=energy_variance[-1] if isinstance(energy_variance, (tuple, list)) else energy_variance)


register(MethodSpec(
    "nuts", "NUTS, all chains batched (native, compiled or eager backend)", "mcmc", nuts, latent_only_support(),
    budgets={"num_samples": 1, "num_warmup": 0, "num_chains": 1, "max_tree_depth": 1},
    constraints={
        "target_accept": Interval(0.0, 1.0), "step_size": Either(PositiveValues(1, "(num_chains,)"), None),
        "inv_mass": Either(PositiveValues(2, "(D,) or (num_chains, D)"), None), "adapt_mass_matrix": Flag(), **_RUN_CONSTRAINTS,
    },
    rules=(_per_chain_in_one_process("nuts", {"step_size": 1, "inv_mass": 2}),),
    quick={"num_samples": 4, "num_warmup": 4, "num_chains": 2, "max_tree_depth": 3, "progress": False},
    # as a surrogate: chains from the prior's draws, not the box, whose networks a 200-step warm-up
    # did not bring back (predictive sds of thousands away from the data on Levy-20); so started,
    # the calibrated limit's whole network (its units and mean), as MCLMC and the ensemble have
    # (docs/bayesopt.md, "Where the chains start", 2026-11-28); the chains in float32 on a copy of
    # the float64 network: a refit about 0.72x as long, held-out NLL and regret level
    # (docs/bayesopt.md, "NUTS's chains in single precision", 2026-12-07)
    bo_options=dict(num_samples=64, num_warmup=200, num_chains=4, max_tree_depth=6, init="prior", dtype=torch.float32),
    bo_limit_network=True,
    # its calibration offered the stationary cosine network too: ahead of random search on every
    # development problem, Hartmann-6 among them, where with erf and ReLU alone it was level with
    # it (docs/bayesopt.md, "NUTS offered the cosine network", 2026-12-08)
    bo_activations=("erf", "relu", "cos"),
    # a refit's chains go on from their last draws with a quarter of the warm-up, adapting from
    # scratch: starting it from the previous run's step sizes and its draws' variance
    # (nuts_adaptation_of) was level in held-out NLL over 8 problems, worse on Branin and
    # Griewank-8 at any warm-up length (docs/bayesopt.md, "NUTS's refits from the previous
    # adaptation", 2026-12-06)
    warm_start=CHAIN_WARM_START,
))
register(MethodSpec(
    "mclmc", "MCLMC (unadjusted microcanonical Langevin), per-chain tuning", "mcmc", mclmc, latent_only_support(),
    budgets={"num_samples": 1, "num_warmup": 0, "num_chains": 1, "thinning": 1},
    constraints={
        "num_warmup": Phases(3, least=0), "step_size": Either(PositiveValues(1, "(num_chains,)"), None),
        "L": Either(PositiveValues(1, "(num_chains,)"), None), **_RUN_CONSTRAINTS,
    },
    rules=(samples_cover_thinning("mclmc"), _per_chain_in_one_process("mclmc", {"step_size": 1, "L": 1})),
    quick={"num_samples": 8, "num_warmup": 12, "num_chains": 2, "thinning": 2, "progress": False},
    # as a surrogate, 512 steps after the tuning, every 16th kept: the members' spread is the
    # predictive's, and draws near each other along a chain are correlated, so members from a
    # short stretch are over-confident (the BO benchmark's held-out NLL at 20 points within 1.5x
    # of the GP's on 7 of 8 problems, 4 of 8 from 32 steps; 1,024 steps no clearly better and a
    # BO step 3.25x the GP's; docs/bayesopt.md, "MCLMC's draws span its chains", 2026-12-07)
    bo_options=dict(num_samples=512, num_warmup=(1000, 200, 200), num_chains=4, thinning=16, init="prior"),
    # the calibrated limit's whole network (its units and mean), chains from the prior's draws:
    # Levy-20's regret +2.06 to +0.97 (docs/bayesopt.md, "Where the chains start")
    bo_limit_network=True,
    # a refit's chains go on from their last draws, each tuning from the step size and L it ended
    # at, its first phase a tenth as long: fits about 0.75x as long as with the tuning restarted,
    # held-out NLL level to slightly worse on the development problems (16 of 45 refits below)
    # and lower on the held-out ones (41 of 53), regret level (docs/bayesopt.md, "MCLMC's refits
    # from their previous tuning", 2026-12-07)
    warm_start=WarmStart(init="init", count="num_chains", prepare=_mclmc_warm_tuning,
                         names=("num_warmup", "step_size", "L", "energy_variance")),
))
register(MethodSpec(
    "pyro_nuts", "Pyro's own NUTS (MCMC(NUTS(model))), the reference", "mcmc", pyro_nuts, latent_only_support(),
    budgets={"num_samples": 4, "num_warmup": 0, "num_chains": 1, "max_tree_depth": 1},
    constraints={"target_accept": Interval(0.0, 1.0)},
    quick={"num_samples": 4, "num_warmup": 2, "max_tree_depth": 2, "progress": False},
    bounded_memory=False, unbounded_because="Pyro's MCMC evaluates the model on all the data at once",
))
