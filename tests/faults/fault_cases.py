"""The runs the fault suite interrupts, shared by the tests and the processes they start: a
small regression network, its data, and each long-running method at a size that takes a few
seconds on one thread (long enough to be stopped part way, short enough to run again whole)."""

import math

import pyro.distributions as dist
import torch

import pyrobnn


def model():
    torch.manual_seed(0)
    return pyrobnn.BayesianModel(
        pyrobnn.MLP(1, 1, hidden=(8,)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.1), 0.5)), pyrobnn.NormalPrior(1.0)
    )


def data(n=32):
    g = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, n).unsqueeze(-1)
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g)


RUNS = {
    "nuts": lambda m, x, y, **kw: pyrobnn.nuts(m, x, y, num_samples=20, num_warmup=20, num_chains=2, max_tree_depth=4, backend="eager", **kw),
    # phase 1: steps 1-30, phase 2: 31-42, phase 3: 43-52, then 60 steps of sampling
    "mclmc": lambda m, x, y, **kw: pyrobnn.mclmc(
        m, x, y, num_samples=60, num_warmup=(30, 12, 10), num_chains=2, thinning=2, diagonal_preconditioning=True, backend="eager", **kw
    ),
    "sgld": lambda m, x, y, **kw: pyrobnn.sgld(m, x, y, num_steps=80, thinning=4, batch_size=8, num_chains=2, step_size=1e-3, **kw),
    "sghmc": lambda m, x, y, **kw: pyrobnn.sghmc(m, x, y, num_steps=80, thinning=4, batch_size=8, num_chains=2, step_size=1e-4, **kw),
    "smile": lambda m, x, y, **kw: pyrobnn.smile(m, x, y, num_samples=30, num_warmup=20, thinning=2, batch_size=8, num_chains=2, **kw),
    "ensemble": lambda m, x, y, **kw: pyrobnn.deep_ensemble(m, x, y, num_members=2, max_epochs=15, batch_size=8, **kw),
    "swag": lambda m, x, y, **kw: pyrobnn.swag(m, x, y, num_epochs=20, batch_size=8, rank=3, num_samples=10, map_options={"max_epochs": 6}, **kw),
}


def fit(checkpoint=None, callback=None, epochs=30):
    """SVI on the same network: returns the model, guide and history."""
    m = model()
    guide = pyrobnn.MeanFieldNormal(m)
    x, y = data()
    kw = {} if checkpoint is None else {"checkpoint": pyrobnn.Checkpointing(checkpoint, every=1000), "resume": True}
    history = pyrobnn.fit(m, guide, x, y, epochs=epochs, batch_size=8, progress=False, seed=0, callback=callback, **kw)
    return m, guide, history


def draws(result) -> dict:
    return {k: v.detach().clone() for k, v in result.samples.items()}


def wide_model():
    """Wider than :func:`model` (2 x 64 units): large enough for torch to split its matrix
    products and sums over threads."""
    torch.manual_seed(0)
    return pyrobnn.BayesianModel(
        pyrobnn.MLP(1, 1, hidden=(64, 64)), pyrobnn.GaussianLikelihood(scale=dist.LogNormal(math.log(0.1), 0.5)), pyrobnn.NormalPrior(1.0)
    )
