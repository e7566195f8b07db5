"""Bayesian optimization with BNN surrogates: pyrobnn's posteriors beside BoTorch's GP, Sobol
random search and laplace-bayesopt, on BoTorch's test functions.

Protocol (after Li, Rudner, Wilson et al., ICLR 2024, at budgets this machine runs): each
problem noiseless, its inputs scaled to the unit cube, the outcomes standardized by each
surrogate (BoTorch's ``Standardize``); ``n_init`` Sobol points, the same for every method within a
seed; then ``steps`` rounds of ``q`` points chosen by qLogNoisyExpectedImprovement, optimized by
``optimize_acqf`` (``num_restarts``, ``raw_samples``). pyrobnn's surrogates refit warm-started
from the previous posterior after each round (``PosteriorSurrogate.refit``); at the last round a
cold fit on the same data is timed beside the warm one (``warm_refit_speedup``; without the
prior's calibration, which both pay, ``warm_refit_speedup_method``), and with
``--cold-arm`` whole cold-refit runs on the first problem (or on the problems it names) give the
final regret to compare with. Every
(problem, method, seed) runs in a fresh process, so that its peak memory (the high-water mark of
the resident set above the process after its imports) is its own.

Prints per problem the median log10 simple regret at the end with its spread over seeds (min and
max), the seconds per BO step split into fit and acquisition, and peak memory; then each method
against random search seed by seed (the runs ending below and above its regret in the same seed,
with a sign test); writes the regret curves to ``--out`` (a JSON file and one PNG per problem) and
prints one JSON object last.

    python benchmarks/bayesopt.py --quick          # CI: Branin and Hartmann-6, small budgets
    python benchmarks/bayesopt.py --seeds 5 --out docs/img/bayesopt_calibrated --results docs/results.json   # docs/bayesopt.md
    python benchmarks/bayesopt.py --regimes        # Branin in 40-D and Gramacy & Lee's function, 100 evaluations
    python benchmarks/bayesopt.py --regimes --seeds 10 --first-seed 5 --out runs/more   # seeds 5-14 beside a saved run,
    python benchmarks/bayesopt.py --from-runs <saved>/bayesopt_runs.json runs/more/bayesopt_runs.json   # summarized as one
    python benchmarks/bayesopt.py --problems ackley10_shifted levy20_shifted rosenbrock5_shifted levy4_shifted \
        griewank8_shifted --seeds 10     # the problems whose maximizer is near the cube's centre, moved off it

The problems are :mod:`bo_problems`' (shared with ``bo_calibration.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bo_problems  # noqa: E402  (the test problems, shared with bo_calibration.py)
from pyrobnn.models.infinite_width import ACTIVATIONS  # noqa: E402

#: 6 Sobol points and 8 rounds of q = 2 (22 evaluations), 3 seeds: the smallest budget at which
#: the GP's median regret is ahead of random search's on both problems (at 16 evaluations and two
#: seeds it was not on Branin: 2026-11-26, docs/bayesopt.md)
QUICK = dict(problems=["branin", "hartmann6"], seeds=3, n_init=6, q=2, steps=8, num_restarts=2, raw_samples=64, num_samples=16)
FULL = dict(problems=["branin", "hartmann6", "ackley10", "levy20"], seeds=3, n_init=10, q=4, steps=8, num_restarts=4,
            raw_samples=256, num_samples=32)
#: the regimes where BNN surrogates should do well (bo_problems.REGIMES, one objective each), at
#: 100 evaluations: 20 Sobol points and 20 rounds of q = 4
REGIME = dict(problems=["branin_embed40", "gramacylee2"], seeds=5, n_init=20, q=4, steps=20, num_restarts=4, raw_samples=256,
              num_samples=32)
#: the baselines, and the surrogates fitted as GPs: the infinite-width BNN is pyrobnn's (a GP with
#: the network's prior, pyrobnn.integrations.infinite_width_gp; refitted from the previous step's
#: fit, its warm_start, unless --cold-refits)
BASELINES = ("random", "gp", "laplace_bayesopt")
#: the settings that say which seeds ran, not how: files that differ only in them merge
SEED_SETTINGS = ("problems", "seeds", "first_seed")
GP_FITTED = ("gp", "infinite_width")
METHODS = ["random", "gp", "infinite_width", "laplace_bayesopt", "nuts", "mclmc", "deep_ensemble", "laplace", "ivon", "swag"]

#: the pyrobnn methods' options at each budget (merged over each method's bo_options in pyrobnn.methods)
OPTIONS = {
    "quick": {
        "nuts": dict(num_samples=16, num_warmup=100, num_chains=2, max_tree_depth=5),
        "mclmc": dict(num_samples=256, num_warmup=(400, 100, 100), num_chains=2, thinning=16),
        "deep_ensemble": dict(num_members=4, max_epochs=300),
        "laplace": dict(map_options=dict(max_epochs=300, lr=1e-2, batch_size=None, patience=1000)),
        "ivon": dict(epochs=300),
        "swag": dict(num_epochs=30, map_options=dict(max_epochs=300, lr=1e-2, batch_size=None, patience=1000)),
    },
    "full": {
        "nuts": dict(num_samples=32, num_warmup=200, num_chains=4, max_tree_depth=6),
        # the sampling of bo_options (512 steps after the tuning, every 16th kept); the tuning twice
        # the library's: with its 1,400 steps a cold fit at 50 points of Branin was over-confident
        # (docs/bayesopt.md, "MCLMC's draws span its chains")
        "mclmc": dict(num_warmup=(2000, 400, 400)),
        "deep_ensemble": dict(num_members=8, max_epochs=1000),
        "laplace": dict(),
        "ivon": dict(epochs=1000),
        "swag": dict(),
    },
}


#: other forms of the Laplace surrogate, screened beside its default (the ``"bounded"`` form since
#: 2026-12-07) by ``bo_boundary.py`` and ``bo_calibration.py``: the last layer alone, the
#: calibrated model's prior precisions as they are (untuned), and the network itself at the
#: posterior's weight draws (laplace-torch's "nn" predictive, a ``PosteriorSurrogate`` of the
#: result) instead of its linearization around the MAP (cold fits only); and the joint form, the
#: erf network's linearized predictive unbounded (the default until 2026-12-07; warm refits as the
#: default's, so the regret runs take it too). Each: the options merged over Laplace's, and the
#: ``laplace_form``
LAPLACE_FORMS = {"laplace:last_layer": (dict(subset="last_layer"), "joint"), "laplace:untuned": (dict(tune_prior=False), "joint"),
                 "laplace:network": ({}, "samples"), "laplace:joint": ({}, "joint")}


def problem(name):
    """``(f, optimum, d)``: a single-objective problem of :mod:`bo_problems` on the unit cube."""
    p = bo_problems.problem(name)
    if p.optimum is None:
        raise ValueError(f"{name} has several objectives: the regret benchmark takes one")
    return p.f, p.optimum, p.d


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def laplace_bayesopt_model(X, Y):
    from botorch.models.transforms.outcome import Standardize
    from laplace_bayesopt.botorch import LaplaceBoTorch

    d = X.shape[-1]

    def get_net():  # the same network as pyrobnn's default surrogate
        return torch.nn.Sequential(torch.nn.Linear(d, 50), torch.nn.Tanh(), torch.nn.Linear(50, 50), torch.nn.Tanh(),
                                   torch.nn.Linear(50, 1)).double()

    return LaplaceBoTorch(get_net, X, Y, outcome_transform=Standardize(1))  # its defaults otherwise


def fit_model(method, X, Y, seed, settings, budget, previous=None):
    """The model this benchmark fits for ``method`` at a step, on all the data so far: BoTorch's
    GP from scratch; the infinite-width GP from ``previous`` (its fit at the step before, as
    BoTorch's tutorials warm-start) or cold; laplace-bayesopt's from scratch; a pyrobnn surrogate
    by ``fit_surrogate`` with the budget's ``OPTIONS`` when ``previous`` is ``None``, else by
    ``previous.refit`` on the points added since, warm."""
    if method == "gp":
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from gpytorch.mlls import ExactMarginalLogLikelihood

        model = SingleTaskGP(X, Y)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        return model
    if method == "infinite_width":
        from pyrobnn.integrations.infinite_width_gp import infinite_width_gp

        if previous is not None:  # its activations are the previous fit's
            return infinite_width_gp(X, Y, warm_start=previous)
        return infinite_width_gp(X, Y, activation=settings.get("activations"))
    if method == "laplace_bayesopt":
        return laplace_bayesopt_model(X, Y)
    if method in LAPLACE_FORMS:
        return laplace_form_model(method, X, Y, seed, settings, budget, previous)
    if previous is None:
        from pyrobnn.integrations.botorch import fit_surrogate, takes_limit_network

        # the activations offered to the calibration of a network that takes its limit's (Laplace's joint form is erf)
        activations = settings.get("activations") if takes_limit_network(method) else None
        return fit_surrogate(X, Y, method, options=OPTIONS[budget][method], num_samples=settings["num_samples"], seed=seed,
                             activations=activations)
    seen = previous.fit_record.train_X.shape[0]
    return previous.refit(X[seen:], Y[seen:], warm=True)


def laplace_form_model(form, X, Y, seed, settings, budget, previous=None):
    """The Laplace surrogate in one of :data:`LAPLACE_FORMS`, fitted as ``fit_model`` fits
    ``"laplace"`` with the form's options and ``laplace_form`` (warm refits for ``laplace:joint``
    only)."""
    from pyrobnn.integrations.botorch import PosteriorSurrogate, fit_surrogate

    options, laplace_form = LAPLACE_FORMS[form]
    if previous is not None:
        if form != "laplace:joint":
            raise ValueError(f"{form} is screened on cold fits only; the regret runs take 'laplace' and 'laplace:joint'")
        seen = previous.fit_record.train_X.shape[0]
        return previous.refit(X[seen:], Y[seen:], warm=True)
    model = fit_surrogate(X, Y, "laplace", options={**OPTIONS[budget]["laplace"], **options}, num_samples=settings["num_samples"],
                          seed=seed, laplace_form=laplace_form)
    if laplace_form != "samples":
        return model
    return PosteriorSurrogate(model.result, X, Y, num_samples=settings["num_samples"], seed=seed, outcome_transform=model.outcome_transform)


def next_batch(model, X, settings, prune_baseline=True, stats=None):
    """The batch of ``settings["q"]`` points on the unit cube that maximizes qLogNEI under
    ``model`` with ``X`` as its baseline, by ``optimize_acqf`` with the budget's ``num_restarts``
    and ``raw_samples``. ``stats``, a dict when given, receives ``evaluations`` (the acquisition's
    forward calls, each over a batch of candidate sets) and ``retried`` (whether ``optimize_acqf``
    warned that L-BFGS-B failed and started again from new initial conditions)."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.optim import optimize_acqf

    d = X.shape[-1]
    bounds = torch.stack([torch.zeros(d, dtype=X.dtype), torch.ones(d, dtype=X.dtype)])
    acq = qLogNoisyExpectedImprovement(model, X_baseline=X, prune_baseline=prune_baseline)
    calls, caught = [0], []
    if stats is not None:
        acq.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    with warnings.catch_warnings(record=stats is not None) as recorded:
        if stats is not None:
            warnings.simplefilter("always")
        candidates, _ = optimize_acqf(acq, bounds=bounds, q=settings["q"], num_restarts=settings["num_restarts"], raw_samples=settings["raw_samples"])
        caught = recorded or []
    for w in caught:  # issued again, under the caller's filters
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if stats is not None:
        stats["evaluations"] = calls[0]
        stats["retried"] = any("Trying again with a new set of initial conditions" in str(w.message) for w in caught)
    return candidates.detach()


def run_one(name, method, seed, settings, budget, cold_refits=False, on_step=None):
    """One BO run; returns its record (a dict). ``on_step(step, X, Y)``, when given, is called at
    each step with the data the step's surrogate is fitted to."""
    from torch.quasirandom import SobolEngine

    torch.manual_seed(seed)
    f, best_possible, d = problem(name)
    X = SobolEngine(d, scramble=True, seed=seed).draw(settings["n_init"]).to(torch.float64)
    Y = f(X)
    baseline = rss_mb()
    best = [float(Y.max())]
    fit_s, acq_s, warm_s, cold_s = [], [], [], []
    warm_method_s = []  # the warm refits' seconds less the prior's calibration
    ard = []  # per step: whether the kernel (the infinite-width GP's, or the calibration a network's prior came from) had one input scale per feature
    activation = []  # per step: that kernel's activation
    surrogate = model = last_warm_data = None
    sobol = SobolEngine(d, scramble=True, seed=10_000 + seed)
    error = None
    for step in range(settings["steps"]):
        if on_step is not None:
            on_step(step, X, Y)
        q = settings["q"]
        t0 = time.perf_counter()
        if method == "random":
            candidates = sobol.draw(q).to(torch.float64)
            t1 = t0
        else:
            previous = None if cold_refits else model
            model = fit_model(method, X, Y, seed, settings, budget, previous=previous)
            if method == "infinite_width" and model.warm_started:
                warm_s.append(time.perf_counter() - t0)
                last_warm_data = X, Y
            elif method not in BASELINES + GP_FITTED:
                surrogate = model
                if previous is not None:
                    (warm_s if surrogate.warm else cold_s).append(surrogate.fit_seconds)
                    if surrogate.warm:
                        warm_method_s.append(surrogate.fit_seconds - surrogate.fit_record.calibration_seconds)
            t1 = time.perf_counter()
            # BoTorch's default prunes the baseline; laplace-bayesopt's posterior fails there
            # ("Models with multiple batch dims are currently unsupported by prune_inferior_points")
            candidates = next_batch(model, X, settings, prune_baseline=method != "laplace_bayesopt")
        t2 = time.perf_counter()
        calibration = surrogate.fit_record.calibration if surrogate is not None else model
        ard.append(getattr(getattr(calibration, "covar_module", None), "ard", None))
        activation.append(getattr(getattr(calibration, "covar_module", None), "activation", None))
        fit_s.append(t1 - t0)
        acq_s.append(t2 - t1)
        X, Y = torch.cat([X, candidates]), torch.cat([Y, f(candidates)])
        best.append(float(Y.max()))
    cold_same_data = cold_method_same_data = None
    if surrogate is not None and not cold_refits and warm_s:
        cold = surrogate.refit(warm=False)  # a cold fit on the data the last warm refit saw
        cold_same_data = cold.fit_seconds
        cold_method_same_data = cold.fit_seconds - cold.fit_record.calibration_seconds
    if last_warm_data is not None:  # the infinite-width GP's cold fit on the data its last warm refit saw
        from pyrobnn.integrations.infinite_width_gp import infinite_width_gp

        t0 = time.perf_counter()
        infinite_width_gp(*last_warm_data, activation=settings.get("activations"))
        cold_same_data = time.perf_counter() - t0
    regret = [max(best_possible - b, 1e-12) for b in best]
    return dict(
        problem=name, method=method, seed=seed, cold_refits=cold_refits, log10_regret=[math.log10(r) for r in regret],
        evaluations=[settings["n_init"] + i * settings["q"] for i in range(len(best))], fit_seconds=fit_s, acq_seconds=acq_s,
        warm_fit_seconds=warm_s, cold_fit_seconds_same_data=cold_same_data, warm_method_seconds=warm_method_s,
        cold_method_seconds_same_data=cold_method_same_data, peak_memory_mb=peak_mb() - baseline, error=error,
        ard=ard,
        activation=activation,
    )


#: each run's address space is capped (GiB), so that a surrogate asking for more memory fails
#: with an error in its own process instead of the machine's OOM killer taking another
#: (laplace-bayesopt's joint covariance over b x q points reached 20 GB at raw_samples=256)
MEMORY_CAP_GB = 8


def child(args):
    settings = json.loads(args.settings)
    cap = int(MEMORY_CAP_GB * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        record = run_one(args.problem, args.method, args.seed, settings, args.budget, args.cold_refits)
    except MemoryError as exc:
        record = dict(problem=args.problem, method=args.method, seed=args.seed, cold_refits=args.cold_refits,
                      error=f"out of memory under the {MEMORY_CAP_GB} GiB cap per run (MemoryError: {str(exc)[:120]})")
    except Exception as exc:  # reported in the table, not fatal to the benchmark
        text = f"{type(exc).__name__}: {exc}"
        if "can't allocate memory" in text or "not enough memory" in text:
            text = f"out of memory under the {MEMORY_CAP_GB} GiB cap per run ({text[:160]})"
        record = dict(problem=args.problem, method=args.method, seed=args.seed, cold_refits=args.cold_refits, error=text[:300])
    print("RECORD " + json.dumps(record))


def launch(problem_name, method, seed, settings, budget, cold_refits, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--problem", problem_name, "--method", method, "--seed", str(seed),
           "--settings", json.dumps(settings), "--budget", budget] + (["--cold-refits"] if cold_refits else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


def median(values):
    values = sorted(values)
    n = len(values)
    return float("nan") if n == 0 else (values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Branin and Hartmann-6 at small budgets (CI)")
    parser.add_argument("--regimes", action="store_true",
                        help="Branin in 40 inputs and Gramacy & Lee's function at 100 evaluations (the full options)")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS + ["laplace:joint"])
    parser.add_argument("--problems", nargs="+", default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first seed: seeds first-seed .. first-seed + seeds - 1, to add seeds to saved runs (merge them "
                             "with --from-runs)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--cold-arm", nargs="*", default=None, metavar="PROBLEM",
                        help="also run pyrobnn's surrogates with cold refits: on the first problem, or on the problems named")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process each")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per run (default: the cores over --jobs; 1 where other work shares the machine)")
    parser.add_argument("--raw-samples", type=int, default=None, help="optimize_acqf's raw_samples (default: the budget's)")
    parser.add_argument("--activations", nargs="+", default=None, choices=ACTIVATIONS,
                        help="the activations the infinite-width GP's fit and the surrogates' calibrations choose among, for every "
                             "surrogate whose network is its limit's (all but `laplace:joint`, an erf network); default: each method's "
                             "(the infinite-width GP's erf and relu; the surrogates' MethodSpec.bo_activations: NUTS's erf, relu "
                             "and cos, the others' erf and relu)")
    parser.add_argument("--out", default=None, help="folder for bayesopt_runs.json and the regret plots")
    parser.add_argument("--results", default=None, help="a results file (docs/results.json) to record the median regrets in")
    parser.add_argument("--from-runs", nargs="+", default=None,
                        help="summarize the runs of earlier --out folders (their bayesopt_runs.json) instead of running; a run of a "
                             "later file replaces the same problem, method, seed and arm of an earlier one")
    parser.add_argument("--markdown", action="store_true", help="also print the regret and cost tables in Markdown (docs/bayesopt.md)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--problem", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--budget", help=argparse.SUPPRESS)
    parser.add_argument("--cold-refits", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.from_runs:
        return finish(*merged_runs(args.from_runs), args=args)
    if args.quick and args.regimes:
        parser.error("--quick and --regimes are two budgets: give one")
    if args.first_seed < 0:
        parser.error(f"--first-seed must be at least 0, got {args.first_seed}")
    budget = "quick" if args.quick else "full"
    settings = dict(QUICK if args.quick else REGIME if args.regimes else FULL)
    for key in ("problems", "seeds", "steps"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if args.raw_samples is not None:
        settings["raw_samples"] = args.raw_samples
    if args.activations is not None:
        settings["activations"] = list(dict.fromkeys(args.activations))
    settings["first_seed"] = args.first_seed
    seeds = range(args.first_seed, args.first_seed + settings["seeds"])
    pyrobnn_methods = [m for m in args.methods if m not in BASELINES]  # those with a warm refit
    jobs = [(p, m, s, False) for p in settings["problems"] for m in args.methods for s in seeds]
    if args.cold_arm is not None:
        cold_problems = args.cold_arm or settings["problems"][:1]
        unknown = [p for p in cold_problems if p not in settings["problems"]]
        if unknown:
            parser.error(f"--cold-arm names problems not run: {', '.join(unknown)} (the problems: {', '.join(settings['problems'])})")
        jobs += [(p, m, s, True) for p in cold_problems for m in pyrobnn_methods for s in seeds]
    command = ("python benchmarks/bayesopt.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    print(f"Bayesian optimization: {len(jobs)} runs ({budget}: {json.dumps(settings)}), {args.jobs} at once", flush=True)
    started = time.perf_counter()
    records, running = [], []
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    queue = list(jobs)
    while queue or running:
        while queue and len(running) < args.jobs:
            job = queue.pop(0)
            running.append((job, launch(*job[:3], settings, budget, job[3], threads)))
        time.sleep(0.2)
        for item in list(running):
            job, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            out = proc.stdout.read()
            lines = [line for line in out.splitlines() if line.startswith("RECORD ")]
            record = json.loads(lines[-1][7:]) if lines else dict(problem=job[0], method=job[1], seed=job[2], cold_refits=job[3],
                                                                  error=f"the run's process exited {proc.returncode} without a record")
            records.append(record)
            if args.out:  # after every run, so that an interrupted benchmark keeps what it measured
                os.makedirs(args.out, exist_ok=True)
                write_json(os.path.join(args.out, "bayesopt_runs.json"),
                           dict(settings=settings, budget=budget, methods=args.methods, command=command, records=records))
            tag = " (cold refits)" if job[3] else ""
            if record.get("error"):
                print(f"  {job[0]:10s} {job[1]:17s} seed {job[2]}{tag}: {record['error']}", flush=True)
            else:
                print(f"  {job[0]:10s} {job[1]:17s} seed {job[2]}{tag}: log10 regret {record['log10_regret'][-1]:+.2f}, "
                      f"fit {sum(record['fit_seconds']):.1f} s, acquisition {sum(record['acq_seconds']):.1f} s", flush=True)
    print(f"{time.perf_counter() - started:.0f} s in all")
    finish(records, settings, args.methods, command, budget, args=args)


def merged_runs(paths):
    """The records of several saved runs (``bayesopt_runs.json`` files) as one: later files
    replace an earlier file's run of the same problem, method, seed and arm; the settings must
    agree (the problems and seeds aside: files of other seeds add theirs). The merged settings'
    ``seeds`` is the largest number of seeds any (problem, method) ran.
    Returns ``(records, settings, methods, command, budget)``."""
    runs, settings, methods, commands, budget = {}, None, [], [], None
    for path in paths:
        with open(path) as fh:
            saved = json.load(fh)
        these = {k: v for k, v in saved["settings"].items() if k not in SEED_SETTINGS}
        if settings is not None and these != {k: v for k, v in settings.items() if k not in SEED_SETTINGS}:
            raise ValueError(f"{path} was run with other settings ({these}) than the files before it ({settings})")
        if settings is None:
            settings, budget = dict(saved["settings"]), saved["budget"]
        settings["problems"] = list(dict.fromkeys(settings["problems"] + saved["settings"]["problems"]))
        methods += [m for m in saved.get("methods", METHODS) if m not in methods]
        commands.append(saved.get("command", "python benchmarks/bayesopt.py"))
        for record in saved["records"]:
            runs[(record["problem"], record["method"], record["seed"], bool(record.get("cold_refits")))] = record
    methods = [m for m in METHODS + list(LAPLACE_FORMS) if m in methods]
    seeds = {}
    for problem, method, seed, cold in runs:
        seeds.setdefault((problem, method, cold), set()).add(seed)
    settings["seeds"] = max((len(s) for s in seeds.values()), default=0)
    settings["first_seed"] = min((seed for _, _, seed, _ in runs), default=0)
    return list(runs.values()), settings, methods, "; ".join(dict.fromkeys(commands)), budget


def finish(records, settings, methods, command, budget, *, args):
    """The tables and the JSON line; with ``--out`` the runs and the plots, with ``--results``
    the median regrets recorded in a results file."""
    summary = summarize(records, settings, methods)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "bayesopt_runs.json")
        write_json(path, dict(settings=settings, budget=budget, methods=methods, command=command, records=records))
        plot(records, settings, args.out)
    if args.results:
        record_results(args.results, summary, settings, command)
    if args.markdown:
        print(markdown_tables(summary, methods))
    print(json.dumps(summary))


def write_json(path, obj):
    """``obj`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


def markdown_tables(summary, methods):
    """The regret and cost tables of docs/bayesopt.md: median log10 regret [min, max] with the
    number of seeds where fewer ran than asked, and seconds per step with peak memory."""
    problems = list(summary["regret"])
    asked = summary["settings"]["seeds"]
    head = "| method | " + " | ".join(problems) + " |\n|---|" + "---|" * len(problems)
    rows, costs = [head], [head]
    for m in methods:
        cells, cost = [], []
        for p in problems:
            value = summary["regret"][p].get(m)
            if value is None:
                cells.append("not run")
                cost.append("")
                continue
            runs = summary["seeds_run"][p][m]
            low, high = summary["regret_spread"][p][m]
            cells.append(f"{value:+.2f} [{low:+.2f}, {high:+.2f}]" + (f" ({runs} seeds)" if runs < asked else ""))
            sec = summary["seconds_per_step"][m][p]
            cost.append(f"{sec['fit']:.1f} + {sec['acquisition']:.1f} s, {summary['peak_memory_mb'][m][p]:.0f} MB")
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
        costs.append(f"| {m} | " + " | ".join(cost) + " |")
    return "\n".join(rows) + "\n\n" + "\n".join(costs)


def record_results(path, summary, settings, command):
    """The median final regrets as ``docs/results.json`` entries (``name`` "Bayesian optimization,
    <problem>", ``metric`` "median log10 simple regret, <method>"), replacing those of an earlier
    run; no paper publishes these settings, so ``published`` is ``None``."""
    entries = []
    if os.path.exists(path):
        with open(path) as fh:
            entries = json.load(fh)
    fresh = []
    for problem, row in summary["regret"].items():
        for method, value in row.items():
            if value is None:
                continue
            spread = summary["regret_spread"][problem][method]
            fresh.append(dict(
                name=f"Bayesian optimization, {problem}", metric=f"median log10 simple regret, {method}", value=value,
                published=None, command=command, seeds=summary["seeds_run"][problem][method], range_over_seeds=spread,
                evaluations=settings["n_init"] + settings["steps"] * settings["q"],
            ))
    keys = {(e["name"], e["metric"]) for e in fresh}
    entries = [e for e in entries if (e["name"], e["metric"]) not in keys] + fresh
    write_json(path, entries)


def summarize(records, settings, methods):
    ok = [r for r in records if not r.get("error")]
    regret, spread, seconds, memory, speedup, cold_arm, seeds_run = {}, {}, {}, {}, {}, {}, {}
    method_speedup = {}  # the same without the prior's calibration
    for p in settings["problems"]:
        print(f"\n{p}: median log10 simple regret after {settings['n_init'] + settings['steps'] * settings['q']} evaluations "
              f"[min, max over {settings['seeds']} seeds]; seconds per step (fit + acquisition); peak memory")
        regret[p], spread[p] = {}, {}
        for m in methods:
            runs = [r for r in ok if r["problem"] == p and r["method"] == m and not r["cold_refits"]]
            failed = [r for r in records if r["problem"] == p and r["method"] == m and r.get("error")]
            if not runs:
                reason = failed[0]["error"] if failed else "not run"
                regret[p][m] = None
                print(f"  {m:17s} did not run: {reason}")
                continue
            finals = [r["log10_regret"][-1] for r in runs]
            seeds_run.setdefault(p, {})[m] = len(runs)
            regret[p][m] = round(median(finals), 3)
            spread[p][m] = [round(min(finals), 3), round(max(finals), 3)]
            fit = median([median(r["fit_seconds"]) for r in runs])
            acq = median([median(r["acq_seconds"]) for r in runs])
            mem = max(r["peak_memory_mb"] for r in runs)
            seconds.setdefault(m, {})[p] = {"fit": round(fit, 3), "acquisition": round(acq, 3)}
            memory.setdefault(m, {})[p] = round(mem, 1)
            print(f"  {m:17s} {regret[p][m]:+7.2f} [{spread[p][m][0]:+.2f}, {spread[p][m][1]:+.2f}]   "
                  f"{fit:7.2f} + {acq:6.2f} s   {mem:7.1f} MB" + (f"   ({len(failed)} runs failed)" if failed else ""))
            warm = [(r["cold_fit_seconds_same_data"], median(r["warm_fit_seconds"])) for r in runs
                    if r.get("warm_fit_seconds") and r.get("cold_fit_seconds_same_data")]
            if warm:
                speedup.setdefault(m, []).extend(c / w for c, w in warm)
            own = [(r["cold_method_seconds_same_data"], median(r["warm_method_seconds"])) for r in runs
                   if r.get("warm_method_seconds") and r.get("cold_method_seconds_same_data")]
            if own:
                method_speedup.setdefault(m, []).extend(c / w for c, w in own)
        cold_runs = [r for r in ok if r["problem"] == p and r["cold_refits"]]
        for m in sorted({r["method"] for r in cold_runs}):
            finals = [r["log10_regret"][-1] for r in cold_runs if r["method"] == m]
            cold_arm.setdefault(p, {})[m] = {"cold": round(median(finals), 3), "warm": regret[p].get(m),
                                             "cold_spread": [round(min(finals), 3), round(max(finals), 3)]}
    print("\nwarm refit: cold-fit seconds over warm-refit seconds on the same data (median over runs); without the prior's "
          "calibration, which both pay")
    warm_refit_speedup, warm_refit_speedup_method = {}, {}
    for m, values in speedup.items():
        warm_refit_speedup[m] = round(median(values), 2)
        warm_refit_speedup_method[m] = round(median(method_speedup[m]), 2) if m in method_speedup else None
        own = f"   {warm_refit_speedup_method[m]:.1f}x" if warm_refit_speedup_method[m] is not None else ""
        print(f"  {m:17s} {warm_refit_speedup[m]:.1f}x{own}")
    for m in methods:
        if m not in BASELINES + GP_FITTED and m not in warm_refit_speedup:
            warm_refit_speedup[m] = warm_refit_speedup_method[m] = None
            ran = any(r["method"] == m for r in ok)
            print(f"  {m:17s} " + ("refits cold (no warm start for this method)" if ran else "not run"))
    if cold_arm:
        print("\nfinal regret, warm refits against cold refits (median log10 regret)")
        for p, rows in cold_arm.items():
            for m, row in rows.items():
                print(f"  {p} {m:17s} warm {row['warm']:+.2f}  cold {row['cold']:+.2f} [{row['cold_spread'][0]:+.2f}, {row['cold_spread'][1]:+.2f}]")
    paired = against_random_by_seed(ok, settings, methods)
    if paired:
        print("\nagainst random search seed by seed (each seed's runs start from the same design): runs ending below / above "
              "random search's regret, ties, two-sided sign test")
        for p, rows in paired.items():
            for m, row in rows.items():
                print(f"  {p:15s} {m:17s} {row['better']:3d} / {row['worse']:<3d} ties {row['ties']}   p = {row['sign_test_p']:.3f}")
    lb = [r for r in records if r["method"] == "laplace_bayesopt"]
    lb_errors = sorted({r["error"] for r in lb if r.get("error")})
    checks = acceptance(regret, spread, warm_refit_speedup, seconds, memory, methods)
    print("\nchecks (issue 45's targets, as measured here: medians over the seeds)")
    for line, ok in checks:
        print(f"  [{'yes' if ok else ' no'}] {line}")
    return dict(regret=regret, regret_spread=spread, seeds_run=seeds_run, warm_refit_speedup=warm_refit_speedup,
                warm_refit_speedup_method=warm_refit_speedup_method, seconds_per_step=seconds,
                peak_memory_mb=memory, cold_arm=cold_arm, laplace_bayesopt=lb_errors[0] if lb_errors else ("ran" if lb else "not run"),
                against_random_by_seed=paired, checks={line: ok for line, ok in checks}, settings=settings)


def sign_test_p(better: int, worse: int) -> float:
    """The two-sided sign test's p-value for ``better`` of ``better + worse`` paired comparisons
    (ties left out): scipy's exact binomial test at probability 1/2; 1 with no comparisons."""
    from scipy.stats import binomtest

    return 1.0 if better + worse == 0 else float(binomtest(better, better + worse, 0.5).pvalue)


def against_random_by_seed(runs, settings, methods) -> dict:
    """Each method's final regret against random search's in the same seed, where both ran (the
    seed fixes the initial Sobol design every method starts from): ``{problem: {method: {better,
    worse, ties, sign_test_p}}}``. Medians of two wide distributions can order them one way while
    the paired runs order them the other (docs/bayesopt.md, the regimes over 15 seeds)."""
    final = {(r["problem"], r["method"], r["seed"]): r["log10_regret"][-1] for r in runs if not r["cold_refits"]}
    out = {}
    for p in settings["problems"]:
        for m in methods:
            if m == "random":
                continue
            pairs = [(v, final[p, "random", s]) for (pp, mm, s), v in final.items() if (pp, mm) == (p, m) and (p, "random", s) in final]
            if not pairs:
                continue
            better, worse = sum(a < b for a, b in pairs), sum(a > b for a, b in pairs)
            out.setdefault(p, {})[m] = dict(better=better, worse=worse, ties=len(pairs) - better - worse,
                                            sign_test_p=round(sign_test_p(better, worse), 4))
    return out


def acceptance(regret, spread, speedup, seconds, memory, methods):
    """``(statement, holds)`` for each of issue 45's targets, read from this run's medians: every
    pyrobnn surrogate ahead of random search on every problem; on every problem a finite BNN
    within the GP's range over seeds, and ahead of the GP's median on at least two; a BNN step at
    most 3x a GP step; warm refits; our Laplace against laplace-bayesopt where both ran."""
    out = []
    problems = list(regret)
    ours = [m for m in methods if m not in BASELINES]
    bnns = [m for m in ours if m not in GP_FITTED]
    for m in ours:
        rows = [(p, regret[p].get(m), regret[p].get("random")) for p in problems]
        rows = [(p, a, b) for p, a, b in rows if a is not None and b is not None]
        if rows:
            behind = [p for p, a, b in rows if a >= b]
            out.append((f"{m}: ahead of random search on {len(rows) - len(behind)} of {len(rows)} problems"
                        + (f" (not {', '.join(behind)})" if behind else ""), not behind))
    for p in problems:
        if regret[p].get("gp") is not None and regret[p].get("random") is not None:
            out.append((f"GP ahead of random search on {p}", regret[p]["gp"] < regret[p]["random"]))
    ahead = []
    for p in problems:
        mine = {m: regret[p][m] for m in bnns if regret[p].get(m) is not None}
        if not mine or regret[p].get("gp") is None:
            continue
        best = min(mine, key=mine.get)
        worst_gp = spread[p]["gp"][1]
        out.append((f"{p}: best finite BNN ({best}, {mine[best]:+.2f}) within the GP's range over seeds (up to {worst_gp:+.2f})",
                    mine[best] <= worst_gp))
        if mine[best] < regret[p]["gp"]:
            ahead.append(f"{p} ({best})")
    if any(regret[p].get("gp") is not None for p in problems):
        out.append((f"a finite BNN ahead of the GP's median on {len(ahead)} problems (at least 2): {', '.join(ahead) or 'none'}", len(ahead) >= 2))
    for m in ours:
        ratios = {p: sum(seconds[m][p].values()) / sum(seconds["gp"][p].values()) for p in problems
                  if p in seconds.get(m, {}) and p in seconds.get("gp", {}) and sum(seconds["gp"][p].values()) > 0}
        if ratios:
            worst = max(ratios, key=ratios.get)
            out.append((f"{m}: a step at most 3x the GP's (at worst {ratios[worst]:.1f}x, {worst}; each surrogate's seconds from its own runs, "
                        "which may have run under different loads: bo_step_cost.py times them side by side)", ratios[worst] <= 3))
    for m, value in speedup.items():
        if value is not None:
            out.append((f"{m}: a warm refit {value:.1f}x faster than a cold fit (at least 3x)", value >= 3))
    for p in problems:
        a, b = regret[p].get("laplace"), regret[p].get("laplace_bayesopt")
        if a is None or b is None:
            continue
        t_a = sum(seconds["laplace"][p].values())
        t_b = sum(seconds["laplace_bayesopt"][p].values())
        out.append((f"{p}: our Laplace {a:+.2f} against laplace-bayesopt {b:+.2f}; {t_a:.1f} s against {t_b:.1f} s per step; "
                    f"{memory['laplace'][p]:.0f} MB against {memory['laplace_bayesopt'][p]:.0f} MB",
                    a <= b and t_a < t_b and memory["laplace"][p] < memory["laplace_bayesopt"][p]))
    return out


def plot(records, settings, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if not r.get("error") and not r["cold_refits"]]
    for p in settings["problems"]:
        fig, ax = plt.subplots(figsize=(5, 3.4))
        for m in sorted({r["method"] for r in ok if r["problem"] == p}):
            runs = [r for r in ok if r["problem"] == p and r["method"] == m]
            curves = torch.tensor([r["log10_regret"] for r in runs])
            evals = runs[0]["evaluations"]
            (line,) = ax.plot(evals, curves.median(0).values, label=m, linestyle="--" if m in ("random", "gp", "laplace_bayesopt") else "-")
            ax.fill_between(evals, curves.min(0).values, curves.max(0).values, alpha=0.10, color=line.get_color())
        ax.set_xlabel("function evaluations")
        ax.set_ylabel("log10 simple regret")
        ax.set_title(f"{p}: median and range over {settings['seeds']} seeds")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"bayesopt_{p}.png"), dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    main()
