"""What checking the data costs: the model's finiteness check under Pyro's own SVI (once per
tensor object, so every step with fresh minibatches) and the device-side check of every batch
in ``pyrobnn.fit``.

    python benchmarks/data_checks.py            # about a minute
    python benchmarks/data_checks.py --quick    # seconds

Each pair (checks on / off, the off variant patching the check out: ``FiniteOnce.__call__`` and
``SVITrainer._flag_batch``, the one thing measured) is timed in interleaved
rounds on the same model; figures are median seconds per step and their ratio. The last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyro
import torch

import pyrobnn
from pyrobnn.infer import SVITrainer
from pyrobnn.utils.validation import FiniteOnce

SETTINGS = {
    "mlp_1_50_1_batch_32": (lambda: pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh"), pyrobnn.GaussianLikelihood(scale=0.1), 1, 32),
    "lenet300100_batch_100": (pyrobnn.LeNet300100, pyrobnn.CategoricalLikelihood(), 784, 100),
}


def batches(features, batch, steps, classification):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(batch, features, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g) if classification else torch.randn(batch, 1, generator=g)
        yield x, y


def time_pyro_svi(name, steps, checks):
    make_net, likelihood, features, batch = SETTINGS[name]
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(make_net(), likelihood)
    guide = pyrobnn.MeanFieldNormal(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.Trace_ELBO())
    data = list(batches(features, batch, steps + 5, features > 1))
    original = FiniteOnce.__call__
    if not checks:
        FiniteOnce.__call__ = lambda self, t, n: None
    try:
        for x, y in data[:5]:
            svi.step(x, y, dataset_size=60_000)
        start = time.perf_counter()
        for x, y in data[5:]:
            svi.step(x, y, dataset_size=60_000)
        return (time.perf_counter() - start) / steps
    finally:
        FiniteOnce.__call__ = original


def time_fit(name, steps, checks):
    make_net, likelihood, features, batch = SETTINGS[name]
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(make_net(), likelihood)
    trainer = SVITrainer(model, pyrobnn.MeanFieldNormal(model), lr=1e-3)
    data = list(batches(features, batch, steps + 5, features > 1))
    original = SVITrainer._flag_batch
    if not checks:
        SVITrainer._flag_batch = lambda self, x, y: (y, torch.zeros((), dtype=torch.bool))
    try:
        for x, y in data[:5]:
            trainer.step(x, y, 60_000)
        start = time.perf_counter()
        for x, y in data[5:]:
            trainer.step(x, y, 60_000)  # the public step: the batch's checks, the update, the failure report
        return (time.perf_counter() - start) / steps
    finally:
        SVITrainer._flag_batch = original


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    steps, rounds = (20, 2) if args.quick else (300, 8)
    summary = {}
    print("| loop | setting | checks on (ms/step) | checks off (ms/step) | on / off |")
    print("|---|---|---|---|---|")
    for loop, timer in (("pyro_svi", time_pyro_svi), ("fit", time_fit)):
        for name in SETTINGS:
            on, off = [], []
            for r in range(rounds):
                for checks in ((True, False) if r % 2 == 0 else (False, True)):  # alternate which goes first
                    (on if checks else off).append(timer(name, steps, checks))
            ratio = statistics.median(on) / statistics.median(off)
            summary[f"{loop}_{name}"] = round(ratio, 3)
            print(f"| {loop} | {name} | {1e3 * statistics.median(on):.3f} | {1e3 * statistics.median(off):.3f} | {ratio:.3f} |", flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
