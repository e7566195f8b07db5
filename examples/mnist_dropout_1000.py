"""The dropout family on 1000 MNIST training images: a 2 x 500 ReLU MLP without dropout, with
MC dropout (Gal & Ghahramani 2016), concrete dropout (Gal et al. 2017) and variational dropout
(Kingma et al. 2015), each evaluated at the posterior mean (weight scaling) and by MC sampling,
over 5 seeds.

    python examples/mnist_dropout_1000.py              # 5 seeds x 4 methods, minutes
    python examples/mnist_dropout_1000.py --quick      # CI: 1 seed, fewer epochs

Settings: the same 1000 images for every seed (subset seed 0), the full 10,000-image test set,
Adam lr 1e-3, batch 100; prior N(0, 1) on the weights of the dropout nets (weight decay
(1 - p) / (2 N) per example), dropout p = 0.5 on the hidden layers and 0.2 on the inputs for
MC dropout; concrete dropout learns p per layer (starting at 0.1, temperature 0.1);
variational dropout learns one alpha per input unit (Kingma's type A) under the log-uniform
prior, alpha <= 1. The base net is a plain PyTorch net trained to the same number of epochs.
"""

import argparse
import json
import time

import torch
from torch import nn

import pyrobnn
from pyrobnn.data import mnist
from pyrobnn.utils.io import record_results
from pyrobnn.evaluation.metrics import accuracy

PUBLISHED = {  # test accuracy %, (posterior mean, MC sampling)
    "base": (89.37, None),
    "MC dropout": (90.07, 90.17),
    "concrete dropout": (90.23, 90.20),
    "variational dropout": (88.77, 89.60),
}

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--data", default=None, help="folder holding MNIST/raw (default $PYROBNN_DATA)")
parser.add_argument("--epochs", type=int, default=300)
parser.add_argument("--seeds", type=int, default=5)
parser.add_argument("--samples", type=int, default=100, help="MC samples for prediction")
parser.add_argument("--quick", action="store_true", help="1 seed, 15 epochs, 20 samples, 2000 test images (CI)")
parser.add_argument("--results", default=None, help="merge the figures into this JSON list")
args = parser.parse_args()

epochs = 15 if args.quick else args.epochs
num_samples = 20 if args.quick else args.samples
seeds = 1 if args.quick else args.seeds
x, y = mnist(args.data, train=True, subset=1000, seed=0)
x_test, y_test = mnist(args.data, train=False, subset=2000 if args.quick else None)
x, x_test = x.reshape(-1, 784), x_test.reshape(-1, 784)


def net():
    return pyrobnn.MLP(784, 10, hidden=(500, 500))


def base(seed):
    torch.manual_seed(seed)
    model = net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(x.shape[0], generator=generator).split(100):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
    with torch.no_grad():
        return 100 * accuracy(torch.softmax(model(x_test), -1), y_test), None, {}


def bayesian(make_guide, prior):
    def run(seed):
        torch.manual_seed(seed)
        model = pyrobnn.BayesianModel(net(), pyrobnn.CategoricalLikelihood(), prior, random="weights")
        guide = make_guide(model)
        pyrobnn.fit(model, guide, x, y, epochs=epochs, batch_size=100, lr=1e-3, seed=seed, progress=False)
        mean = pyrobnn.predict(model, guide, x_test, method="mean").accuracy(y_test)
        sampled = pyrobnn.predict(model, guide, x_test, num_samples=num_samples, sample_batch_size=25, seed=seed).accuracy(y_test)
        extra = {}
        if isinstance(guide, pyrobnn.ConcreteDropout):
            extra["dropout_p"] = {k: round(float(v), 4) for k, v in guide.dropout_probabilities().items()}
        return 100 * mean, 100 * sampled, extra

    return run


methods = {
    "base": base,
    "MC dropout": bayesian(lambda m: pyrobnn.MCDropout(m, p={"0.weight": 0.2, "*": 0.5}), pyrobnn.NormalPrior(1.0)),
    "concrete dropout": bayesian(lambda m: pyrobnn.ConcreteDropout(m, init_p=0.1), pyrobnn.NormalPrior(1.0)),
    "variational dropout": bayesian(
        lambda m: pyrobnn.VariationalDropout(m, alpha="unit", init_log_alpha=0.0, log_alpha_range=(-8.0, 0.0)), pyrobnn.LogUniformPrior()
    ),
}

rows, entries = {}, []
start = time.perf_counter()
for name, run in methods.items():
    t0 = time.perf_counter()
    outs = [run(seed) for seed in range(seeds)]
    mean_acc = torch.tensor([o[0] for o in outs])
    sampled = torch.tensor([o[1] for o in outs]) if outs[0][1] is not None else None
    std = lambda t: t.std().item() if t.numel() > 1 else 0.0  # noqa: E731
    rows[name] = {
        "mean_prediction": (mean_acc.mean().item(), std(mean_acc)),
        "mc_sampling": None if sampled is None else (sampled.mean().item(), std(sampled)),
        "seconds": time.perf_counter() - t0,
        **outs[0][2],  # extras (concrete dropout's p) of seed 0
    }
    if "dropout_p" in rows[name]:
        rows[name]["dropout_p_per_seed"] = [o[2]["dropout_p"] for o in outs]

print(f"{'method':22s} | {'posterior mean (ours)':>22s} | {'published':>13s} | {'MC sampling (ours)':>19s} | {'published':>13s}")
for name, row in rows.items():
    pm, mc = PUBLISHED[name]
    cells = [f"{row['mean_prediction'][0]:.2f} ± {row['mean_prediction'][1]:.2f}", str(pm)]
    cells += [f"{row['mc_sampling'][0]:.2f} ± {row['mc_sampling'][1]:.2f}" if row["mc_sampling"] else "-", str(mc) if mc else "-"]
    print(f"{name:22s} | {cells[0]:>22s} | {cells[1]:>13s} | {cells[2]:>19s} | {cells[3]:>13s}")
if "concrete dropout" in rows:
    print("concrete dropout's learned p per layer (seed 0):", rows["concrete dropout"].get("dropout_p"))
print(f"{seeds} seed(s), {epochs} epochs, {time.perf_counter() - start:.0f} s")

if args.results:
    command = f"python examples/mnist_dropout_1000.py --epochs {epochs} --seeds {seeds}" + (" --quick" if args.quick else "")
    for name, row in rows.items():
        label = f"1000-image MNIST, {name}" + (" (quick)" if args.quick else "")
        for key, pub, metric in (("mean_prediction", PUBLISHED[name][0], "test accuracy %, posterior mean"), ("mc_sampling", PUBLISHED[name][1], "test accuracy %, MC sampling")):
            if row[key] is not None:
                entries.append({"name": label, "metric": metric, "value": row[key][0], "std_over_seeds": row[key][1], "published": pub, "command": command, "seeds": list(range(seeds)), "epochs": epochs})
    record_results(args.results, entries)
print(json.dumps({"epochs": epochs, "seeds": seeds, "chance_accuracy": 10.0, "methods": rows}))
