"""Where each surrogate's acquisition sends its candidates: to the cube's boundary or inside it.

    python benchmarks/bo_boundary.py            # the 8 development and held-out problems, 3 designs each; about 20 min
    python benchmarks/bo_boundary.py --quick    # Hartmann-6, 1 design, GP, infinite-width GP and Laplace, small budgets

One step of ``bayesopt.py``'s loop, taken apart: from ``--n`` scrambled Sobol points of a problem
(seed = the design), each surrogate is fitted as the regret benchmark fits it (BoTorch's
``SingleTaskGP``; pyrobnn's ``infinite_width_gp``; ``fit_surrogate`` with ``bayesopt.py``'s
options for its budget) and qLogNEI's batch of ``q`` candidates is optimized with its
``optimize_acqf`` settings. Per design and surrogate it prints the fraction of the candidates'
coordinates within ``1e-3`` of a bound (0 for points inside the cube, 1 for corners), each
candidate's largest distance from the centre in any coordinate (``L_inf``; 0.5 on a face), the
objective at the candidates and whether any beats the best observation. Most of these objectives
are worst at the corners, so a surrogate whose candidates sit there spends its evaluations where
random search's rarely go. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bayesopt  # noqa: E402
from bo_problems import DEVELOPMENT, HELD_OUT, problem, single_objective  # noqa: E402

#: a coordinate this close to 0 or 1 lies on the boundary
ON_BOUND = 1e-3
FULL = dict(problems=DEVELOPMENT + HELD_OUT, designs=3, n=26,
            methods=["gp", "infinite_width", "nuts", "mclmc", "deep_ensemble", "laplace", "ivon", "swag"])
QUICK = dict(problems=["hartmann6"], designs=1, n=12, methods=["gp", "infinite_width", "laplace"])


def step(name, method, design, n, budget):
    """One acquisition from ``n`` Sobol points of ``name`` (design ``design``): the candidates'
    place and value against the best observation."""
    from torch.quasirandom import SobolEngine

    settings = bayesopt.QUICK if budget == "quick" else bayesopt.FULL
    p = problem(name)
    X = SobolEngine(p.d, scramble=True, seed=design).draw(n).to(torch.float64)
    Y = p.f(X)
    model = bayesopt.fit_model(method, X, Y, design, settings, budget)
    torch.manual_seed(design)
    candidates = bayesopt.next_batch(model, X, settings)
    values = p.f(candidates).squeeze(-1)
    on_bound = ((candidates < ON_BOUND) | (candidates > 1 - ON_BOUND)).to(torch.float64)
    return dict(problem=name, method=method, design=design, n=n, on_bound=float(on_bound.mean()),
                l_inf=[round(float(v), 4) for v in (candidates - 0.5).abs().amax(-1)],
                values=[float(v) for v in values], best_observed=float(Y.max()), improves=bool(values.max() > Y.max()))


def summarize(records):
    """Per problem and surrogate: the mean fraction of coordinates on the boundary and the number
    of designs whose batch improved on the best observation."""
    out = {}
    for r in records:
        out.setdefault(r["problem"], {}).setdefault(r["method"], []).append(r)
    return {p: {m: dict(on_bound=round(statistics.fmean(r["on_bound"] for r in rs), 3), improved=sum(r["improves"] for r in rs), designs=len(rs))
                for m, rs in by.items()} for p, by in out.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one problem, one design, three surrogates, bayesopt.py's quick budgets")
    parser.add_argument("--problems", nargs="+", default=None, help="default: " + " ".join(FULL["problems"]))
    parser.add_argument("--methods", nargs="+", default=None, help="default: " + " ".join(FULL["methods"]))
    parser.add_argument("--designs", type=int, default=None, help="Sobol designs (seeds 0, 1, ...); default 3")
    parser.add_argument("--n", type=int, default=None, help="points in each design; default 26 (bayesopt.py's fifth step)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    problems, methods = args.problems or base["problems"], args.methods or base["methods"]
    designs, n = args.designs if args.designs is not None else base["designs"], args.n if args.n is not None else base["n"]
    if designs < 1:
        parser.error(f"--designs must be at least 1, got {designs}")
    if n < 2:
        parser.error(f"--n must be at least 2, got {n}")
    known = single_objective()
    if any(p not in known for p in problems):
        parser.error(f"--problems: {[p for p in problems if p not in known]} are not single-objective problems of bo_problems.py; "
                     f"choose from {' '.join(known)}")
    unknown = sorted(set(methods) - set(bayesopt.METHODS) - {"gp", "infinite_width"}) + sorted({"random", "laplace_bayesopt"} & set(methods))
    if unknown:
        parser.error(f"--methods: {unknown} not surrogates here; choose from gp infinite_width {' '.join(bayesopt.OPTIONS['full'])}")
    budget = "quick" if args.quick else "full"
    warnings.filterwarnings("ignore", category=UserWarning)
    records = []
    for name in problems:
        for design in range(designs):
            for method in methods:
                r = step(name, method, design, n, budget)
                records.append(r)
                print(f"{name:17s} design {design} {method:14s} on the boundary {r['on_bound']:.2f}  L_inf {r['l_inf']}  "
                      f"f {[round(v, 2) for v in r['values']]}  best observed {r['best_observed']:.2f}", flush=True)
    print(json.dumps(dict(settings=dict(problems=problems, methods=methods, designs=designs, n=n, budget=budget),
                          records=records, summary=summarize(records))))


if __name__ == "__main__":
    main()
