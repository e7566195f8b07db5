"""SVI under Lightning against our own loop, and from one process to two (DDP over gloo).

    python benchmarks/lightning_svi.py            # about three minutes on two cores
    python benchmarks/lightning_svi.py --quick    # seconds, for CI

LeNet-300-100 with a mean-field guide and local reparameterization (the MNIST setting:
softmax likelihood, batch 100, Adam) on synthetic inputs of MNIST's shape (the time does not
depend on the values), N examples per epoch. Methods, each timed over whole epochs after a
first one that is not counted (set-up, first-touch allocation):

- ``fit``: ``pyrobnn.fit``'s loop (``SVITrainer``), one process, the machine's threads.
- ``lightning_1``: ``SVIModule`` under ``L.Trainer(devices=1)``, one process, the same threads.
- ``lightning_ddp2``: ``SVIModule`` under ``L.Trainer(devices=2, strategy="ddp_spawn")``:
  two processes of one thread each (Lightning's default split of the cores), each taking
  ``N / 2`` examples per epoch in batches of 100, gradients averaged over gloo.

Figures: seconds per epoch (median over rounds; rounds interleave the methods because the
machine is shared and noisy), Lightning's overhead ``lightning_1 / fit`` and the scaling
``lightning_1 / lightning_ddp2`` (epoch time on the same data). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyrobnn
from pyrobnn.integrations.lightning import EndProcessGroup, SVIModule


def lenet():
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.LeNet300100(), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))
    return model, pyrobnn.MeanFieldNormal(model)


def data(n):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)


class EpochTimes(L.Callback):
    """Rank 0 writes the wall time of each training epoch to ``path`` (JSON)."""

    def __init__(self, path):
        self.path, self.times, self.start = path, [], None

    def on_train_epoch_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        self.times.append(time.perf_counter() - self.start)
        if trainer.global_rank == 0:
            with open(self.path, "w") as f:
                json.dump(self.times, f)


def time_fit(n, epochs, batch):
    model, guide = lenet()
    x, y = data(n)
    stamps = [time.perf_counter()]
    trainer = pyrobnn.SVITrainer(model, guide, lr=1e-3, estimator="local")
    trainer.fit(x, y, epochs=epochs + 1, batch_size=batch, progress=False, seed=0, callback=lambda t, e: stamps.append(time.perf_counter()))
    return [b - a for a, b in zip(stamps[1:], stamps[2:])]


def time_lightning(n, epochs, batch, devices):
    model, guide = lenet()
    x, y = data(n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "times.json")
        trainer = L.Trainer(
            accelerator="cpu", devices=devices, strategy="ddp_spawn" if devices > 1 else "auto", max_epochs=epochs + 1,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tmp, callbacks=[EpochTimes(path), EndProcessGroup()],
        )
        trainer.fit(SVIModule(model, guide, lr=1e-3, estimator="local"), DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True))
        with open(path) as f:
            return json.load(f)[1:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (for CI)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    n, epochs, rounds = (1_000, 1, 1) if args.quick else (12_000, 3, args.rounds)
    batch = 100
    per_epoch = {"fit": [], "lightning_1": [], "lightning_ddp2": []}
    for r in range(rounds):
        per_epoch["fit"] += time_fit(n, epochs, batch)
        per_epoch["lightning_1"] += time_lightning(n, epochs, batch, 1)
        per_epoch["lightning_ddp2"] += time_lightning(n, epochs, batch, 2)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in per_epoch.items()), flush=True)
    median = {k: statistics.median(v) for k, v in per_epoch.items()}
    steps = n // batch
    print(f"\nLeNet-300-100, mean-field, local reparameterization, batch {batch}, {n} examples per epoch, torch threads {torch.get_num_threads()}")
    print("| method | s per epoch | ms per step (of one process) |")
    print("|---|---|---|")
    for k, v in median.items():
        print(f"| {k} | {v:.3f} | {1e3 * v / (steps // (2 if k.endswith('ddp2') else 1)):.2f} |")
    ratios = {
        "lightning_overhead": median["lightning_1"] / median["fit"],
        "ddp2_speedup_over_lightning_1": median["lightning_1"] / median["lightning_ddp2"],
        "ddp2_speedup_over_fit": median["fit"] / median["lightning_ddp2"],
    }
    print(json.dumps({"seconds_per_epoch": median, **ratios}))


if __name__ == "__main__":
    sys.exit(main())
