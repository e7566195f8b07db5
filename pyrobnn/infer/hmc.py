"""Gradient-based samplers on a BayesianModel: NUTS (a fast batched path, and Pyro's MCMC as the
reference) and MCLMC, from random starts or from given positions (a deep ensemble's members)."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import pyro
import torch

from pyrobnn.infer import native as native_kernels
from pyrobnn.infer.budget import ExecutionPath, check_compile, choose_path
from pyrobnn.infer.fit import validate_training_data
from pyrobnn.infer.mclmc import sample_mclmc
from pyrobnn.infer.nuts import sample_nuts
from pyrobnn.infer.potential import FlatPotential
from pyrobnn.infer.processes import concat_rows, run_in_processes, split_rows
from pyrobnn.validation import check_positive_int, check_positive_number

__all__ = ["MCMCResult", "nuts", "mclmc", "pyro_nuts", "initial_positions", "check_samplable"]


@dataclass
class MCMCResult:
    """Posterior samples of every latent site, ``{name: (chains, draws, *shape)}``, with
    per-draw sampler statistics (``diverging``, ``tree_depth``, ``accept_prob``, ...) and the
    sampler's wall time."""

    samples: dict
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    method: str = ""

    @property
    def num_chains(self) -> int:
        return next(iter(self.samples.values())).shape[0]

    @property
    def num_draws(self) -> int:
        return next(iter(self.samples.values())).shape[1]

    def flat_samples(self) -> dict:
        """``{name: (chains * draws, *shape)}``, as ``pyro.infer.Predictive`` takes them."""
        return {k: v.reshape((-1,) + v.shape[2:]) for k, v in self.samples.items()}

    @property
    def num_divergences(self) -> int:
        d = self.stats.get("diverging")
        return int(d.sum()) if d is not None else 0


def check_samplable(model):
    """Refuse a model with point parameters in its likelihood: samplers and ensembles here move
    latent sites only."""
    if any(True for _ in model.likelihood.parameters()):
        raise ValueError(
            "MCMC samples latent sites only: give the likelihood a fixed noise scale or a prior "
            "(GaussianLikelihood(scale=0.1) or scale=dist.LogNormal(...)), not scale='learned'"
        )


def nuts(
    model,
    x,
    y,
    num_samples: int = 500,
    num_warmup: int = 500,
    num_chains: int = 4,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    seed: int = 0,
    init_radius: float = 2.0,
    compile="auto",
    progress: bool = True,
    init=None,
    num_processes: int = 1,
) -> MCMCResult:
    """NUTS for ``model`` conditioned on ``(x, y)``, all chains in one batched computation.

    The potential and its gradient come from :class:`~pyrobnn.infer.potential.FlatPotential`
    (one vmapped network pass for all chains, no Pyro tracing), and the sampler from
    :func:`~pyrobnn.infer.nuts.sample_nuts` (multinomial NUTS, Stan's warm-up, per-chain step
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
        :class:`~pyrobnn.infer.ensemble.EnsembleResult` (ensemble-initialized NUTS, Sommer et al.
        2024), an :class:`MCMCResult` (its last draws) or unconstrained vectors ``(chains, dim)``;
        ``num_chains`` is then their number.
    :param compile: which code runs the transitions (:mod:`pyrobnn.infer.budget`):
        ``"auto"`` (default) lets the run's budget pick between the native kernels of
        :mod:`pyrobnn.infer.native` (stacks of ``nn.Linear`` with Normal priors and a Gaussian,
        heteroscedastic or categorical likelihood; built once per machine in about 2 s), the
        torch code compiled with ``torch.compile`` (every other model; 10-16 s per run) and the
        eager torch code (no start-up); ``True`` takes the fastest compiled path, ``False`` the
        eager one. ``stats["path"]`` and ``stats["path_reason"]`` say which ran and why. If
        ``torch.compile`` fails, the run falls back to eager code with a warning.
    :param num_processes: split the chains into this many groups, each run in its own process
        (:mod:`pyrobnn.infer.processes`): a group no longer waits for another group's longest
        trajectory, and each uses its own core. Group ``i`` draws from the seed ``seed + i``
        (the starting positions are drawn here from ``seed``, so they do not change). The native
        kernels are built here first, so the processes load them instead of building their own.
    """
    for name, value, least in (("num_samples", num_samples, 1), ("num_warmup", num_warmup, 0), ("max_tree_depth", max_tree_depth, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if not (isinstance(target_accept, (int, float)) and 0 < target_accept < 1):
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept!r}")
    check_compile(compile)

    if num_processes != 1:
        options = dict(num_samples=num_samples, num_warmup=num_warmup, max_tree_depth=max_tree_depth, target_accept=target_accept, compile=compile)
        return _run_in_processes(nuts, "NUTS", model, x, y, init, num_chains, init_radius, seed, num_processes, options, progress)

    def run(potential_fn, z0, generator, path):
        return sample_nuts(
            potential_fn, z0, num_samples=num_samples, num_warmup=num_warmup, max_tree_depth=max_tree_depth,
            target_accept=target_accept, generator=generator, progress=progress, compile=path.kind == "torch.compile",
            native=path.native,
        )

    evaluations = (num_warmup + num_samples) * (2**max_tree_depth - 1)
    return _run_sampler(model, x, y, run, "NUTS", init, num_chains, init_radius, seed, compile, evaluations, bound=True)


def _run_sampler(model, x, y, run, name, init, num_chains, init_radius, seed, compile, evaluations, bound=False) -> MCMCResult:
    """What the model-level samplers share: check the model and data, build the potential and
    the starting positions, let the budget pick the path (:func:`~pyrobnn.infer.budget.choose_path`,
    for ``evaluations`` gradient evaluations per chain), run ``run(potential_fn, z0, generator,
    path)`` without gradients (a failed ``torch.compile`` falls back to eager code with a
    warning), and unpack the draws ``(chains, draws, dim)`` into sites, with the potential at
    every draw and the path in the stats."""
    check_samplable(model)
    x, y = validate_training_data(model, x, y)
    x, y = x.to(model.device), y.to(model.device)
    was_training = model.training
    model.eval()
    path = None
    try:
        potential = FlatPotential(model, x, y)
        generator = torch.Generator(device=model.device).manual_seed(seed)
        z0 = initial_positions(potential, init, num_chains, init_radius, generator)
        start = time.perf_counter()
        # the positions are unconstrained and mapped into each support, so distribution argument
        # checks (Pyro's validation) cannot fail here except on a non-finite step, which the
        # samplers undo or count as divergent; inside compiled code each check would also be a
        # data-dependent branch, which the compiled NUTS loop refuses
        with torch.no_grad(), pyro.validation_enabled(False):
            path = choose_path(potential, z0, compile, name, evaluations, bound)
            if path.kind == "native":
                draws, stats = run(path.native.value_and_grad, z0, generator, path)
            elif path.kind == "torch.compile":
                try:
                    draws, stats = run(potential.value_and_grad_functional, z0, generator, path)
                except Exception as e:  # no C++ compiler, an unsupported operation, ...
                    warnings.warn(f"{name} runs eagerly: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
                    path = ExecutionPath("eager", f"torch.compile failed ({type(e).__name__}); {path.reason}")
                    generator.manual_seed(seed)
                    z0 = initial_positions(potential, init, num_chains, init_radius, generator)
                    draws, stats = run(potential.value_and_grad, z0, generator, path)
            else:
                draws, stats = run(potential.value_and_grad, z0, generator, path)
        seconds = time.perf_counter() - start
        chains, kept = draws.shape[:2]
        values = potential.unpack(draws.reshape(chains * kept, potential.dim))
        if "energy" not in stats:
            stats["energy"] = _energies(potential, draws)
        stats.update(path.stats())
    finally:
        model.train(was_training)
        if path is not None and path.native is not None:
            path.native.close()
    samples = {k: v.reshape((chains, kept) + v.shape[1:]) for k, v in values.items()}
    return MCMCResult(samples, stats, seconds, f"pyrobnn {name}" + (" (ensemble-initialized)" if init is not None else ""))


def _run_in_processes(sampler, name, model, x, y, init, num_chains, init_radius, seed, num_processes, options, progress):
    """``sampler`` (:func:`nuts` or :func:`mclmc`) with its chains split over ``num_processes``
    processes: the starting positions are drawn here (from ``seed``, as in one process), group
    ``i`` samples from the seed ``seed + i``, and the groups' draws and per-chain statistics are
    joined in chain order."""
    check_positive_int("num_processes", num_processes)
    check_samplable(model)
    x, y = validate_training_data(model, x, y)
    generator = torch.Generator(device=model.device).manual_seed(seed)
    z0 = initial_positions(FlatPotential(model), init, num_chains, init_radius, generator)  # the layout only
    groups = split_rows(z0, num_processes)
    if options.get("compile") is not False and native_kernels.unsupported_reason(model, x) is None:
        try:  # built once here, so that the processes load it instead of each building its own
            native_kernels.library()
        except native_kernels.NativeUnavailable:
            pass  # each process will say why in its stats
    calls = [((model, x, y), dict(options, init=g, seed=seed + i, progress=False)) for i, g in enumerate(groups)]
    start = time.perf_counter()
    results = run_in_processes(sampler, calls, progress=progress, desc=f"{name}, {len(groups)} processes")
    seconds = time.perf_counter() - start
    samples = concat_rows([r.samples for r in results])
    stats = concat_rows([r.stats for r in results])
    return MCMCResult(samples, stats, seconds, f"pyrobnn {name}" + (" (ensemble-initialized)" if init is not None else ""))


def initial_positions(potential, init, num_chains, init_radius, generator):
    """Unconstrained starting positions ``(chains, dim)``: uniform on ``[-init_radius,
    init_radius]`` (``init=None``), or from ``init`` (an ensemble, an MCMC result's last draws,
    or a tensor)."""
    if init is None:
        if not isinstance(num_chains, int) or num_chains < 1:
            raise ValueError(f"num_chains must be a positive integer, got {num_chains!r}")
        return potential.initial(num_chains, init_radius, generator)
    if isinstance(init, MCMCResult):
        z = potential.pack({k: v[:, -1] for k, v in init.samples.items()})
    elif isinstance(init, torch.Tensor):
        z = init
    else:
        raise TypeError(f"init must be an EnsembleResult, an MCMCResult or a tensor, got {type(init).__name__}")
    if z.dim() != 2 or z.shape[1] != potential.dim:
        raise ValueError(f"init must hold positions of shape (chains, {potential.dim}), got {tuple(z.shape)}")
    if not torch.isfinite(z).all():
        raise ValueError("init holds non-finite positions")
    return z.detach().to(dtype=potential.model.dtype, device=potential.model.device).clone()


@torch.no_grad()
def _energies(potential, draws):
    """The potential at every draw, ``(chains, draws)``: the log-density trace that tells a
    chain still climbing from one that is stationary."""
    chains, n, dim = draws.shape
    if n == 0:
        return draws.new_zeros(chains, 0)
    out = [potential(draws[:, i : i + 256].transpose(0, 1).reshape(-1, dim)).reshape(-1, chains).T for i in range(0, n, 256)]
    return torch.cat(out, 1)


def mclmc(
    model,
    x,
    y,
    num_samples: int = 10_000,
    num_warmup=(40_000, 5_000, 5_000),
    num_chains: int = 4,
    *,
    thinning: int = 10,
    step_size: float = 1e-3,
    L=None,
    energy_variance=(0.5, 0.1),
    diagonal_preconditioning: bool = False,
    seed: int = 0,
    init_radius: float = 2.0,
    init=None,
    compile="auto",
    progress: bool = True,
    num_processes: int = 1,
) -> MCMCResult:
    """Unadjusted MCLMC (:mod:`pyrobnn.infer.mclmc`) for ``model`` conditioned on ``(x, y)``, all
    chains in one batched computation, each chain tuned on its own.

    The defaults are the MILE protocol (Sommer et al. 2025, ICLR): 50,000 tuning steps split
    40,000 / 5,000 / 5,000 over the three phases, a target energy variance per dimension
    scheduled from 0.5 to 0.1, initial step size ``1e-3`` and ``L = max(sqrt(d), 15)``, then
    ``num_samples`` steps of which every ``thinning``-th is kept. Start the chains from a deep
    ensemble (``init=deep_ensemble(...)``; :func:`pyrobnn.infer.ensemble.ensemble_sampling` does
    both), as MILE does: from random starts the chains spend their tuning climbing.

    :param num_warmup: the steps of the three tuning phases, or one number split 80/10/10.
    :param compile: which code runs each step, as in :func:`nuts`: ``"auto"`` (default: the
        native kernels where they apply and pay, else ``torch.compile`` where the run is long
        enough, else eager torch code), ``True`` or ``False``.
    :param num_processes: run the chains in this many groups, one process each, as in
        :func:`nuts`.
    :returns: an :class:`MCMCResult` with ``num_samples // thinning`` draws per chain; its stats
        hold the potential at each draw (``energy``), the energy errors, the tuned ``step_size``,
        ``L`` and ``inv_mass``, and the steps undone for a non-finite result (``nonfinite``).
    """
    for name, value in (("step_size", step_size), ("L", L)):
        if value is not None:  # None: BlackJAX's initial value (sample_mclmc)
            check_positive_number(name, value)
    check_compile(compile)
    if isinstance(num_warmup, int):
        num_warmup = (round(0.8 * num_warmup), round(0.1 * num_warmup), num_warmup - round(0.8 * num_warmup) - round(0.1 * num_warmup))

    if num_processes != 1:
        options = dict(
            num_samples=num_samples, num_warmup=num_warmup, thinning=thinning, step_size=step_size, L=L,
            energy_variance=energy_variance, diagonal_preconditioning=diagonal_preconditioning, compile=compile,
        )
        return _run_in_processes(mclmc, "MCLMC", model, x, y, init, num_chains, init_radius, seed, num_processes, options, progress)

    def run(potential_fn, z0, generator, path):
        L0 = max(math.sqrt(z0.shape[1]), 15.0) if L is None else L
        return sample_mclmc(
            potential_fn, z0, num_samples, num_warmup, thinning=thinning, step_size=step_size, L=L0, energy_variance=energy_variance,
            diagonal_preconditioning=diagonal_preconditioning, generator=generator, progress=progress,
            compile=path.kind == "torch.compile", native=path.native,
        )

    steps = sum(num_warmup) + (round(num_warmup[1] / 3) if diagonal_preconditioning else 0) + num_samples
    return _run_sampler(model, x, y, run, "MCLMC", init, num_chains, init_radius, seed, compile, 2 * steps)


def pyro_nuts(
    model,
    x,
    y,
    num_samples: int = 500,
    num_warmup: int = 500,
    num_chains: int = 1,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    seed: int = 0,
    jit_compile: bool = False,
    progress: bool = True,
) -> MCMCResult:
    """The reference path: ``pyro.infer.MCMC(pyro.infer.NUTS(model))``, one chain after the
    other in this process, the samples stacked by chain."""
    check_samplable(model)
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
            diagnostics = mcmc.diagnostics()
            stats["diverging"].append(torch.tensor([len(diagnostics.get("divergences", {}).get("chain 0", []))]))
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    samples = {k: torch.stack([c[k] for c in chains]) for k in names}
    return MCMCResult(samples, {"diverging_total": torch.cat(stats["diverging"])}, seconds, "pyro NUTS")
