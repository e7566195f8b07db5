"""The model-level sampler runner: what every full-batch sampler of a BayesianModel shares.

:func:`run_sampler` checks the model and data once, builds the flat potential
(:class:`~pyrobnn.infer.core.potential.FlatPotential`) and the starting positions
(:func:`initial_positions`), takes the backend that runs the kernel by the rule of
:mod:`pyrobnn.infer.mcmc.backend`, runs the kernel without gradients and unpacks the draws into
a :class:`~pyrobnn.infer.results.posterior.Posterior`. :func:`run_in_process_groups` splits the chains
over processes (:mod:`pyrobnn.infer.core.processes`) and joins their posteriors.
"""

from __future__ import annotations

import contextlib
import time
import warnings

import pyro
import torch

from pyrobnn.infer.core.checkpoints import RunCheckpoint
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.problem import flat_problem, training_data
from pyrobnn.infer.core.processes import concat_rows, run_in_processes, split_rows
from pyrobnn.infer.core.starts import initial_positions
from pyrobnn.infer.mcmc import native as native_kernels
from pyrobnn.infer.mcmc.backend import ExecutionPath, choose_path
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.utils import memory
from pyrobnn.utils.validation import check_positive_int

__all__ = ["run_sampler", "run_in_process_groups", "energies", "label"]


def label(name: str, init) -> str:
    """The method's label: ``"pyrobnn NUTS"``, ``"pyrobnn MCLMC (ensemble-initialized)"``."""
    return f"pyrobnn {name}" + (" (ensemble-initialized)" if init is not None else "")


def run_sampler(
    model, x, y, run, name, init, num_chains, init_radius, seed, backend, evaluations, bound=False, settings=None, checkpoint=None,
) -> Posterior:
    """What the model-level samplers share: check the model and data, build the potential and
    the starting positions, take the backend (:func:`~pyrobnn.infer.mcmc.backend.choose_path`,
    for ``evaluations`` gradient evaluations per chain), run ``run(potential_fn, z0, generator,
    path, run_checkpoint)`` without gradients (a failed ``torch.compile`` falls back to eager code
    with a warning), and unpack the draws ``(chains, draws, dim)`` into sites, with the potential
    at every draw and the backend in the stats.

    :param checkpoint: a :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` or ``None``: the
        run's :class:`~pyrobnn.infer.core.checkpoints.RunCheckpoint`, whose identity is the sampler, its
        ``settings``, the data, the starting positions and the model's structure.
    """
    path = None
    with contextlib.ExitStack() as cleanup:
        problem = cleanup.enter_context(flat_problem(model, x, y, seed))
        cleanup.callback(lambda: path is not None and path.native is not None and path.native.close())
        potential, generator = problem.potential, problem.generator
        z0 = initial_positions(potential, init, num_chains, init_radius, generator)
        settings = with_chain_count(settings, z0.shape[0])
        run_checkpoint = None
        if checkpoint is not None:
            fixed = {k: v for k, v in (settings or {}).items() if k not in ("backend", "num_processes", "init")}
            run_checkpoint = RunCheckpoint.of_run(checkpoint, name, fixed, model, (problem.x, problem.y), z0)
        start = time.perf_counter()
        # the positions are unconstrained and mapped into each support, so distribution argument
        # checks (Pyro's validation) cannot fail here except on a non-finite step, which the
        # samplers undo or count as divergent; inside compiled code each check would also be a
        # data-dependent branch, which the compiled NUTS loop refuses
        with torch.no_grad(), pyro.validation_enabled(False):
            path = choose_path(potential, z0, backend, name, evaluations, bound)
            if path.kind == "native":
                draws, stats = run(path.native.value_and_grad, z0, generator, path, run_checkpoint)
            elif path.kind == "torch.compile":
                try:
                    draws, stats = run(potential.value_and_grad_functional, z0, generator, path, run_checkpoint)
                except Exception as e:  # no C++ compiler, an unsupported operation, ...
                    warnings.warn(
                        f"{name} runs eagerly: torch.compile failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}); "
                        "pass backend='eager' to run eagerly without the attempt", stacklevel=3,
                    )
                    path = ExecutionPath("eager", f"torch.compile failed ({type(e).__name__}); {path.reason}")
                    generator.manual_seed(seed)
                    z0 = initial_positions(potential, init, num_chains, init_radius, generator)
                    draws, stats = run(potential.value_and_grad, z0, generator, path, run_checkpoint)
            else:
                draws, stats = run(potential.value_and_grad, z0, generator, path, run_checkpoint)
        seconds = time.perf_counter() - start
        samples = potential.unpack_draws(draws)
        if "energy" not in stats:
            stats["energy"] = energies(potential, draws)
        stats.update(path.stats())
    return Posterior(samples, stats, seconds, label(name, init), "mcmc", settings, model)


def with_chain_count(settings, chains: int) -> dict:
    """``settings`` recording the chains that ran: with ``init`` (an ensemble, a tensor of starts)
    their number is ``init``'s, not the ``num_chains`` argument's."""
    settings = dict(settings or {})
    if "num_chains" in settings:
        settings["num_chains"] = chains
    return settings


def run_in_process_groups(
    sampler, name, model, x, y, init, num_chains, init_radius, seed, num_processes, options, progress, settings=None, checkpoint=None,
):
    """``sampler`` (:func:`nuts` or :func:`mclmc`) with its chains split over ``num_processes``
    processes: the starting positions are drawn here (from ``seed``, as in one process), group
    ``i`` samples from the seed ``seed + i``, and the groups' draws and per-chain statistics are
    joined in chain order. With ``checkpoint`` (a
    :class:`~pyrobnn.infer.core.checkpoints.Checkpointing`), group ``i`` of ``k`` checkpoints to
    ``<path>.group<i>-of-<k>``."""
    check_positive_int("num_processes", num_processes)
    x, y = training_data(model, x, y)
    generator = torch.Generator(device=model.device).manual_seed(seed)
    z0 = initial_positions(FlatPotential(model), init, num_chains, init_radius, generator)  # the layout only
    groups = split_rows(z0, num_processes)
    if options.get("backend") in ("auto", "native") and native_kernels.unsupported_reason(model, x) is None:
        try:  # built once here, so that the processes load it instead of each building its own
            native_kernels.library()
        except native_kernels.NativeUnavailable:
            pass  # each process will say why in its stats
    def group_checkpoint(i):
        if checkpoint is None:
            return {}
        return dict(checkpoint=checkpoint.with_suffix(f".group{i}-of-{len(groups)}"))

    calls = [((model, x, y), dict(options, init=g, seed=seed + i, progress=False, **group_checkpoint(i))) for i, g in enumerate(groups)]
    start = time.perf_counter()
    results = run_in_processes(sampler, calls, progress=progress, desc=f"{name}, {len(groups)} processes")
    seconds = time.perf_counter() - start
    samples = concat_rows([r.samples for r in results])
    stats = concat_rows([r.stats for r in results])
    return Posterior(samples, stats, seconds, label(name, init), "mcmc", with_chain_count(settings, z0.shape[0]), model)


@torch.no_grad()
def energies(potential, draws):
    """The potential at every draw, ``(chains, draws)``: the log-density trace that tells a
    chain still climbing from one that is stationary. As many draws go through at once as the
    memory budget allows over the full data (:mod:`pyrobnn.utils.memory`)."""
    chains, n, dim = draws.shape
    if n == 0:
        return draws.new_zeros(chains, 0)
    per_row = potential.x.shape[0] * memory.activation_bytes(potential.model.net, potential.x) * memory.FORWARD_FACTOR
    group = int(max(1, min(256, memory.budget() // max(per_row * chains, 1))))
    out = [potential(draws[:, i : i + group].transpose(0, 1).reshape(-1, dim)).reshape(-1, chains).T for i in range(0, n, group)]
    return torch.cat(out, 1)
