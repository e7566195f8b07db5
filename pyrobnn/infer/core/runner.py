"""The one runner of every sampler: NUTS and MCLMC (full batch), SGLD, SGHMC and SMILE
(minibatches) are kernel definitions (:mod:`pyrobnn.infer.core.kernel`); this module runs them.

:func:`run_chains` is the loop over steps, written once: each step asks the adaptation for the
settings and the data for the target, draws the kernel's random numbers, takes the step on the
execution path, lets the data's failure policy judge it, tallies and adapts, keeps the draws the
thinning keeps, shows progress, and writes the checkpoint when due. The checkpoint is the state
records themselves (the kernel's, the adaptation's, the generator's, the data order's and the
draws so far), so a resumed run gives the uninterrupted run's draws bit for bit; SIGTERM and
SIGINT stop the loop after the step it is in with that state written
(:mod:`pyrobnn.infer.core.interrupts`).

:func:`sample` runs a :class:`Sampler` (a method's kernel, adaptation, data and starts) on a
model: it checks the data once, builds the flat potential and the starting positions, takes the
execution path the sampler's rule gives (a failed ``torch.compile`` falls back to eager code
with a warning), splits the chains over processes when asked, runs them on a copy of the model in
another floating dtype when asked (the draws handed back in the model's), and returns a
:class:`~pyrobnn.infer.results.posterior.Posterior`. The public methods (``pyrobnn.nuts``,
``mclmc``, ``sgld``, ``sghmc``, ``smile``) take flat keywords and build the kernel's settings
and a :class:`RunSettings` from them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
import warnings
from collections import defaultdict
from typing import NamedTuple, Optional

import pyro
import torch

from pyrobnn.infer.core import records
from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint, watching
from pyrobnn.infer.core.execution import EAGER, ExecutionPath
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.problem import flat_problem, training_data
from pyrobnn.infer.core.processes import concat_rows, run_in_processes, split_rows
from pyrobnn.infer.core.starts import initial_positions
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.runtime import raised_recompile_limits
from pyrobnn.utils.validation import check_positive_int

__all__ = ["Chains", "Trace", "run_chains", "RunSettings", "Sampler", "sample", "IDENTITY_EXCLUDES"]


class Chains(NamedTuple):
    """What :func:`run_chains` returns: the kept draws ``(C, S, D)``, the statistics (per draw
    ``(C, S)``, per chain, the kernel's and the adaptation's final values, the tallies), and the
    1-based step number of each draw."""

    draws: torch.Tensor
    stats: dict
    kept: tuple


def _progress_unit(kernel) -> str:
    return "it" if kernel.unit == "iterations" else "step"


class Trace:
    """What a run keeps as it goes: for every kept step the kernel's record (the draw ``"z"`` and
    per-draw statistics, each ``(C, ...)``) and its 1-based step number, and the kernel's tallies
    summed apart over warm-up (``<name>_warmup``) and sampling (``<name>``); a checkpoint holds it
    as :meth:`state_dict`."""

    def __init__(self, kernel, chains: int, device):
        self.values, self.kept = defaultdict(list), []
        self.tallies = {f"{name}{suffix}": torch.zeros(chains, dtype=torch.long, device=device)
                        for name in kernel.tallies for suffix in ("", "_warmup")}
        self._warmup_names = {name: f"{name}_warmup" for name in kernel.tallies}

    def count(self, counts: dict, warming: bool) -> None:
        for name, count in counts.items():
            self.tallies[self._warmup_names[name] if warming else name].add_(count)

    def keep(self, step: int, record: dict) -> None:
        for k, v in record.items():
            self.values[k].append(v)
        self.kept.append(step)

    def state_dict(self) -> dict:
        return {
            "values": {k: torch.stack(v, 1).cpu() for k, v in self.values.items()} if self.kept else None,
            "tallies": {k: v.cpu() for k, v in self.tallies.items()}, "kept": list(self.kept),
        }

    def load_state_dict(self, state: dict, device) -> None:
        for k, v in (state["values"] or {}).items():
            self.values[k] = list(v.to(device).unbind(1))
        self.tallies.update({k: v.to(device) for k, v in state["tallies"].items()})
        self.kept = list(state["kept"])

    def draws(self, position) -> torch.Tensor:
        """The kept draws ``(C, S, D)`` (none: ``(C, 0, D)``)."""
        return torch.stack(self.values["z"], 1) if self.kept else position.new_zeros(position.shape[0], 0, position.shape[1])

    def stats(self) -> dict:
        """The per-draw statistics, ``(C, S, ...)`` each."""
        return {k: torch.stack(v, 1) for k, v in self.values.items() if k != "z"}


def run_chains(
    kernel, adaptation, data, position, *, num_samples: int, thinning: int = 1, generator=None, path: ExecutionPath = EAGER,
    checkpoint: Optional[RunCheckpoint] = None, progress: bool = False,
) -> Chains:
    """Run ``kernel`` from ``position`` (``(C, D)``): ``adaptation.num_steps`` warm-up steps, then
    ``num_samples`` steps of which ``adaptation.keeps`` (every ``thinning``-th) give draws.

    :param data: the target of each step (:class:`~pyrobnn.infer.core.kernel.FullBatch`,
        :class:`~pyrobnn.infer.core.minibatch.Minibatches`).
    :param path: the :class:`~pyrobnn.infer.core.execution.ExecutionPath` the steps run on
        (``kernel.stepper(path, ...)``).
    :param checkpoint: a :class:`~pyrobnn.infer.core.checkpoints.RunCheckpoint`: the run starts from
        its saved state if there is one (then no ``init`` runs and no random number is drawn
        for it), and writes its state when due, at the end, and at a stop signal; never where
        the adaptation cannot be resumed from (just before such a stretch it is written).
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("thinning", thinning)
    device = position.device
    step = kernel.stepper(path, data.fixed_target)
    total = adaptation.num_steps + num_samples
    trace = Trace(kernel, position.shape[0], device)
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is None:
        state = kernel.init(position, data, generator)
        tuning = adaptation.init(state, data, generator)
        first = 0
    else:
        state = records.from_tree(kernel.State, saved["state"], device)
        tuning = None if saved["adaptation"] is None else records.from_tree(adaptation.State, saved["adaptation"], device)
        generator.set_state(saved["generator"])
        data.load_state_dict(saved["data"])
        trace.load_state_dict(saved["trace"], device)
        first = int(saved["iteration"])

    def snapshot(count):
        data.before_save(state)
        return {
            "iteration": count, "state": records.to_tree(state), "adaptation": None if tuning is None else records.to_tree(tuning),
            "generator": generator.get_state(), "data": data.state_dict(), "trace": trace.state_dict(),
        }

    bar = tqdm(total=total, initial=first, disable=not progress, desc=kernel.name, unit=_progress_unit(kernel), dynamic_ncols=True, mininterval=0.5)
    # the loop's calls, looked up once: a native step takes tens of microseconds, and the
    # loop's own Python is paid on every one of them
    settings_of, update, keeps, num_warmup = adaptation.settings, adaptation.update, adaptation.keeps, adaptation.num_steps
    next_target, guard, after_step = data.next_target, data.guard, data.after_step
    randoms_of, tally, record = kernel.randoms, kernel.tally, kernel.record
    # a compiled step is compiled for each potential (see raised_recompile_limits)
    with raised_recompile_limits(enabled=path.compiled), watching(checkpoint):
        try:
            for i in range(first, total):
                warming = i < num_warmup
                settings = settings_of(tuning, i)
                target = next_target()
                new, info = step(state, target, randoms_of(state, settings, generator), settings)
                state = guard(state, new, info)
                trace.count(tally(info), warming)
                if warming:
                    tuning = update(tuning, i, state, info, target, generator)
                if keeps(i, thinning):
                    trace.keep(i + 1, record(state, info))
                last = i + 1 == total
                after_step(i, state, last)
                if progress:
                    if i % 10 == 0 or last:
                        shown = kernel.progress(state, info, settings_of(tuning, i))
                        if shown is not None:
                            bar.set_postfix({"phase": "warmup" if warming else "sample", **shown}, refresh=False)
                    bar.update(1)
                if checkpoint is not None:
                    # a stretch the adaptation cannot resume inside (MCLMC's third phase): the
                    # state just before it is always written, so a stop inside goes back no further
                    resumable = adaptation.resumable_after(i + 1)
                    entering = resumable and not last and not adaptation.resumable_after(i + 2)
                    checkpoint.after(i + 1, lambda: snapshot(i + 1), last=last, resumable=resumable, unit=kernel.unit, now=entering)
        finally:
            bar.close()
    stats = trace.stats()
    stats.update(kernel.final(state))
    stats.update(adaptation.final(tuning))
    stats.update(trace.tallies)
    return Chains(trace.draws(position), stats, tuple(trace.kept))


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How a sampler's run goes, whatever its kernel: ``num_samples`` steps after the warm-up,
    every ``thinning``-th kept; ``num_chains`` chains (or one per row of ``init``: a posterior's
    last draws, an ensemble's members, positions ``(chains, dim)``), started by the sampler's rule
    (uniform in ``[-init_radius, init_radius]`` for the full-batch samplers); the ``seed``; the
    ``backend`` the sampler's rule reads; a progress bar; a
    :class:`~pyrobnn.infer.core.checkpoints.Checkpointing`; the chains split over
    ``num_processes`` processes; the chains in ``dtype`` (``None``: the model's)."""

    num_samples: int
    thinning: int = 1
    num_chains: int = 4
    init: object = None
    init_radius: float = 2.0
    seed: int = 0
    backend: str = "eager"
    progress: bool = True
    checkpoint: Optional[Checkpointing] = None
    num_processes: int = 1
    dtype: Optional[torch.dtype] = None


#: settings a resumed run may change: they decide how it runs, not what it computes
IDENTITY_EXCLUDES = ("backend", "num_processes", "init", "progress", "checkpoint")


class Sampler:
    """A sampling method as :func:`sample` runs it on a model: its ``name`` (progress, checkpoints,
    messages), result ``family``, the ``settings`` the result records, and what a family defines
    in a subclass: the starting positions, the execution path, the kernel with its adaptation and
    data, the label and the statistics of its result."""

    def __init__(self, name: str, family: str, settings: dict):
        self.name, self.family, self.settings = name, family, dict(settings)

    def starts(self, potential, generator, run: RunSettings) -> torch.Tensor:
        """The chains' starting positions ``(chains, dim)``: uniform in the box, or ``run.init``'s
        (:func:`~pyrobnn.infer.core.starts.initial_positions`)."""
        return initial_positions(potential, run.init, run.num_chains, run.init_radius, generator)

    def choose_path(self, potential, z0, run: RunSettings) -> ExecutionPath:
        return EAGER

    def parts(self, problem, z0, path: ExecutionPath) -> tuple:
        """``(kernel, adaptation, data)`` for a run on ``problem``
        (:class:`~pyrobnn.infer.core.problem.FlatProblem`) from ``z0`` on ``path``."""
        raise NotImplementedError

    def label(self, run: RunSettings) -> str:
        return self.name

    def stats(self, chains: Chains) -> dict:
        return dict(chains.stats)

    def before_processes(self, model, x, run: RunSettings) -> None:
        """Work done once before the chains are split over processes (a shared build)."""

    def recorded(self, chains: int) -> dict:
        """The settings as the result records them, with the chains that ran (with ``init``
        their number is ``init``'s, not the ``num_chains`` argument's)."""
        out = dict(self.settings)
        if "num_chains" in out:
            out["num_chains"] = chains
        return out


def sample(model, x, y, sampler: Sampler, run: RunSettings) -> Posterior:
    """``sampler`` on ``model`` conditioned on ``(x, y)`` (module docstring)."""
    if run.dtype is not None and run.dtype != model.dtype:
        return _in_dtype(model, x, y, sampler, run)
    if run.num_processes != 1:
        return _in_process_groups(model, x, y, sampler, run)
    path = None
    with contextlib.ExitStack() as cleanup:
        problem = cleanup.enter_context(flat_problem(model, x, y, run.seed))
        cleanup.callback(lambda: path is not None and path.close())
        potential, generator = problem.potential, problem.generator
        z0 = sampler.starts(potential, generator, run)
        settings = sampler.recorded(z0.shape[0])
        checkpoint = None
        if run.checkpoint is not None:
            identity = {k: v for k, v in settings.items() if k not in IDENTITY_EXCLUDES}
            checkpoint = RunCheckpoint.of_run(run.checkpoint, sampler.name, identity, model, (problem.x, problem.y), z0)
        start = time.perf_counter()
        # the positions are unconstrained and mapped into each support, so distribution argument
        # checks (Pyro's validation) cannot fail here except on a non-finite step, which the
        # kernels undo or count; inside compiled code each check would also be a data-dependent
        # branch, which the compiled NUTS loop refuses
        with torch.no_grad(), pyro.validation_enabled(False):
            path = sampler.choose_path(potential, z0, run)
            options = dict(num_samples=run.num_samples, thinning=run.thinning, generator=generator, checkpoint=checkpoint, progress=run.progress)
            try:
                chains = run_chains(*sampler.parts(problem, z0, path), z0, path=path, **options)
            except Exception as e:  # no C++ compiler, an unsupported operation, ...
                if not path.compiled:
                    raise
                warnings.warn(
                    f"{sampler.name} runs eagerly: torch.compile failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}); "
                    "pass backend='eager' to run eagerly without the attempt", stacklevel=3,
                )
                path = ExecutionPath("eager", f"torch.compile failed ({type(e).__name__}); {path.reason}")
                generator.manual_seed(run.seed)
                z0 = sampler.starts(potential, generator, run)
                chains = run_chains(*sampler.parts(problem, z0, path), z0, path=path, **options)
        seconds = time.perf_counter() - start
        samples = potential.unpack_draws(chains.draws)
        stats = sampler.stats(chains)
        stats.update(path.stats())
    return Posterior(samples, stats, seconds, sampler.label(run), sampler.family, settings, model)


def _in_dtype(model, x, y, sampler: Sampler, run: RunSettings) -> Posterior:
    """The chains run on a copy of ``model`` in ``run.dtype`` (its parameters and priors cast, the
    data cast as for any model), and the result is ``model``'s: the draws and the floating-point
    statistics cast to its dtype. ``model`` itself is not changed. In single precision the native
    kernels (:mod:`pyrobnn.infer.core.native`) evaluate twice as many numbers per vector
    instruction; the draws carry single precision's rounding."""
    x, y = training_data(model, x, y)  # checked against the model itself

    def cast(value, dtype):
        return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    copied = copy.deepcopy(model).to(run.dtype)
    result = sample(copied, cast(x, run.dtype), cast(y, run.dtype), sampler, dataclasses.replace(run, dtype=None))

    return dataclasses.replace(result, samples={k: cast(v, model.dtype) for k, v in result.samples.items()},
                               stats={k: cast(v, model.dtype) for k, v in result.stats.items()}, model=model)


def _in_process_groups(model, x, y, sampler: Sampler, run: RunSettings) -> Posterior:
    """The chains split into ``run.num_processes`` groups, each sampled by :func:`sample` in its
    own process (:mod:`pyrobnn.infer.core.processes`): the starting positions are drawn here
    (from ``run.seed``, as in one process), group ``i`` samples from the seed ``seed + i`` and
    checkpoints to ``<path>.group<i>-of-<k>``, and the groups' draws and per-chain statistics are
    joined in chain order."""
    x, y = training_data(model, x, y)
    generator = torch.Generator(device=model.device).manual_seed(run.seed)
    z0 = sampler.starts(FlatPotential(model), generator, run)  # the layout only
    groups = split_rows(z0, run.num_processes)
    sampler.before_processes(model, x, run)
    calls = []
    for i, g in enumerate(groups):
        checkpoint = None if run.checkpoint is None else run.checkpoint.with_suffix(f".group{i}-of-{len(groups)}")
        group = dataclasses.replace(run, init=g, seed=run.seed + i, progress=False, checkpoint=checkpoint, num_processes=1)
        calls.append(((model, x, y, sampler, group), {}))
    start = time.perf_counter()
    results = run_in_processes(sample, calls, progress=run.progress, desc=f"{sampler.name}, {len(groups)} processes")
    seconds = time.perf_counter() - start
    samples = concat_rows([r.samples for r in results])
    stats = concat_rows([r.stats for r in results])
    return Posterior(samples, stats, seconds, sampler.label(run), sampler.family, sampler.recorded(z0.shape[0]), model)
