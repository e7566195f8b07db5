"""How honest the Bayesian-optimization surrogates are away from their data: held-out predictive
NLL and the coverage of 90% intervals at small n, every pyrobnn surrogate beside BoTorch's GP.

    python benchmarks/bo_calibration.py --quick     # minutes: n = 10, 20, two problems, two seeds
    python benchmarks/bo_calibration.py             # n = 10, 20, 50, 100, all problems, five seeds

The acquisition function reads the surrogate's predictive away from the evaluated points; a
surrogate confident there proposes the wrong points. So, per problem, seed and n: ``n`` scrambled
Sobol points of the unit cube (the design BO starts from), ``N_TEST`` uniform test points, the
outcomes standardized with the training points' mean and standard deviation (as BoTorch's
``Standardize`` does); each surrogate's predictive of a new observation
(``posterior(X, observation_noise=True)``) is summarized by its mean and variance, and scored by
the Gaussian NLL of the standardized test outcomes under them and by the share of outcomes inside
the central 90% interval (mean +- 1.645 sd). A moment-matched Gaussian scores an ensemble's
mixture by its first two moments only: the same yardstick for every surrogate.

The problems are split once, before any default is chosen: the **development** set (the BO
benchmark's Branin, Hartmann-6, Ackley-10, Levy-20) is where defaults may be tuned; the
**held-out** set (Rosenbrock-5, Levy-4, Griewank-8, Styblinski-Tang-10) is only reported, as
are the **regimes** where BNN surrogates should do well (:data:`REGIMES`: high-dimensional,
non-stationary, two outputs). The
pyrobnn surrogates are ``fit_surrogate(X, Y, method)`` with the BO benchmark's options at its
budget (their default network: its prior chosen by the data at every fit); ``infinite_width`` is
that network's infinite-width GP (:func:`pyrobnn.integrations.infinite_width_gp.infinite_width_gp`).
The last line printed is one JSON object: per problem, n and method the median NLL and
coverage over seeds with their range, and each method's NLL over the GP's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bo_problems  # noqa: E402
import bayesopt  # noqa: E402  (the BO benchmark's surrogates, fitted with its options per method and budget)
from bo_problems import DEVELOPMENT, HELD_OUT, REGIMES, SHIFTED  # noqa: E402

N_TEST = 500
Z90 = 1.6448536269514722  # the 95% quantile of N(0, 1): a central 90% interval
WITHIN = math.log(1.5)  # "within 1.5x of the GP's NLL": a predictive density at most 1.5 times lower per point

QUICK = dict(problems=["branin", "rosenbrock5"], sizes=[10, 20], seeds=2, methods=["gp", "infinite_width", "laplace", "deep_ensemble", "nuts"],
             num_samples=16)
FULL = dict(problems=DEVELOPMENT + HELD_OUT + REGIMES, sizes=[10, 20, 50, 100], seeds=5,
            methods=["gp", "infinite_width", "laplace", "deep_ensemble", "nuts", "mclmc", "ivon", "swag"], num_samples=32)


def problem_set(name: str) -> str:
    """The set of bo_problems' split a problem belongs to."""
    return ("development" if name in DEVELOPMENT else "held-out" if name in HELD_OUT else "shifted (held out)" if name in SHIFTED
            else "regime")


def problem(name):
    """``(f, d)``: the problem's function on the unit cube (outputs ``(n, m)``) and its dimension."""
    p = bo_problems.problem(name)
    return p.f, p.d


def fit(method, X, Y, budget, num_samples, seed, activations=None):
    """The surrogate ``method`` fitted to ``(X, Y)`` as the BO benchmark's first step fits it
    (``bayesopt.fit_model``: the GP, the infinite-width GP, a pyrobnn method with its options at
    the budget, or a form of the Laplace surrogate of ``bayesopt.LAPLACE_FORMS``), its calibration
    choosing among ``activations`` (default: each method's, as ``bayesopt.py``'s)."""
    return bayesopt.fit_model(method, X, Y, seed, dict(num_samples=num_samples, activations=activations), budget)


def scores(model, X_test, Y_test, mu, sd):
    """Gaussian NLL per point and the 90% coverage of the standardized test outcomes."""
    with torch.no_grad():
        posterior = model.posterior(X_test, observation_noise=True)
        mean, var = posterior.mean, posterior.variance  # (n, m)
    m, v, y = ((mean - mu) / sd).reshape(-1), (var / sd**2).reshape(-1), ((Y_test - mu) / sd).reshape(-1)
    v = v.clamp_min(1e-12)
    nll = 0.5 * torch.log(2 * math.pi * v) + 0.5 * (y - m) ** 2 / v
    inside = ((y - m).abs() <= Z90 * v.sqrt()).double()
    return float(nll.mean()), float(inside.mean())


def run(settings, budget):
    from torch.quasirandom import SobolEngine

    records = []
    for name in settings["problems"]:
        f, d = problem(name)
        for seed in range(settings["seeds"]):
            g = torch.Generator(device="cpu").manual_seed(1000 + seed)
            X_test = torch.rand(N_TEST, d, generator=g, dtype=torch.float64, device="cpu")
            Y_test = f(X_test)
            for n in settings["sizes"]:
                X = SobolEngine(d, scramble=True, seed=seed).draw(n).to(torch.float64)
                Y = f(X)
                mu, sd = Y.mean(0), Y.std(0)  # per output, as Standardize
                for method in settings["methods"]:
                    torch.manual_seed(seed)
                    start = time.perf_counter()
                    try:
                        model = fit(method, X, Y, budget, settings["num_samples"], seed, settings.get("activations"))
                        nll, coverage = scores(model, X_test, Y_test, mu, sd)
                        error = None
                    except Exception as e:  # a surrogate that fails here is reported, not hidden
                        nll = coverage = float("nan")
                        error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                    records.append(dict(problem=name, set=problem_set(name), seed=seed, n=n,
                                        method=method, nll=nll, coverage=coverage, seconds=time.perf_counter() - start, error=error))
                    print(f"{name:>16} n={n:<4} seed={seed} {method:>14}: NLL {nll:8.3f}  coverage {coverage:5.2f}  "
                          f"{records[-1]['seconds']:6.1f} s" + (f"  {error}" if error else ""), flush=True)
    return records


def summarize(records, settings):
    summary = {}
    for name in settings["problems"]:
        for n in settings["sizes"]:
            rows = {}
            for method in settings["methods"]:
                mine = [r for r in records if r["problem"] == name and r["n"] == n and r["method"] == method and r["error"] is None]
                if not mine:
                    continue
                nll = [r["nll"] for r in mine]
                cov = [r["coverage"] for r in mine]
                rows[method] = {"nll": statistics.median(nll), "nll_range": [min(nll), max(nll)], "coverage": statistics.median(cov),
                                "coverage_range": [min(cov), max(cov)], "seconds": statistics.median(r["seconds"] for r in mine)}
            if "gp" in rows:
                for method, row in rows.items():
                    row["nll_minus_gp"] = row["nll"] - rows["gp"]["nll"]
                    row["within_1.5x_gp"] = row["nll_minus_gp"] <= WITHIN
            summary[f"{name}/n={n}"] = rows
    return summary


def checks(summary, n=20):
    """``(statement, holds)`` per problem and BNN surrogate at ``n``: the median held-out NLL
    within 1.5x of the GP's, read as a predictive density at most 1.5 times lower per point
    (NLL at most log 1.5 = 0.405 above the GP's; a ratio of NLLs means nothing where they are
    negative)."""
    out = []
    for key, rows in summary.items():
        if not key.endswith(f"/n={n}") or "gp" not in rows:
            continue
        for method, row in rows.items():
            if method != "gp":
                out.append((f"{key}: {method} NLL {row['nll']:.2f} against the GP's {rows['gp']['nll']:.2f} (+{WITHIN:.3f} allowed)",
                            row["within_1.5x_gp"]))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--problems", nargs="+", help=f"of {DEVELOPMENT + HELD_OUT + SHIFTED + REGIMES}")
    parser.add_argument("--methods", nargs="+")
    parser.add_argument("--sizes", nargs="+", type=int)
    parser.add_argument("--seeds", type=int)
    parser.add_argument("--activations", nargs="+", choices=bayesopt.ACTIVATIONS,
                        help="the activations the infinite-width GP's fit and the surrogates' calibrations choose among "
                             "(bayesopt.py's --activations); default: each method's, as there")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    for key in ("problems", "methods", "sizes", "seeds", "activations"):
        if getattr(args, key):
            settings[key] = getattr(args, key)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    records = run(settings, "quick" if args.quick else "full")
    summary = summarize(records, settings)
    print("\nmedian NLL over seeds (coverage of 90% intervals), per problem and n:")
    for key, rows in summary.items():
        print(f"  {key:>24}: " + ", ".join(f"{m} {r['nll']:.2f} ({r['coverage']:.2f})" for m, r in rows.items()))
    verdicts = checks(summary)
    if verdicts:
        print(f"\nheld-out NLL at n = 20 within 1.5x of the GP's ({sum(h for _, h in verdicts)} of {len(verdicts)} hold):")
        for statement, holds in verdicts:
            print(f"  {'holds' if holds else 'does not hold'}: {statement}")
    print(json.dumps({"settings": settings, "summary": summary, "checks": [{"statement": s, "holds": h} for s, h in verdicts]}))


if __name__ == "__main__":
    main()
