"""SVI step time and memory: pyrobnn against plain PyTorch, hand-written BNN steps and
bayesian-torch.

    python benchmarks/svi_speed.py             # a few minutes (one torch.compile included)
    python benchmarks/svi_speed.py --quick     # seconds, no compilation, for CI
    python benchmarks/svi_speed.py --default-allocator   # without tune_cpu_allocator()

Networks, on synthetic inputs (time does not depend on the values): LeNet-300-100 at batch
100 and 1000 (softmax likelihood, N = 60,000) and the 1-50-1 tanh regression MLP at batch 32
(Gaussian likelihood, N = 1,000). Every method takes one Adam step per minibatch:

- ``plain``: the deterministic network, ``torch.optim.Adam`` with its defaults.
- ``handwritten_bbb``: Bayes by Backprop in plain PyTorch: mu and softplus(rho) per weight, one
  weight sample per minibatch, NLL * N / B plus the Monte Carlo KL log q(w) - log p(w) at that
  sample (Pyro's ``Trace_ELBO`` estimator), N(0, 1) prior, default Adam.
- ``handwritten_lrt``: the same network with local reparameterization and the analytic KL.
- ``pyrobnn_trace``: BayesianModel + MeanFieldNormal + SVITrainer(elbo="trace"): the
  ``handwritten_bbb`` estimator.
- ``pyrobnn_sample`` / ``pyrobnn_lrt`` / ``pyrobnn_flipout``: elbo="meanfield" (analytic KL)
  with one weight sample per minibatch / local reparameterization / flipout; ``..._compiled``
  with ``compile=True``.
- ``pyro_svi``: the same model and guide under ``pyro.infer.SVI`` and ``pyro.optim.Adam``.
- ``bayesian_torch_reparam`` / ``_flipout``: bayesian-torch's ``LinearReparameterization``
  (one weight sample per minibatch) and ``LinearFlipout``, analytic KL, if it is installed.

Methods are timed in interleaved rounds, because this machine is shared and noisy; each figure
is the median step time over all rounds. Peak memory of one step is the growth of the
process's resident set over the first step in a fresh subprocess (gradients, optimizer state,
activations, temporaries). The last line is one JSON object of
ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import pyro
import torch
import torch.nn.functional as F

import pyrobnn
from pyrobnn.utils.runtime import tune_cpu_allocator

N_LENET, N_MLP = 60_000, 1_000


def data(suite, batch):
    if suite.startswith("lenet"):
        return torch.randn(batch, 784), torch.randint(0, 10, (batch,)), N_LENET
    return torch.randn(batch, 1), torch.randn(batch, 1), N_MLP


SUITES = {
    "lenet": dict(
        net=lambda: pyrobnn.LeNet300100(),
        sizes=[784, 300, 100, 10],
        activation=torch.relu,
        nll=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
        plain_loss=lambda out, y: F.cross_entropy(out, y),
        likelihood=pyrobnn.CategoricalLikelihood,
    ),
    "mlp": dict(
        net=lambda: pyrobnn.MLP(1, 1, hidden=(50,), activation="tanh"),
        sizes=[1, 50, 1],
        activation=torch.tanh,
        nll=lambda out, y: 0.5 * ((out - y) ** 2).sum() / 0.1**2,
        plain_loss=lambda out, y: F.mse_loss(out, y),
        likelihood=lambda: pyrobnn.GaussianLikelihood(scale=0.1),
    ),
}


def plain_step(s):
    net = s["net"]()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(x, y, n):
        opt.zero_grad(set_to_none=True)
        s["plain_loss"](net(x), y).backward()
        opt.step()

    return step


class Handwritten:
    """A Bayesian MLP in plain PyTorch: mu and rho per weight, sigma = softplus(rho)."""

    def __init__(self, s, local):
        self.params = []
        for fan_in, fan_out in zip(s["sizes"][:-1], s["sizes"][1:]):
            layer = torch.nn.Linear(fan_in, fan_out)
            for p in (layer.weight, layer.bias):
                self.params += [p.detach().clone().requires_grad_(), torch.full_like(p, math.log(math.expm1(1e-3))).requires_grad_()]
        self.activation, self.nll, self.local = s["activation"], s["nll"], local
        self.opt = torch.optim.Adam(self.params, lr=1e-3)

    def __call__(self, x, y, n):
        self.opt.zero_grad(set_to_none=True)
        kl, h = 0.0, x
        layers = len(self.params) // 4
        for i in range(layers):
            mu_w, rho_w, mu_b, rho_b = self.params[4 * i : 4 * i + 4]
            s_w, s_b = F.softplus(rho_w), F.softplus(rho_b)
            if self.local:
                # local reparameterization, analytic KL against N(0, 1)
                for mu, s in ((mu_w, s_w), (mu_b, s_b)):
                    kl = kl + (0.5 * (s * s + mu * mu) - torch.log(s) - 0.5).sum()
                mean = F.linear(h, mu_w, mu_b)
                var = F.linear(h * h, s_w * s_w, s_b * s_b)
                h = mean + torch.sqrt(var) * torch.randn_like(mean)
            else:
                # one weight sample per minibatch, Monte Carlo KL at the sample
                weights = []
                for mu, s in ((mu_w, s_w), (mu_b, s_b)):
                    eps = torch.randn_like(mu)
                    w = mu + s * eps
                    kl = kl + (-torch.log(s) - 0.5 * eps**2 + 0.5 * w**2).sum()
                    weights.append(w)
                h = F.linear(h, *weights)
            if i < layers - 1:
                h = self.activation(h)
        loss = self.nll(h, y) * n / x.shape[0] + kl
        loss.backward()
        self.opt.step()


def pyrobnn_step(s, elbo, estimator=None, compile=False):
    model = pyrobnn.BayesianModel(s["net"](), s["likelihood"](), pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model)
    trainer = pyrobnn.SVITrainer(model, guide, elbo=elbo, lr=1e-3, estimator=estimator, compile=compile)

    def step(x, y, n):
        trainer.step(x, y, dataset_size=n)

    return step


def pyro_svi_step(s):
    model = pyrobnn.BayesianModel(s["net"](), s["likelihood"](), pyrobnn.NormalPrior(1.0))
    guide = pyrobnn.MeanFieldNormal(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.Trace_ELBO())

    def step(x, y, n):
        svi.step(x, y, dataset_size=n)

    return step


def bayesian_torch_step(s, flipout):
    try:
        from bayesian_torch.layers import LinearFlipout, LinearReparameterization
    except ImportError:
        return None
    layer_cls = LinearFlipout if flipout else LinearReparameterization
    layers = torch.nn.ModuleList(
        layer_cls(a, b, prior_mean=0.0, prior_variance=1.0, posterior_mu_init=0.0, posterior_rho_init=-6.9)
        for a, b in zip(s["sizes"][:-1], s["sizes"][1:])
    )
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)

    def step(x, y, n):
        opt.zero_grad(set_to_none=True)
        h, kl = x, 0.0
        for i, layer in enumerate(layers):
            h, k = layer(h)
            kl = kl + k
            if i < len(layers) - 1:
                h = s["activation"](h)
        (s["nll"](h, y) * n / x.shape[0] + kl).backward()
        opt.step()

    return step


def make_methods(suite, quick):
    s = SUITES[suite]
    methods = {
        "plain": plain_step(s),
        "handwritten_bbb": Handwritten(s, local=False),
        "handwritten_lrt": Handwritten(s, local=True),
        "pyrobnn_trace": pyrobnn_step(s, "trace"),
        "pyrobnn_sample": pyrobnn_step(s, "meanfield"),
        "pyrobnn_lrt": pyrobnn_step(s, "meanfield", "local"),
        "pyrobnn_flipout": pyrobnn_step(s, "meanfield", "flipout"),
        "pyro_svi": pyro_svi_step(s),
    }
    if not quick and suite == "lenet":
        methods["pyrobnn_lrt_compiled"] = pyrobnn_step(s, "meanfield", "local", compile=True)
        methods["pyrobnn_flipout_compiled"] = pyrobnn_step(s, "meanfield", "flipout", compile=True)
    for name, flip in (("bayesian_torch_reparam", False), ("bayesian_torch_flipout", True)):
        fn = bayesian_torch_step(s, flip)
        if fn is not None:
            methods[name] = fn
    return methods


def time_methods(methods, batch_data, rounds, steps):
    x, y, n = batch_data
    times = {name: [] for name in methods}
    for fn in methods.values():
        for _ in range(5):
            fn(x, y, n)
    for _ in range(rounds):
        for name, fn in methods.items():
            for _ in range(steps):
                start = time.perf_counter()
                fn(x, y, n)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_of(method, suite, batch):
    """Child process: peak resident growth over the first step (gradients, optimizer state,
    activations and temporaries), in bytes; the kernel's peak counter is reset just before."""
    x, y, n = data(suite, batch)
    fn = make_methods(suite, quick=True)[method]
    before = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    fn(x, y, n)
    return max(_status_bytes("VmHWM") - before, 0)


def measure_memory(methods, suite, batch, tuned):
    result = {}
    for method in methods:
        env = dict(os.environ)
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", method, suite, str(batch)] + ([] if tuned else ["--default-allocator"]),
            capture_output=True, text=True, env=env, timeout=600,
        )
        result[method] = int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    return result


def benchmark(quick=False, tuned=True):
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    rounds, steps = (2, 5) if quick else (6, 25)
    runs = [("lenet", 100), ("lenet", 1000), ("mlp", 32)]
    results = {}
    for suite, batch in runs:
        methods = make_methods(suite, quick)
        medians = time_methods(methods, data(suite, batch), rounds, steps if batch < 1000 else max(2, steps // 3))
        key = f"{suite}_b{batch}"
        results[key] = medians
        print(f"\n{key}: median step time (ms), ratio to plain")
        for method, t in medians.items():
            print(f"  {method:26s} {1e3 * t:8.3f} ms   x{t / medians['plain']:.2f}")
    b100, b1000, mlp = results["lenet_b100"], results["lenet_b1000"], results["mlp_b32"]

    def best(r, kind):
        return min(v for k, v in r.items() if k.startswith(f"pyrobnn_{kind}"))

    ratios = {
        "meanfield_vs_handwritten": b100["pyrobnn_trace"] / b100["handwritten_bbb"],
        "meanfield_vs_plain": b100["pyrobnn_trace"] / b100["plain"],
        "lrt_vs_handwritten": best(b100, "lrt") / b100["handwritten_lrt"],
        "lrt_eager_vs_handwritten": b100["pyrobnn_lrt"] / b100["handwritten_lrt"],
        "lrt_vs_plain_b100": best(b100, "lrt") / b100["plain"],
        "lrt_vs_plain_b1000": best(b1000, "lrt") / b1000["plain"],
        "flipout_vs_plain_b100": best(b100, "flipout") / b100["plain"],
        "handwritten_lrt_vs_plain_b100": b100["handwritten_lrt"] / b100["plain"],
        "handwritten_lrt_vs_plain_b1000": b1000["handwritten_lrt"] / b1000["plain"],
        "pyro_svi_vs_handwritten": b100["pyro_svi"] / b100["handwritten_bbb"],
        "mlp_meanfield_vs_handwritten": mlp["pyrobnn_trace"] / mlp["handwritten_bbb"],
        "mlp_meanfield_vs_plain": mlp["pyrobnn_trace"] / mlp["plain"],
        "mlp_lrt_vs_plain": mlp["pyrobnn_lrt"] / mlp["plain"],
    }
    if "bayesian_torch_reparam" in b100:
        for key, r in (("b100", b100), ("b1000", b1000)):
            ratios[f"sample_vs_bayesian_torch_{key}"] = r["pyrobnn_sample"] / r["bayesian_torch_reparam"]
            ratios[f"flipout_vs_bayesian_torch_{key}"] = best(r, "flipout") / r["bayesian_torch_flipout"]
    if not quick:
        memory = measure_memory(["plain", "handwritten_lrt", "pyrobnn_lrt", "pyrobnn_sample"], "lenet", 100, tuned)
        print("\npeak resident growth over one LeNet-300-100 step at batch 100 (MiB):")
        for k, v in memory.items():
            print(f"  {k:26s} {v / 2**20 if v is not None else float('nan'):8.2f}")
        if memory.get("plain"):
            ratios["lrt_memory_vs_plain"] = memory["pyrobnn_lrt"] / memory["plain"]
    print(json.dumps({k: round(v, 3) for k, v in ratios.items()}))
    return ratios


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--default-allocator", action="store_true", help="leave glibc's malloc thresholds alone")
    parser.add_argument("--memory-child", nargs=3, metavar=("METHOD", "SUITE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.default_allocator:
        tune_cpu_allocator()
    if args.memory_child:
        method, suite, batch = args.memory_child
        print(memory_of(method, suite, int(batch)))
    else:
        print(f"allocator: {'glibc defaults' if args.default_allocator else 'tune_cpu_allocator()'}; torch {torch.__version__}, threads {torch.get_num_threads()}")
        benchmark(args.quick, tuned=not args.default_allocator)
