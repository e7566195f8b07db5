"""What the fault protections cost, each timed against itself switched off in the same run
(this machine is shared and noisy: rounds are interleaved and the medians compared).

    python benchmarks/reliability_overheads.py            # about a minute
    python benchmarks/reliability_overheads.py --quick    # seconds, for CI

- ``svi step``: ``fit``'s step with the overflow guard (one copy of the parameters per step, a
  finiteness check after the update, :class:`pyrobnn.infer.core.failures.OverflowGuard`)
  against the same step with the guard's two calls replaced by no-ops: the 1-50-50-1 MLP at full
  batch (100 points) and LeNet-300-100 at batch 100.
- ``checkpoint write``: a NUTS-sized run state (64 chains x 2,000 draws of the 1-50-1 MLP's 151
  weights, 77 MB) written by ``RunCheckpoint.save``, with its SHA-256 of the state and the
  in-memory serialization, against ``torch.save`` straight to the file.
- ``signal watch``: installing and removing the SIGTERM/SIGINT handlers around a run.

The last line is one JSON object of the ratios (protected / unprotected).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings

import torch

import pyrobnn
from pyrobnn.infer.core.checkpoints import RunCheckpoint
from pyrobnn.infer.core.interrupts import stop_signals


def _svi_case(name):
    torch.manual_seed(0)
    if name == "mlp":
        net, lik = pyrobnn.MLP(1, 1, hidden=(50, 50)), pyrobnn.GaussianLikelihood(scale=0.1)
        x = torch.linspace(-1, 1, 100).unsqueeze(-1)
        y = torch.sin(3 * x)
    else:
        net, lik = pyrobnn.LeNet300100(), pyrobnn.CategoricalLikelihood()
        x = torch.randn(100, 784)
        y = torch.randint(0, 10, (100,))
    model = pyrobnn.BayesianModel(net, lik, pyrobnn.NormalPrior(1.0))
    return model, x, y


def _time_steps(name, steps, guarded):
    model, x, y = _svi_case(name)
    trainer = pyrobnn.SVITrainer(model, pyrobnn.MeanFieldNormal(model))
    trainer.fit(x, y, epochs=2, progress=False)  # set up, warm
    if not guarded:
        trainer._guard.save = lambda: None
        trainer._guard.undo_overflow = lambda: torch.zeros((), dtype=torch.bool)
    start = time.perf_counter()
    trainer.fit(x, y, epochs=2 + steps, progress=False)
    return (time.perf_counter() - start) / steps * 1e3


def _time_checkpoint(folder, state, protected):
    path = os.path.join(folder, "run.ckpt")
    start = time.perf_counter()
    if protected:
        RunCheckpoint(path, "NUTS", {"seed": 0}).save(state, 1)
    else:
        torch.save({"state": state}, path)
    return (time.perf_counter() - start) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps, a smaller state")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    rounds, steps = (3, 50) if args.quick else (7, 300)
    ratios = {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {rounds} interleaved rounds")
    for name in ("mlp", "lenet"):
        times = {True: [], False: []}
        for _ in range(rounds):
            for guarded in (False, True):
                times[guarded].append(_time_steps(name, steps if name == "mlp" else steps // 5, guarded))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        ratios[f"svi_step_{name}"] = on / off
        print(f"svi step, {name:5s}: {off:.3f} ms without the overflow guard, {on:.3f} ms with it: x{on / off:.3f}")
    chains, draws = (16, 500) if args.quick else (64, 2000)
    state = {"draws": torch.randn(chains, draws, 151, dtype=torch.float64), "generator": torch.Generator().get_state(), "iteration": draws}
    with tempfile.TemporaryDirectory() as folder:
        times = {True: [], False: []}
        for _ in range(rounds):
            for protected in (False, True):
                times[protected].append(_time_checkpoint(folder, state, protected))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    ratios["checkpoint_write"] = on / off
    mb = state["draws"].numel() * 8 / 1e6
    print(f"checkpoint write, {mb:.0f} MB: {off:.1f} ms torch.save, {on:.1f} ms atomic with SHA-256: x{on / off:.2f}")
    start = time.perf_counter()
    for _ in range(1000):
        with stop_signals():
            pass
    print(f"signal watch: {(time.perf_counter() - start):.3f} ms per run (install and remove the two handlers)")
    print(json.dumps({k: round(v, 4) for k, v in ratios.items()}))


if __name__ == "__main__":
    main()
