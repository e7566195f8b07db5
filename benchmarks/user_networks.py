"""Users' own networks at speed and in bounded memory: a CNN on 28x28 images (also with batch
normalization) and a residual MLP.

For NUTS, MCLMC, SGHMC, SMILE, IVON, mean-field VI (``fit``) and a deep ensemble, this prints the
gradient evaluations (or optimizer steps) per second of the method as a ratio to the same
network's plain ``torch.func`` gradient of the same log joint on the same rows and points, in a
loop; the predictive's image-forwards per second on the test set (10,000 images) as a ratio to
plain batched inference of the network (``net(x)`` under ``no_grad``); and the peak resident
memory of each, every measurement in a fresh process (its ``ru_maxrss``; a process that only
imports pyrobnn and builds the data is printed first, for what the method adds).

A method's rate is taken between two runs of the same call with the same seed, one longer than
the other: the longer run's extra evaluations over its extra time, so that start-up costs
(``torch.compile``, the native build, tuning) do not count; the first run's whole time is the
cold start, printed beside. The full-batch samplers' evaluations are counted where the potential
is called (one call for all chains, tuning included); a method that fails is printed and kept as
a row, and the others still run.

    python benchmarks/user_networks.py            # about 40 minutes on the two-core reference machine
    python benchmarks/user_networks.py --quick    # CI: tiny budgets, the same code paths

The CNN reads MNIST from the data folder (``$PYROBNN_DATA``, else ``../shared/data``) where it is,
else random 28x28 images (the times do not depend on the values). Figures: docs/logs/benchmarks.md.
"""

import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import json, resource, sys, time, warnings
import torch
from torch import nn
warnings.simplefilter("ignore")
torch.set_num_threads(1)
import pyrobnn
from pyrobnn.infer.core.potential import FlatPotential

spec = json.loads(sys.argv[1])
network, method, quick = spec["network"], spec["method"], spec["quick"]


class CNN(nn.Module):
    """Two 5x5 convolutions (16, 32 channels) with max pooling, then 1568 -> 24 -> 10: 51k weights."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 * 7 * 7, 24), nn.ReLU(), nn.Linear(24, 10))

    def forward(self, x):
        return self.head(self.features(x))


class BatchNormCNN(CNN):
    """The CNN with BatchNorm2d after its first convolution."""

    def __init__(self):
        super().__init__()
        self.features.insert(1, nn.BatchNorm2d(16))


class ResidualMLP(nn.Module):
    """8 -> 64, three residual tanh blocks, 64 -> 1: 12.9k weights."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 64)
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])
        self.out = nn.Linear(64, 1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.out(h)


def data():
    g = torch.Generator().manual_seed(0)
    if network in ("cnn", "cnn_batchnorm"):
        n, m = (200, 1000) if quick else (1000, 10000)
        try:
            from pyrobnn.data import mnist
            x, y = mnist(spec["data"], train=True, subset=n, seed=0)
            xt, yt = mnist(spec["data"], train=False, subset=m, seed=0)
            source = "MNIST"
        except Exception:
            x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
            xt, yt = torch.randn(m, 1, 28, 28, generator=g), torch.randint(0, 10, (m,), generator=g)
            source = "random images"
        return (CNN() if network == "cnn" else BatchNormCNN()), pyrobnn.CategoricalLikelihood(), x.reshape(-1, 1, 28, 28).float(), y.long(), xt.reshape(-1, 1, 28, 28).float(), source
    n, m = (200, 1000) if quick else (1000, 10000)
    x = torch.randn(n + m, 8, generator=g)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(n + m, generator=g)
    return ResidualMLP(), pyrobnn.GaussianLikelihood(0.1), x[:n], y[:n], x[n:], "synthetic regression"


net, lik, x, y, x_test, source = data()
torch.manual_seed(0)
model = pyrobnn.BayesianModel(net, lik, pyrobnn.NormalPrior(1.0))
CHAINS, BATCH, MEMBERS = 2, 128, 3

if method == "idle":
    out = {}
elif method == "auto_step":
    # SGHMC's step_size="auto" from 3 chains on n training images: the curvature estimate on its
    # subset, and one full-data Hessian-vector product (the old estimate took 50 of them)
    from pyrobnn.infer.core.curvature import largest_curvature
    from pyrobnn.infer.core.starts import chain_starts

    if network != "residual_mlp":
        from pyrobnn.data import mnist
        n = 500 if quick else 10000
        try:
            x, y = mnist(spec["data"], train=True, subset=n, seed=1)
            x = x.reshape(-1, 1, 28, 28).float()
        except Exception:
            x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    potential = FlatPotential(model, x, y)
    z = chain_starts(model, potential, None, 3, 0, torch.Generator().manual_seed(0))
    start = time.perf_counter()
    estimate = largest_curvature(potential, z, generator=torch.Generator().manual_seed(0))
    out = {"points": x.shape[0], "seconds": time.perf_counter() - start, "estimate": estimate.tolist()}
    start = time.perf_counter()
    largest_curvature(potential, z, iterations=1, points=None)
    out["full_data_product_seconds"] = time.perf_counter() - start
elif method == "baseline":
    # the same log joint's gradient by plain torch.func: functional_call of the network, vmapped
    # over rows, on the full data (the full-batch samplers) and on a minibatch (the others)
    names = [n for n, _ in net.named_parameters()]
    params = {n: p.detach() for n, p in net.named_parameters()}
    net.eval()

    def log_joint(p, xb, yb, scale):
        out = torch.func.functional_call(net, p, (xb,))
        log_lik = lik.distribution(out).log_prob(lik.check_targets(yb, out.shape)).sum()
        prior = sum(-0.5 * (v ** 2).sum() for v in p.values())
        return scale * log_lik + prior

    def rate(rows, xb, yb, reps):
        stacked = {n: v.unsqueeze(0).expand((rows,) + v.shape).clone() for n, v in params.items()}
        scale = x.shape[0] / xb.shape[0]
        grad = torch.func.vmap(torch.func.grad(log_joint), in_dims=(0, None, None, None))
        grad(stacked, xb, yb, scale)
        start = time.perf_counter()
        for _ in range(reps):
            grad(stacked, xb, yb, scale)
        return reps / (time.perf_counter() - start)

    reps = 3 if quick else 10
    out = {"full_batch_chains": rate(CHAINS, x, y, max(1, reps // 2)), "minibatch_chains": rate(CHAINS, x[:BATCH], y[:BATCH], reps),
           "minibatch_members": rate(MEMBERS, x[:BATCH], y[:BATCH], reps), "minibatch_one": rate(1, x[:BATCH], y[:BATCH], reps)}
    with torch.no_grad():
        net(x_test[:100])
        start = time.perf_counter()
        for i in range(0, x_test.shape[0], 1000):
            net(x_test[i : i + 1000])
        out["forwards_per_second"] = x_test.shape[0] / (time.perf_counter() - start)
    out["source"] = source
    out["weights"] = sum(p.numel() for p in net.parameters())
else:
    size = spec["size"]
    # the full-batch samplers' gradient evaluations, counted where they happen (one call: every
    # chain at once), warm-up and step-size search included; a run's trees and tuning are too
    # irregular for a count from its draws
    calls = [0]
    for name in ("value_and_grad", "value_and_grad_functional"):
        original = getattr(FlatPotential, name)

        def counted(self, z, _original=original):
            calls[0] += 1
            return _original(self, z)

        setattr(FlatPotential, name, counted)

    def run(size):
        if method == "nuts":
            r = pyrobnn.nuts(model, x, y, num_samples=size, num_warmup=2, num_chains=CHAINS, max_tree_depth=3, progress=False)
            return r, calls[0]
        if method == "mclmc":
            r = pyrobnn.mclmc(model, x, y, num_samples=size, num_warmup=(4, 2, 0), num_chains=CHAINS, thinning=size, progress=False)
            return r, calls[0]
        if method == "sghmc":
            # the automatic step size (the default 1e-5 diverges on the residual MLP at N = 1,000)
            r = pyrobnn.sghmc(model, x, y, step_size="auto", num_steps=size, thinning=size, batch_size=BATCH, num_chains=CHAINS, progress=False)
            return r, size
        if method == "smile":
            r = pyrobnn.smile(model, x, y, num_samples=size, num_warmup=10, thinning=size, batch_size=BATCH, num_chains=CHAINS, progress=False)
            return r, 2 * size  # two minibatch gradients per step
        if method == "ivon":
            r = pyrobnn.ivon(model, x, y, epochs=size, batch_size=BATCH, progress=False)
            return r, size * -(-x.shape[0] // BATCH)
        if method == "meanfield":
            r = pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=size, batch_size=BATCH, progress=False)
            return r, size * -(-x.shape[0] // BATCH)
        if method == "deep_ensemble":
            r = pyrobnn.deep_ensemble(model, x, y, num_members=MEMBERS, max_epochs=size, batch_size=BATCH, progress=False)
            return r, size * -(-x.shape[0] // BATCH)
        raise ValueError(method)

    start = time.perf_counter()
    result, evaluations = run(size)
    seconds = time.perf_counter() - start
    path = result.stats.get("path") if isinstance(result.stats.get("path"), str) else None
    if path not in (None, "eager"):
        evaluations = float("nan")  # compiled code calls the potential once, to trace it: no count
    out = {"seconds": seconds, "evaluations": evaluations, "path": path}
    if hasattr(result, "num_draws") and method in ("ivon", "meanfield"):
        result.num_draws = 10
    draws = result.as_draws().num_chains * result.as_draws().num_draws if method not in ("ivon", "meanfield") else 10
    if spec.get("predict"):
        result.predict(x_test[:50])
        start = time.perf_counter()
        result.predict(x_test, seed=0)
        out["predict_seconds"] = time.perf_counter() - start
        out["forwards"] = draws * x_test.shape[0]
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
'''

#: per method, the two run sizes (samples, steps or epochs) whose difference is timed: on the
#: residual MLP, and on the CNNs, whose full-data gradient takes seconds
SIZES = {
    "nuts": ((4, 12), (2, 6)), "mclmc": ((40, 200), (6, 16)), "sghmc": ((20, 120), (10, 40)), "smile": ((20, 120), (10, 40)),
    "ivon": ((1, 4), (1, 3)), "meanfield": ((1, 4), (1, 3)), "deep_ensemble": ((1, 4), (1, 3)),
}
QUICK = {"nuts": (2, 4), "mclmc": (6, 12), "sghmc": (5, 15), "smile": (5, 15), "ivon": (1, 2), "meanfield": (1, 2), "deep_ensemble": (1, 2)}
#: which baseline rate each method's evaluation is the counterpart of
BASELINE = {"nuts": "full_batch_chains", "mclmc": "full_batch_chains", "sghmc": "minibatch_chains", "smile": "minibatch_chains", "ivon": "minibatch_one",
            "meanfield": "minibatch_one", "deep_ensemble": "minibatch_members"}


def child(spec):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets (CI)")
    parser.add_argument("--networks", default="cnn,cnn_batchnorm,residual_mlp")
    parser.add_argument("--methods", default=",".join(SIZES))
    parser.add_argument("--data-dir", default=os.environ.get("PYROBNN_DATA") or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"),
                        help="the folder holding MNIST/raw (default $PYROBNN_DATA, else ../shared/data)")
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--no-auto-step", action="store_true", help="leave out the step_size='auto' measurement")
    args = parser.parse_args()
    results = {}
    idle = child({"network": "residual_mlp", "method": "idle", "quick": True, "data": args.data_dir})["peak_rss_mib"]
    print(f"a process that imports pyrobnn and builds the data: peak RSS {idle:.0f} MiB")
    for network in args.networks.split(","):
        base = child({"network": network, "method": "baseline", "quick": args.quick, "data": args.data_dir})
        print(f"\n{network}: {base['weights']:,} weights, {base['source']}; plain torch.func gradients per second: "
              f"{base['full_batch_chains']:.2f} (2 chains, full data), {base['minibatch_chains']:.1f} (2 chains, batch 128), "
              f"{base['minibatch_members']:.1f} (3 members), {base['minibatch_one']:.1f} (one network); plain inference "
              f"{base['forwards_per_second']:,.0f} forwards/s; peak RSS {base['peak_rss_mib']:.0f} MiB")
        print(f"{'method':15s} {'evals/s':>9s} {'ratio':>6s} {'cold s':>7s} {'path':>14s} {'pred fwd/s':>11s} {'ratio':>6s} {'peak MiB':>9s}")
        rows = {}
        for method in args.methods.split(","):
            small, large = QUICK[method] if args.quick else SIZES[method][0 if network == "residual_mlp" else 1]
            try:
                first = child({"network": network, "method": method, "quick": args.quick, "size": small, "data": args.data_dir})
                second = child({"network": network, "method": method, "quick": args.quick, "size": large, "predict": True, "data": args.data_dir})
            except RuntimeError as e:  # one method's failure is a figure too: printed, kept, and the others still run
                rows[method] = {"error": str(e).splitlines()[-1]}
                print(f"{method:15s} failed: {rows[method]['error']}")
                continue
            extra, elapsed = second["evaluations"] - first["evaluations"], second["seconds"] - first["seconds"]
            rate = extra / elapsed if extra > 0 and elapsed > 0 else float("nan")  # nan: the longer run was not measurably longer
            forwards = second["forwards"] / second["predict_seconds"]
            row = {
                "evaluations_per_second": rate, "ratio_to_torch_func": rate / base[BASELINE[method]], "cold_seconds": first["seconds"],
                "path": second["path"] or "-", "predict_forwards_per_second": forwards,
                "predict_ratio_to_inference": forwards / base["forwards_per_second"], "peak_rss_mib": second["peak_rss_mib"],
            }
            rows[method] = row
            print(f"{method:15s} {rate:9.2f} {row['ratio_to_torch_func']:6.2f} {first['seconds']:7.1f} {row['path']:>14s} "
                  f"{forwards:11,.0f} {row['predict_ratio_to_inference']:6.2f} {row['peak_rss_mib']:9.0f}")
        results[network] = {"baseline": base, "methods": rows, "idle_peak_rss_mib": idle}
        if not args.no_auto_step:
            auto = results[network]["auto_step"] = child({"network": network, "method": "auto_step", "quick": args.quick, "data": args.data_dir})
            print(f"step_size='auto' from 3 chains on {auto['points']:,} training points: {auto['seconds']:.1f} s, peak RSS "
                  f"{auto['peak_rss_mib']:.0f} MiB; one full-data Hessian-vector product {auto['full_data_product_seconds']:.1f} s "
                  f"(the full-data estimate took 50)")
        if args.out:  # after every network, so that a long run keeps what it measured
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
