"""Torch intra-op threads on a small BNN: one thread against the default, idle and with a core busy.

A 1-50-1 network's steps are too small to gain from a second intra-op thread, and when another
process holds a core the threads wait for each other. This times a deep ensemble (4 members, 200
epochs of minibatches of 32) and mean-field ``fit`` (300 epochs) in a fresh process per thread
count, with and without a busy-looping process beside it, and prints each time with its ratio to
one thread in the same condition.

    python benchmarks/threads.py            # about a minute
    python benchmarks/threads.py --quick    # CI
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

CHILD = """
import json, sys, time, torch, pyrobnn
torch.set_num_threads(int(sys.argv[1]))
epochs = int(sys.argv[2])
torch.manual_seed(0)
model = pyrobnn.BayesianModel(pyrobnn.MLP(1, 1, hidden=(50,)), pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0))
x = torch.randn(100, 1); y = torch.sin(x)
s = time.perf_counter()
pyrobnn.deep_ensemble(model, x, y, num_members=4, max_epochs=epochs, batch_size=32, progress=False)
ensemble = time.perf_counter() - s
s = time.perf_counter()
pyrobnn.fit(model, pyrobnn.MeanFieldNormal(model), x, y, epochs=round(1.5 * epochs), batch_size=32, progress=False)
print(json.dumps({"deep_ensemble": ensemble, "fit": time.perf_counter() - s}))
"""


def _busy():
    while True:
        pass


def _time(threads, epochs):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(epochs)], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 epochs instead of 200")
    args = parser.parse_args()
    epochs = 20 if args.quick else 200
    threads = sorted({1, os.cpu_count() or 1})
    for condition in ("idle", "one core busy"):
        hog = None
        if condition != "idle":
            hog = multiprocessing.get_context("spawn").Process(target=_busy, daemon=True)
            hog.start()
            time.sleep(0.5)
        try:
            times = {t: _time(t, epochs) for t in threads}
        finally:
            if hog is not None:
                hog.terminate()
        for task in ("deep_ensemble", "fit"):
            row = ", ".join(f"{t} thread(s) {times[t][task]:.2f} s ({times[t][task] / times[1][task]:.2f}x)" for t in threads)
            print(f"{condition:14s} {task:14s} {row}", flush=True)


if __name__ == "__main__":
    main()
