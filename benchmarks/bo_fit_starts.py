"""Where the infinite-width GP's marginal-likelihood fit starts, and what that costs the fit: the
evidence for :data:`pyrobnn.integrations.infinite_width_gp.FIT_STARTS`.

    python benchmarks/bo_fit_starts.py            # the development problems, n = 10, 20, 40, 3 designs (minutes)
    python benchmarks/bo_fit_starts.py --problems rosenbrock5 levy4 griewank8 styblinskitang10   # held out
    python benchmarks/bo_fit_starts.py --activation relu   # the ReLU kernel's fit (the default: erf's)

Per problem, n and design (``n`` scrambled Sobol points, the design BO starts from): the
maximized objective of BoTorch's ``fit_gpytorch_mll`` (the log marginal likelihood plus the
hyperpriors' log density, per point, standardized outcomes) from the first start alone, from
``FIT_STARTS`` (the library's fit) and from a grid of 33 starts (the first and every combination of
input scale 0.5, 1, 2, 4, bias scale 0.1, 1, hidden scale 1, 2 and output scale 1, 2), with the
fitted noise variance: above 0.3 the fit explains the data as noise. A case counts as short when
its objective is more than 0.003 nats per point below the grid's. The last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bo_problems import DEVELOPMENT, HELD_OUT, REGIMES, problem  # noqa: E402

GRID = [(1.0, 1.0, 1.5, 1.5)] + list(itertools.product((0.5, 1.0, 2.0, 4.0), (0.1, 1.0), (1.0, 2.0), (1.0, 2.0)))
#: an objective this far below the grid's (nats per point) is short of it
SHORT = 3e-3
#: a fitted noise variance above this (standardized units) explains the data as noise
NOISE_MODE = 0.3


def objective(gp) -> float:
    """The fitted objective per point: what ``fit_gpytorch_mll`` maximized."""
    from gpytorch.mlls import ExactMarginalLogLikelihood

    gp.train()
    with torch.no_grad():
        value = float(ExactMarginalLogLikelihood(gp.likelihood, gp)(gp(*gp.train_inputs), gp.train_targets))
    gp.eval()
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", default=DEVELOPMENT, choices=DEVELOPMENT + HELD_OUT + REGIMES[:2])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10, 20, 40])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--activation", default="erf", choices=["erf", "relu"],
                        help="the kernel whose fit is measured (infinite_width_gp fits each from the same starts)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or min(args.sizes) < 2:
        parser.error(f"--seeds must be at least 1 and every --sizes at least 2, got {args.seeds} and {args.sizes}")
    warnings.filterwarnings("ignore")  # BoTorch's input-scaling and optimization warnings at these sizes
    from torch.quasirandom import SobolEngine

    from pyrobnn.integrations.infinite_width_gp import FIT_STARTS, infinite_width_gp

    rows = []
    for name in args.problems:
        prob = problem(name)
        for n in args.sizes:
            for seed in range(args.seeds):
                X = SobolEngine(prob.d, scramble=True, seed=seed).draw(n).to(torch.float64)
                Y = prob.f(X)
                row = dict(problem=name, n=n, seed=seed)
                for arm, starts in (("first", FIT_STARTS[:1]), ("fit_starts", FIT_STARTS), ("grid", GRID)):
                    t0 = time.perf_counter()
                    gp = infinite_width_gp(X, Y, activation=args.activation, starts=starts)
                    row[arm] = dict(objective=objective(gp), noise=float(gp.likelihood.noise.detach().max()),
                                    seconds=time.perf_counter() - t0)
                rows.append(row)
                print(f"{name:>16} n={n:<3} seed={seed}  " + "  ".join(
                    f"{arm} {row[arm]['objective']:+.3f} (noise {row[arm]['noise']:.3g}, {row[arm]['seconds']:.2f} s)"
                    for arm in ("first", "fit_starts", "grid")), flush=True)
    summary = {}
    for arm in ("first", "fit_starts"):
        summary[arm] = dict(
            short=sum(r[arm]["objective"] < r["grid"]["objective"] - SHORT for r in rows),
            noise_mode_while_signal_more_probable=sum(
                r[arm]["noise"] > NOISE_MODE and r["grid"]["noise"] <= NOISE_MODE and r[arm]["objective"] < r["grid"]["objective"] - SHORT
                for r in rows),
            median_seconds=sorted(r[arm]["seconds"] for r in rows)[len(rows) // 2],
        )
    print(f"\n{len(rows)} cases; short of the grid's fit: first start alone {summary['first']['short']}, "
          f"FIT_STARTS {summary['fit_starts']['short']}; in the noise mode though the signal was more probable: "
          f"{summary['first']['noise_mode_while_signal_more_probable']} and {summary['fit_starts']['noise_mode_while_signal_more_probable']}; "
          f"median seconds per fit {summary['first']['median_seconds']:.2f} and {summary['fit_starts']['median_seconds']:.2f}")
    print(json.dumps(dict(settings=vars(args), summary=summary, rows=rows)))


if __name__ == "__main__":
    main()
