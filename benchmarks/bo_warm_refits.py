"""A sampler's warm refits along a Bayesian-optimization run: how short the refit's tuning can be.

    python benchmarks/bo_warm_refits.py --quick       # NUTS on Branin, 1 design, 3 refits: minutes
    python benchmarks/bo_warm_refits.py               # the development problems, 2 designs, 7 refits each
    python benchmarks/bo_warm_refits.py --problems rosenbrock5 levy4 griewank8 styblinskitang10   # held out
    python benchmarks/bo_warm_refits.py --method mclmc --variants restart tuning:0.25 carried:0.1

A BO run refits its surrogate after every batch on a few more points. A sampler's refit (the
surrogate's ``refit``, ``warm_fraction`` 0.25) continues each chain from its last draw; how its
warm-up starts is the question here. Side by side on the same data, each variant refitting from
its own previous fit:

- ``restart``: the registered warm start (NUTS's: the warm-up as a cold run's, a quarter of the
  cold fit's long, a step-size search from scratch, a unit mass matrix re-estimated in a window;
  MCLMC's: as ``carried`` below, a quarter of the cold fit's second and third tuning phases and
  a fortieth of its first);

NUTS's variants:

- ``carried:W``: each chain's step size and a diagonal inverse mass matrix from the previous
  posterior's draws (:func:`pyrobnn.infer.mcmc.samplers.nuts_adaptation_of`), held through a
  warm-up of ``W`` iterations that adapts the step size alone;
- ``carried-stats:W``: as ``carried:W``, with the matrix the previous run used
  (``stats["inv_mass"]``) in place of its draws' variance;
- ``carried-windows:W``: as ``carried:W``, the matrix only the warm-up's start, re-estimated in
  its windows (``adapt_mass_matrix=True``; a warm-up under 20 iterations has none);
- ``depth:D``: the registered warm start with trees of at most ``D`` doublings
  (``max_tree_depth``) in the refit;
- ``samples:S``: the registered warm start drawing ``S`` draws per chain in the refit
  (``num_samples``).

Either sampler's:

- ``float32``, ``float64``: the registered warm start with the refit's chains in that dtype
  (``dtype``: on a copy of the float64 network, the draws handed back in float64).

MCLMC's variants:

- ``tuning:F``: the three tuning phases from the initial step size and ``L``, ``F`` of the cold
  fit's steps each, at least 1 (``tuning:0.25``: the registered warm start until 2026-12-07);
- ``carried:F``: as ``tuning:F``, each chain's tuning started as the registered warm start
  starts it, from its previous step size and ``L``
  (:func:`pyrobnn.infer.mcmc.samplers.mclmc_tuning_of`) at the target energy variance the
  previous tuning ended at (its schedule's end), instead of the initial step size, MILE's ``L``
  and the schedule from its start;
- ``tuning:A/B/C``, ``carried:A/B/C``: as above with the three phases' steps given.

The data are ``bayesopt.py``'s ``n_init`` scrambled Sobol points of each design, then ``q``
points of a second Sobol sequence per refit (as ``bo_step_cost.py``), the surrogate fitted with
``bayesopt.py``'s options at the budget (its prior calibrated at every fit). The cold fit is made
once and shared; then the variants take turns within each refit (the order rotates). Per refit:
the fit's seconds, the draws per chain, the mean step size, NUTS's leapfrog steps per draw and divergent transitions
(MCLMC's mean ``L`` and steps undone for a non-finite result), and the held-out Gaussian NLL and
90% coverage of ``bo_calibration.py`` (``N_TEST`` uniform points, the outcomes standardized by
the training data's mean and sd). Torch and the BLAS libraries run
on one thread. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bayesopt  # noqa: E402
import bo_calibration  # noqa: E402
from bo_problems import DEVELOPMENT, problem, single_objective  # noqa: E402
from pyrobnn import methods  # noqa: E402
from pyrobnn.infer.mcmc.samplers import nuts_adaptation_of  # noqa: E402


def variant_warm_start(method: str, variant: str, registered: methods.WarmStart) -> methods.WarmStart:
    """The warm start a variant name of ``method`` (``"nuts"`` or ``"mclmc"``) stands for (the
    module docstring lists them); ``restart`` is ``registered``, the method's declared one."""
    if variant == "restart":
        return registered
    if variant in ("float32", "float64"):  # either sampler: the registered warm start, the refit's chains in this dtype
        dtype = getattr(torch, variant)
        return dataclasses.replace(registered, prepare=lambda model, previous, x, y, options, fraction, seed: dict(
            registered.prepare(model, previous, x, y, options, fraction, seed) if registered.prepare else options, dtype=dtype),
            names=registered.names + ("dtype",))
    kind, _, amount = variant.partition(":")
    if method == "mclmc":
        return mclmc_variant(variant, kind, amount, registered)
    if kind not in ("carried", "carried-stats", "carried-windows", "depth", "samples") or not amount.isdigit() or int(amount) < 1:
        raise ValueError(f"unknown variant {variant!r} of nuts: restart, carried:W, carried-stats:W or carried-windows:W (W iterations), "
                         "depth:D (D >= 1 doublings), samples:S (S >= 1 draws per chain)")
    if kind in ("depth", "samples"):
        option = "max_tree_depth" if kind == "depth" else "num_samples"
        return dataclasses.replace(registered, prepare=lambda model, previous, x, y, options, fraction, seed: dict(options, **{option: int(amount)}),
                                   names=registered.names + (option,))

    def prepare(model, previous, x, y, options, fraction, seed):
        carried = nuts_adaptation_of(previous, model)
        if kind == "carried-stats":
            carried["inv_mass"] = previous.stats["inv_mass"]
        return dict(options, **carried, num_warmup=int(amount), adapt_mass_matrix=kind == "carried-windows")

    return methods.WarmStart(init="init", count="num_chains", prepare=prepare,
                             names=("step_size", "inv_mass", "num_warmup", "adapt_mass_matrix"))


def mclmc_variant(variant: str, kind: str, amount: str, registered: methods.WarmStart) -> methods.WarmStart:
    """MCLMC's ``tuning:F`` and ``carried:F`` (the module docstring)."""
    phases = amount.split("/")
    try:
        share = float(amount) if len(phases) == 1 else None
    except ValueError:
        share = float("nan")
    given = len(phases) == 3 and all(p.isdigit() for p in phases)
    if kind not in ("tuning", "carried") or not (given or (share is not None and 0.0 < share <= 1.0)):
        raise ValueError(f"unknown variant {variant!r} of mclmc: restart, tuning:F or carried:F (F in (0, 1], the cold tuning's share), "
                         "tuning:A/B/C or carried:A/B/C (the phases' steps)")

    def prepare(model, previous, x, y, options, fraction, seed):
        cold = options.get("num_warmup", inspect.signature(methods.spec("mclmc").run).parameters["num_warmup"].default)
        num_warmup = tuple(int(p) for p in phases) if given else methods.scaled_budget(tuple(cold), share)
        if kind == "carried":  # the registered warm start's carried tuning, with this variant's budget
            options = registered.prepare(model, previous, x, y, options, fraction, seed)
        return dict(options, num_warmup=num_warmup)

    return methods.WarmStart(init=registered.init, count=registered.count, prepare=prepare,
                             names=("num_warmup", "step_size", "L", "energy_variance"))


def refit_scores(method, model, X_test, Y_test, Y):
    """The held-out NLL and coverage of ``bo_calibration.scores`` and the sampler's statistics of
    a fit (``divergences``: NUTS's divergent transitions, MCLMC's steps undone)."""
    nll, coverage = bo_calibration.scores(model, X_test, Y_test, Y.mean(0), Y.std(0))
    stats = model.result.stats
    record = dict(nll=round(nll, 4), coverage=round(coverage, 4), step_size=float(stats["step_size"].double().mean()),
                  warmup=model.result.settings["num_warmup"], draws=model.result.num_draws)
    if method == "nuts":
        return dict(record, leapfrogs=round(stats["num_steps"].double().mean().item(), 2), divergences=int(stats["diverging"].sum()))
    return dict(record, L=float(stats["L"].double().mean()), divergences=int(stats["nonfinite"].sum()))


def run(method, name, design, variants, refits, budget, activations=None):
    """Each variant's refits along one design of ``name``: a list of per-refit records
    (``activations``: those the calibrations choose among, as ``bayesopt.py --activations``;
    default: the method's)."""
    from torch.quasirandom import SobolEngine

    settings = bayesopt.QUICK if budget == "quick" else bayesopt.FULL
    settings = dict(settings, activations=activations)
    p = problem(name)
    X = SobolEngine(p.d, scramble=True, seed=design).draw(settings["n_init"]).to(torch.float64)
    more = SobolEngine(p.d, scramble=True, seed=10_000 + design)
    Y = p.f(X)
    g = torch.Generator(device="cpu").manual_seed(1000 + design)
    X_test = torch.rand(bo_calibration.N_TEST, p.d, generator=g, dtype=torch.float64, device="cpu")
    Y_test = p.f(X_test)
    registered = methods.spec(method)
    start = time.perf_counter()
    cold = bayesopt.fit_model(method, X, Y, design, settings, budget)
    records = [dict(problem=name, design=design, variant="cold", n=X.shape[0], seconds=round(time.perf_counter() - start, 3),
                    **refit_scores(method, cold, X_test, Y_test, Y))]
    print(records[-1], flush=True)
    models = dict.fromkeys(variants, cold)
    try:
        for k in range(refits):
            new = more.draw(settings["q"]).to(torch.float64)
            X, Y = torch.cat([X, new]), torch.cat([Y, p.f(new)])
            for variant in variants[k % len(variants):] + variants[: k % len(variants)]:
                methods.METHODS[method] = dataclasses.replace(registered, warm_start=variant_warm_start(method, variant, registered.warm_start))
                start = time.perf_counter()
                models[variant] = bayesopt.fit_model(method, X, Y, design, settings, budget, previous=models[variant])
                seconds = time.perf_counter() - start
                records.append(dict(problem=name, design=design, variant=variant, n=X.shape[0], seconds=round(seconds, 3),
                                    **refit_scores(method, models[variant], X_test, Y_test, Y)))
                print(records[-1], flush=True)
    finally:
        methods.METHODS[method] = registered
    return records


def summarize(records, variants):
    """Per variant over every refit: the median seconds, NUTS's leapfrogs per draw, and NLL, and
    the refits whose NLL is below the ``restart`` variant's at the same problem, design and n."""
    base = {(r["problem"], r["design"], r["n"]): r["nll"] for r in records if r["variant"] == "restart"}
    out = {}
    for v in variants:
        rows = [r for r in records if r["variant"] == v]
        paired = [r["nll"] - base[(r["problem"], r["design"], r["n"])] for r in rows if (r["problem"], r["design"], r["n"]) in base]
        out[v] = dict(refits=len(rows), seconds=statistics.median(r["seconds"] for r in rows),
                      leapfrogs=statistics.median(r["leapfrogs"] for r in rows) if rows and "leapfrogs" in rows[0] else None, nll=statistics.median(r["nll"] for r in rows),
                      divergences=sum(r["divergences"] for r in rows),
                      nll_below_restart=sum(d < 0 for d in paired) if v != "restart" else None,
                      nll_difference_to_restart=statistics.median(paired) if paired and v != "restart" else None)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Branin, one design, 3 refits, the quick budget")
    parser.add_argument("--method", choices=["nuts", "mclmc"], default="nuts", help="the sampler whose refits are compared")
    parser.add_argument("--problems", nargs="+", default=None, help="default: the development problems")
    parser.add_argument("--designs", type=int, default=2, help="Sobol designs (seeds 0, 1, ...) per problem")
    parser.add_argument("--refits", type=int, default=None, help="refits after the cold fit (default: bayesopt.py's steps less one)")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="NUTS's restart, carried:W, carried-stats:W, carried-windows:W, depth:D, samples:S (default: restart carried:10 "
                             "carried:50 carried-windows:50); MCLMC's restart, tuning:F, carried:F, tuning:A/B/C, carried:A/B/C (default: restart tuning:0.25)")
    parser.add_argument("--activations", nargs="+", default=None, choices=bayesopt.ACTIVATIONS,
                        help="the activations the calibrations choose among (default: the method's), as bayesopt.py's; a refit whose "
                             "data choose another activation than its previous fit's starts cold in every variant")
    args = parser.parse_args(argv)
    if args.variants is None:
        args.variants = ["restart", "carried:10", "carried:50", "carried-windows:50"] if args.method == "nuts" else ["restart", "tuning:0.25"]
    if "restart" not in args.variants:
        parser.error("--variants must include restart, the registered warm start the others are compared with")
    for v in args.variants:
        try:
            variant_warm_start(args.method, v, methods.spec(args.method).warm_start)
        except ValueError as e:
            parser.error(f"--variants: {e}")
    if args.designs < 1:
        parser.error(f"--designs must be at least 1, got {args.designs}")
    problems = args.problems or (["branin"] if args.quick else DEVELOPMENT)
    known = single_objective()
    if any(p not in known for p in problems):
        parser.error(f"--problems: {[p for p in problems if p not in known]} are not single-objective problems of bo_problems.py")
    budget = "quick" if args.quick else "full"
    activations = args.activations and list(dict.fromkeys(args.activations))
    refits = args.refits if args.refits is not None else (3 if args.quick else bayesopt.FULL["steps"] - 1)
    designs = 1 if args.quick else args.designs
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    records = []
    with threadpool_limits(1):
        for name in problems:
            for design in range(designs):
                records += run(args.method, name, design, args.variants, refits, budget, activations)
    summary = summarize(records, args.variants)
    print(f"\n{args.method}, per variant over every refit: median seconds, held-out NLL; refits with a lower NLL than restart's")
    undone = "divergent" if args.method == "nuts" else "steps undone"
    for v, s in summary.items():
        paired = "" if s["nll_below_restart"] is None else f"   NLL below restart's in {s['nll_below_restart']} of {s['refits']} (median difference {s['nll_difference_to_restart']:+.3f})"
        leapfrogs = "" if s["leapfrogs"] is None else f"  {s['leapfrogs']:5.1f} leapfrogs"
        print(f"  {v:18s} {s['seconds']:6.2f} s{leapfrogs}  NLL {s['nll']:7.3f}  {s['divergences']} {undone}{paired}")
    print(json.dumps(dict(settings=dict(method=args.method, problems=problems, designs=designs, refits=refits, budget=budget, variants=args.variants,
                                        activations=activations),
                          records=records, summary=summary)))


if __name__ == "__main__":
    main()
