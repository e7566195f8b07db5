"""The GPU path, measured on one device: SVI steps, NUTS and MCLMC against their references.

    python benchmarks/gpu.py --quick               # within 5 minutes on an H100/H200
    python benchmarks/gpu.py                       # longer runs, steadier figures
    python benchmarks/gpu.py --smoke --device cpu  # seconds: the script itself, on any machine

Everything runs on ``--device`` (default ``cuda``); every ratio compares figures taken in the
same run, because the host sets eager times (the same eager loop took 3.25 and 4.94 ms on two
machines of the same card).

- **SVI**, LeNet-300-100 (266,610 weights), batch 128, 60,000 synthetic MNIST-shaped points resident
  on the device, one Adam step per batch, one weight draw per batch: ``plain`` (the deterministic
  network), ``handwritten_bbb`` (Bayes by Backprop in 25 lines of torch: softplus scales, analytic
  KL, fused Adam) eager and ``_captured`` (the whole step in one CUDA graph, its batch copied into
  fixed buffers: the floor a library can reach), bayesian-torch's ``LinearReparameterization``
  (where installed), and ``pyrobnn.fit`` with ``MeanFieldNormal`` (``elbo="meanfield"``): with its
  default ``capture=True`` and with ``capture=False``, and with local reparameterization and
  flipout. Milliseconds per step over whole epochs after one epoch of warm-up, CUDA kernels and
  host launches (``cudaLaunchKernel``, ``cudaGraphLaunch``) per step from the profiler.
- **NUTS**, 128 chains of a 1-50-1 tanh MLP on 1,000 points, 100 + 100 iterations (50 + 50 with
  ``--quick``), trees of at most 6 doublings: ``pyrobnn.nuts`` against NumPyro's NUTS with
  vectorized chains (a fresh kernel per run, timed on its second run: warm), the minimum over a
  grid of the effective sample size of the predictive mean, per second. Then 1,024 chains against
  128 at 50 + 50.
- **MCLMC**, 128 chains of a 2 x 50 tanh MLP on 2,000 points: ``pyrobnn.mclmc`` against
  BlackJAX's ``mclmc`` (vmapped chains, the same number of steps at our tuned step size and L),
  steps per second.
- **Host reads of NUTS**: the eager transition's reads of device values on the host (each a
  synchronization on a GPU) and torch operations, per iteration and per leapfrog step, with the
  accelerators' schedule (``host_checks="few"``) and the CPU's (``"per_leaf"``), 8 chains of the
  1-50-1 network, counted by a dispatch mode (the same on any device).

NumPyro and BlackJAX run in child processes (JAX's thread pool slows PyTorch in its process).
The last line printed is one JSON object: the figures, ratios, peak device memory, the device's
name and the libraries' versions.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import pyrobnn

N_TRAIN, BATCH = 60_000, 128


# ------------------------------------------------------------------------------------------ SVI
def lenet_data(device, n):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.rand(n, 784, generator=g, device="cpu").to(device)
    y = torch.randint(0, 10, (n,), generator=g, device="cpu").to(device)
    return x, y


class HandwrittenBBB:
    """Bayes by Backprop for LeNet-300-100 in plain torch: mu and rho per weight, softplus
    scales, one weight draw per batch, the analytic KL against N(0, 1), fused Adam."""

    def __init__(self, device, n):
        torch.manual_seed(0)
        net = pyrobnn.LeNet300100().to(device)
        self.params = []
        for layer in (m for m in net if isinstance(m, torch.nn.Linear)):
            for p in (layer.weight, layer.bias):
                self.params += [p.detach().clone().requires_grad_(), torch.full_like(p, math.log(math.expm1(1e-3))).requires_grad_()]
        self.n = n
        self.opt = torch.optim.Adam(self.params, lr=1e-3, fused=device.type == "cuda", capturable=device.type == "cuda")

    def loss(self, x, y):
        h, kl = x, 0.0
        layers = len(self.params) // 4
        for i in range(layers):
            mu_w, rho_w, mu_b, rho_b = self.params[4 * i : 4 * i + 4]
            weights = []
            for mu, rho in ((mu_w, rho_w), (mu_b, rho_b)):
                s = F.softplus(rho)
                weights.append(mu + s * torch.randn_like(mu))
                kl = kl + (0.5 * (s * s + mu * mu) - torch.log(s) - 0.5).sum()
            h = F.linear(h, *weights)
            if i < layers - 1:
                h = torch.relu(h)
        return F.cross_entropy(h, y, reduction="sum") * self.n / x.shape[0] + kl

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        self.loss(x, y).backward()
        self.opt.step()


class PlainNet:
    def __init__(self, device):
        torch.manual_seed(0)
        self.net = pyrobnn.LeNet300100().to(device)
        self.params = list(self.net.parameters())
        self.opt = torch.optim.Adam(self.params, lr=1e-3, fused=device.type == "cuda", capturable=device.type == "cuda")

    def loss(self, x, y):
        return F.cross_entropy(self.net(x), y)

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        self.loss(x, y).backward()
        self.opt.step()


def captured(loop, x, y):
    """``loop``'s whole step (forward, backward, Adam) recorded once as a CUDA graph; returns a
    step function that copies its batch into the graph's buffers and replays it."""
    sx, sy = x[:BATCH].clone(), y[:BATCH].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            loop.step(sx, sy)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    loop.opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loop.loss(sx, sy).backward()
        loop.opt.step()

    def step(xb, yb):
        sx.copy_(xb)
        sy.copy_(yb)
        graph.replay()

    return step


def bayesian_torch_loop(device, n):
    try:
        from bayesian_torch.layers import LinearReparameterization
    except ImportError:
        return None
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(
        LinearReparameterization(a, b, prior_mean=0.0, prior_variance=1.0, posterior_mu_init=0.0, posterior_rho_init=-6.9)
        for a, b in ((784, 300), (300, 100), (100, 10))
    ).to(device)
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        h, kl = xb, 0.0
        for i, layer in enumerate(layers):
            h, k = layer(h)
            kl = kl + k
            if i < 2:
                h = torch.relu(h)
        (F.cross_entropy(h, yb, reduction="sum") * n / xb.shape[0] + kl).backward()
        opt.step()

    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loop(step, x, y, device, steps):
    """Milliseconds per step over ``steps`` batches drawn in order from the resident data, after
    ``min(steps, 20)`` warm-up batches."""
    n = x.shape[0]
    order = torch.randperm(n, generator=torch.Generator(device="cpu").manual_seed(1), device="cpu").to(device)
    batches = [order[i * BATCH : (i + 1) * BATCH] for i in range(min(steps, n // BATCH))]
    for idx in batches[: min(steps, 20)]:
        step(x[idx], y[idx])
    sync(device)
    start = time.perf_counter()
    for idx in batches:
        step(x[idx], y[idx])
    sync(device)
    return 1e3 * (time.perf_counter() - start) / len(batches)


def time_fit(x, y, device, steps, **options):
    """``pyrobnn.fit`` over ``steps`` batches per epoch: milliseconds per step of the second
    epoch (the first warms up and records), and the capture status."""
    torch.manual_seed(0)
    model = pyrobnn.BayesianModel(pyrobnn.LeNet300100(), pyrobnn.CategoricalLikelihood(), pyrobnn.NormalPrior(1.0)).to(device)
    guide = pyrobnn.MeanFieldNormal(model).to(device)
    n = steps * BATCH
    trainer = pyrobnn.SVITrainer(model, guide, elbo="meanfield", lr=1e-3, **options)
    history = trainer.fit(x[:n], y[:n], epochs=2, batch_size=BATCH, progress=False, seed=0)
    return 1e3 * (history.seconds[1] - history.seconds[0]) / steps, trainer


def launches(step, x, y, device, steps=10):
    """CUDA kernels run and host launches made per step, from the profiler."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    idx = torch.arange(BATCH, device=device)
    step(x[idx], y[idx])
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(x[idx], y[idx])
        sync(device)
    kernels = host = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif e.name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch"):
            host += 1
    return {"kernels": kernels / steps, "host_launches": host / steps}


def svi_section(device, quick, smoke):
    steps = 20 if smoke else (150 if quick else 460)
    n = steps * BATCH if smoke else N_TRAIN
    x, y = lenet_data(device, n)
    out, kernels = {}, {}
    plain, bbb = PlainNet(device), HandwrittenBBB(device, n)
    out["plain"] = time_loop(plain.step, x, y, device, steps)
    out["handwritten_bbb"] = time_loop(bbb.step, x, y, device, steps)
    kernels["handwritten_bbb"] = launches(bbb.step, x, y, device)
    if device.type == "cuda":
        plain_graph, bbb_graph = captured(PlainNet(device), x, y), captured(HandwrittenBBB(device, n), x, y)
        out["plain_captured"] = time_loop(plain_graph, x, y, device, steps)
        out["handwritten_bbb_captured"] = time_loop(bbb_graph, x, y, device, steps)
        kernels["handwritten_bbb_captured"] = launches(bbb_graph, x, y, device)
    bt = bayesian_torch_loop(device, n)
    if bt is not None:
        out["bayesian_torch_reparam"] = time_loop(bt, x, y, device, steps)
    status = {}
    for name, options in (("pyrobnn_meanfield", {}), ("pyrobnn_meanfield_eager", {"capture": False}),
                          ("pyrobnn_lrt", {"estimator": "local"}), ("pyrobnn_flipout", {"estimator": "flipout"})):
        out[name], trainer = time_fit(x, y, device, steps, **options)
        status[name] = trainer.capture_status
        if name in ("pyrobnn_meanfield", "pyrobnn_meanfield_eager"):
            kernels[name] = launches(lambda xb, yb, t=trainer: t.step(xb, yb, dataset_size=n), x, y, device)
    ratios = {f"{k}_vs_plain": v / out["plain"] for k, v in out.items() if k != "plain"}
    if "handwritten_bbb_captured" in out:
        ratios["meanfield_vs_handwritten_captured"] = out["pyrobnn_meanfield"] / out["handwritten_bbb_captured"]
        for k in ("pyrobnn_lrt", "pyrobnn_flipout"):
            ratios[f"{k}_vs_meanfield"] = out[k] / out["pyrobnn_meanfield"]
    if "bayesian_torch_reparam" in out:
        ratios["meanfield_vs_bayesian_torch"] = out["pyrobnn_meanfield"] / out["bayesian_torch_reparam"]
    return {"ms_per_step": out, "ratios": ratios, "launches_per_step": kernels, "capture": status, "steps_timed": steps}


# ---------------------------------------------------------------------------------- samplers
def regression(n, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.linspace(-2, 2, n, device="cpu").unsqueeze(-1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g, device="cpu")
    return x, y


GRID = torch.linspace(-2.5, 2.5, 20, device="cpu").unsqueeze(-1)


def min_ess(f):
    """``f``: ``(chains, draws, points)``; the smallest ESS over the points (ArviZ)."""
    import arviz as az

    return float(min(az.ess(np.ascontiguousarray(f[..., i])) for i in range(f.shape[-1])))


def predictions(model, result):
    """The network's output on ``GRID`` at every draw, ``(chains, draws, points)``."""
    from pyrobnn.models.functional import call_with_weights

    samples = result.as_draws().samples
    flat = {s.name: samples[s.name].reshape(-1, *s.shape) for s in model.sites}
    with torch.no_grad():
        f = call_with_weights(model.net, model.sites, flat, GRID.to(model.device))
    return f[..., 0].reshape(result.num_chains, result.num_draws, -1).double().cpu().numpy()


def mlp(hidden, device):
    torch.manual_seed(0)
    net = pyrobnn.MLP(1, 1, hidden=hidden, activation="tanh")
    return pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=0.1), pyrobnn.NormalPrior(1.0)).to(device)


def peak_reset(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak(device):
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def run_nuts(device, chains, warmup, samples, n_points, depth=6):
    x, y = regression(n_points)
    model = mlp((50,), device)
    peak_reset(device)
    start = time.perf_counter()
    result = pyrobnn.nuts(model, x.to(device), y.to(device), num_samples=samples, num_warmup=warmup, num_chains=chains,
                          max_tree_depth=depth, seed=0, progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "min_ess": min_ess(predictions(model, result)), "chains": chains, "path": result.stats["path"],
            "mean_steps": float(result.stats["num_steps"].double().mean()), "peak_mib": peak(device)}


def run_mclmc(device, chains, steps, n_points):
    x, y = regression(n_points, seed=1)
    model = mlp((50, 50), device)
    warm = (steps[0] * 8 // 10, steps[0] // 10, steps[0] - steps[0] * 8 // 10 - steps[0] // 10)
    peak_reset(device)
    start = time.perf_counter()
    result = pyrobnn.mclmc(model, x.to(device), y.to(device), num_samples=steps[1], num_warmup=warm, num_chains=chains, thinning=1,
                           seed=0, progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps_per_s": (sum(warm) + steps[1]) / seconds, "chains": chains, "path": result.stats["path"],
            "step_size": float(result.stats["step_size"].double().mean()) if "step_size" in result.stats else None,
            "L": float(result.stats["L"].double().mean()) if "L" in result.stats else None, "peak_mib": peak(device)}


REFERENCE = r'''
import json, math, sys, time
import numpy as np
job = json.loads(sys.argv[1])
import jax, jax.numpy as jnp
x = jnp.linspace(-2, 2, job["n"])[:, None]
y = jnp.asarray(np.asarray(job["y"]))
grid = jnp.linspace(-2.5, 2.5, 20)[:, None]
hidden = job["hidden"]
sizes = [1] + hidden + [1]
def unflatten(z):
    out, i = [], 0
    for a, b in zip(sizes[:-1], sizes[1:]):
        out.append((z[i:i + a * b].reshape(b, a), z[i + a * b:i + a * b + b])); i += a * b + b
    return out
dim = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
def forward(z, inp):
    h = inp
    layers = unflatten(z)
    for k, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if k + 1 < len(layers): h = jnp.tanh(h)
    return h[:, 0]
def logdensity(z):
    f = forward(z, x)
    return jnp.sum(-0.5 * ((y - f) / 0.1) ** 2) - 0.5 * jnp.sum(z ** 2)
out = {"device": str(jax.devices()[0]), "jax": jax.__version__}
if job["kind"] == "nuts":
    import numpyro
    from numpyro.infer import MCMC, NUTS
    out["numpyro"] = numpyro.__version__
    def potential(z): return -logdensity(z)
    times = []
    for run in range(2):  # the second is warm; a fresh kernel each time (a reused one fails a vectorized rerun)
        mcmc = MCMC(NUTS(potential_fn=potential, max_tree_depth=job["depth"]), num_warmup=job["warmup"], num_samples=job["samples"],
                    num_chains=job["chains"], chain_method="vectorized", progress_bar=False)
        init = 0.1 * jax.random.normal(jax.random.PRNGKey(run), (job["chains"], dim))
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(run), init_params=init)
        z = mcmc.get_samples(group_by_chain=True)
        z.block_until_ready()
        times.append(time.perf_counter() - start)
    f = jax.vmap(jax.vmap(lambda zz: forward(zz, grid)))(z)
    out.update(seconds_cold=times[0], seconds=times[1], f=np.asarray(f).tolist())
else:
    import blackjax
    out["blackjax"] = blackjax.__version__
    kernel = blackjax.mclmc(logdensity, L=job["L"], step_size=job["step_size"])
    init = jax.vmap(lambda z: blackjax.mcmc.mclmc.init(z, logdensity, jax.random.PRNGKey(0)))(
        0.1 * jax.random.normal(jax.random.PRNGKey(1), (job["chains"], dim)))
    def run(state, key):
        def one(s, k):
            s, _ = kernel.step(k, s)
            return s, None
        keys = jax.random.split(key, job["steps"])
        return jax.lax.scan(one, state, keys)[0]
    go = jax.jit(jax.vmap(run))
    times = []
    for r in range(2):
        keys = jax.random.split(jax.random.PRNGKey(r), job["chains"])
        start = time.perf_counter()
        s = go(init, keys)
        s.position.block_until_ready()
        times.append(time.perf_counter() - start)
    out.update(seconds_cold=times[0], seconds=times[1], steps_per_s=job["steps"] / times[1])
print("RESULT " + json.dumps(out))
'''


def reference(job):
    """A NumPyro or BlackJAX run in a child process; ``None`` where JAX or the library is absent."""
    name = "numpyro" if job["kind"] == "nuts" else "blackjax"
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec(name) is None:
        return {"skipped": f"{name} or jax is not installed"}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "reference.py")
        with open(path, "w") as f:
            f.write(REFERENCE)
        env = dict(os.environ)
        if job.get("platform"):
            env["JAX_PLATFORMS"] = job["platform"]
        run = subprocess.run([sys.executable, path, json.dumps(job)], capture_output=True, text=True, env=env, timeout=1200)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        return {"failed": (run.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(lines[-1][len("RESULT "):])


def sampler_section(device, quick, smoke, with_reference):
    platform = "cuda" if device.type == "cuda" else "cpu"
    if smoke:
        nuts_cfg, many, mclmc_cfg = dict(chains=4, warmup=10, samples=10, n_points=100), 8, dict(chains=4, steps=(50, 20), n_points=100)
    elif quick:
        nuts_cfg, many, mclmc_cfg = dict(chains=128, warmup=50, samples=50, n_points=1000), 1024, dict(chains=128, steps=(1000, 1000), n_points=2000)
    else:
        nuts_cfg, many, mclmc_cfg = dict(chains=128, warmup=100, samples=100, n_points=1000), 1024, dict(chains=128, steps=(4000, 2000), n_points=2000)
    out = {}
    ours = run_nuts(device, **nuts_cfg)
    out["nuts"] = {"pyrobnn": ours}
    if with_reference:
        x, y = regression(nuts_cfg["n_points"])
        ref = reference({"kind": "nuts", "n": nuts_cfg["n_points"], "y": y[:, 0].tolist(), "hidden": [50], "depth": 6, "chains": nuts_cfg["chains"],
                         "warmup": nuts_cfg["warmup"], "samples": nuts_cfg["samples"], "platform": platform})
        if "f" in ref:
            ref["min_ess"] = min_ess(np.asarray(ref.pop("f")))
            ours_rate, ref_rate = ours["min_ess"] / ours["seconds"], ref["min_ess"] / ref["seconds"]
            out["nuts"]["ess_per_s_vs_numpyro"] = ours_rate / ref_rate
        out["nuts"]["numpyro"] = ref
    small = run_nuts(device, **{**nuts_cfg, "warmup": min(50, nuts_cfg["warmup"]), "samples": min(50, nuts_cfg["samples"])})
    large = run_nuts(device, **{**nuts_cfg, "chains": many, "warmup": min(50, nuts_cfg["warmup"]), "samples": min(50, nuts_cfg["samples"])})
    out["nuts"]["chains_scaling"] = {"small": small, "large": large, "time_ratio": large["seconds"] / small["seconds"]}
    ours = run_mclmc(device, **mclmc_cfg)
    out["mclmc"] = {"pyrobnn": ours}
    if with_reference:
        x, y = regression(mclmc_cfg["n_points"], seed=1)
        ref = reference({"kind": "mclmc", "n": mclmc_cfg["n_points"], "y": y[:, 0].tolist(), "hidden": [50, 50], "chains": mclmc_cfg["chains"],
                         "steps": sum(mclmc_cfg["steps"]), "L": ours["L"] or 1.0, "step_size": ours["step_size"] or 0.01, "platform": platform})
        if "steps_per_s" in ref:
            out["mclmc"]["steps_per_s_vs_blackjax"] = ours["steps_per_s"] / ref["steps_per_s"]
        out["mclmc"]["blackjax"] = ref
    return out


def nuts_host_reads(device, iterations=40):
    """Host reads and torch operations per eager NUTS iteration and per leapfrog step, for both
    schedules of :class:`~pyrobnn.infer.mcmc.nuts_kernel.NUTS`, and whether they drew the same."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from pyrobnn.infer.core.kernel import FullBatch
    from pyrobnn.infer.core.potential import FlatPotential
    from pyrobnn.infer.core.runner import run_chains
    from pyrobnn.infer.mcmc.nuts_kernel import NUTS, WindowAdaptation
    from pyrobnn.testing import HostReads

    class Ops(TorchDispatchMode):  # the torch operations dispatched
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    x, y = regression(200)
    model = mlp((50,), device).eval()
    potential = FlatPotential(model, x.to(device), y.to(device))
    out, draws = {}, {}
    for checks in ("few", "per_leaf"):
        z0 = 0.1 * torch.randn(8, potential.dim, generator=torch.Generator(device="cpu").manual_seed(0), device="cpu").to(device)
        with torch.no_grad(), HostReads() as reads, Ops() as ops:
            run = run_chains(NUTS(6, host_checks=checks, graphs=False), WindowAdaptation(iterations // 2), FullBatch(potential.value_and_grad), z0,
                             num_samples=iterations // 2, generator=torch.Generator(device=device).manual_seed(1))
        leaves = float(run.stats["num_steps"].double().sum()) / 8
        out[checks] = {"reads_per_iteration": reads.count / iterations, "ops_per_iteration": ops.count / iterations,
                       "ops_per_leapfrog_step": ops.count / max(leaves, 1.0), "leapfrog_steps_per_iteration": leaves / iterations}
        draws[checks] = run.draws
    out["same_draws"] = bool(torch.equal(draws["few"], draws["per_leaf"]))
    return out


def versions():
    found = {"torch": torch.__version__, "python": sys.version.split()[0]}
    for name in ("pyro", "jax", "numpyro", "blackjax", "bayesian_torch", "arviz"):
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "installed")
        except Exception:
            found[name] = None
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="shorter runs: within 5 minutes on an H100/H200")
    parser.add_argument("--smoke", action="store_true", help="tiny runs that check the script, on any device")
    parser.add_argument("--no-reference", action="store_true", help="leave out NumPyro and BlackJAX")
    parser.add_argument("--skip", nargs="*", default=(), choices=("svi", "samplers"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; --device cpu runs the script on the CPU")
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "versions": versions(),
              "mode": "smoke" if args.smoke else ("quick" if args.quick else "full"), "date": time.strftime("%Y-%m-%d")}
    start = time.perf_counter()
    if "svi" not in args.skip:
        peak_reset(device)
        report["svi"] = svi_section(device, args.quick, args.smoke)
        report["svi"]["peak_mib"] = peak(device)
        print("svi:", json.dumps(report["svi"], indent=1, default=str), flush=True)
    if "samplers" not in args.skip:
        report["samplers"] = sampler_section(device, args.quick, args.smoke, not args.no_reference)
        report["samplers"]["nuts_host_reads"] = nuts_host_reads(device, 4 if args.smoke else 40)
        print("samplers:", json.dumps(report["samplers"], indent=1, default=str), flush=True)
    report["seconds"] = time.perf_counter() - start
    print(json.dumps(report, default=str))
    return report


if __name__ == "__main__":
    main()
