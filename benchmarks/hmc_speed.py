"""NUTS speed on a 1-50-1 tanh BNN: effective samples per second of pyrobnn's fast path,
Pyro's NUTS and NumPyro's NUTS.

    python benchmarks/hmc_speed.py            # about 10 minutes
    python benchmarks/hmc_speed.py --quick    # a minute

Model: y = f(x) + N(0, 0.1^2), f a 1-50-1 tanh network with N(0, 1) weights, on 100
standardized points of Blundell et al.'s curve; 300 warm-up and 300 sampling iterations per
chain, maximum tree depth 10, target acceptance 0.8 in all three. Each sampler runs at its best
settings here: Pyro with ``jit_compile=True`` (one chain; chains are separate processes in
Pyro), NumPyro with one chain per CPU core (``chain_method="parallel"``; its
``"vectorized"`` chains measured 20% fewer ESS/s here), pyrobnn with the path its budget picks
(the native kernels for this model, chain groups on the threads; 64 chains by default,
``--chains 4,64`` runs both and reports each against NumPyro), optionally split over processes
(``--processes 1,2``: ``num_processes``, one thread each).

Figure of merit: the minimum bulk ESS (ArviZ) over the network's predictions at 20 points of
a grid, divided by the wall time of the whole run (warm-up and compilation included, since a
user waits for them too); sampling-only time is printed as well. NumPyro's two chains are run
with 8 seeds (``--numpyro-runs``) and pooled, its ESS taken over the 16 chains and its time
summed: a single 2-chain run's ESS swings threefold with the seed. The last line is one JSON
object including ``ess_per_s_vs_numpyro`` (pyrobnn / NumPyro).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
import pyro
import torch

import pyrobnn
from pyrobnn.data import blundell_regression
from pyrobnn.infer.mcmc.samplers import nuts, pyro_nuts

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import arviz as az


def data():
    x, y = blundell_regression(100, seed=0)
    return (x - x.mean()) / x.std(), (y - y.mean()) / y.std()


def model():
    return pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh"), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))


GRID = torch.linspace(-2.0, 2.0, 20).unsqueeze(-1)


def min_ess(f):
    """f: (chains, draws, points)."""
    return float(min(az.ess(np.ascontiguousarray(f[..., i])) for i in range(f.shape[-1])))


def torch_predictions(m, result):
    m.eval()
    out = pyro.infer.Predictive(m, posterior_samples=result.flat_samples(), return_sites=["_RETURN"])(GRID)["_RETURN"]
    return out.reshape(result.num_chains, result.num_draws, -1).double().numpy()


def run_pyrobnn(warmup, samples, chains, processes=1):
    x, y = data()
    m = model()
    start = time.perf_counter()
    result = nuts(m, x, y, num_samples=samples, num_warmup=warmup, num_chains=chains, seed=0, progress=False, num_processes=processes)
    total = time.perf_counter() - start
    return {"wall_s": total, "sampling_s": result.seconds, "min_ess": min_ess(torch_predictions(m, result)), "chains": chains, "processes": processes,
            "mean_tree_depth": result.stats["tree_depth"].double().mean().item(), "divergences": result.num_divergences,
            "path": result.stats["path"]}


def run_pyro(warmup, samples):
    x, y = data()
    m = model()
    start = time.perf_counter()
    result = pyro_nuts(m, x, y, num_samples=samples, num_warmup=warmup, num_chains=1, seed=0, jit_compile=True, progress=False)
    total = time.perf_counter() - start
    return {"wall_s": total, "sampling_s": result.seconds, "min_ess": min_ess(torch_predictions(m, result)), "chains": 1}


def run_numpyro(warmup, samples, chains, runs):
    """``runs`` runs of ``chains`` parallel chains with seeds 0, 1, ...: the ESS of the pooled
    chains over the summed wall time. One run's 2-chain ESS is too noisy to compare (over eight
    seeds it ranged 134-375, ESS/s 14-41), and with so few chains it also misses the
    disagreement between chains stuck in different modes that many chains reveal."""
    try:
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={chains}")
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as nd
        from numpyro.infer import MCMC, NUTS
    except ImportError:
        return None
    x, y = data()
    X, Y = jnp.array(x.numpy()), jnp.array(y.numpy())

    def np_model(X, Y=None):
        w1 = numpyro.sample("w1", nd.Normal(0, 1).expand([1, 50]).to_event(2))
        b1 = numpyro.sample("b1", nd.Normal(0, 1).expand([50]).to_event(1))
        w2 = numpyro.sample("w2", nd.Normal(0, 1).expand([50, 1]).to_event(2))
        b2 = numpyro.sample("b2", nd.Normal(0, 1).expand([1]).to_event(1))
        f = jnp.tanh(X @ w1 + b1) @ w2 + b2
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("obs", nd.Normal(f, 0.1).to_event(1), obs=Y)

    mcmc = MCMC(NUTS(np_model, max_tree_depth=10, target_accept_prob=0.8), num_warmup=warmup, num_samples=samples,
                num_chains=chains, chain_method="parallel" if chains > 1 else "sequential", progress_bar=False)
    g = GRID.numpy()
    total, fs, per_run = 0.0, [], []
    for seed in range(runs):
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), X, Y)
        s = mcmc.get_samples(group_by_chain=True)
        s["w1"].block_until_ready()  # JAX dispatches asynchronously: time the finished result
        wall = time.perf_counter() - start
        w1, b1, w2, b2 = (np.asarray(s[k], dtype=np.float64) for k in ("w1", "b1", "w2", "b2"))
        hidden = np.tanh(np.einsum("gi,cdih->cdgh", g, w1) + b1[:, :, None, :])
        fs.append(np.einsum("cdgh,cdho->cdgo", hidden, w2)[..., 0] + b2)
        total += wall
        per_run.append(min_ess(fs[-1]) / wall)
    f = np.concatenate(fs, 0)
    return {"wall_s": total, "sampling_s": total, "min_ess": min_ess(f), "chains": chains * runs,
            "per_run_ess_per_s": [round(v, 2) for v in per_run]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--chains", default="64", help="pyrobnn's batched chains; a comma-separated list runs each (the best is compared)")
    parser.add_argument("--numpyro-runs", type=int, default=8, help="NumPyro runs (seeds) pooled; each runs one chain per core")
    parser.add_argument("--skip-pyro", action="store_true", help="leave out Pyro's NUTS (the slow one)")
    parser.add_argument("--processes", default="1", help="pyrobnn's chains split over this many processes (num_processes); a comma-separated list runs each")
    args = parser.parse_args(argv)
    warmup, samples = (50, 50) if args.quick else (300, 300)
    counts = [int(c) for c in args.chains.split(",")]
    processes = [int(p) for p in args.processes.split(",")]
    rows = {}
    for c in counts:
        for p in processes:
            name = "pyrobnn" + (f"-{c}" if len(counts) > 1 else "") + (f"-{p}p" if len(processes) > 1 else "")
            rows[name] = run_pyrobnn(warmup, samples, c, p)
    numpyro_row = run_numpyro(warmup, samples, chains=os.cpu_count() or 1, runs=2 if args.quick else args.numpyro_runs)
    if numpyro_row is not None:
        rows["numpyro"] = numpyro_row
    if not args.skip_pyro:
        rows["pyro"] = run_pyro(warmup, samples)
    print(f"1-50-1 tanh BNN, 100 points, {warmup} + {samples} iterations per chain")
    print(f"{'sampler':12s} {'chains':>6s} {'wall (s)':>9s} {'sampling (s)':>13s} {'min ESS f(x)':>13s} {'ESS/s':>8s}")
    for name, r in rows.items():
        r["ess_per_s"] = r["min_ess"] / r["wall_s"]
        print(f"{name:12s} {r['chains']:6d} {r['wall_s']:9.1f} {r['sampling_s']:13.1f} {r['min_ess']:13.1f} {r['ess_per_s']:8.2f}")
    if "numpyro" in rows:
        print(f"NumPyro's {len(rows['numpyro']['per_run_ess_per_s'])} runs pooled; ESS/s of each run alone: {rows['numpyro']['per_run_ess_per_s']}")
    summary = {f"{k}_ess_per_s": round(v["ess_per_s"], 3) for k, v in rows.items()}
    ours = max((v for k, v in rows.items() if k.startswith("pyrobnn")), key=lambda v: v["ess_per_s"])
    summary["pyrobnn_best_chains"] = ours["chains"]
    summary["pyrobnn_best_processes"] = ours["processes"]
    if "numpyro" in rows:
        summary["ess_per_s_vs_numpyro"] = round(ours["ess_per_s"] / rows["numpyro"]["ess_per_s"], 3)
        for k, v in rows.items():
            if k.startswith("pyrobnn"):
                summary[f"{k}_vs_numpyro"] = round(v["ess_per_s"] / rows["numpyro"]["ess_per_s"], 3)
    if "pyro" in rows:
        summary["ess_per_s_vs_pyro"] = round(ours["ess_per_s"] / rows["pyro"]["ess_per_s"], 3)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":  # required: num_processes spawns processes that re-import this file
    main()
