"""A Bayesian classifier on two moons, trained with pyrobnn.fit and MC dropout.

    python examples/classification.py --out classification.png          # about 15 s
    python examples/classification.py --quick --out classification.png  # CI

Plots the predictive probability and the epistemic uncertainty (mutual information)
over the plane: it grows away from the data.
"""

import argparse
import json

import matplotlib.pyplot as plt
import pyro
import torch

import pyrobnn
from pyrobnn.data import two_moons
from pyrobnn.evaluation.plotting import save_figure

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--quick", action="store_true", help="few epochs, for CI")
parser.add_argument("--out", default="classification.png")
args = parser.parse_args()

pyro.set_rng_seed(0)
x, y = two_moons(500, noise=0.15, seed=0)
x_test, y_test = two_moons(2000, noise=0.15, seed=1)

net = pyrobnn.MLP(2, 2, hidden=(64, 64))
model = pyrobnn.BayesianModel(net, pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0))
guide = pyrobnn.MCDropout(model, p={"0.weight": 0.0, "*": 0.2})  # no dropout on the two inputs

history = pyrobnn.fit(model, guide, x, y, epochs=40 if args.quick else 400, batch_size=50, lr=3e-3, seed=0).history
test = pyrobnn.predict(model, guide, x_test, num_samples=100)
print(json.dumps({**test.metrics(y_test), "final_nll": history.nll[-1], "final_kl": history.kl[-1]}))

# predictive over the plane
g = torch.linspace(-2.0, 3.0, 120)
xx, yy = torch.meshgrid(g, g, indexing="xy")
grid = torch.stack([xx.reshape(-1), yy.reshape(-1)], -1)
pred = pyrobnn.predict(model, guide, grid, num_samples=100)
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, values, title in [
    (axes[0], pred.probs[:, 1], "P(class 1)"),
    (axes[1], pred.mutual_information, "mutual information (epistemic)"),
]:
    im = ax.contourf(xx, yy, values.reshape(xx.shape), levels=20, cmap="viridis")
    ax.scatter(x[:, 0], x[:, 1], c=y, s=6, cmap="coolwarm", edgecolors="k", linewidths=0.2)
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
save_figure(fig, args.out)
print(f"wrote {args.out}")
