"""Bayes by Backprop on MNIST (Blundell et al. 2015): a 2 x 400 ReLU MLP with a scale-mixture
prior and a mean-field Normal posterior, then the signal-to-noise pruning table.

    python examples/mnist_bbb.py --checkpoint runs/bbb.pt          # 600 epochs (the paper's "at least")
    python examples/mnist_bbb.py --quick                           # CI, under a minute

Recipe: pixels divided by 126 (as in the paper), prior pi N(0, sigma1^2) + (1 - pi)
N(0, sigma2^2) with pi = 1/2, -log sigma1 = 0, -log sigma2 = 6 by default (``--pi``,
``--neg-log-sigma1``, ``--neg-log-sigma2`` choose another point of the paper's grid: pi in
{1/4, 1/2, 3/4}, -log sigma1 in {0, 1, 2}, -log sigma2 in {6, 7, 8}; the paper chose on a
validation set, which ``--validation N`` holds out: the last N training images, its error shown
beside the test error), one weight sample per minibatch of 128 (``--estimator local`` or
``flipout`` for a lower-variance gradient of the same objective), Monte Carlo KL
(``Trace_ELBO``), Adam lr 1e-3 (``--optimizer sgd`` for the paper's plain SGD, its learning
rate given for the paper's minibatch cost KL / M + summed minibatch NLL). Test error is that of
the posterior-mean network; pruning removes the weights with the lowest |mu| / sigma over the
whole network.

Training checkpoints every epoch; rerunning the same command resumes where it stopped.
"""

import argparse
import json
import math

import torch

import pyrobnn
from pyrobnn.guides import sparsity
from pyrobnn.data import mnist
from pyrobnn.utils.io import record_results
from pyrobnn.evaluation.metrics import error_percent

PUBLISHED_ERROR = 1.36  # 400 units, scale-mixture prior (Table 1)
PUBLISHED_PRUNING = {0.0: 1.24, 0.5: 1.24, 0.75: 1.24, 0.95: 1.29, 0.98: 1.39}  # 1200 units (Table 2)

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--data", default=None, help="folder holding MNIST/raw (default $PYROBNN_DATA)")
parser.add_argument("--epochs", type=int, default=600)
parser.add_argument("--hidden", type=int, default=400)
parser.add_argument("--quick", action="store_true", help="5000 images, 3 epochs (CI)")
parser.add_argument("--checkpoint", default=None, help="save every epoch to / resume from this file")
parser.add_argument("--results", default=None, help="merge the figures into this JSON list")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--pi", type=float, default=0.5, help="weight of the wide component of the prior")
parser.add_argument("--neg-log-sigma1", type=float, default=0.0, help="-log of the wide component's scale")
parser.add_argument("--neg-log-sigma2", type=float, default=6.0, help="-log of the narrow component's scale")
parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate, or SGD's on the paper's minibatch cost")
parser.add_argument("--validation", type=int, default=0, help="hold out the last N training images and report their error")
parser.add_argument("--estimator", choices=("weight", "local", "flipout"), default="weight",
                    help="gradient estimator of the likelihood term: one weight sample per minibatch (the paper's), "
                    "local reparameterization or flipout (same objective, lower variance)")
args = parser.parse_args()

epochs = 3 if args.quick else args.epochs
x, y = mnist(args.data, train=True, subset=5000 if args.quick else None)
x_test, y_test = mnist(args.data, train=False, subset=2000 if args.quick else None)
x, x_test = x * (255.0 / 126.0), x_test * (255.0 / 126.0)
if not 0 <= args.validation < len(x):
    parser.error(f"--validation must be in [0, {len(x)}), got {args.validation}")
n_train = len(x) - args.validation
x, y, x_val, y_val = x[:n_train], y[:n_train], x[n_train:], y[n_train:]

torch.manual_seed(args.seed)
net = pyrobnn.MLP(784, 10, hidden=(args.hidden, args.hidden))
prior = pyrobnn.ScaleMixturePrior(mixture_weight=args.pi, scale1=math.exp(-args.neg_log_sigma1), scale2=math.exp(-args.neg_log_sigma2))
model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood(), prior)
guide = pyrobnn.MeanFieldNormal(model)


batches = math.ceil(len(x) / 128)
# pyrobnn's loss is the full-data estimate N / B * (minibatch NLL) + KL, M = N / B times the
# paper's minibatch cost, so plain SGD on it takes lr / M to make the paper's steps
optimizer = None if args.optimizer == "adam" else (lambda params: torch.optim.SGD(params, lr=args.lr / batches))


def error_of(g, images=x_test, labels=y_test):
    probs = pyrobnn.predict(model, g, images.reshape(-1, 784), method="mean", batch_size=2000).probs
    return error_percent(probs, labels)


def progress(trainer, epoch):
    shown = {"val_err": error_of(guide, x_val, y_val)} if args.validation else {}
    return {**shown, "test_err": error_of(guide)}


history = pyrobnn.fit(
    model, guide, x.reshape(-1, 784), y, epochs=epochs, batch_size=128, lr=args.lr, optimizer=optimizer, elbo="trace",
    estimator=None if args.estimator == "weight" else args.estimator,
    checkpoint=args.checkpoint, resume=args.checkpoint is not None, seed=args.seed,
    callback=progress,
).history
table = {}
for fraction in PUBLISHED_PRUNING:
    table[fraction] = error_of(sparsity.PrunedGuide(guide, sparsity.masks_by_snr(guide, fraction)))
sampled = pyrobnn.predict(model, guide, x_test.reshape(-1, 784), num_samples=10, batch_size=2000, seed=0)
sampled_error = error_percent(sampled.probs, y_test)

print(f"{'removed':>8s} | {'test error %':>12s} | published (1200 units)")
for fraction, err in table.items():
    print(f"{100 * fraction:7.0f}% | {err:12.2f} | {PUBLISHED_PRUNING[fraction]}")
print(f"BBB 2 x {args.hidden}: posterior-mean test error {table[0.0]:.2f}% (published {PUBLISHED_ERROR}%), "
      f"10-sample predictive {sampled_error:.2f}%, {len(history.epoch)} epochs, {history.seconds[-1]:.0f} s")
result = {"hidden": args.hidden, "epochs": len(history.epoch), "error": table[0.0], "sampled_error": sampled_error,
          "pruning": {str(k): v for k, v in table.items()}, "chance_error": 90.0, "train_seconds": history.seconds[-1],
          "optimizer": args.optimizer, "lr": args.lr, "prior": {"pi": args.pi, "neg_log_sigma1": args.neg_log_sigma1, "neg_log_sigma2": args.neg_log_sigma2},
          "estimator": args.estimator, "validation_images": args.validation, "validation_error": error_of(guide, x_val, y_val) if args.validation else None}
if args.results:
    settings = f"--optimizer {args.optimizer} --lr {args.lr:g} --pi {args.pi:g} --neg-log-sigma1 {args.neg_log_sigma1:g} --neg-log-sigma2 {args.neg_log_sigma2:g} --estimator {args.estimator}"
    command = (f"python examples/mnist_bbb.py --epochs {epochs} --hidden {args.hidden} --seed {args.seed} {settings}"
               + (f" --validation {args.validation}" if args.validation else "") + (" --quick" if args.quick else ""))
    tuned = any(getattr(args, k) != parser.get_default(k) for k in ("optimizer", "lr", "pi", "neg_log_sigma1", "neg_log_sigma2", "estimator"))
    name = (f"Bayes by Backprop 2 x {args.hidden}" + (f" ({settings})" if tuned else "")
            + (f" ({args.validation} images held out)" if args.validation else "") + (f" (seed {args.seed})" if args.seed else "")
            + (" (quick)" if args.quick else ""))
    entries = [{"name": name, "metric": "test error %", "value": table[0.0], "published": PUBLISHED_ERROR, "command": command, "epochs": len(history.epoch), "seed": args.seed, "train_seconds": history.seconds[-1]}]
    entries += [{"name": name, "metric": f"test error % with {100 * f:.0f}% of weights removed by SNR", "value": e, "published": PUBLISHED_PRUNING[f], "command": command, "epochs": len(history.epoch), "seed": args.seed} for f, e in table.items() if f > 0]
    record_results(args.results, entries)
print(json.dumps(result))
