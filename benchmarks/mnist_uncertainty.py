"""Classification uncertainty on MNIST with LeNet-300-100: every posterior approximation on the
same BayesianModel (N(0, 1) prior on every weight and bias, categorical likelihood).

    python benchmarks/mnist_uncertainty.py --data-dir ../shared/data            # full (about 1 h here)
    python benchmarks/mnist_uncertainty.py --quick --data-dir ../shared/data    # a few minutes

Data: the 60,000 training images split 50,000 / 10,000 (training / validation, seeded), the
10,000 test images; out of distribution, the test images with one fixed random permutation of
their pixels and the test images rotated by 90 degrees.

Methods: a 5-member deep ensemble trained as one batched computation (MAP of the log joint,
AdamW, early stopping on the validation NLL); MAP = its first member; MAP with temperature
scaling (fitted on the validation split); Laplace around the MAP with KFAC GGN on the last layer
and on all weights (prior precision tuned by the marginal likelihood, linearized predictive);
SWAG from the MAP; SGLD and cyclical SGHMC started at the MAP (step sizes from the largest
curvature); pSMILE (stochastic-gradient microcanonical sampling) with one chain per ensemble
member; MC dropout (p = 0.1) and mean-field VI (local reparameterization), both by
``pyrobnn.fit``; IVON (natural-gradient variational learning of a diagonal Gaussian).

Metrics on the test set: error (%), NLL (nats per image), ECE (15 bins, %), Brier score; OOD:
AUROC of predictive entropy and of mutual information for telling the shifted images from the
test images. Reliability diagrams in ``--out``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import matplotlib.pyplot as plt
import torch

import pyrobnn
from pyrobnn.evaluation.calibration import TemperatureScaling
from pyrobnn.data import mnist
from pyrobnn.infer.modes.ensemble import deep_ensemble
from pyrobnn.infer.modes.laplace import laplace
from pyrobnn.infer.sgmcmc import sghmc, sgld, smile
from pyrobnn.infer.modes.swag import swag
from pyrobnn.utils.io import atomic_write_text, record_results
from pyrobnn.evaluation.metrics import brier_score, ood_auroc
from pyrobnn.evaluation.plotting import plot_reliability_diagram, save_figure


def settings(quick):
    if quick:
        return dict(train=2000, val=500, test=1000, members=2, epochs=3, swag_epochs=3, sg_epochs=3, vi_epochs=3, samples=20, batch=128,
                    smile_warmup=20, smile_steps=40, ivon_epochs=10)
    return dict(train=None, val=10_000, test=None, members=5, epochs=15, swag_epochs=10, sg_epochs=10, vi_epochs=15, samples=100, batch=128,
                smile_warmup=1000, smile_steps=3000, ivon_epochs=15)


METHOD_KEYS = ("map", "temperature", "ensemble", "laplace_last_layer", "laplace_all", "swag", "sgld", "sghmc", "smile", "mc_dropout", "meanfield",
               "ivon")


def new_model():
    return pyrobnn.BayesianModel(pyrobnn.LeNet300100(), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))


def load(data_dir, s, seed=0):
    x, y = mnist(data_dir, train=True)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    val, rest = perm[: s["val"]], perm[s["val"] :]
    if s["train"] is not None:
        rest = rest[: s["train"]]
    x_test, y_test = mnist(data_dir, train=False, subset=s["test"], seed=seed)
    pixels = torch.randperm(28 * 28, generator=torch.Generator().manual_seed(seed + 1))
    permuted = x_test.reshape(-1, 28 * 28)[:, pixels].reshape(x_test.shape)
    rotated = torch.rot90(x_test, 1, dims=(2, 3)).contiguous()
    return {"x": x[rest], "y": y[rest], "x_val": x[val], "y_val": y[val], "x_test": x_test, "y_test": y_test,
            "permuted": permuted, "rotated": rotated}


def sampled(model, posterior, num):
    def run(x):
        return pyrobnn.predict(model, posterior, x, num_samples=num, batch_size=1000, sample_batch_size=25, seed=0)
    return run


def scores(predictor, d):
    test = predictor(d["x_test"])
    out = {"error": 100 * (1 - test.accuracy(d["y_test"])), "nll": -test.log_likelihood(d["y_test"]),
           "ece": 100 * test.ece(d["y_test"]), "brier": brier_score(test.probs, d["y_test"])}
    for shift in ("permuted", "rotated"):
        shifted = predictor(d[shift])
        out[f"auroc_entropy_{shift}"] = ood_auroc(test.entropy, shifted.entropy)
        out[f"auroc_mi_{shift}"] = ood_auroc(test.mutual_information, shifted.mutual_information)
    return out, test


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", default=None, help="folder holding MNIST/raw (default $PYROBNN_DATA)")
    parser.add_argument("--out", default="runs/mnist_uncertainty")
    parser.add_argument("--results", default=None, help="merge the figures into this results JSON (docs/results.json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None,
                        help=f"comma-separated subset of {','.join(METHOD_KEYS)}; merged into an earlier run's results in --out")
    args = parser.parse_args(argv)
    if args.only is not None:
        args.only = args.only.split(",")
        unknown = [k for k in args.only if k not in METHOD_KEYS]
        if unknown:
            parser.error(f"--only: unknown methods {unknown}; choose from {list(METHOD_KEYS)}")
    s = settings(args.quick)
    torch.set_num_threads(int(os.environ.get("PYROBNN_THREADS", "2")))
    d = load(args.data_dir, s, args.seed)
    os.makedirs(args.out, exist_ok=True)
    print(f"MNIST: {d['x'].shape[0]} training, {d['x_val'].shape[0]} validation, {d['x_test'].shape[0]} test images", flush=True)
    rows, tests = {}, {}
    model = new_model()

    def record(name, predictor, fit_seconds):
        start = time.perf_counter()
        rows[name], tests[name] = scores(predictor, d)
        rows[name]["fit_s"] = fit_seconds
        rows[name]["predict_s"] = time.perf_counter() - start
        print(f"{name:34s} " + " ".join(f"{k} {v:.4g}" for k, v in rows[name].items()), flush=True)

    def want(key):
        return args.only is None or key in args.only

    start = time.perf_counter()
    ensemble = deep_ensemble(model, d["x"], d["y"], num_members=s["members"], x_val=d["x_val"], y_val=d["y_val"], objective="map", lr=1e-3,
                             batch_size=s["batch"], max_epochs=s["epochs"], patience=3, seed=args.seed, progress=False)
    t_ens = time.perf_counter() - start
    first = ensemble.member(0)
    if want("map"):
        record("MAP", sampled(model, first, None), t_ens)
    if want("temperature"):
        net = model.deterministic_net({k: v[0, 0] for k, v in ensemble.samples.items()}).eval()
        start = time.perf_counter()
        scaled = TemperatureScaling(net).fit(d["x_val"], d["y_val"])
        record("MAP + temperature scaling", scaled.predict, t_ens + time.perf_counter() - start)
        rows["MAP + temperature scaling"]["temperature"] = scaled.temperature
    if want("ensemble"):
        record(f"deep ensemble ({s['members']})", sampled(model, ensemble, None), t_ens)
    for subset in ("last_layer", "all"):
        if want(f"laplace_{subset}"):
            start = time.perf_counter()
            result = laplace(model, d["x"], d["y"], subset=subset, hessian="kron", map_estimate=first, num_samples=s["samples"], seed=args.seed)
            record(f"Laplace KFAC ({subset.replace('_', ' ')}, GLM)", result.linearized_predict, t_ens + time.perf_counter() - start)
    if want("swag"):
        start = time.perf_counter()
        result = swag(model, d["x"], d["y"], num_epochs=s["swag_epochs"], batch_size=s["batch"], rank=20, num_samples=s["samples"],
                      map_estimate=first, seed=args.seed, progress=False)
        record("SWAG", sampled(model, result, None), t_ens + time.perf_counter() - start)
        rows["SWAG"]["lr"] = float(result.stats["lr"])
    steps = s["sg_epochs"] * math.ceil(d["x"].shape[0] / s["batch"])
    keep = steps // 2  # SGLD: after half the steps as burn-in; cyclical SGHMC: the second half of each cycle
    for key, name, sampler, extra in (("sgld", "SGLD", sgld, {}),
                                      ("sghmc", "cyclical SGHMC", sghmc, {"schedule": "cyclical", "num_cycles": 2, "exploration": 0.5, "friction": 0.1})):
        if want(key):
            start = time.perf_counter()
            result = sampler(model, d["x"], d["y"], step_size="auto", num_steps=steps, thinning=max(1, keep // s["samples"]),
                             batch_size=s["batch"], init=first, seed=args.seed, progress=False, **extra)
            record(name, sampled(model, result, None), t_ens + time.perf_counter() - start)
    if want("smile"):
        # SMILE's ensemble: a chain from each member, the paper's LeNet step size (0.01), tuned in warm-up
        start = time.perf_counter()
        per_chain = max(1, s["samples"] // ensemble.num_chains)
        result = smile(model, d["x"], d["y"], num_warmup=s["smile_warmup"], num_samples=s["smile_steps"], step_size=0.01, tune=True,
                       thinning=max(1, s["smile_steps"] // per_chain), batch_size=s["batch"], init=ensemble, seed=args.seed, progress=False)
        record(f"pSMILE ({ensemble.num_chains} chains from the ensemble)", sampled(model, result, None), t_ens + time.perf_counter() - start)
    for key, name, guide_fn, estimator in (("mc_dropout", "MC dropout (p = 0.1)", lambda m: pyrobnn.MCDropout(m, p=0.1), None),
                                           ("meanfield", "mean-field VI", lambda m: pyrobnn.MeanFieldNormal(m), "local")):
        if want(key):
            vi_model = new_model()
            guide = guide_fn(vi_model)
            start = time.perf_counter()
            pyrobnn.fit(vi_model, guide, d["x"], d["y"], epochs=s["vi_epochs"], batch_size=s["batch"], lr=1e-3, estimator=estimator,
                        progress=False, seed=args.seed)
            record(name, sampled(vi_model, guide, s["samples"]), time.perf_counter() - start)
    if want("ivon"):
        vi_model = new_model()
        start = time.perf_counter()
        # (quick: more epochs than the other VI methods get; its learning rate ramps up and decays over the run)
        result = pyrobnn.ivon(vi_model, d["x"], d["y"], epochs=s["ivon_epochs"], batch_size=s["batch"], seed=args.seed, progress=False)
        record("IVON", sampled(vi_model, result.guide, s["samples"]), time.perf_counter() - start)

    names = list(rows)
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(names) / cols), cols, figsize=(4 * cols, 4 * math.ceil(len(names) / cols)))
    for ax, name in zip(axes.reshape(-1), names):
        plot_reliability_diagram(ax, tests[name].probs, d["y_test"])
        ax.set_title(name, fontsize=9)
    for ax in axes.reshape(-1)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, os.path.join(args.out, "reliability.png" if args.only is None else f"reliability-{'-'.join(args.only)}.png"))
    saved = os.path.join(args.out, "results.json")
    if args.only is not None and os.path.exists(saved):
        with open(saved) as f:
            rows = {**json.load(f), **rows}
    atomic_write_text(json.dumps(rows, indent=1) + "\n", saved)

    print("\n| method | error (%) | NLL | ECE (%) | Brier | AUROC entropy: permuted / rotated | AUROC MI: permuted / rotated | fit (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['error']:.2f} | {r['nll']:.4f} | {r['ece']:.2f} | {r['brier']:.4f} | "
              f"{r['auroc_entropy_permuted']:.3f} / {r['auroc_entropy_rotated']:.3f} | {r['auroc_mi_permuted']:.3f} / {r['auroc_mi_rotated']:.3f} | {r['fit_s']:.0f} |")
    if args.results and not args.quick:
        command = "python benchmarks/mnist_uncertainty.py " + " ".join(argv if argv is not None else [])
        entries = []
        for name, r in rows.items():
            for metric, key in (("error", "error"), ("nll", "nll"), ("ece", "ece"), ("brier", "brier"),
                                ("auroc", "auroc_entropy_permuted"), ("auroc rotated", "auroc_entropy_rotated")):
                entries.append({"name": f"MNIST LeNet-300-100: {name}", "metric": metric, "value": r[key], "published": None,
                                "seed": args.seed, "seconds": r["fit_s"], "command": command})
        record_results(args.results, entries)
    summary = {"quick": args.quick, **{f"{name}/{k}": round(v, 4) for name, r in rows.items() for k, v in r.items() if k in ("error", "nll", "ece")}}
    print(json.dumps(summary))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
