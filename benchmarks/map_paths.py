"""A full-batch MAP's training on the native kernels against torch's autograd: seconds per
AdamW step and peak memory, for the runs a Bayesian-optimization surrogate makes.

    python benchmarks/map_paths.py            # about a minute
    python benchmarks/map_paths.py --quick    # fewer steps and rounds

``deep_ensemble`` takes the native kernels for a full-batch ``objective="map"`` or
``"anchored"`` of a network they take (``backend="auto"``; :func:`pyrobnn.infer.modes.ensemble.gradient_path`)
and torch's autograd otherwise (``backend="eager"``). The runs: the network ``calibrated_model``
gives for 5-D Rosenbrock at 30 and 42 Sobol points (50-50 erf units behind a fixed input map, a
constant output offset, float64: the surrogates' network at a BO run's refit sizes), trained as
Laplace's and SWAG's MAP (one member, ``"map"``) and as the deep ensemble (8 members,
``"anchored"``), for ``--steps`` epochs of one full batch each with the surrogates' learning rate.
Per run and path, in a fresh child process each: the best of ``--rounds`` rounds' seconds of
one ``deep_ensemble`` call divided by its steps (its set-up included: what a warm refit of that
many steps costs per step), the ratio of torch's to the native's, and the child's peak resident memory (``getrusage``;
the native kernels allocate outside torch's allocator, so its own counters would miss them; both
children make the same imports and fits before the runs, so the difference is the paths'). One
torch thread (``--threads``), as the BO benchmarks. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from torch.quasirandom import SobolEngine
from botorch.test_functions import Rosenbrock
from pyrobnn.infer.modes.ensemble import deep_ensemble
from pyrobnn.integrations.infinite_width_gp import calibrated_model

n, members, objective, backend, steps, rounds, threads = json.loads(sys.argv[1])
torch.set_num_threads(threads)
X = SobolEngine(5, scramble=True, seed=0).draw(n).to(torch.float64)
y = Rosenbrock(dim=5)(X)
y = (y - y.mean()) / y.std()
model = calibrated_model(X, y.unsqueeze(-1))
options = dict(num_members=members, objective=objective, lr=1e-2, batch_size=None, patience=10**6, progress=False, backend=backend)
deep_ensemble(model, X, y, max_epochs=2, **options)  # the library loaded, the allocator warm
best = float("inf")
for _ in range(rounds):
    t0 = time.perf_counter()
    result = deep_ensemble(model, X, y, max_epochs=steps, **options)
    best = min(best, (time.perf_counter() - t0) / steps)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
print(json.dumps(dict(seconds_per_step=best, peak_rss_mb=peak, path=result.stats["path"])))
"""


def measure(n, members, objective, backend, steps, rounds, threads) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([n, members, objective, backend, steps, rounds, threads])],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 steps, 2 rounds")
    parser.add_argument("--steps", type=int, default=250, help="AdamW steps per round (a warm refit's 250)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 50, 2
    if args.steps < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--steps, --rounds and --threads must be at least 1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    runs = []
    print(f"{'run':<34} {'torch ms/step':>14} {'native ms/step':>15} {'ratio':>7} {'peak RSS, torch; native (MB)':>30}")
    for n in (30, 42):
        for members, objective, what in ((1, "map", "Laplace's and SWAG's MAP"), (8, "anchored", "the deep ensemble")):
            eager = measure(n, members, objective, "eager", args.steps, args.rounds, args.threads)
            native = measure(n, members, objective, "auto", args.steps, args.rounds, args.threads)
            if native["path"] != "native":
                raise SystemExit(f"backend='auto' took the {native['path']} path for {what}: the native kernels are not available here")
            ratio = eager["seconds_per_step"] / native["seconds_per_step"]
            label = f"{what}, n = {n}"
            print(f"{label:<34} {1e3 * eager['seconds_per_step']:>14.3f} {1e3 * native['seconds_per_step']:>15.3f} {ratio:>6.1f}x "
                  f"{eager['peak_rss_mb']:>18.0f}; {native['peak_rss_mb']:.0f}", flush=True)
            runs.append(dict(n=n, members=members, objective=objective, eager=eager, native=native, ratio=ratio))
    print(json.dumps(dict(settings=vars(args), runs=runs)))


if __name__ == "__main__":
    main()
