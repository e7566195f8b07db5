"""Which input scales the finite networks' prior should have below ten points per feature (one per
feature, ARD, or one shared), and which criterion finds it: the evidence for
:func:`pyrobnn.integrations.infinite_width_gp.calibration_fit`'s rule.

    python benchmarks/bo_input_scales.py                                   # Hartmann-6 (development), minutes
    python benchmarks/bo_input_scales.py --problems branin_embed40        # Branin in 40-D (a regime), tens of minutes

Per problem and design (the first ``n`` of a scrambled Sobol sequence, for each of ``--sizes``;
outcomes standardized at each ``n``, as a BO surrogate's are), ``calibration_fit`` with each shape:
the held-out NLL per point of its GP (noise included) at 500 uniform points (the points
``bo_calibration.py`` tests on), and the choice each criterion makes:

- **Schwarz**: the fitted objective (log marginal likelihood plus log hyperprior density) less
  :math:`(d - 1)/2 \\log n` for ARD's extra scales (``infinite_width_gp``'s rule);
- **LOO**: the leave-one-out log predictive density at the fitted scales (Rasmussen & Williams
  2006, eq. 5.12: :math:`\\log p(y_i \\mid y_{-i}) = -\\tfrac12 \\log(2\\pi/[K^{-1}]_{ii}) - [K^{-1} y]_i^2 / 2[K^{-1}]_{ii}`);
- **prequential** (``calibration_fit``'s default): the log predictive density each shape's
  previous fit gave the points added since, summed over the sizes (``calibration_fit`` refitted
  from the previous size's fit, as in a BO loop; at the first size a tie, one shared scale).

A criterion is right where it picks the shape with the lower held-out NLL. Sizes at or above
``ARD_POINTS_PER_FEATURE`` points per feature are ARD by rule, whatever the criteria say. The
last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bo_calibration import N_TEST, scores  # noqa: E402
from bo_problems import DEVELOPMENT, HELD_OUT, REGIMES, problem  # noqa: E402


def leave_one_out(gp) -> float:
    """The sum of the leave-one-out log predictive densities of ``gp``'s training outcomes at its
    fitted hyperparameters (every outcome's)."""
    gp.train()
    with torch.no_grad():
        prior = gp.likelihood(gp(*gp.train_inputs))
        inverse = torch.cholesky_inverse(torch.linalg.cholesky(prior.covariance_matrix))
        alpha = (inverse @ (gp.train_targets - prior.mean).unsqueeze(-1)).squeeze(-1)
        precision = inverse.diagonal(dim1=-2, dim2=-1)
        value = float((-0.5 * torch.log(2 * math.pi / precision) - 0.5 * alpha**2 / precision).sum())
    gp.eval()
    return value


def objective(gp, ard) -> float:
    """The fitted objective of ``gp``'s shape ``ard`` (its best activation's)."""
    return max(fit["objective"] for (_, shape), fit in gp.infinite_width_fits.items() if shape == ard)


def main(argv=None):
    from torch.quasirandom import SobolEngine

    from pyrobnn.integrations.infinite_width_gp import ARD_POINTS_PER_FEATURE, calibration_fit

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", default=["hartmann6"], choices=DEVELOPMENT + HELD_OUT + REGIMES[:2])
    parser.add_argument("--sizes", nargs="+", type=int, default=[20, 30, 42, 60, 100])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.seeds < 1 or min(args.sizes) < 2 or args.sizes != sorted(set(args.sizes)):
        parser.error("--seeds must be >= 1 and --sizes increasing, each >= 2")
    torch.set_num_threads(1)
    cases = []
    for name in args.problems:
        p = problem(name)
        for seed in range(args.seeds):
            g = torch.Generator(device="cpu").manual_seed(1000 + seed)
            X_test = torch.rand(N_TEST, p.d, generator=g, dtype=torch.float64, device="cpu")
            Y_test = p.f(X_test)
            X = SobolEngine(p.d, scramble=True, seed=seed).draw(max(args.sizes)).to(torch.float64)
            Y = p.f(X)
            previous = None
            for n in args.sizes:
                start = time.perf_counter()
                mu, sd = Y[:n].mean(0), Y[:n].std(0)
                y = (Y[:n] - mu) / sd
                fits = {ard: calibration_fit(X[:n], y, ard=ard) for ard in (False, True)}
                nll = {ard: scores(gp, X_test, (Y_test - mu) / sd, 0.0, 1.0)[0] for ard, gp in fits.items()}  # the GP is in standardized units
                loo = {ard: leave_one_out(gp) for ard, gp in fits.items()}
                gain = objective(fits[True], True) - objective(fits[False], False)
                penalty = (p.d - 1) / 2 * math.log(n)
                below = n < ARD_POINTS_PER_FEATURE * p.d
                case = dict(problem=name, seed=seed, n=n, below_rule=below, nll_shared=nll[False], nll_ard=nll[True],
                            loo_shared=loo[False], loo_ard=loo[True], objective_gain=gain, schwarz_penalty=penalty,
                            better_ard=nll[True] < nll[False], schwarz_ard=gain > penalty, loo_ard_choice=loo[True] > loo[False])
                if below:  # the rule's own choice, refitted from the previous size's fit
                    previous = calibration_fit(X[:n], y, warm_start=previous)
                    case["prequential_ard"] = bool(previous.covar_module.ard)
                    case["prequential_scores"] = {"shared": previous.shape_scores[False], "ard": previous.shape_scores[True]}
                cases.append(case)
                mark = {True: "ARD", False: "shared", None: "-"}
                print(f"{name:>15} seed {seed} n={n:<4} held-out NLL shared {nll[False]:7.3f} ARD {nll[True]:7.3f}   "
                      f"Schwarz {mark[case['schwarz_ard']]:>6}  LOO {mark[case['loo_ard_choice']]:>6}  "
                      f"prequential {mark[case.get('prequential_ard')]:>6}  ({time.perf_counter() - start:.0f} s)", flush=True)
    summary = {}
    for criterion in ("schwarz_ard", "loo_ard_choice", "prequential_ard"):
        judged = [c for c in cases if c["below_rule"] and criterion in c]
        summary[criterion] = dict(cases=len(judged), right=sum(c[criterion] == c["better_ard"] for c in judged),
                                  chose_ard=sum(c[criterion] for c in judged))
    print("summary (below the rule's points per feature): " + ", ".join(f"{k}: right in {v['right']} of {v['cases']}" for k, v in summary.items()))
    print(json.dumps(dict(command="python benchmarks/bo_input_scales.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                          cases=cases, summary=summary)))


if __name__ == "__main__":
    main()
