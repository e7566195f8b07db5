"""Bayesian regression on a toy 1-D data set with a gap, trained with Pyro's own SVI.

    python examples/regression.py --out regression.png          # about 20 s
    python examples/regression.py --quick --out regression.png  # CI

The model and guide are ordinary Pyro callables: pyro.infer.SVI trains them and
pyro.infer.Predictive samples from them; pyrobnn.predict summarizes the predictive.

Mean-field VI is known to overestimate the noise on small data sets and to be
overconfident inside gaps between the data (Foong et al. 2019); the plot shows both.
"""

import argparse
import json

import matplotlib.pyplot as plt
import pyro
import torch

import pyrobnn
from pyrobnn.data import gap_regression
from pyrobnn.evaluation.plotting import plot_regression_1d, save_figure

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--quick", action="store_true", help="few steps, for CI")
parser.add_argument("--out", default="regression.png")
args = parser.parse_args()

pyro.set_rng_seed(0)
x, y = gap_regression(n=120, noise=0.1, seed=0)
x_test, y_test = gap_regression(n=500, noise=0.1, seed=1)

# a network, a prior, a likelihood: the model; a variational family: the guide
net = pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh")
model = pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale="learned", init_scale=0.1), pyrobnn.NormalPrior(1.0))
guide = pyrobnn.MeanFieldNormal(model)

svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), pyro.infer.Trace_ELBO())
steps = 300 if args.quick else 4000
for step in range(steps):
    loss = svi.step(x, y)
    if step % 500 == 0:
        print(f"step {step:5d}  loss {loss:9.2f}")

test = pyrobnn.predict(model, guide, x_test, num_samples=500)
results = {"rmse": test.rmse(y_test), "log_likelihood": test.log_likelihood(y_test), "coverage_90": test.coverage(y_test)}
print(json.dumps(results))

grid = torch.linspace(-1.5, 1.5, 300).unsqueeze(-1)
fig, ax = plt.subplots(figsize=(6, 4))
plot_regression_1d(ax, grid, pyrobnn.predict(model, guide, grid, num_samples=500), x, y, title="mean-field BNN, data with a gap")
ax.legend(fontsize=7)
save_figure(fig, args.out)
print(f"wrote {args.out}")
