"""SVI step time: pyrobnn against a plain PyTorch step and a hand-written Bayes by Backprop step.

    python benchmarks/svi_speed.py            # about 1 minute
    python benchmarks/svi_speed.py --quick    # a few seconds, for CI

Networks: LeNet-300-100 at batch 100 (softmax likelihood, N = 60,000) and the 1-50-1 tanh
regression MLP at batch 32 (Gaussian likelihood, N = 1,000), on synthetic inputs (time does
not depend on the values). Every method takes one Adam step per minibatch:

- ``plain``: the deterministic network, cross-entropy / squared error.
- ``handwritten``: pure-PyTorch Bayes by Backprop: mu and softplus(rho) per weight, one weight
  sample per minibatch, NLL * N / B plus the Monte Carlo KL log q(w) - log p(w) at that sample
  (the estimator of Pyro's Trace_ELBO), N(0, 1) prior.
- ``pyrobnn``: BayesianModel + MeanFieldNormal + SVITrainer with elbo="trace" (the same
  estimator), and the same with elbo="meanfield" (analytic KL) against a hand-written step
  with the analytic KL.
- ``pyro_svi``: the same model and guide under pyro.infer.SVI with pyro.optim.Adam.

Methods are timed in interleaved rounds (the machine is shared and noisy); each figure is the
median step time over all rounds. The last line is one JSON object of ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import pyro
import torch
import torch.nn.functional as F

import pyrobnn


def lenet_data(batch):
    return torch.randn(batch, 784), torch.randint(0, 10, (batch,)), 60_000


def mlp_data(batch):
    return torch.randn(batch, 1), torch.randn(batch, 1), 1_000


def plain_step(net_factory, loss_fn):
    net = net_factory()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y, n):
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    return step


class HandwrittenBBB:
    """Bayes by Backprop in plain PyTorch for a stack of Linear layers."""

    def __init__(self, sizes, activation, nll, analytic_kl=False):
        self.params = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layer = torch.nn.Linear(fan_in, fan_out)
            for p in (layer.weight, layer.bias):
                mu = p.detach().clone().requires_grad_()
                rho = torch.full_like(p, math.log(math.expm1(1e-3))).requires_grad_()
                self.params += [mu, rho]
        self.activation, self.nll, self.analytic_kl = activation, nll, analytic_kl
        self.opt = torch.optim.Adam(self.params, lr=1e-3)

    def __call__(self, x, y, n):
        self.opt.zero_grad(set_to_none=True)
        kl = 0.0
        h = x
        layers = len(self.params) // 4
        for i in range(layers):
            tensors = []
            for mu, rho in (self.params[4 * i : 4 * i + 2], self.params[4 * i + 2 : 4 * i + 4]):
                sigma = F.softplus(rho)
                eps = torch.randn_like(mu)
                w = mu + sigma * eps
                if self.analytic_kl:
                    kl = kl + (-torch.log(sigma) + 0.5 * (sigma**2 + mu**2) - 0.5).sum()
                else:
                    # log N(w; mu, sigma) - log N(w; 0, 1)
                    kl = kl + (-torch.log(sigma) - 0.5 * eps**2 + 0.5 * w**2).sum()
                tensors.append(w)
            h = F.linear(h, *tensors)
            if i < layers - 1:
                h = self.activation(h)
        loss = self.nll(h, y) * n / x.shape[0] + kl
        loss.backward()
        self.opt.step()


def pyrobnn_step(net_factory, likelihood, elbo):
    model = pyrobnn.BayesianModel(net_factory(), likelihood, pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model)
    trainer = pyrobnn.SVITrainer(model, guide, elbo=elbo, lr=1e-3)

    def step(x, y, n):
        trainer.step(x, y, dataset_size=n)

    return step


def pyro_svi_step(net_factory, likelihood):
    model = pyrobnn.BayesianModel(net_factory(), likelihood, pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.Trace_ELBO())

    def step(x, y, n):
        svi.step(x, y, dataset_size=n)

    return step


def time_methods(methods, data, rounds, steps):
    x, y, n = data
    times = {name: [] for name in methods}
    for fn in methods.values():
        for _ in range(10):
            fn(x, y, n)
    for _ in range(rounds):
        for name, fn in methods.items():
            for _ in range(steps):
                start = time.perf_counter()
                fn(x, y, n)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def benchmark(quick=False):
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    rounds, steps = (2, 10) if quick else (5, 40)
    gaussian_nll = lambda out, y: 0.5 * ((out - y) ** 2).sum() / 0.1**2  # noqa: E731
    suites = {
        "lenet300100_b100": dict(
            data=lenet_data(100),
            net=lambda: pyrobnn.LeNet300100(),
            sizes=[784, 300, 100, 10],
            activation=torch.relu,
            nll=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
            plain_loss=lambda out, y: F.cross_entropy(out, y),
            likelihood=pyrobnn.CategoricalLikelihood,
        ),
        "mlp_1_50_1_b32": dict(
            data=mlp_data(32),
            net=lambda: pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh"),
            sizes=[1, 50, 1],
            activation=torch.tanh,
            nll=gaussian_nll,
            plain_loss=lambda out, y: F.mse_loss(out, y),
            likelihood=lambda: pyrobnn.GaussianLikelihood(scale=0.1),
        ),
    }
    results = {}
    for name, s in suites.items():
        methods = {
            "plain": plain_step(s["net"], s["plain_loss"]),
            "handwritten_mc_kl": HandwrittenBBB(s["sizes"], s["activation"], s["nll"]),
            "pyrobnn_trace": pyrobnn_step(s["net"], s["likelihood"](), "trace"),
            "handwritten_analytic_kl": HandwrittenBBB(s["sizes"], s["activation"], s["nll"], analytic_kl=True),
            "pyrobnn_meanfield": pyrobnn_step(s["net"], s["likelihood"](), "meanfield"),
            "pyro_svi": pyro_svi_step(s["net"], s["likelihood"]()),
        }
        medians = time_methods(methods, s["data"], rounds, steps)
        results[name] = medians
        print(f"\n{name}: median step time (ms), ratio to plain")
        for method, t in medians.items():
            print(f"  {method:26s} {1e3 * t:8.3f} ms   x{t / medians['plain']:.2f}")
    lenet, mlp = results["lenet300100_b100"], results["mlp_1_50_1_b32"]
    ratios = {
        "meanfield_vs_handwritten": lenet["pyrobnn_trace"] / lenet["handwritten_mc_kl"],
        "meanfield_vs_plain": lenet["pyrobnn_trace"] / lenet["plain"],
        "meanfield_analytic_vs_handwritten": lenet["pyrobnn_meanfield"] / lenet["handwritten_analytic_kl"],
        "pyro_svi_vs_handwritten": lenet["pyro_svi"] / lenet["handwritten_mc_kl"],
        "mlp_meanfield_vs_handwritten": mlp["pyrobnn_trace"] / mlp["handwritten_mc_kl"],
        "mlp_meanfield_vs_plain": mlp["pyrobnn_trace"] / mlp["plain"],
    }
    print(json.dumps({k: round(v, 3) for k, v in ratios.items()}))
    return ratios


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    benchmark(args.quick)
