"""The cost of one leaf: the potential and its gradient for all chains at once, in microseconds
per chain, at 1, 4, 16 and 64 chains, for each of our paths and for JAX/XLA.

    python benchmarks/leaf_speed.py            # a minute or two
    python benchmarks/leaf_speed.py --quick    # fewer repetitions

Models: the 1-50-1 tanh network of ``hmc_speed.py`` (100 points) and MILE's 16-16 ReLU network
with a heteroscedastic output on 215 points (yacht's training part), float32; and the Bayesian-
optimization surrogates' network (``bayesopt.py``: 50-50 erf units behind a fixed input map,
a constant output offset, float64) on 30 points in 2-D and 42 in 6-D, the sizes of a BO run's
refits, and on 10 points in 2-D (a first fit) in float64 and float32 (no JAX row: its JAX twin is
not written). Paths:

- ``native``: :mod:`pyrobnn.infer.core.native` (the hand-derived kernels), one call for all chains;
- ``compiled``: ``FlatPotential.value_and_grad_functional`` under ``torch.compile`` (the torch
  path the samplers compile; the compilation time is printed beside);
- ``eager``: ``FlatPotential.value_and_grad`` (autograd, op by op);
- ``jax``: ``jax.jit(jax.vmap(jax.value_and_grad(logdensity)))`` of the same network, in a child
  process (JAX's thread pool slows PyTorch in the same process): the computation NumPyro's and
  BlackJAX's leapfrog and isokinetic steps evaluate, without their integrator's own work.

All run on ``--threads`` threads (default 1: the per-core cost). Each figure is the best of five
rounds of repeated calls. ``--against REV`` also builds the native kernels' source at git
revision ``REV`` (with today's flags and constants header: for revisions whose kernels take the
same model record) and times it beside today's, as ``native@REV``, in the same rounds;
``--scalar-math`` does so for today's source built without glibc's vector math library (what a
machine without it runs). The last line is one JSON object.

    python benchmarks/leaf_speed.py --quick --skip-jax --against 4436aae --scalar-math   # the kernels before 2026-12-06
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
    """``(label, model, x, y, activation)``; ``activation`` is ``None`` where no JAX twin exists."""
    import hmc_speed
    import uci_sampling

    torch.manual_seed(0)
    x, y = hmc_speed.data()
    yield "1-50-1 tanh, N=100", hmc_speed.model(), x, y, "tanh"
    x = torch.randn(215, 6)
    y = torch.randn(215, 1)
    yield "6-16-16-2 ReLU heteroscedastic, N=215", uci_sampling.mile_model(6), x, y, "relu"
    for d, n in ((2, 30), (6, 42)):  # the surrogates' network at a BO run's sizes
        f64 = torch.float64
        yield f"{d}-50-50-1 erf (BO surrogate), float64, N={n}", surrogate_network(d), torch.rand(n, d, dtype=f64), torch.randn(n, 1, dtype=f64), None
    # a BO run's first fit (10 points, fewer than a float32 vector's 16 under AVX-512), with the
    # chains in float64 and in float32 (the NUTS surrogate's dtype option)
    x, y = torch.rand(10, 2, dtype=torch.float64), torch.randn(10, 1, dtype=torch.float64)
    yield "2-50-50-1 erf (BO surrogate), float64, N=10", surrogate_network(2), x, y, None
    yield "2-50-50-1 erf (BO surrogate), float32, N=10", surrogate_network(2).float(), x.float(), y.float(), None


def surrogate_network(d):
    """The Bayesian-optimization surrogates' network for ``d`` inputs: ``d-50-50-1`` erf units
    behind a fixed input map, a constant output offset, a fixed noise scale, float64 (the shape
    ``calibrated_model`` gives, at fixed scales)."""
    from pyrobnn import GaussianLikelihood
    from pyrobnn.models.infinite_width import InfiniteWidthMLP

    f64 = torch.float64
    limit = InfiniteWidthMLP("erf", (1.0, 1.5, 1.5), (1.0,) * 3, torch.full((d,), 0.5, dtype=f64), torch.full((d,), 2.0, dtype=f64),
                             output_mean=torch.tensor([0.3], dtype=f64))
    return limit.bayesian_model(GaussianLikelihood(scale=0.1), out_features=1, width=50, dtype=f64)


def best_time(fn, z, repeats):
    fn(z)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn(z)
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


#: where the kernels' source has lived: in the shared core since 2026-12-06, before that beside the samplers
KERNEL_SOURCES = ("pyrobnn/infer/core/native/mlp_kernels.cpp", "pyrobnn/infer/mcmc/native/mlp_kernels.cpp")


def kernel_source_at(revision, cwd):
    """The path of the native kernels' source at git ``revision`` (``None`` where it has none)."""
    for path in KERNEL_SOURCES:
        if subprocess.run(["git", "cat-file", "-e", f"{revision}:{path}"], capture_output=True, cwd=cwd).returncode == 0:
            return path
    return None


def library_at(revision=None, vector_math=True):
    """The native kernels' source at git ``revision`` (``None``: today's), built as the package
    builds it (:func:`~pyrobnn.infer.core.native.build.compile_kernels`, today's flags and
    constants header; without glibc's vector math library unless ``vector_math``) into a
    temporary folder: ``(name, library)``."""
    import tempfile

    from pyrobnn.infer.core.native import build

    folder = tempfile.mkdtemp(prefix="pyrobnn-kernels-")
    source = build.SOURCE
    if revision is not None:
        root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        source = os.path.join(folder, "kernels.cpp")
        with open(source, "w") as f:
            f.write(subprocess.run(["git", "show", f"{revision}:{kernel_source_at(revision, root)}"], capture_output=True,
                                   text=True, check=True, cwd=root).stdout)
    out = os.path.join(folder, "lib.so")
    build.compile_kernels(source, out, build.build_info()["compiler"], vector_math=vector_math)
    return (f"native@{revision}" if revision else "native, scalar math"), build.load_kernels(out)


def torch_rows(quick, against=None, scalar_math=False):
    import copy

    import pyro

    from pyrobnn.infer.core import native
    from pyrobnn.infer.core.potential import FlatPotential

    others = ([library_at(against)] if against else []) + ([library_at(None, vector_math=False)] if scalar_math else [])
    rows = []
    for label, model, x, y, _ in problems():
        potential = FlatPotential(model.eval(), x, y)
        kernel = native.NativeMLP(potential)
        paths = [("native", kernel.value_and_grad)]
        for name, lib in others:
            other = copy.copy(kernel)
            other.lib = lib
            paths.append((name, other.value_and_grad))
        with torch.no_grad(), pyro.validation_enabled(False):
            for chains in CHAINS:
                z = torch.randn(chains, potential.dim, dtype=model.dtype) * 0.3
                start = time.perf_counter()
                compiled = torch.compile(potential.value_and_grad_functional, dynamic=False)
                compiled(z)
                compile_s = time.perf_counter() - start
                repeats = max(3, (200 if quick else 1000) // chains)
                row = {"problem": label, "chains": chains, "compile_s": round(compile_s, 1)}
                for name, fn in paths + [("compiled", compiled), ("eager", potential.value_and_grad)]:
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
        if activation is None:
            continue
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
    parser.add_argument("--against", metavar="REV", default=None, help="also time the native kernels' source at this git revision")
    parser.add_argument("--scalar-math", action="store_true", help="also time today's kernels built without glibc's vector math library")
    args = parser.parse_args(argv)
    if args.against is not None:
        if kernel_source_at(args.against, os.path.dirname(os.path.abspath(__file__))) is None:
            parser.error(f"--against: {args.against!r} is no git revision of this checkout with the native kernels' source")
    torch.set_num_threads(args.threads)
    rows = torch_rows(args.quick, args.against, args.scalar_math)
    if not args.skip_jax:
        jax = {(r["problem"], r["chains"]): r["jax"] for r in jax_rows(args.quick, args.threads)}
        for row in rows:
            if (row["problem"], row["chains"]) in jax:
                row["jax"] = jax[(row["problem"], row["chains"])]
    extra = ([f"native@{args.against}"] if args.against else []) + (["native, scalar math"] if args.scalar_math else [])
    print(f"us per chain per potential-and-gradient evaluation, {args.threads} thread(s); beside each other build, today's speed-up over it")
    print(f"{'problem':48s} {'chains':>6s} {'native':>8s}" + "".join(f" {name:>20s} {'speed-up':>8s}" for name in extra)
          + f" {'compiled':>9s} {'eager':>8s} {'jax':>8s} {'compile (s)':>11s}")
    for r in rows:
        jax_text = f"{r['jax']:8.2f}" if "jax" in r else f"{'':>8s}"
        other_text = "".join(f" {r[name]:20.2f} {r[name] / r['native']:7.2f}x" for name in extra)
        print(f"{r['problem']:48s} {r['chains']:6d} {r['native']:8.2f}{other_text} {r['compiled']:9.2f} {r['eager']:8.1f} {jax_text} {r['compile_s']:11.1f}")
    keys = ("native", *extra, "compiled", "eager", "jax")
    summary = {f"{r['problem'].split(',')[0]}/{r['chains']}/{k}": round(r[k], 2) for r in rows for k in keys if k in r}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
