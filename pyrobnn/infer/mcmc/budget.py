"""Which code a sampler runs: the run's budget picks the path.

Three paths compute the same transitions on the same random numbers:

- ``"native"``: the hand-written kernels of :mod:`pyrobnn.infer.mcmc.native`, for the common Bayesian
  MLP; built once per machine (about 2 s) and loaded from the user's cache afterwards;
- ``"torch.compile"``: the torch code compiled by Inductor, for every other model; it pays
  10-16 s of compilation in every run and every process (Inductor's cache does not store the NUTS
  loop's ``while_loop`` graph);
- ``"eager"``: the same torch code run op by op; no start-up cost, and the reference.

With ``compile="auto"`` a run too short for a build or a compilation to pay runs eagerly: the
eager time is estimated from one timed gradient evaluation at the starting positions times the
run's number of evaluations (for NUTS the most its trees can take, ``2**max_tree_depth - 1`` per
iteration) and compared with the start-up cost plus the compiled run. ``compile=True`` takes the
fastest compiled path whatever the budget, ``compile=False`` the eager one. The choice and its
reason go into the result's ``stats["path"]`` and ``stats["path_reason"]``.

Different paths agree to rounding on each evaluation (float64: to about 1e-13), not bit for bit,
and a chain's trajectory amplifies rounding differences over many steps: pass ``compile=True`` or
``False`` where a run must repeat bit for bit whatever the cache holds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from pyrobnn.infer.mcmc import native as native_kernels

__all__ = ["ExecutionPath", "choose_path", "check_compile", "COMPILE_SECONDS", "EAGER_OVERHEAD_SECONDS", "COMPILED_SPEEDUP"]

#: ``torch.compile``'s start-up per run, measured on the reference machine (docs/logs/benchmarks.md:
#: 10-16 s for the NUTS doubling and the MCLMC step)
COMPILE_SECONDS = {"NUTS": 15.0, "MCLMC": 12.0}
#: the eager sampler's own work per gradient evaluation besides the potential (the leapfrog
#: update, tree bookkeeping or velocity updates: about 40-60 small operations)
EAGER_OVERHEAD_SECONDS = {"NUTS": 2.5e-4, "MCLMC": 1.5e-4}
#: the compiled torch path against the eager one, per evaluation (conservative: 20-40x measured
#: on the 1-50-1 network at 4 chains)
COMPILED_SPEEDUP = 10.0
#: multiply-adds per chain and evaluation (points x sum of in x out over the layers) from which
#: MCLMC with at least LOCKSTEP_CHAINS chains runs faster in Inductor's batched matrix products
#: than in the native per-chain loops: MILE's protocol on concrete (300k) took 176 s native on
#: two threads against 96 s compiled on one; yacht (83k) is faster native (docs/logs/benchmarks.md).
#: NUTS stays native: its chains build trees of different lengths, which lockstep would pay for.
LARGE_MACS, LOCKSTEP_CHAINS = 150_000, 8


@dataclass
class ExecutionPath:
    """The chosen path: ``kind`` (``"native"``, ``"torch.compile"`` or ``"eager"``), the
    reason in words, and the :class:`~pyrobnn.infer.mcmc.native.NativeMLP` for the native path."""

    kind: str
    reason: str
    native: Optional[object] = None

    def stats(self) -> dict:
        return {"path": self.kind, "path_reason": self.reason}


def _eager_seconds_per_evaluation(potential, z0, sampler) -> float:
    with torch.no_grad():
        potential.value_and_grad(z0)
        start = time.perf_counter()
        potential.value_and_grad(z0)
    return time.perf_counter() - start + EAGER_OVERHEAD_SECONDS[sampler]


def check_compile(compile) -> None:
    if compile not in ("auto", True, False) or isinstance(compile, (int, float)) and not isinstance(compile, bool):
        raise ValueError(f"compile must be 'auto', True or False, got {compile!r}")


def choose_path(potential, z0, compile, sampler: str, evaluations: int, bound: bool = False) -> ExecutionPath:
    """The path for a run of ``sampler`` (``"NUTS"`` or ``"MCLMC"``) of ``potential`` (a
    :class:`~pyrobnn.infer.potential.FlatPotential` with its data) from ``z0``, making
    ``evaluations`` gradient evaluations per chain (``bound``: at most that many).

    :param compile: ``"auto"``, ``True`` or ``False`` (module docstring).
    """
    check_compile(compile)
    if compile is False:
        return ExecutionPath("eager", "compile=False: the eager torch path")
    reason = native_kernels.unsupported_reason(potential.model, potential.x)
    info = native_kernels.build_info() if reason is None else None
    if reason is None and info["compiler"] is None:
        reason = "no C++ compiler was found"
    many = f"{'at most ' if bound else ''}{evaluations:,} gradient evaluations per chain"
    eager = None
    if compile == "auto" and not (reason is None and info["cached"] and z0.shape[0] < LOCKSTEP_CHAINS):
        # timed only where it decides something (a cached native library needs no estimate)
        eager = _eager_seconds_per_evaluation(potential, z0, sampler) * evaluations
    if reason is None and sampler == "MCLMC" and z0.shape[0] >= LOCKSTEP_CHAINS:
        macs = native_kernels.multiply_adds(potential.model, potential.x)
        if macs >= LARGE_MACS and (compile is True or eager > COMPILE_SECONDS[sampler] + eager / COMPILED_SPEEDUP):
            return ExecutionPath(
                "torch.compile",
                f"MCLMC moves {z0.shape[0]} chains in lockstep on a network of {macs:,} multiply-adds per chain and "
                f"evaluation: Inductor's batched matrix products beat the native per-chain loops there"
                + (f"; {many}: about {eager:.0f} s eagerly" if eager is not None else ""),
            )
    if reason is None:
        if compile is True or info["cached"] or eager > info["build_seconds"]:
            try:
                kernel = native_kernels.NativeMLP(potential)
            except native_kernels.NativeUnavailable as e:
                reason = str(e)
            else:
                record = kernel.record
                if record["event"] == "built":
                    why = f"built the native kernels in {record['build_seconds']:.1f} s (once per machine, kept in {native_kernels.library_folder()})"
                    if "rebuilt_because" in record:
                        why += f"; the cached library was refused: {record['rebuilt_because']}"
                    if eager is not None:
                        why += f"; {many} would take about {eager:.1f} s eagerly"
                else:
                    why = "the native kernels, from this machine's cache"
                return ExecutionPath("native", why, kernel)
        else:
            return ExecutionPath(
                "eager", f"{many}: about {eager:.1f} s eagerly, less than building the native kernels (about {info['build_seconds']:.0f} s, once per machine)"
            )
    if compile is True:
        return ExecutionPath("torch.compile", f"compile=True; the native kernels do not apply: {reason}")
    startup = COMPILE_SECONDS[sampler]
    if eager is None:  # the cached library was refused or failed to load
        eager = _eager_seconds_per_evaluation(potential, z0, sampler) * evaluations
    if eager > startup + eager / COMPILED_SPEEDUP:
        return ExecutionPath("torch.compile", f"the native kernels do not apply ({reason}); {many}: about {eager:.0f} s eagerly, more than compiling (about {startup:.0f} s)")
    return ExecutionPath("eager", f"the native kernels do not apply ({reason}); {many}: about {eager:.1f} s eagerly, less than compiling (about {startup:.0f} s)")
