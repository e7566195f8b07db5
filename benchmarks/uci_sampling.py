"""The MILE UCI protocol: deep ensembles, and ensemble-initialized MCLMC and NUTS, beside
BlackJAX's MCLMC from the same starting points and NumPyro's NUTS at 4 chains.

    python benchmarks/uci_sampling.py --data-dir ../shared/data        # the full protocol (about 2 h here)
    python benchmarks/uci_sampling.py --quick --data-dir ../shared/data  # yacht, one seed, short runs: minutes

Protocol (Sommer et al. 2025, ICLR, "Microcanonical Langevin Ensembles"; ``../shared/REFERENCES.md``):
concrete, energy and yacht, z-scored with the training part's statistics, 70/10/20
train/validation/test from a shuffle seeded 1, 2, 3; an MLP with 2 hidden layers of 16 ReLU units
and a heteroscedastic Gaussian output (mean and log-scale, the scale clipped to [1e-6, 1e6]);
N(0, 1) prior on every weight and bias; 12 members.

- **DE**: AdamW (lr 1e-3, weight decay 1e-3) on the negative log-likelihood, batch 32, up to 500
  epochs, early stopping with patience 10 on the validation NLL, one batched run for all members.
- **DE-initialized MCLMC** (MILE): one chain per member; 50,000 tuning steps (40k/5k/5k), then
  10,000 steps thinned by 10.
- **DE-initialized NUTS**: one chain per member, 100 warm-up iterations and 1,000 draws.
- **DE-initialized pSMILE and SGHMC** (``--skip-minibatch`` to leave out): the minibatch
  samplers from the same members on batches of ``--batch-size`` (64) points, at MILE's number of
  gradient evaluations: SMILE (two per step, a fixed step size ``--smile-step-size``, 1e-3, as
  in the paper's UCI runs) warms its preconditioner up for as many steps as MILE tunes and
  samples for as many, thinned alike; SGHMC (one per step, step size ``"auto"``, friction 0.1) runs twice as
  many steps, the first half burn-in, thinned to as many draws.
- **BlackJAX MCLMC** (``--skip-blackjax`` to leave out): ``blackjax.mclmc`` with the McLachlan
  isokinetic integrator and ``mclmc_find_L_and_step_size`` (vmapped over chains, the same
  40k/5k/5k phases, target energy variance 0.1: BlackJAX has no schedule, so this is the end of
  MILE's), from the same members, the same number of steps and chains, timed to the finished
  result (compilation included, as ours).

Metrics on the test part in standardized units: LPPD (log of the mean predictive density over all
chains and draws, averaged over points) and RMSE of the mean prediction; wall time of each
phase; for the samplers the worst and median within-chain R-hat on the test predictions (and
log density) over chains (:func:`pyrobnn.infer.results.diagnostics.within_chain_summary`). ``--long-factor F``
also runs MCLMC ``F`` times longer on the first seed of each data set and reports the worst
within-chain R-hat at growing sampling lengths, to find where the worst chain gets below 1.1.

The same run also times our NUTS and NumPyro's at 4 chains on the 1-50-1 model of
``hmc_speed.py`` (300 + 300 iterations; 50 + 50 with ``--quick``). The last line printed is one
JSON object with ``mclmc_vs_blackjax`` (BlackJAX's wall time over ours for the same MCLMC runs)
and ``nuts4_vs_numpyro`` (our ESS per second at 4 chains over NumPyro's). Each (data set, seed)
record is saved in ``--out`` as it completes, and a rerun of the same command reuses it.
"""

from __future__ import annotations

import os

# NumPyro's parallel chains need host devices, set before JAX is imported anywhere
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import argparse
import json
import math
import shutil
import sys
import time

import numpy as np
import torch

import pyrobnn
from pyrobnn.infer.results import diagnostics
from pyrobnn.data import uci_shuffled
from pyrobnn.infer.modes.ensemble import deep_ensemble
from pyrobnn.infer.mcmc import mclmc, nuts
from pyrobnn.infer.sgmcmc import sghmc, smile
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.utils.io import atomic_write_text, record_results

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hmc_speed  # noqa: E402  (the 1-50-1 model and NumPyro runner)

DATASETS = ("concrete", "energy", "yacht")


def mile_model(in_features, min_scale=1e-6):
    """MILE's network; ``min_scale`` is the floor of the noise scale (the protocol's 1e-6, or a
    larger one for targets that repeat exactly: ``--min-scale``)."""
    net = pyrobnn.MLP(in_features, 2, hidden=(16, 16), activation="relu")
    likelihood = pyrobnn.HeteroscedasticGaussianLikelihood(min_scale=min_scale, max_scale=1e6, link="exp")
    return pyrobnn.BayesianModel(net, likelihood, pyrobnn.NormalPrior(1.0))


def settings(quick):
    if quick:
        return {"members": 4, "max_epochs": 100, "warmup": (1500, 250, 250), "samples": 1000, "thinning": 5,
                "nuts_warmup": 30, "nuts_samples": 60, "nuts_depth": 6, "hmc_iters": 50}
    return {"members": 12, "max_epochs": 500, "warmup": (40_000, 5_000, 5_000), "samples": 10_000, "thinning": 10,
            "nuts_warmup": 100, "nuts_samples": 1000, "nuts_depth": 10, "hmc_iters": 300}


def scores(model, result, split):
    pred = pyrobnn.predict(model, result, split.x_test, num_samples=None)
    return {"lppd": pred.log_likelihood(split.y_test), "rmse": pred.rmse(split.y_test)}


def within_chain(model, result, split, reference_lppd):
    """Within-chain diagnostics, with the degeneracy checks against the training data and the
    deep ensemble's test LPPD (``reference_lppd``)."""
    s = diagnostics.within_chain_summary(model, result, split.x_test, split.y_test, x_train=split.x_train, y_train=split.y_train,
                                         reference_lppd=reference_lppd)
    return {
        "worst_rhat": s["worst_rhat"], "median_rhat": s["median_rhat"], "drifting_chains": s["drifting_chains"],
        "between_chain_rhat": s["between_chain_rhat"], "per_chain_lppd": [round(float(v), 4) for v in s["lppd"]],
        "degenerate": s["degenerate"], "heavy_tail_share": s["heavy_tail_share"], "verdict": s["verdict"],
    }


def prefix_rhat(model, result, split, fractions=(0.2, 0.4, 0.6, 0.8, 1.0)):
    """The worst within-chain R-hat on the first fraction of each chain's draws."""
    out = {}
    for frac in fractions:
        n = max(8, int(round(frac * result.num_draws)))
        part = Posterior({k: v[:, :n] for k, v in result.samples.items()}, {"energy": result.stats["energy"][:, :n]})
        out[n] = diagnostics.within_chain_summary(model, part, split.x_test)["worst_rhat"]
    return out


# ------------------------------------------------------------------------------ BlackJAX
def blackjax_mclmc(potential, z0, s, seed):
    """BlackJAX's MCLMC on the same potential (re-written in JAX for the MLP of ``mile_model``),
    from the same positions, the same steps; returns draws ``(C, S, D)`` and the wall time.

    It runs in a child process: once JAX has run in a process, its thread pool slows PyTorch's
    work there many times over (a deep ensemble took 112 s after it against 3 s before), which
    would make every later timing of ours meaningless."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.npz")
        layout = np.array([[start, stop] for _, start, stop, _ in potential.blocks])
        shapes = json.dumps([list(shape) for _, _, _, shape in potential.blocks])
        np.savez(job, x=potential.x.numpy(), y=potential.y.numpy()[:, 0], z0=z0.numpy(), layout=layout, shapes=shapes,
                 warmup=np.array(s["warmup"]), samples=s["samples"], thinning=s["thinning"], seed=seed,
                 min_scale=potential.model.likelihood.min_scale)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--blackjax-worker", job], check=True)
        with np.load(os.path.join(tmp, "out.npz")) as out:
            return torch.as_tensor(out["draws"].copy(), dtype=torch.float32), float(out["seconds"])


def jax_logdensity(x, y, layout, activation="relu", noise=None, min_scale=1e-6, max_scale=1e6):
    """The log density of ``mile_model`` (or of ``hmc_speed``'s model) in JAX, for a flat
    parameter vector laid out as ``FlatPotential`` lays it (``layout``: ``(start, stop, shape)``
    per weight and bias, layer by layer): N(0, 1) priors, and a Gaussian likelihood with the
    fixed scale ``noise``, or (``noise=None``) the heteroscedastic output whose second column is a
    log-scale clipped to ``[min_scale, max_scale]``."""
    import jax
    import jax.numpy as jnp

    act = jnp.tanh if activation == "tanh" else jax.nn.relu
    dim = max(b for _, b, _ in layout)

    def logdensity(z):
        h = x
        params = [z[a:b].reshape(shape) for a, b, shape in layout]
        for i in range(0, len(params), 2):
            h = h @ params[i].T + params[i + 1]
            if i + 2 < len(params):
                h = act(h)
        if noise is None:
            loc, scale = h[:, 0], jnp.clip(jnp.exp(h[:, 1]), min_scale, max_scale)
        else:
            loc, scale = h[:, 0], noise
        log_lik = jnp.sum(-0.5 * ((y - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * math.log(2 * math.pi))
        return log_lik - 0.5 * jnp.sum(z**2) - 0.5 * dim * math.log(2 * math.pi)

    return logdensity


def blackjax_worker(job):
    """The child process of :func:`blackjax_mclmc`."""
    import jax
    import jax.numpy as jnp
    import blackjax

    with np.load(job) as f:
        spec = {k: f[k] for k in f.files}
    x, y = jnp.asarray(spec["x"]), jnp.asarray(spec["y"])
    shapes = [tuple(v) for v in json.loads(str(spec["shapes"]))]
    layout = [(int(a), int(b), shape) for (a, b), shape in zip(spec["layout"], shapes)]
    n1, n2, n3 = (int(v) for v in spec["warmup"])
    samples, thinning, seed = int(spec["samples"]), int(spec["thinning"]), int(spec["seed"])
    z0 = jnp.asarray(spec["z0"])
    dim = z0.shape[1]

    logdensity = jax_logdensity(x, y, layout, min_scale=float(spec["min_scale"]))

    total = n1 + n2 + n3
    kernel = blackjax.mcmc.mclmc.build_kernel(integrator=blackjax.mcmc.integrators.isokinetic_mclachlan)
    params0 = blackjax.adaptation.mclmc_adaptation.MCLMCAdaptationState(
        jnp.asarray(max(math.sqrt(dim), 15.0)), jnp.asarray(1e-3), jnp.ones(dim)
    )

    def one_chain(z, key):
        init_key, tune_key, run_key = jax.random.split(key, 3)
        state = blackjax.mcmc.mclmc.init(z, logdensity, init_key)
        state, params, _ = blackjax.mclmc_find_L_and_step_size(
            kernel, total, state, tune_key, logdensity_fn=logdensity, frac_tune1=n1 / total, frac_tune2=n2 / total,
            frac_tune3=n3 / total, desired_energy_var=0.1, diagonal_preconditioning=False, params=params0,
        )

        def thinned(state, key):
            def step(state, key):
                state, _ = kernel(key, state, logdensity, params.inverse_mass_matrix, params.L, params.step_size)
                return state, None

            state, _ = jax.lax.scan(step, state, jax.random.split(key, thinning))
            return state, state.position

        _, draws = jax.lax.scan(thinned, state, jax.random.split(run_key, samples // thinning))
        return draws

    run = jax.jit(jax.vmap(one_chain))
    keys = jax.random.split(jax.random.PRNGKey(seed), z0.shape[0])
    start = time.perf_counter()
    draws = run(z0, keys)
    draws.block_until_ready()
    seconds = time.perf_counter() - start
    np.savez(os.path.join(os.path.dirname(job), "out.npz"), draws=np.asarray(draws), seconds=seconds)


def as_result(potential, draws, seconds, method):
    chains, n, dim = draws.shape
    values = potential.unpack(draws.reshape(chains * n, dim))
    energy = potential(draws.reshape(chains * n, dim)).reshape(chains, n)
    return Posterior({k: v.reshape((chains, n) + v.shape[1:]) for k, v in values.items()}, {"energy": energy}, seconds, method)


# ------------------------------------------------------------------------------ one data set
def run_one(name, seed, s, args, record, save):
    """Fill ``record`` with the methods it lacks, calling ``save`` after each."""
    split = uci_shuffled(name, seed, data_path=args.data_dir)
    model = mile_model(split.x_train.shape[1], args.min_scale)
    record.update({"dataset": name, "seed": seed, "n_train": split.x_train.shape[0], "n_test": split.x_test.shape[0]})
    # the ensemble is cheap and deterministic given the seed: trained again on a resumed run
    ensemble = deep_ensemble(
        model, split.x_train, split.y_train, num_members=s["members"], x_val=split.x_val, y_val=split.y_val, objective="likelihood",
        lr=1e-3, weight_decay=1e-3, batch_size=32, max_epochs=s["max_epochs"], patience=10, seed=seed, progress=False,
    )
    record["DE"] = {**scores(model, ensemble, split), "seconds": ensemble.seconds,
                    "epochs": ensemble.stats["epochs"].tolist()}
    print(f"{name} seed {seed}: DE {record['DE']['lppd']:.3f} LPPD in {ensemble.seconds:.1f} s", flush=True)
    save()
    if not args.skip_mclmc and "MCLMC" not in record:
        mclmc_run(model, ensemble, split, s, seed, record)
        save()
    potential = FlatPotential(model.eval(), split.x_train, split.y_train)
    z0 = potential.pack({k: v[:, 0] for k, v in ensemble.samples.items()})
    if not args.skip_blackjax and "BlackJAX MCLMC" not in record:
        draws, seconds = blackjax_mclmc(potential, z0, s, seed)
        bj = as_result(potential, draws, seconds, "BlackJAX MCLMC")
        record["BlackJAX MCLMC"] = {**scores(model, bj, split), "seconds": seconds, **within_chain(model, bj, split, record["DE"]["lppd"])}
        print(f"{name} seed {seed}: BlackJAX MCLMC {record['BlackJAX MCLMC']['lppd']:.3f} LPPD in {seconds:.1f} s", flush=True)
        save()
    if not args.skip_mclmc and args.long_factor > 1 and seed == args.seeds[0] and "MCLMC long" not in record:
        n = s["samples"] * args.long_factor
        result = mclmc(model, split.x_train, split.y_train, num_samples=n, num_warmup=s["warmup"], thinning=s["thinning"],
                       init=ensemble, seed=seed, progress=False)
        record["MCLMC long"] = {"steps": n, **scores(model, result, split), "seconds": result.seconds,
                                "rhat_by_draws": prefix_rhat(model, result, split, fractions=tuple(np.linspace(0.1, 1.0, 10)))}
        save()
    if not args.skip_minibatch:
        minibatch_runs(model, ensemble, split, s, seed, record, save, args.batch_size, args.smile_step_size)
    if not args.skip_nuts and "NUTS" not in record:
        result = nuts(model, split.x_train, split.y_train, num_samples=s["nuts_samples"], num_warmup=s["nuts_warmup"],
                      max_tree_depth=s["nuts_depth"], init=ensemble, seed=seed, progress=False)
        record["NUTS"] = {**scores(model, result, split), "seconds": result.seconds, **within_chain(model, result, split, record["DE"]["lppd"]),
                          "path": result.stats["path"],
                          "mean_tree_depth": result.stats["tree_depth"].double().mean().item(), "divergences": result.num_divergences}
        print(f"{name} seed {seed}: NUTS {record['NUTS']['lppd']:.3f} LPPD in {result.seconds:.1f} s; {record['NUTS']['verdict']}", flush=True)
        save()
    return record


def mclmc_run(model, ensemble, split, s, seed, record):
    name = split.name
    result = mclmc(model, split.x_train, split.y_train, num_samples=s["samples"], num_warmup=s["warmup"], thinning=s["thinning"],
                   init=ensemble, seed=seed, progress=False)
    record["MCLMC"] = {**scores(model, result, split), "seconds": result.seconds, **within_chain(model, result, split, record["DE"]["lppd"]),
                       "path": result.stats["path"],
                       "step_size_median": result.stats["step_size"].median().item(), "L_median": result.stats["L"].median().item(),
                       "nonfinite_steps": int(result.stats["nonfinite"].sum() + result.stats["nonfinite_warmup"].sum()),
                       "rhat_by_draws": prefix_rhat(model, result, split)}
    print(f"{name} seed {seed}: MCLMC {record['MCLMC']['lppd']:.3f} LPPD in {result.seconds:.1f} s; {record['MCLMC']['verdict']}", flush=True)


def minibatch_runs(model, ensemble, split, s, seed, record, save, batch_size, smile_step_size):
    """pSMILE and SGHMC from the ensemble at MILE's gradient evaluations (module docstring)."""
    warmup = sum(s["warmup"])
    runs = {
        "SMILE": lambda: smile(model, split.x_train, split.y_train, num_warmup=warmup, num_samples=s["samples"], thinning=s["thinning"],
                               step_size=smile_step_size, batch_size=batch_size, init=ensemble, seed=seed, progress=False),
        "SGHMC": lambda: sghmc(model, split.x_train, split.y_train, step_size="auto", friction=0.1, num_steps=2 * (warmup + s["samples"]),
                               num_burnin=2 * warmup, thinning=2 * s["thinning"], batch_size=batch_size, init=ensemble, seed=seed,
                               progress=False),
    }
    for method, run in runs.items():
        if method in record:
            continue
        try:
            result = run()
        except Exception as error:  # a failed run is a result of the comparison, not the end of it
            record[method] = {"failed": f"{type(error).__name__}: {error}"}
            print(f"{split.name} seed {seed}: {method} failed: {record[method]['failed']}", flush=True)
            save()
            continue
        potential = FlatPotential(model.eval(), split.x_train, split.y_train)
        draws = potential.pack({k: v.reshape((-1,) + v.shape[2:]) for k, v in result.samples.items()})
        result.stats["energy"] = potential(draws).reshape(result.num_chains, result.num_draws)
        record[method] = {**scores(model, result, split), "seconds": result.seconds, "batch_size": batch_size,
                          **within_chain(model, result, split, record["DE"]["lppd"])}
        if method == "SMILE":
            record[method]["resets"] = int(result.stats["resets"].sum() + result.stats["resets_warmup"].sum())
            record[method]["step_size_median"] = result.stats["step_size"].median().item()
        print(f"{split.name} seed {seed}: {method} {record[method]['lppd']:.3f} LPPD in {result.seconds:.1f} s; {record[method]['verdict']}",
              flush=True)
        save()


METHODS = ("DE", "MCLMC", "BlackJAX MCLMC", "SMILE", "SGHMC", "NUTS")
LABELS = {"DE": "deep ensemble", "MCLMC": "DE-initialized MCLMC", "BlackJAX MCLMC": "DE-initialized MCLMC in BlackJAX",
          "SMILE": "DE-initialized pSMILE (minibatch)", "SGHMC": "DE-initialized SGHMC (minibatch)", "NUTS": "DE-initialized NUTS"}


def summarize(records):
    table = {}
    for name in sorted({r["dataset"] for r in records}):
        rows = [r for r in records if r["dataset"] == name]
        for method in METHODS:
            got = [r[method] for r in rows if method in r and "failed" not in r[method]]
            if not got:
                continue
            entry = {"seeds": len(got)}
            for metric in ("lppd", "rmse", "seconds"):
                v = np.array([g[metric] for g in got], dtype=np.float64)
                entry[metric] = float(v.mean())
                entry[f"{metric}_se"] = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else 0.0
            if "worst_rhat" in got[0]:
                entry["worst_rhat"] = float(max(g["worst_rhat"] for g in got))
                entry["median_rhat"] = float(np.median([g["median_rhat"] for g in got]))
            table[(name, method)] = entry
    return table


def cold_and_warm(argv, args):
    """The run twice in child processes that share a fresh, empty cache folder (pyrobnn's native
    kernels, Inductor's cache): the first pays every build and compilation (cold), the second
    finds them built (warm). The summary is the warm run's, with the cold run's speed ratios
    beside it under ``<name>_cold``."""
    import subprocess
    import tempfile

    base, skip = [], False
    for a in argv:  # the arguments without --passes and --out (set per run below)
        if skip:
            skip = False
        elif a in ("--passes", "--out"):
            skip = True
        elif not a.startswith(("--passes=", "--out=")):
            base.append(a)
    summaries = {}
    with tempfile.TemporaryDirectory(prefix="pyrobnn-cold-") as cache:
        env = dict(os.environ, PYROBNN_CACHE=os.path.join(cache, "pyrobnn"), TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"))
        for name in ("cold", "warm"):
            out = os.path.join(args.out, name)
            shutil.rmtree(out, ignore_errors=True)  # a resumed record would time nothing
            print(f"--- {name} run (kernel caches in {cache})", flush=True)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), *base, "--passes", "one", "--out", out], env=env,
                                  stdout=subprocess.PIPE, text=True)
            sys.stdout.write(proc.stdout)
            if proc.returncode != 0:
                raise SystemExit(f"the {name} run failed (exit {proc.returncode})")
            summaries[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    summary = dict(summaries["warm"])
    for key in ("mclmc_vs_blackjax", "nuts4_vs_numpyro", "nuts4_ess_per_s", "nuts_vs_mclmc_time"):
        if key in summaries["cold"]:
            summary[f"{key}_cold"] = summaries["cold"][key]
    print(json.dumps(summary))
    return summary


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--blackjax-worker"]:
        return blackjax_worker(argv[1])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="yacht, one seed, 4 members, short runs")
    parser.add_argument("--data-dir", default=None, help="folder holding uci/<name> (default $PYROBNN_DATA)")
    parser.add_argument("--datasets", default=None, help=f"comma-separated (default {','.join(DATASETS)}; yacht with --quick)")
    parser.add_argument("--seeds", default=None, help="comma-separated shuffle seeds (default 1,2,3; 1 with --quick)")
    parser.add_argument("--out", default="runs/uci_sampling", help="folder for the per-run records (resumed from)")
    parser.add_argument("--results", default=None, help="merge the protocol's figures into this results JSON (docs/results.json)")
    parser.add_argument("--skip-mclmc", action="store_true", help="leave out our MCLMC (e.g. to run NUTS in another process)")
    parser.add_argument("--skip-blackjax", action="store_true")
    parser.add_argument("--skip-nuts", action="store_true", help="leave out DE-initialized NUTS (the slowest part)")
    parser.add_argument("--skip-numpyro", action="store_true", help="leave out the 4-chain NUTS comparison")
    parser.add_argument("--skip-minibatch", action="store_true", help="leave out pSMILE and SGHMC")
    parser.add_argument("--batch-size", type=int, default=64, help="the minibatch samplers' batch size")
    parser.add_argument("--smile-step-size", type=float, default=1e-3,
                        help="SMILE's fixed step size (the paper's UCI runs searched 1e-2, 1e-3, 1e-4; default 1e-3)")
    parser.add_argument("--long-factor", type=int, default=1, help="also run MCLMC this many times longer on the first seed")
    parser.add_argument("--min-scale", type=float, default=1e-6,
                        help="floor of the heteroscedastic noise scale (the protocol: 1e-6; raise it for targets that repeat exactly)")
    parser.add_argument("--passes", default=None,
                        help="'cold,warm': run twice, first with empty kernel caches, in child processes, and report both "
                             "(default with --quick); 'one': a single run with the caches as they are (default otherwise)")
    args = parser.parse_args(argv)
    passes = args.passes or ("cold,warm" if args.quick else "one")
    if passes != "one":
        return cold_and_warm(argv, args)
    datasets = args.datasets.split(",") if args.datasets else (["yacht"] if args.quick else list(DATASETS))
    args.seeds = [int(v) for v in args.seeds.split(",")] if args.seeds else ([1] if args.quick else [1, 2, 3])
    s = settings(args.quick)
    torch.set_num_threads(int(os.environ.get("PYROBNN_THREADS", "2")))
    os.makedirs(args.out, exist_ok=True)
    fingerprint = json.loads(json.dumps(dict(s, min_scale=args.min_scale)))
    if not args.skip_minibatch and args.batch_size != 64:
        fingerprint["batch_size"] = args.batch_size
    if not args.skip_minibatch and args.smile_step_size != 1e-3:
        fingerprint["smile_step_size"] = args.smile_step_size
    records = []
    for name in datasets:
        for seed in args.seeds:
            path = os.path.join(args.out, f"{name}-{seed}{'-quick' if args.quick else ''}.json")
            record = {}
            if os.path.exists(path):
                with open(path) as f:
                    saved = json.load(f)
                if saved.get("fingerprint") == fingerprint:
                    record = saved["record"]
                    print(f"{name} seed {seed}: resuming from {path} ({', '.join(k for k in METHODS if k in record)} done)", flush=True)

            def save(record=record, path=path):
                atomic_write_text(json.dumps({"fingerprint": fingerprint, "record": record}, indent=1), path)

            records.append(run_one(name, seed, s, args, record, save))

    table = summarize(records)
    print(f"\nMILE protocol{' (quick)' if args.quick else ''}: test LPPD and RMSE (standardized), mean ± SE over seeds {args.seeds}")
    print(f"{'data set':10s} {'method':34s} {'LPPD':>16s} {'RMSE':>16s} {'time (s)':>10s} {'worst/median within-chain R-hat':>32s}")
    for (name, method), e in table.items():
        rhat = f"{e['worst_rhat']:.3f} / {e['median_rhat']:.3f}" if "worst_rhat" in e else ""
        print(f"{name:10s} {LABELS[method]:34s} {e['lppd']:8.3f} ± {e['lppd_se']:.3f} {e['rmse']:8.3f} ± {e['rmse_se']:.3f} {e['seconds']:10.1f} {rhat:>32s}")

    summary = {"quick": args.quick, "datasets": datasets, "seeds": args.seeds}
    for (name, method), e in table.items():
        summary[f"{name}/{method}/lppd"] = round(e["lppd"], 4)
    both = [r for r in records if "MCLMC" in r and "BlackJAX MCLMC" in r]
    if both:
        summary["mclmc_vs_blackjax"] = round(sum(r["BlackJAX MCLMC"]["seconds"] for r in both) / sum(r["MCLMC"]["seconds"] for r in both), 3)
    both = [r for r in records if "MCLMC" in r and "NUTS" in r]
    if both:
        summary["nuts_vs_mclmc_time"] = round(sum(r["NUTS"]["seconds"] for r in both) / sum(r["MCLMC"]["seconds"] for r in both), 3)
    for method in ("MCLMC", "NUTS"):
        worst = [r[method]["worst_rhat"] for r in records if method in r]
        if worst:
            summary[f"{method.lower()}_worst_within_chain_rhat"] = round(max(worst), 4)
            summary[f"{method.lower()}_median_within_chain_rhat"] = round(float(np.median([r[method]["median_rhat"] for r in records if method in r])), 4)
    for r in records:
        if "MCLMC long" in r:
            summary[f"{r['dataset']}/MCLMC long/rhat_by_draws"] = {k: round(v, 4) for k, v in r["MCLMC long"]["rhat_by_draws"].items()}

    if not args.skip_numpyro:
        n = s["hmc_iters"]
        ours4 = hmc_speed.run_pyrobnn(n, n, 4)
        theirs4 = hmc_speed.run_numpyro(n, n, chains=4, runs=2 if args.quick else 4)
        ours4["ess_per_s"] = ours4["min_ess"] / ours4["wall_s"]
        print(f"\nNUTS at 4 chains, 1-50-1 model, {n} + {n}: pyrobnn {ours4['min_ess']:.0f} ESS in {ours4['wall_s']:.1f} s ({ours4['ess_per_s']:.2f}/s)")
        if theirs4 is not None:
            theirs4["ess_per_s"] = theirs4["min_ess"] / theirs4["wall_s"]
            print(f"NumPyro {theirs4['min_ess']:.0f} ESS in {theirs4['wall_s']:.1f} s ({theirs4['ess_per_s']:.2f}/s; its runs alone: {theirs4['per_run_ess_per_s']})")
            summary["nuts4_vs_numpyro"] = round(ours4["ess_per_s"] / theirs4["ess_per_s"], 3)
        summary["nuts4_ess_per_s"] = round(ours4["ess_per_s"], 3)

    if args.results and not args.quick:
        command = "python benchmarks/uci_sampling.py " + " ".join(argv)
        entries = []
        for (name, method), e in table.items():
            for metric in ("lppd", "rmse"):
                entries.append({"name": f"{name}: {LABELS[method]} (MILE protocol)", "metric": metric, "value": e[metric],
                                "published": None, "se": e[f"{metric}_se"], "seeds": args.seeds, "seconds": e["seconds"],
                                "command": command})
        record_results(args.results, entries)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
