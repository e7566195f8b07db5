"""Sparse variational dropout on MNIST (Molchanov, Ashukha & Vetrov 2017).

    python examples/mnist_sparse_vd.py --net lenet300100 --checkpoint runs/svd300.pt   # 200 epochs
    python examples/mnist_sparse_vd.py --net lenet5 --checkpoint runs/svd5.pt
    python examples/mnist_sparse_vd.py --quick                                         # CI, a minute

Recipe of the reference code: log-uniform prior on every weight (biases are point parameters),
per-weight alpha with the additive reparameterization (log sigma^2 starts at -10), log alpha
clipped to [-8, 8], local reparameterization, Adam lr 1e-3 at batch 100 for 200 epochs
(LeNet-300-100: constant to epoch 100, then linear to 0; LeNet-5: linear to 0 from the start),
KL weight 0 for 5 epochs and then linear to 1 at epoch 20, and the reference code's train-time
clipping: the mean of a weight with log alpha >= 3 is zero during training too, its noise kept
(``--no-train-clip`` trains the plain family instead). At the end, weights with log alpha >= 3
are zeroed and the network at the pruned posterior mean is evaluated and exported as a plain
``nn.Module``.

Two further details of the reference code (bayesgroup/variational-dropout-sparsifies-dnn,
``svdo-lasagne``), off by default and switched on by ``--reference``: ``--init reference``
(dense weights N(0, 0.01^2), convolutions Glorot-uniform, zero biases: what its layers end up
with) and ``--center`` (the training set's mean image subtracted from every input).

Training checkpoints every epoch; rerunning the same command resumes where it stopped.
MNIST is read from ``--data`` (default $PYROBNN_DATA) and copied to a cache, never written to.
"""

import argparse
import json
import time

import torch

import pyrobnn
from pyrobnn.guides import sparsity
from pyrobnn.data import mnist
from pyrobnn.utils.io import atomic_save, record_results
from pyrobnn.evaluation.metrics import error_percent

PUBLISHED = {"lenet300100": {"error": 1.92, "compression": 68}, "lenet5": {"error": 0.75, "compression": 280}}

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--net", choices=sorted(PUBLISHED), default="lenet300100")
parser.add_argument("--data", default=None, help="folder holding MNIST/raw (default $PYROBNN_DATA)")
parser.add_argument("--epochs", type=int, default=200)
parser.add_argument("--quick", action="store_true", help="5000 images, 3 epochs (CI)")
parser.add_argument("--checkpoint", default=None, help="save every epoch to / resume from this file")
parser.add_argument("--export", default=None, help="write the pruned deterministic network here")
parser.add_argument("--results", default=None, help="merge the figures into this JSON list")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--init", choices=("torch", "glorot", "reference"), default="torch",
                    help="initial weights: PyTorch's layer defaults; Glorot-uniform weights and zero biases everywhere; "
                         "or the reference code's (dense N(0, 0.01^2), convolutions Glorot-uniform, zero biases)")
parser.add_argument("--train-clip", action=argparse.BooleanOptionalAction, default=True,
                    help="zero the mean of weights with log alpha >= 3 while training, as the reference code does (default); --no-train-clip for the plain family")
parser.add_argument("--center", action="store_true", help="subtract the training set's mean image from the inputs (the exported net then expects centered inputs)")
parser.add_argument("--reference", action="store_true", help="the reference code's other details too: --train-clip --init reference --center")
args = parser.parse_args()
if args.reference:
    args.train_clip, args.init, args.center = True, "reference", True

epochs = 3 if args.quick else args.epochs
x, y = mnist(args.data, train=True, subset=5000 if args.quick else None)
x_test, y_test = mnist(args.data, train=False, subset=2000 if args.quick else None)
if args.center:
    mean_image = x.mean(0, keepdim=True)
    x, x_test = x - mean_image, x_test - mean_image

torch.manual_seed(args.seed)
net = pyrobnn.LeNet300100() if args.net == "lenet300100" else pyrobnn.LeNet5()
if args.init != "torch":
    for layer in net.modules():
        if isinstance(layer, torch.nn.Linear) and args.init == "reference":
            torch.nn.init.normal_(layer.weight, std=0.01)
            torch.nn.init.zeros_(layer.bias)
        elif isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d)):
            torch.nn.init.xavier_uniform_(layer.weight)
            torch.nn.init.zeros_(layer.bias)
model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood(), pyrobnn.LogUniformPrior(), random="weights")
guide = pyrobnn.SparseVariationalDropout(model, init_log_sigma2=-10.0, train_clip=3.0 if args.train_clip else None)


def lr_schedule(t):
    """Factor on the learning rate at fractional epoch t, as in the reference code: LeNet-300-100
    constant for the first half, then linear to 0; LeNet-5 linear to 0 from the start."""
    if args.quick:
        return 1.0
    if args.net == "lenet5":
        return max(0.0, (epochs - t) / epochs)
    half = epochs / 2
    return 1.0 if t < half else max(0.0, (epochs - t) / half)


def error_of(g):
    return error_percent(pyrobnn.predict(model, g, x_test, method="mean", batch_size=1000).probs, y_test)


def progress(trainer, epoch):
    masks = sparsity.masks_by_log_alpha(guide)
    report = sparsity.report(guide, masks)
    return {"test_err": error_of(sparsity.PrunedGuide(guide, masks)), "sparsity": 1.0 - 1.0 / report.compression}


annealing = (0, 1) if args.quick else (5, 20)
start = time.perf_counter()
history = pyrobnn.fit(
    model, guide, x, y, epochs=epochs, batch_size=100, lr=1e-3, estimator="local", kl_annealing=annealing,
    lr_schedule=lr_schedule, checkpoint=args.checkpoint, resume=args.checkpoint is not None, seed=args.seed,
    callback=progress,
).history
masks = sparsity.masks_by_log_alpha(guide, threshold=3.0)
pruned = sparsity.PrunedGuide(guide, masks)
report = sparsity.report(guide, masks)
error = error_of(pruned)
exported = sparsity.export(model, pruned)
with torch.no_grad():
    exported_error = error_percent(exported(x_test), y_test)
if args.export:
    atomic_save(exported.state_dict(), args.export)

print(report)
layers = " - ".join(f"{100 * s:.1f}" for s in report.as_dict()["sparsity_per_layer"].values())
pub = PUBLISHED[args.net]
print(f"{args.net}: test error {error:.2f}% (published {pub['error']}%), exported net {exported_error:.2f}%, "
      f"sparsity per layer {layers} %, compression {report.compression:.1f}x (published {pub['compression']}x), "
      f"{len(history.epoch)} epochs, {history.seconds[-1]:.0f} s of training")
result = {"net": args.net, "epochs": len(history.epoch), "error": error, "exported_error": exported_error,
          "chance_error": 90.0, **report.as_dict(), "train_seconds": history.seconds[-1], "wall_seconds": time.perf_counter() - start}
if args.results:
    command = (f"python examples/mnist_sparse_vd.py --net {args.net} --epochs {epochs} --seed {args.seed} --init {args.init}"
               + ("" if args.train_clip else " --no-train-clip") + (" --center" if args.center else "") + (" --quick" if args.quick else ""))
    details = [d for d, on in (("no train clip", not args.train_clip), (f"{args.init} init", args.init != "torch"), ("centered", args.center), (f"seed {args.seed}", args.seed != 0)) if on]
    name = f"sparse VD {args.net}" + (f" ({', '.join(details)})" if details else "") + (" (quick)" if args.quick else "")
    record_results(args.results, [
        {"name": name, "metric": "test error %", "value": error, "published": pub["error"], "command": command, "epochs": len(history.epoch), "seed": args.seed, "train_seconds": history.seconds[-1]},
        {"name": name, "metric": "compression", "value": report.compression, "published": pub["compression"], "command": command, "epochs": len(history.epoch), "seed": args.seed},
    ])
print(json.dumps(result))
