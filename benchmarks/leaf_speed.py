"""The cost of one leaf: the potential and its gradient for all chains at once, in microseconds
per chain, at 1, 4, 16 and 64 chains, for each of our paths and for JAX/XLA.

    python benchmarks/leaf_speed.py            # a minute or two
    python benchmarks/leaf_speed.py --quick    # fewer repetitions

Models: the 1-50-1 tanh network of ``hmc_speed.py`` (100 points) and MILE's 16-16 ReLU network
with a heteroscedastic output on 215 points (yacht's training part), float32. Paths:

- ``native``: :mod:`pyrobnn.infer.mcmc.native` (the hand-derived kernels), one call for all chains;
- ``compiled``: ``FlatPotential.value_and_grad_functional`` under ``torch.compile`` (the torch
  path the samplers compile; the compilation time is printed beside);
- ``eager``: ``FlatPotential.value_and_grad`` (autograd, op by op);
- ``jax``: ``jax.jit(jax.vmap(jax.value_and_grad(logdensity)))`` of the same network, in a child
  process (JAX's thread pool slows PyTorch in the same process): the computation NumPyro's and
  BlackJAX's leapfrog and isokinetic steps evaluate, without their integrator's own work.

All run on ``--threads`` threads (default 1: the per-core cost). Each figure is the best of five
rounds of repeated calls. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHAINS = (1, 4, 16, 64)


def problems():
    import hmc_speed
    import uci_sampling

    torch.manual_seed(0)
    x, y = hmc_speed.data()
    yield "1-50-1 tanh, N=100", hmc_speed.model(), x, y, "tanh"
    x = torch.randn(215, 6)
    y = torch.randn(215, 1)
    yield "6-16-16-2 ReLU heteroscedastic, N=215", uci_sampling.mile_model(6), x, y, "relu"


def best_time(fn, z, repeats):
    fn(z)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn(z)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def torch_rows(quick):
    import pyro

    from pyrobnn.infer.mcmc import native
    from pyrobnn.infer.core.potential import FlatPotential

    rows = []
    for label, model, x, y, _ in problems():
        potential = FlatPotential(model.eval(), x, y)
        kernel = native.NativeMLP(potential)
        with torch.no_grad(), pyro.validation_enabled(False):
            for chains in CHAINS:
                z = torch.randn(chains, potential.dim) * 0.3
                start = time.perf_counter()
                compiled = torch.compile(potential.value_and_grad_functional, dynamic=False)
                compiled(z)
                compile_s = time.perf_counter() - start
                repeats = max(3, (200 if quick else 1000) // chains)
                row = {"problem": label, "chains": chains, "compile_s": round(compile_s, 1)}
                for name, fn in (("native", kernel.value_and_grad), ("compiled", compiled), ("eager", potential.value_and_grad)):
                    row[name] = best_time(fn, z, repeats if name != "eager" else max(3, repeats // 10)) / chains * 1e6
                rows.append(row)
        kernel.close()
    return rows


def jax_worker(spec_path):
    """Child process: the same potentials in JAX, timed the same way; prints a JSON list."""
    import jax
    import jax.numpy as jnp
    import uci_sampling

    with open(spec_path) as f:
        specs = json.load(f)
    out = []
    for spec in specs:
        x, y = jnp.asarray(spec["x"], dtype=jnp.float32), jnp.asarray(spec["y"], dtype=jnp.float32)[:, 0]
        layout = [(a, b, tuple(shape)) for a, b, shape in spec["layout"]]
        logdensity = uci_sampling.jax_logdensity(x, y, layout, spec["activation"], noise=None if spec["hetero"] else 0.1)

        grad = jax.jit(jax.vmap(jax.value_and_grad(logdensity)))
        for chains in CHAINS:
            z = jnp.asarray(np.random.default_rng(0).normal(size=(chains, spec["dim"])).astype(np.float32) * 0.3)
            jax.block_until_ready(grad(z))
            repeats = max(3, spec["repeats"] // chains)
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(repeats):
                    r = grad(z)
                jax.block_until_ready(r)
                best = min(best, (time.perf_counter() - start) / repeats)
            out.append({"problem": spec["label"], "chains": chains, "jax": best / chains * 1e6})
    print(json.dumps(out))


def jax_rows(quick, threads):
    import tempfile

    from pyrobnn.infer.core.potential import FlatPotential

    specs = []
    for label, model, x, y, activation in problems():
        potential = FlatPotential(model.eval(), x, y)
        specs.append({
            "label": label, "x": x.tolist(), "y": y.tolist(), "dim": potential.dim, "activation": activation,
            "layout": [[a, b, list(shape)] for _, a, b, shape in potential.blocks],
            "hetero": model.likelihood.__class__.__name__.startswith("Heteroscedastic"), "repeats": 200 if quick else 1000,
        })
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(specs, f)
    env = dict(os.environ, XLA_FLAGS=f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} intra_op_parallelism_threads={threads}")
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--jax-worker", f.name], capture_output=True, text=True, env=env)
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        print(f"JAX not measured: {proc.stderr.strip().splitlines()[-1:] if proc.stderr else proc.returncode}")
        return []
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--jax-worker"]:
        return jax_worker(argv[1])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-jax", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = torch_rows(args.quick)
    if not args.skip_jax:
        jax = {(r["problem"], r["chains"]): r["jax"] for r in jax_rows(args.quick, args.threads)}
        for row in rows:
            if (row["problem"], row["chains"]) in jax:
                row["jax"] = jax[(row["problem"], row["chains"])]
    print(f"us per chain per potential-and-gradient evaluation, {args.threads} thread(s)")
    print(f"{'problem':40s} {'chains':>6s} {'native':>8s} {'compiled':>9s} {'eager':>8s} {'jax':>8s} {'compile (s)':>11s}")
    for r in rows:
        jax_text = f"{r['jax']:8.2f}" if "jax" in r else f"{'':>8s}"
        print(f"{r['problem']:40s} {r['chains']:6d} {r['native']:8.2f} {r['compiled']:9.2f} {r['eager']:8.1f} {jax_text} {r['compile_s']:11.1f}")
    summary = {f"{r['problem'].split(',')[0]}/{r['chains']}/{k}": round(r[k], 2) for r in rows for k in ("native", "compiled", "eager", "jax") if k in r}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
