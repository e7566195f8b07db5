"""What the calibration costs at each step of a BO loop: the seconds, L-BFGS-B's evaluations of
the marginal likelihood and the objective it reaches, for the fit every default surrogate makes
(:func:`pyrobnn.integrations.infinite_width_gp.calibration_fit`, cold at the first step and warm
from the step before after it).

    python benchmarks/bo_calibration_steps.py                       # Branin, Rosenbrock-5, Levy-4, Hartmann-6; 2 designs
    python benchmarks/bo_calibration_steps.py --problems levy20 --designs 1

Per problem and design: ``n_init`` scrambled Sobol points (the BO benchmark's 10), then ``steps``
steps that each add ``q`` points of a second Sobol sequence (the same for any code, so that two
versions of the library see the same data: run this at each and compare the objectives step by
step) and refit the calibration on the standardized outcomes. The evaluations are the calls of
BoTorch's batched L-BFGS-B to its objective (one call evaluates every batch element: activations, input-scale shapes
and starts), counted by wrapping ``botorch.optim.batched_lbfgs_b.fmin_l_bfgs_b_batched``; the
objective is the kept fit's (``infinite_width_fits``: log marginal likelihood plus the log
hyperprior densities, nats). One torch and one BLAS thread, as ``bayesopt.py``'s runs. The last
line is one JSON object with every step's record.
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

from bo_problems import problem, single_objective  # noqa: E402


def counting_lbfgs():
    """Wrap BoTorch's batched L-BFGS-B so that its objective's calls are counted; returns the
    counter (a one-element list)."""
    import botorch.optim.batched_lbfgs_b as batched

    calls, original = [0], batched.fmin_l_bfgs_b_batched

    def counted(func, x0, **kwargs):
        def objective(*args, **kw):
            calls[0] += 1
            return func(*args, **kw)

        return original(objective, x0, **kwargs)

    batched.fmin_l_bfgs_b_batched = counted
    return calls


def run(name, design, n_init, q, steps, calls):
    from torch.quasirandom import SobolEngine

    from pyrobnn.integrations.infinite_width_gp import calibration_fit

    p = problem(name)
    X = SobolEngine(p.d, scramble=True, seed=design).draw(n_init).to(torch.float64)
    Y = p.f(X)
    more = SobolEngine(p.d, scramble=True, seed=10_000 + design)
    fit, records = None, []
    for step in range(steps + 1):
        if step:
            new = more.draw(q).to(torch.float64)
            X, Y = torch.cat([X, new]), torch.cat([Y, p.f(new)])
        calls[0] = 0
        t0 = time.perf_counter()
        fit = calibration_fit(X, (Y - Y.mean()) / Y.std(), warm_start=fit)
        seconds = time.perf_counter() - t0
        best = max(fit.infinite_width_fits, key=lambda key: fit.infinite_width_fits[key]["objective"])
        records.append(dict(n=X.shape[0], warm=step > 0, seconds=seconds, evaluations=calls[0],
                            objective=fit.infinite_width_fits[best]["objective"], noise=float(fit.likelihood.noise.detach().max())))
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", default=["branin", "rosenbrock5", "levy4", "hartmann6"])
    parser.add_argument("--designs", type=int, default=2, help="Sobol designs (seeds 0, 1, ...) per problem")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    known = single_objective()
    unknown = [p for p in args.problems if p not in known]
    if unknown:
        parser.error(f"--problems: {unknown} are not single-objective problems of bo_problems.py; choose from {' '.join(known)}")
    if args.designs < 1 or args.steps < 1:
        parser.error(f"--designs and --steps must be at least 1, got {args.designs} and {args.steps}")
    from threadpoolctl import threadpool_limits

    warnings.filterwarnings("ignore")  # BoTorch's input-scaling warnings at these sizes
    torch.set_num_threads(1)
    calls = counting_lbfgs()
    out = []
    with threadpool_limits(1):
        for name in args.problems:
            for design in range(args.designs):
                records = run(name, design, n_init=10, q=4, steps=args.steps, calls=calls)
                out.append(dict(problem=name, design=design, steps=records))
                warm = records[1:]
                print(f"{name:>12} design {design}: cold {records[0]['seconds']:.2f} s, {records[0]['evaluations']} evaluations; "
                      f"warm (median over {len(warm)} steps) {statistics.median(r['seconds'] for r in warm):.3f} s, "
                      f"{statistics.median(r['evaluations'] for r in warm):.0f} evaluations", flush=True)
    print(json.dumps(dict(settings=vars(args), runs=out)))


if __name__ == "__main__":
    main()
