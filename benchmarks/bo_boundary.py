"""Where each surrogate's acquisition sends its candidates: to the cube's boundary or inside it.

    python benchmarks/bo_boundary.py            # the 8 development and held-out problems, 3 designs each; about 20 min
    python benchmarks/bo_boundary.py --quick    # Hartmann-6, 1 design, GP, infinite-width GP and Laplace, small budgets
    python benchmarks/bo_boundary.py --problems griewank8_shifted --along infinite_width --designs 4   # at that run's steps 3, 5, 7

One step of ``bayesopt.py``'s loop, taken apart: from ``--n`` scrambled Sobol points of a problem
(seed = the design), each surrogate is fitted as the regret benchmark fits it (BoTorch's
``SingleTaskGP``; pyrobnn's ``infinite_width_gp``; ``fit_surrogate`` with ``bayesopt.py``'s
options for its budget) and qLogNEI's batch of ``q`` candidates is optimized with its
``optimize_acqf`` settings. Per design and surrogate it prints the fraction of the candidates'
coordinates within ``1e-3`` of a bound (0 for points inside the cube, 1 for corners), each
candidate's largest distance from the centre in any coordinate (``L_inf``; 0.5 on a face), the
objective at the candidates and whether any beats the best observation. Most of these objectives
are worst at the corners, so a surrogate whose candidates sit there spends its evaluations where
random search's rarely go.

Why the candidates go where they go, read at the cube's corners (all ``2^d`` where there are at
most :data:`CORNERS`, else that many drawn under the design's seed), in units of the design's
outcomes (its mean and standard deviation): the spread of the surrogate's posterior mean across
the corners (a GP's mean reverts to its constant far from the data; a single trained network's
carries whatever it extrapolates) and the largest upper bound, mean plus two posterior standard
deviations, against the best observation. The surrogates are ``--methods`` of ``gp``,
``infinite_width``, ``bayesopt.py``'s pyrobnn methods and the Laplace surrogate's other forms
(``bayesopt.LAPLACE_FORMS``: ``laplace:last_layer``, ``laplace:untuned``, ``laplace:network``,
``laplace:joint``).

With ``--along METHOD`` the data are not Sobol points but what ``METHOD``'s own run of
``bayesopt.py``'s loop (seed = the design) had at the steps ``--at-steps``: points a BO run has
gathered near its best ones, where the batch's gain and the nearest candidate's distance from
the best observed point (``from_best``) say whether a surrogate refines there or leaves.
The last line is one JSON object.
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
#: the most corners at which the surrogate's posterior is read
CORNERS = 64
FULL = dict(problems=DEVELOPMENT + HELD_OUT, designs=3, n=26,
            methods=["gp", "infinite_width", "nuts", "mclmc", "deep_ensemble", "laplace", "ivon", "swag"])
QUICK = dict(problems=["hartmann6"], designs=1, n=12, methods=["gp", "infinite_width", "laplace"])


def settings_for(budget, activations=None):
    """``bayesopt.py``'s settings for ``budget``, with ``activations`` as its ``--activations``."""
    settings = dict(bayesopt.QUICK if budget == "quick" else bayesopt.FULL)
    if activations is not None:
        settings["activations"] = activations
    return settings


def sobol_design(name, design, n):
    """``n`` scrambled Sobol points of ``name`` (seed ``design``) and the objective there."""
    from torch.quasirandom import SobolEngine

    p = problem(name)
    X = SobolEngine(p.d, scramble=True, seed=design).draw(n).to(torch.float64)
    return X, p.f(X)


def run_states(name, method, design, steps, budget, activations=None):
    """The data ``method``'s own BO run of ``name`` (``bayesopt.py``'s loop, seed ``design``) had
    at each of ``steps`` (step ``k`` holds ``n_init + k q`` points): ``{k: (X, Y)}``."""
    states = {}
    settings = dict(settings_for(budget, activations), steps=max(steps) + 1)  # the later steps do not change these
    bayesopt.run_one(name, method, design, settings, budget,
                     on_step=lambda k, X, Y: states.update({k: (X.clone(), Y.clone())}) if k in steps else None)
    return states


def step(name, method, design, X, Y, budget, activations=None):
    """One acquisition from the data ``(X, Y)`` of ``name`` (design ``design`` seeds the fit and
    the acquisition): the candidates' place and value against the best observation, and their
    distance from it; ``activations`` as ``bayesopt.py``'s."""
    settings = settings_for(budget, activations)
    p = problem(name)
    model = bayesopt.fit_model(method, X, Y, design, settings, budget)
    torch.manual_seed(design)
    candidates = bayesopt.next_batch(model, X, settings)
    values = p.f(candidates).squeeze(-1)
    on_bound = ((candidates < ON_BOUND) | (candidates > 1 - ON_BOUND)).to(torch.float64)
    mean, sd = corner_posterior(model, corners(p.d, design), Y)
    incumbent = X[Y.reshape(-1).argmax()]
    return dict(problem=name, method=method, design=design, n=X.shape[0], on_bound=float(on_bound.mean()),
                candidates=candidates.tolist(), from_best=float((candidates - incumbent).norm(dim=-1).min()),
                l_inf=[round(float(v), 4) for v in (candidates - 0.5).abs().amax(-1)],
                values=[float(v) for v in values], best_observed=float(Y.max()), improves=bool(values.max() > Y.max()),
                corner_mean=[round(float(v), 4) for v in mean], corner_sd=[round(float(v), 4) for v in sd],
                best_observed_standardized=float((Y.max() - Y.mean()) / Y.std()), observed_sd=float(Y.std()))


def corners(d, design):
    """The cube's ``2^d`` corners where ``2^d <= CORNERS``, else ``CORNERS`` of them drawn under ``design``."""
    if 2**d <= CORNERS:
        return torch.cartesian_prod(*[torch.tensor([0.0, 1.0], dtype=torch.float64)] * d).reshape(-1, d)
    g = torch.Generator(device="cpu").manual_seed(design)
    return torch.randint(0, 2, (CORNERS, d), generator=g, device="cpu").to(torch.float64)


def corner_posterior(model, points, Y):
    """The model's posterior mean and standard deviation of the function (no observation noise)
    at each of ``points`` alone, in units of ``Y`` standardized by its mean and standard deviation."""
    with torch.no_grad():
        posterior = model.posterior(points.unsqueeze(-2))
    return (posterior.mean.reshape(-1) - Y.mean()) / Y.std(), posterior.variance.reshape(-1).sqrt() / Y.std()


def summarize(records):
    """Per problem and surrogate, over its records (``designs``: one per design, or per design and
    step with ``--along``): the mean fraction of coordinates on the boundary, the number of
    records whose batch improved on the best observation, the median of the batch's best value
    less the best observation (standardized units: the step's gain, negative where no candidate
    improved), the median distance from the best observed point to the nearest candidate, the
    mean spread (standard deviation) of the posterior mean across the corners and the mean excess
    of the corners' largest upper bound over the best observation (standardized units)."""
    out = {}
    for r in records:
        out.setdefault(r["problem"], {}).setdefault(r["method"], []).append(r)
    return {p: {m: dict(on_bound=round(statistics.fmean(r["on_bound"] for r in rs), 3), improved=sum(r["improves"] for r in rs), designs=len(rs),
                        batch_gain=round(statistics.median(batch_gain(r) for r in rs), 3),
                        from_best=round(statistics.median(r["from_best"] for r in rs), 3),
                        corner_mean_spread=round(statistics.fmean(statistics.pstdev(r["corner_mean"]) for r in rs), 3),
                        corner_bound_over_best=round(statistics.fmean(upper_bound(r) - r["best_observed_standardized"] for r in rs), 3))
                for m, rs in by.items()} for p, by in out.items()}


def batch_gain(record):
    """The batch's best value less the best observation, in units of the design's outcomes'
    standard deviation."""
    return (max(record["values"]) - record["best_observed"]) / record["observed_sd"]


def upper_bound(record):
    """The largest posterior mean plus two standard deviations over the record's corners."""
    return max(m + 2 * s for m, s in zip(record["corner_mean"], record["corner_sd"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one problem, one design, three surrogates, bayesopt.py's quick budgets")
    parser.add_argument("--problems", nargs="+", default=None, help="default: " + " ".join(FULL["problems"]))
    parser.add_argument("--methods", nargs="+", default=None, help="default: " + " ".join(FULL["methods"]))
    parser.add_argument("--designs", type=int, default=None, help="Sobol designs (seeds 0, 1, ...); default 3")
    parser.add_argument("--n", type=int, default=None, help="points in each design; default 26 (bayesopt.py's fifth step)")
    parser.add_argument("--activations", nargs="+", default=None, choices=bayesopt.ACTIVATIONS,
                        help="the activations the calibrations choose among, as bayesopt.py's --activations")
    parser.add_argument("--along", default=None, metavar="METHOD",
                        help="take the data from METHOD's own BO run of each design (bayesopt.py's loop) at --at-steps, not from Sobol points")
    parser.add_argument("--at-steps", nargs="+", type=int, default=None, metavar="K",
                        help="with --along: the steps whose data are taken (step k has n_init + k q points); default 3 5 7")
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
    runs = ["gp", "infinite_width", *bayesopt.OPTIONS["full"]]  # the surrogates bayesopt.py's loop runs
    surrogates = [*runs, *bayesopt.LAPLACE_FORMS]
    unknown = [m for m in methods if m not in surrogates]
    if unknown:
        parser.error(f"--methods: {unknown} not surrogates here; choose from {' '.join(surrogates)}")
    budget = "quick" if args.quick else "full"
    at_steps = args.at_steps if args.at_steps is not None else [3, 5, 7]
    if args.along is not None:
        if args.along not in runs:
            parser.error(f"--along: {args.along!r} is not a surrogate bayesopt.py's loop runs; choose from {' '.join(runs)}")
        if args.n is not None:
            parser.error("--n sets the Sobol designs' size; with --along the data are the run's")
        steps = settings_for(budget)["steps"]
        if any(not 0 <= k < steps for k in at_steps):
            parser.error(f"--at-steps must lie in 0..{steps - 1} (the {budget} budget's steps), got {at_steps}")
    elif args.at_steps is not None:
        parser.error("--at-steps is for --along")
    warnings.filterwarnings("ignore", category=UserWarning)
    records = []
    for name in problems:
        for design in range(designs):
            if args.along is None:
                data = {None: sobol_design(name, design, n)}
            else:
                data = run_states(name, args.along, design, at_steps, budget, args.activations)
            for at, (X, Y) in data.items():
                for method in methods:
                    r = step(name, method, design, X, Y, budget, args.activations)
                    if at is not None:
                        r.update(along=args.along, at_step=at)
                    records.append(r)
                    print(f"{name:17s} design {design} n {r['n']} {method:18s} on the boundary {r['on_bound']:.2f}  L_inf {r['l_inf']}  "
                          f"f {[round(v, 2) for v in r['values']]}  best observed {r['best_observed']:.2f} (nearest candidate "
                          f"{r['from_best']:.3f} away)  corners: mean spread {statistics.pstdev(r['corner_mean']):.2f}, largest mean "
                          f"+ 2 sd {upper_bound(r):.2f} against the best's {r['best_observed_standardized']:.2f}", flush=True)
    print(json.dumps(dict(settings=dict(problems=problems, methods=methods, designs=designs, n=n if args.along is None else None,
                                        along=args.along, at_steps=at_steps if args.along is not None else None, budget=budget,
                                        activations=args.activations),
                          records=records, summary=summarize(records))))


if __name__ == "__main__":
    main()
