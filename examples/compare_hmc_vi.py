"""NUTS beside variational inference on a toy regression with a gap, from Python.

    python examples/compare_hmc_vi.py --out compare.png           # about 3 minutes
    python examples/compare_hmc_vi.py --quick --out compare.png   # CI

Fits the same Bayesian network by NUTS (the reference posterior) and by mean-field VI and
concrete dropout, reports how far each VI predictive is from NUTS's (2-Wasserstein distance
between predictive marginals), checks NUTS's convergence on predictions with ArviZ, and plots
the three predictives. `pyrobnn compare` does the same for every method and for UCI data.
"""

import argparse
import json
import math

import matplotlib.pyplot as plt
import pyro
import pyro.distributions as dist
import torch

import pyrobnn
from pyrobnn.infer.results import diagnostics
from pyrobnn.apps.compare import predictive_w2
from pyrobnn.data import gap_regression
from pyrobnn.evaluation.plotting import plot_regression_1d, save_figure

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--quick", action="store_true", help="short runs, for CI")
parser.add_argument("--out", default="compare.png")
args = parser.parse_args()

pyro.set_rng_seed(0)
x, y = gap_regression(n=100, noise=0.1, seed=0)
x_test, y_test = gap_regression(n=200, noise=0.1, seed=1)
grid = torch.linspace(-1.6, 1.6, 300).unsqueeze(-1)


def make_model():
    # one model for every method: 1-50-1 tanh network, N(0, 1) weights, log-normal noise prior
    net = pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh")
    return pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.25), 1.0)), pyrobnn.NormalPrior(1.0))


# the reference: NUTS, 8 chains in one batched computation
model = make_model()
chains, warmup, samples, depth = (2, 60, 60, 5) if args.quick else (8, 300, 300, 10)
result = pyrobnn.nuts(model, x, y, num_samples=samples, num_warmup=warmup, num_chains=chains, max_tree_depth=depth)
idata = diagnostics.inference_data(model, result, x_test, y_test)
print("NUTS convergence:", diagnostics.convergence_summary(idata))
predictions = {"NUTS": (pyrobnn.predict(model, result, x_test, None), pyrobnn.predict(model, result, grid, None))}

# two variational approximations of the same model
for label, make_guide in (("mean-field VI", pyrobnn.MeanFieldNormal), ("concrete dropout", pyrobnn.ConcreteDropout)):
    model = make_model()
    guide = make_guide(model)
    pyrobnn.fit(model, guide, x, y, epochs=150 if args.quick else 3000, lr=1e-2, estimator="local")
    predictions[label] = (pyrobnn.predict(model, guide, x_test, 500), pyrobnn.predict(model, guide, grid, 500))

results = {
    label: {**test.metrics(y_test), "w2_to_nuts": predictive_w2(test, predictions["NUTS"][0])}
    for label, (test, _) in predictions.items()
}
print(json.dumps(results, indent=1))

fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), sharey=True)
for ax, (label, (_, on_grid)) in zip(axes, predictions.items()):
    plot_regression_1d(ax, grid, on_grid, x, y, title=label)
axes[0].legend(fontsize=6)
save_figure(fig, args.out)
print(f"wrote {args.out}")
