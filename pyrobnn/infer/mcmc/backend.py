"""Which code runs a full-batch sampler: the backend, chosen by a rule on the model and the run.

Three backends compute the same transitions on the same random numbers:

- ``"native"``: the hand-written kernels of :mod:`pyrobnn.infer.core.native`, for the common
  Bayesian MLP; built once per machine (about 2 s) and loaded from the user's cache afterwards;
- ``"compile"``: the torch code compiled by Inductor (``torch.compile``), for any network; it
  pays 10-16 s of compilation in every run and every process;
- ``"eager"``: the same torch code run op by op; no start-up cost, and the reference.

``backend="auto"`` (the default) applies a rule to what the model is and what the run asks for,
never to timings or to what a cache holds, so that one call with one seed takes one backend on
every machine that has a C++ compiler, and gives bit-identical draws each time:

1. the native kernels where they apply (:func:`~pyrobnn.infer.core.native.unsupported_reason`
   is ``None`` and a C++ compiler is found), except MCLMC with at least :data:`LOCKSTEP_CHAINS`
   chains on a network of at least :data:`LARGE_MACS` multiply-adds per evaluation, which
   Inductor's batched products run faster;
2. else ``torch.compile`` when the run asks for at least :data:`COMPILE_FROM_EVALUATIONS`
   gradient evaluations per chain (for NUTS, the most its trees can take);
3. else eager torch code (a run too short for a compilation to pay).

Rule 2 also asks the installed torch: NUTS's compiled doubling is a ``torch.while_loop`` whose
body takes the potential's gradient, which torch captures from :data:`COMPILED_NUTS_TORCH` on
(torch 2.11 refuses it with ``UncapturedHigherOrderOpError``; 2.14, which CI runs, compiles it);
below that ``auto`` takes eager code, saying why, and ``backend="compile"`` is refused before sampling.

``backend="native" | "compile" | "eager"`` names one; ``"native"`` is refused, with the reason,
for a model the kernels do not take. Two backends agree to rounding on each evaluation (float64:
to about 1e-13), not bit for bit, and a chain amplifies rounding over many steps. The choice and
its reason go into the result's ``stats["path"]`` and ``stats["path_reason"]`` (``summary()``
shows them). A ``torch.compile`` that fails falls back to eager code with a warning that says so.
"""

from __future__ import annotations

import torch

from pyrobnn.infer.core.execution import ExecutionPath
from pyrobnn.infer.core import native as native_kernels

__all__ = ["choose_path", "BACKENDS", "COMPILE_FROM_EVALUATIONS", "LARGE_MACS", "LOCKSTEP_CHAINS", "COMPILED_NUTS_TORCH", "compile_refusal", "torch_version"]

#: the values ``backend=`` takes (the module docstring says what each runs)
BACKENDS = ("auto", "native", "compile", "eager")
#: gradient evaluations per chain from which a model outside the native kernels is compiled:
#: ``torch.compile`` costs 10-16 s once, and saves 20-40x per evaluation of a small network
#: (docs/logs/benchmarks.md), which pays from about this many evaluations of the 1-50-1 network
COMPILE_FROM_EVALUATIONS = 20_000
#: multiply-adds per chain and evaluation (points x sum of in x out over the layers) from which
#: MCLMC with at least LOCKSTEP_CHAINS chains runs faster in Inductor's batched matrix products
#: than in the native per-chain loops: MILE's protocol on concrete (300k) took 176 s native on
#: two threads against 96 s compiled on one; yacht (83k) is faster native (docs/logs/benchmarks.md).
#: NUTS stays native: its chains build trees of different lengths, which lockstep would pay for.
LARGE_MACS, LOCKSTEP_CHAINS = 150_000, 8


#: the first torch (major, minor) known to compile NUTS's doubling (a while loop over gradients)
COMPILED_NUTS_TORCH = (2, 14)


def torch_version(version: str = None) -> tuple:
    """``(major, minor)`` of the installed torch (or of ``version``, e.g. ``"2.11.0+cu130"``)."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def compile_refusal(sampler: str, version: str = None):
    """Why ``sampler`` cannot be compiled with the installed torch (``None``: it can)."""
    if sampler == "NUTS" and torch_version(version) < COMPILED_NUTS_TORCH:
        need = ".".join(map(str, COMPILED_NUTS_TORCH))
        return (f"torch {(version or torch.__version__).split('+')[0]} cannot compile NUTS's doubling (a while loop over gradients; "
                f"torch >= {need} can)")
    return None


def _native(potential, why) -> ExecutionPath:
    kernel = native_kernels.NativeMLP(potential)
    return ExecutionPath("native", f"{why}; {native_kernels.loading_note(kernel.record)}", kernel)


def choose_path(potential, z0, backend: str, sampler: str, evaluations: int, bound: bool = False) -> ExecutionPath:
    """The backend for a run of ``sampler`` (``"NUTS"`` or ``"MCLMC"``) of ``potential`` (a
    :class:`~pyrobnn.infer.core.potential.FlatPotential` holding its data) from ``z0``, making
    ``evaluations`` gradient evaluations per chain (``bound``: at most that many), by the rule of
    the module docstring. ``backend`` is one of :data:`BACKENDS` (the samplers' constraints
    check it at the call)."""
    if backend == "eager":
        return ExecutionPath("eager", "backend='eager'")
    refusal = compile_refusal(sampler)
    if backend == "compile":
        if refusal is not None:
            raise ValueError(f"backend='compile' does not apply to this run: {refusal}; use backend='eager' or 'auto'")
        return ExecutionPath("torch.compile", "backend='compile'")
    reason = native_kernels.native_refusal(potential.model, potential.x)
    if backend == "native":
        if reason is not None:
            raise ValueError(f"backend='native' does not apply to this run: {reason}; use backend='compile' or 'auto'")
        return _native(potential, "backend='native'")
    many = f"{'at most ' if bound else ''}{evaluations:,} gradient evaluations per chain"
    if reason is None:
        macs = native_kernels.multiply_adds(potential.model, potential.x)
        if sampler == "MCLMC" and z0.shape[0] >= LOCKSTEP_CHAINS and macs >= LARGE_MACS:
            return ExecutionPath(
                "torch.compile",
                f"MCLMC moves {z0.shape[0]} chains (>= {LOCKSTEP_CHAINS}) in lockstep on a network of {macs:,} multiply-adds per chain "
                f"and evaluation (>= {LARGE_MACS:,}): Inductor's batched matrix products beat the native per-chain loops there",
            )
        try:
            return _native(potential, "the native kernels apply to this network, prior and likelihood")
        except native_kernels.NativeUnavailable as e:
            reason = str(e)
    if evaluations >= COMPILE_FROM_EVALUATIONS:
        if refusal is not None:
            return ExecutionPath("eager", f"the native kernels do not apply ({reason}); {many} would pay for torch.compile, but {refusal}")
        return ExecutionPath("torch.compile", f"the native kernels do not apply ({reason}); {many} (>= {COMPILE_FROM_EVALUATIONS:,}): torch.compile")
    return ExecutionPath(
        "eager", f"the native kernels do not apply ({reason}); {many} (< {COMPILE_FROM_EVALUATIONS:,}): too few for compiling to pay"
    )
