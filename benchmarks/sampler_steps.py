"""The cost of one sampler step, all of it: an MCLMC step (its noise, the native step, the
kernel's bookkeeping) and a NUTS transition, in microseconds per chain, on the Bayesian-
optimization surrogates' network, today's code beside a git revision's.

    python benchmarks/sampler_steps.py                      # today's code alone
    python benchmarks/sampler_steps.py --against HEAD~3     # beside the code at HEAD~3, in turns
    python benchmarks/sampler_steps.py --dtypes float64 float32   # the chains in float64 (the network's) and in float32

``leaf_speed.py`` times the potential's gradient alone; a sampler's step also draws its noise,
updates its velocity and checks what it made, and those are what this times: ``mclmc`` and
``nuts`` (:func:`pyrobnn.mclmc`, :func:`pyrobnn.nuts`) with 4 chains on the surrogates' network
(``leaf_speed.py``'s: 50-50 erf units behind a fixed input map, a constant output offset,
float64) at a BO run's sizes, 30 points in 2-D and 42 in 6-D, the chains started at prior draws.
Each figure is a run's sampling time less the same run with a tenth of its steps, over the
steps between: the tuning and the run's set-up cancel. ``--against REV`` checks ``REV`` out
into a temporary git worktree and runs the same measurement in a child process with that
worktree's ``pyrobnn`` first on its path, the two codes taking turns round by round (each the
best of ``--rounds``), so that a change of load reaches both. One thread each (``--threads``).
``--dtypes``: the chains' dtypes (the samplers' ``dtype``; ``float32`` runs them on a float32
copy of the float64 network: a code before 2026-12-07 has no such option). The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from leaf_speed import surrogate_network  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: (label, input dimension, points): the surrogates' network at a BO run's sizes
SIZES = (("2-50-50-1 erf, N=30", 2, 30), ("6-50-50-1 erf, N=42", 6, 42))


def run_seconds(sampler, model, x, y, steps, dtype="float64"):
    """Seconds of one run with ``steps`` sampling steps (transitions) after a short tuning, the
    chains in ``dtype`` (the float64 network's own unless ``"float32"``)."""
    import pyrobnn

    chains = {} if dtype == "float64" else dict(dtype=getattr(torch, dtype))
    start = time.perf_counter()
    if sampler == "mclmc":
        pyrobnn.mclmc(model, x, y, num_samples=steps, num_warmup=(50, 10, 10), thinning=1, num_chains=4, init="prior", progress=False,
                      **chains)
    else:
        pyrobnn.nuts(model, x, y, num_samples=steps, num_warmup=20, num_chains=4, max_tree_depth=6, init="prior", progress=False, **chains)
    return time.perf_counter() - start


def measure(steps, dtypes=("float64",)):
    """``{label: microseconds per chain and step}`` for this process's ``pyrobnn``, the chains
    in each of ``dtypes``."""
    out = {}
    for label, d, n in SIZES:
        g = torch.Generator().manual_seed(0)
        x = torch.rand(n, d, generator=g, dtype=torch.float64)
        y = torch.randn(n, generator=g, dtype=torch.float64)
        model = surrogate_network(d)
        for dtype in dtypes:
            for sampler, count in (("mclmc", steps), ("nuts", max(10, steps // 40))):
                run_seconds(sampler, model, x, y, max(1, count // 10), dtype)  # builds and loads the kernels
                long, short = run_seconds(sampler, model, x, y, count, dtype), run_seconds(sampler, model, x, y, max(1, count // 10), dtype)
                out[f"{sampler}, {label}, chains in {dtype}"] = (long - short) / (count - max(1, count // 10)) / 4 * 1e6
    return out


def child(steps, dtypes):
    print(json.dumps(measure(steps, dtypes)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", metavar="REV", default=None, help="also time the code at this git revision")
    parser.add_argument("--steps", type=int, default=2000, help="MCLMC steps per run (NUTS: a 40th of them)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", nargs="+", choices=["float64", "float32"], default=["float64"], help="the chains' dtypes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 20 or args.rounds < 1 or args.threads < 1:
        parser.error(f"--steps must be at least 20 (a figure is a run's time less a tenth of it), --rounds and --threads at "
                     f"least 1; got {args.steps}, {args.rounds}, {args.threads}")
    if args.against and subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.against}^{{commit}}"], cwd=ROOT,
                                       capture_output=True).returncode != 0:
        parser.error(f"--against: {args.against!r} is no git revision of this checkout")
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.steps, args.dtypes)
        return
    worktree = None
    if args.against:
        worktree = tempfile.mkdtemp(prefix="pyrobnn-against-")
        subprocess.run(["git", "worktree", "add", "--detach", worktree, args.against], cwd=ROOT, check=True, capture_output=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    codes = {"today": (env, ROOT)}
    if worktree:
        codes[args.against] = (dict(env, PYTHONPATH=worktree + os.pathsep + env.get("PYTHONPATH", "")), worktree)
    best = {}
    try:
        for _ in range(args.rounds):
            for name, (child_env, _) in codes.items():
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--steps", str(args.steps),
                                       "--threads", str(args.threads), "--dtypes", *args.dtypes], env=child_env, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                for key, value in row.items():
                    best[(name, key)] = min(best.get((name, key), float("inf")), value)
    finally:
        if worktree:
            subprocess.run(["git", "worktree", "remove", "--force", worktree], cwd=ROOT, capture_output=True)
    keys = sorted({key for _, key in best})
    print(f"microseconds per chain and step (best of {args.rounds} rounds, {args.threads} thread(s)):")
    for key in keys:
        line = f"  {key:>32}: " + ", ".join(f"{name} {best[(name, key)]:8.1f}" for name in codes)
        if args.against:
            line += f"   {args.against} / today {best[(args.against, key)] / best[('today', key)]:.2f}x"
        print(line)
    print(json.dumps({"against": args.against, "rounds": args.rounds, "threads": args.threads, "dtypes": args.dtypes,
                      "us_per_chain_step": {f"{name} | {key}": best[(name, key)] for name, key in best}}))


if __name__ == "__main__":
    main()
