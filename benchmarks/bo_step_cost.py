"""A BO step's cost for every surrogate against the GP's, timed side by side in one process.

    python benchmarks/bo_step_cost.py            # the 8 development and held-out problems, 1 design; about 20 min
    python benchmarks/bo_step_cost.py --quick    # Branin, 3 steps, the infinite-width GP and Laplace at bayesopt.py's quick budgets

``bayesopt.py`` reports each surrogate's seconds per step from its own runs, and its runs of
different surrogates and seeds ran on different days beside different loads, so its ratios to
the GP's step compare numbers a shared machine timed under different conditions. This times the
steps of ``bayesopt.py``'s loop with every surrogate on the same data in one process, taking
turns within each step (the order rotates by step), so that a change of load reaches all of them
alike: ``n_init`` scrambled Sobol points, then ``steps`` steps that each fit (BoTorch's GP from
scratch; the infinite-width GP from its previous fit; the pyrobnn surrogates cold at the first
step and by a warm ``refit`` after, with ``bayesopt.py``'s options for the budget) and optimize
qLogNEI's batch of ``q`` with ``bayesopt.py``'s settings, and then add the next ``q`` points of a
second Sobol sequence (the same points for every surrogate: what a step costs depends on how
many points there are, not on which). Per problem and surrogate it prints the median fit and
acquisition seconds over the steps (``bayesopt.py``'s statistic), the step's ratio to the GP's,
the median number of the acquisition's evaluations and the steps at which L-BFGS-B failed and
``optimize_acqf`` started again from new initial conditions (which about doubles a step's
acquisition); the last line is one JSON object. Torch and the BLAS and OpenMP libraries run on ``--threads``
threads (1, as ``bayesopt.py``'s runs).
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

import bayesopt  # noqa: E402
from bo_problems import DEVELOPMENT, HELD_OUT, problem, single_objective  # noqa: E402

SURROGATES = ["infinite_width", "nuts", "mclmc", "deep_ensemble", "laplace", "ivon", "swag"]
#: timed on request: Laplace's joint form (its surrogate before 2026-12-07), beside its bounded default
ALSO = ["laplace:joint"]
#: issue 45's bound: a BNN step at most this many times a GP step at n <= 50
BOUND = 3.0


def run(name, methods, design, budget, steps, activations=None):
    """Every surrogate's fit and acquisition seconds at each step of one design of ``name``
    (``activations``: those the calibrations choose among, as ``bayesopt.py --activations``)."""
    from torch.quasirandom import SobolEngine

    settings = dict(bayesopt.QUICK if budget == "quick" else bayesopt.FULL)
    if activations is not None:
        settings["activations"] = activations
    p = problem(name)
    X = SobolEngine(p.d, scramble=True, seed=design).draw(settings["n_init"]).to(torch.float64)
    more = SobolEngine(p.d, scramble=True, seed=10_000 + design)
    Y = p.f(X)
    order = ["gp"] + methods
    models = dict.fromkeys(order)  # each surrogate's fit at the step before (None: none yet)
    times = {m: {"fit": [], "acquisition": [], "n": [], "evaluations": [], "retried": []} for m in order}
    for k in range(steps):
        for m in order[k % len(order):] + order[: k % len(order)]:
            t0 = time.perf_counter()
            models[m] = bayesopt.fit_model(m, X, Y, design, settings, budget, previous=models[m])
            t1 = time.perf_counter()
            torch.manual_seed(design)
            stats = {}
            bayesopt.next_batch(models[m], X, settings, stats=stats)
            times[m]["fit"].append(t1 - t0)
            times[m]["acquisition"].append(time.perf_counter() - t1)
            times[m]["n"].append(X.shape[0])
            times[m]["evaluations"].append(stats["evaluations"])
            times[m]["retried"].append(stats["retried"])
        new = more.draw(settings["q"]).to(torch.float64)
        X, Y = torch.cat([X, new]), torch.cat([Y, p.f(new)])
    return times


def summarize(times):
    """Per surrogate: median fit and acquisition seconds over the steps, the step's ratio to the
    GP's (medians' sums, as ``bayesopt.py`` forms it), the median number of acquisition
    evaluations and the steps whose L-BFGS-B failed and ``optimize_acqf`` started again."""
    gp = statistics.median(times["gp"]["fit"]) + statistics.median(times["gp"]["acquisition"])
    out = {}
    for m, t in times.items():
        fit, acq = statistics.median(t["fit"]), statistics.median(t["acquisition"])
        out[m] = dict(fit=round(fit, 4), acquisition=round(acq, 4), ratio_to_gp=round((fit + acq) / gp, 3),
                      evaluations=statistics.median(t["evaluations"]), retried_steps=sum(t["retried"]))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Branin, 3 steps, the infinite-width GP and Laplace, quick budgets")
    parser.add_argument("--problems", nargs="+", default=None, help="default: the development and held-out problems")
    parser.add_argument("--methods", nargs="+", default=None, help="default: " + " ".join(SURROGATES) + " (the GP always runs)")
    parser.add_argument("--designs", type=int, default=1, help="Sobol designs (seeds 0, 1, ...) per problem")
    parser.add_argument("--threads", type=int, default=1, help="torch's and the BLAS/OpenMP libraries' threads")
    parser.add_argument("--activations", nargs="+", default=None, choices=bayesopt.ACTIVATIONS,
                        help="the activations the calibrations choose among (default: each method's), as bayesopt.py's")
    args = parser.parse_args(argv)
    if args.designs < 1:
        parser.error(f"--designs must be at least 1, got {args.designs}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    problems = args.problems or (["branin"] if args.quick else DEVELOPMENT + HELD_OUT)
    methods = args.methods or (["infinite_width", "laplace"] if args.quick else SURROGATES)
    unknown = sorted(set(methods) - set(SURROGATES + ALSO))
    if unknown:
        parser.error(f"--methods: {unknown} are not surrogates timed here; choose from {' '.join(SURROGATES + ALSO)}")
    known = single_objective()
    if any(p not in known for p in problems):
        parser.error(f"--problems: {[p for p in problems if p not in known]} are not single-objective problems of bo_problems.py; "
                     f"choose from {' '.join(known)}")
    budget = "quick" if args.quick else "full"
    steps = 3 if args.quick else bayesopt.FULL["steps"]
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    results, records = {}, []
    with threadpool_limits(args.threads):
        for name in problems:
            for design in range(args.designs):
                times = run(name, methods, design, budget, steps, args.activations and list(dict.fromkeys(args.activations)))
                records.append(dict(problem=name, design=design, times=times))
                summary = summarize(times)
                results.setdefault(name, []).append(summary)
                print(f"\n{name}, design {design}: median seconds per step (fit + acquisition), ratio to the GP's step, "
                      f"median acquisition evaluations, steps whose optimizer started again")
                for m, s in summary.items():
                    print(f"  {m:15s} {s['fit']:7.2f} + {s['acquisition']:6.2f} s   {s['ratio_to_gp']:5.2f}x   "
                          f"{s['evaluations']:5.0f} evaluations   {s['retried_steps']}/{steps} retried", flush=True)
    worst = {}
    for m in methods:
        ratios = {p: statistics.median(s[m]["ratio_to_gp"] for s in rows) for p, rows in results.items()}
        p = max(ratios, key=ratios.get)
        worst[m] = dict(problem=p, ratio=ratios[p], within_bound=ratios[p] <= BOUND)
        print(f"  [{'yes' if ratios[p] <= BOUND else ' no'}] {m}: a step at most {BOUND:g}x the GP's (at worst {ratios[p]:.2f}x, {p})")
    print(json.dumps(dict(settings=dict(problems=problems, methods=methods, designs=args.designs, budget=budget, steps=steps, threads=args.threads,
                                        activations=args.activations),
                          records=records, summary=results, worst=worst)))


if __name__ == "__main__":
    main()
