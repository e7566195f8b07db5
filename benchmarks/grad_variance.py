"""Kingma, Salimans & Welling 2015, Table 1: variance of minibatch gradient estimates on MNIST.

    python benchmarks/grad_variance.py --data ../shared/data            # 10 and 100 epochs (hours)
    python benchmarks/grad_variance.py --data ../shared/data --quick    # about a minute

A fully connected ReLU network (784-1024-1024-1024-10; 784-256-256-256-10 with --quick) with
variational dropout with independent weight noise (type B: q(w) = N(theta, alpha theta^2),
alpha <= 1, log-uniform prior) is trained with local reparameterization (Adam, lr 1e-3,
batch 100). At the chosen epochs, for each estimator, the gradient of the ELBO with respect to
the weight means theta is computed on ``--draws`` random minibatches of 100 with fresh noise;
the variance over draws, averaged over the weights of the bottom (first) and top (last)
layer, is reported:

- local reparameterization;
- a separate weight sample per data point (slow);
- one weight sample per minibatch (standard);
- no dropout noise (weights at theta: only the minibatch varies; the minimal variance).

Our gradients are of the ELBO summed over the data set, a scale the paper does not state, so
the absolute values are not comparable with the published ones; the ratios to local
reparameterization are, and are printed beside the paper's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pyro
import torch

import pyrobnn
from pyrobnn.data import mnist
from pyrobnn.models.estimators import Estimator, LocalReparameterization, PerExampleWeights, layer_forward
from pyrobnn.infer import SplitELBO

PUBLISHED = {  # Table 1 of Kingma et al. 2015: top 10 ep, top 100 ep, bottom 10 ep, bottom 100 ep
    "local reparameterization": (7.8e3, 1.2e3, 1.9e2, 1.1e2),
    "separate weight sample per data point": (1.4e4, 2.6e3, 4.3e2, 2.5e2),
    "one weight sample per minibatch": (4.9e4, 4.3e3, 8.5e2, 3.3e2),
    "no dropout noise": (2.8e3, 5.9e1, 1.3e2, 9.0e0),
}


class NoNoise(Estimator):
    """Every layer at its weights' means: the gradient varies only with the minibatch."""

    name = "no noise"

    def layer_output(self, module, x, w, b):
        return layer_forward(module, x, None if w is None else w.mean, None if b is None else b.mean)


def estimators():
    return {
        "local reparameterization": LocalReparameterization,
        "separate weight sample per data point": PerExampleWeights,
        "one weight sample per minibatch": None,
        "no dropout noise": NoNoise,
    }


def gradient_variance(model, guide, x, y, draws, batch, generator):
    bottom, top = model.sites[0], [s for s in model.sites if s.param_name == "weight"][-1]
    elbo = SplitELBO("analytic")
    result = {}
    for name, cls in estimators().items():
        grads = {bottom.name: [], top.name: []}
        for _ in range(draws):
            idx = torch.randint(0, x.shape[0], (batch,), generator=generator)
            guide.zero_grad()
            handler = cls() if cls is not None else None
            with handler if handler is not None else torch.enable_grad():
                elbo.differentiable_loss(model, guide, x[idx], y[idx], dataset_size=x.shape[0]).backward()
            for site in (bottom, top):
                grads[site.name].append(guide.theta[site.name.replace(".", ":")].grad.reshape(-1).clone())
        result[name] = {
            "top": torch.stack(grads[top.name]).var(0).mean().item(),
            "bottom": torch.stack(grads[bottom.name]).var(0).mean().item(),
        }
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="folder with MNIST/raw (default $PYROBNN_DATA)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", default=None, help="comma-separated epochs at which to measure")
    parser.add_argument("--draws", type=int, default=None, help="minibatch draws per estimate")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--checkpoint", default=None, help="resume training from / save to this file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    epochs = [int(e) for e in (args.epochs or ("1,2" if args.quick else "10,100")).split(",")]
    draws = args.draws or (20 if args.quick else 100)
    hidden = args.hidden or (256 if args.quick else 1024)
    x, y = mnist(args.data, train=True, subset=6000 if args.quick else None)
    x = x.reshape(x.shape[0], -1)

    pyro.set_rng_seed(args.seed)
    net = pyrobnn.MLP(784, 10, hidden=(hidden,) * 3)
    model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood(), pyrobnn.LogUniformPrior(), random="weights")
    # alpha = 1 at the start (Gaussian dropout with p = 0.5), at most 1 (Kingma et al.)
    guide = pyrobnn.VariationalDropout(model, alpha="weight", init_log_alpha=0.0, log_alpha_range=(-8.0, 0.0))
    trainer = pyrobnn.SVITrainer(model, guide, elbo="meanfield", lr=1e-3, estimator="local")
    generator = torch.Generator().manual_seed(args.seed)
    rows = {}
    start = time.perf_counter()
    for target in epochs:
        trainer.fit(x, y, epochs=target, batch_size=100, progress=sys.stderr.isatty(), checkpoint=args.checkpoint, resume=args.checkpoint is not None)
        rows[target] = gradient_variance(model, guide, x, y, draws, 100, generator)
        acc = pyrobnn.predict(model, guide, x[:2000], method="mean").accuracy(y[:2000])
        print(f"epoch {target}: training accuracy (posterior mean, 2000 images) {acc:.4f}, {time.perf_counter() - start:.0f} s", flush=True)
        print(json.dumps({"epoch": target, "variances": rows[target]}), flush=True)  # kept if a later epoch is cut off

    first, last = epochs[0], epochs[-1]
    print("\nvariance of minibatch gradients w.r.t. theta (ours; ratio to local reparameterization; paper's ratio)")
    print(f"{'estimator':40s} | top {first} ep | top {last} ep | bottom {first} ep | bottom {last} ep")
    table = {}
    for name in estimators():
        pub = PUBLISHED[name]
        pub_local = PUBLISHED["local reparameterization"]
        cells, entry = [], {}
        for (layer, epoch, k) in (("top", first, 0), ("top", last, 1), ("bottom", first, 2), ("bottom", last, 3)):
            value = rows[epoch][name][layer]
            ratio = value / rows[epoch]["local reparameterization"][layer]
            cells.append(f"{value:9.3g} (x{ratio:5.2f}; paper x{pub[k] / pub_local[k]:5.2f})")
            entry[f"{layer}_{epoch}"] = value
        table[name] = entry
        print(f"{name:40s} | " + " | ".join(cells))
    print(json.dumps({"epochs": epochs, "hidden": hidden, "draws": draws, "variances": table}))
    return table


if __name__ == "__main__":
    main()
