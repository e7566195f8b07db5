"""What OpenBLAS's threads cost the infinite-width GP's batched fit, the evidence for running
:mod:`pyrobnn.integrations.infinite_width_gp`'s fits with the BLAS libraries on one thread.

    python benchmarks/bo_blas_threads.py            # Branin at 22 points, Hartmann-6 at 30, 5 repeats
    python benchmarks/bo_blas_threads.py --quick    # 2 repeats

Every surrogate default fits an :class:`~pyrobnn.integrations.infinite_width_gp.InfiniteWidthKernel`
GP from :data:`~pyrobnn.integrations.infinite_width_gp.FIT_STARTS` at once: a GP batched over the
starts, which BoTorch's ``fit_gpytorch_mll`` fits by its batched L-BFGS-B, one scipy ``setulb``
call per start and iteration, under the kernel's bounded scales. Since scipy 1.15 ``setulb`` calls
LAPACK, and OpenBLAS on several threads makes each call of a problem this small slow (scipy issue
#22438; BoTorch limits the threads around its unbatched fits and candidate generation, not around
this fit). Per problem this times that fit (``n`` scrambled Sobol points, standardized outcomes,
erf kernel, one input scale) with the BLAS libraries at their own thread count and under
``threadpool_limits(1, "blas")``, in turn, the same GP from the same starts; prints the medians,
their ratio and whether the two fits' hyperparameters are bit-identical. The torch threads are
the process's default unless ``--torch-threads`` sets them. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bo_problems import problem  # noqa: E402

CASES = (("branin", 22), ("hartmann6", 30))


def batched_gp(X, Y):
    """The erf half of the library's batched GP before its fit (which batches the ReLU kernel
    beside it): one batch element per start of FIT_STARTS, one input scale. With BoTorch's own
    likelihood and loss: since 2026-12-01 the library's fit optimizes the noise variance on a
    softplus coordinate and evaluates the loss on plain tensors (fewer evaluations, each cheaper:
    docs/bayesopt.md, "The calibration's noise on a log scale"); what a BLAS thread costs each
    ``setulb`` call, which this measures, is the same."""
    from botorch.models import SingleTaskGP

    from pyrobnn.integrations.infinite_width_gp import FIT_START_NOISE, FIT_STARTS, SCALE_NAMES, InfiniteWidthKernel

    k, (n, d) = len(FIT_STARTS), X.shape
    low, high = X.min(0).values, X.max(0).values
    kernel = InfiniteWidthKernel(d, center=(low + high) / 2, base_scale=2 / (high - low), batch_shape=torch.Size([k]))
    with torch.no_grad():
        for i, name in enumerate(SCALE_NAMES):
            raw = getattr(kernel, f"raw_{name}")
            starts = torch.tensor([start[i] for start in FIT_STARTS], dtype=X.dtype).reshape(k, 1, 1).expand_as(raw)
            raw.copy_(getattr(kernel, f"raw_{name}_constraint").inverse_transform(starts))
    gp = SingleTaskGP(X.expand(k, n, d), Y.expand(k, n, 1), covar_module=kernel, outcome_transform=None)
    gp.likelihood.noise = torch.full_like(gp.likelihood.noise, FIT_START_NOISE)
    return gp


def timed_fit(X, Y, limit: bool):
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood
    from threadpoolctl import threadpool_limits

    gp = batched_gp(X, Y)
    start = time.perf_counter()
    if limit:
        with threadpool_limits(limits=1, user_api="blas"):
            fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    else:
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    return time.perf_counter() - start, [p.detach().clone() for p in gp.parameters()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    parser.add_argument("--torch-threads", type=int, default=None, help="torch's threads (default: the process's own, as a user's)")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    if repeats < 1:
        parser.error(f"--repeats must be at least 1, got {repeats}")
    if args.torch_threads is not None:
        if args.torch_threads < 1:
            parser.error(f"--torch-threads must be at least 1, got {args.torch_threads}")
        torch.set_num_threads(args.torch_threads)
    from threadpoolctl import threadpool_info
    from torch.quasirandom import SobolEngine

    warnings.filterwarnings("ignore")
    blas = sorted({(info["internal_api"], info["num_threads"]) for info in threadpool_info() if info["user_api"] == "blas"})
    print(f"BLAS libraries (api, threads): {blas}; torch threads: {torch.get_num_threads()}; {repeats} repeats, in turn")
    results = {}
    for name, n in CASES:
        task = problem(name)
        X = SobolEngine(task.d, scramble=True, seed=0).draw(n).to(torch.float64)
        Y = task.f(X)
        Y = (Y - Y.mean()) / Y.std()
        times = {False: [], True: []}
        fits = {}
        for _ in range(repeats):
            for limit in (False, True):
                seconds, fits[limit] = timed_fit(X, Y, limit)
                times[limit].append(seconds)
        own, one = statistics.median(times[False]), statistics.median(times[True])
        identical = all(torch.equal(a, b) for a, b in zip(fits[False], fits[True]))
        results[name] = {"n": n, "blas_own_threads_s": round(own, 3), "blas_one_thread_s": round(one, 3), "ratio": round(own / one, 2),
                         "identical_fits": identical}
        print(f"{name:10s} n={n}: the batched fit {own:.2f} s with BLAS on its own threads, {one:.2f} s on one "
              f"({own / one:.1f}x); fits bit-identical: {identical}")
    print(json.dumps({"blas": blas, "torch_threads": torch.get_num_threads(), "repeats": repeats, "cases": results}))


if __name__ == "__main__":
    main()
