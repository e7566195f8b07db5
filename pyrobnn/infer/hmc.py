"""NUTS on a BayesianModel: a fast batched path, and Pyro's MCMC as the reference."""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, field

import pyro
import torch

from pyrobnn.infer.fit import validate_training_data
from pyrobnn.infer.nuts import sample_nuts
from pyrobnn.infer.potential import FlatPotential

__all__ = ["MCMCResult", "nuts", "pyro_nuts"]


@dataclass
class MCMCResult:
    """Posterior samples of every latent site, ``{name: (chains, draws, *shape)}``, with
    per-draw sampler statistics (``diverging``, ``tree_depth``, ``accept_prob``, ...) and the
    sampler's wall time."""

    samples: dict
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    method: str = ""

    @property
    def num_chains(self) -> int:
        return next(iter(self.samples.values())).shape[0]

    @property
    def num_draws(self) -> int:
        return next(iter(self.samples.values())).shape[1]

    def flat_samples(self) -> dict:
        """``{name: (chains * draws, *shape)}``, as ``pyro.infer.Predictive`` takes them."""
        return {k: v.reshape((-1,) + v.shape[2:]) for k, v in self.samples.items()}

    @property
    def num_divergences(self) -> int:
        d = self.stats.get("diverging")
        return int(d.sum()) if d is not None else 0


def _check_model(model):
    if any(True for _ in model.likelihood.parameters()):
        raise ValueError(
            "MCMC samples latent sites only: give the likelihood a fixed noise scale or a prior "
            "(GaussianLikelihood(scale=0.1) or scale=dist.LogNormal(...)), not scale='learned'"
        )


def nuts(
    model,
    x,
    y,
    num_samples: int = 500,
    num_warmup: int = 500,
    num_chains: int = 4,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    seed: int = 0,
    init_radius: float = 2.0,
    compile: bool = True,
    progress: bool = True,
) -> MCMCResult:
    """NUTS for ``model`` conditioned on ``(x, y)``, all chains in one batched computation.

    The potential and its gradient come from :class:`~pyrobnn.infer.potential.FlatPotential`
    (one vmapped network pass for all chains, no Pyro tracing), and the sampler from
    :func:`~pyrobnn.infer.nuts.sample_nuts` (multinomial NUTS, Stan's warm-up, per-chain step
    sizes and diagonal mass matrices). Chains start from uniform draws on
    ``[-init_radius, init_radius]`` in unconstrained space, as Pyro's and Stan's do.

    The samples are of the model's latent sites and go straight into
    ``pyro.infer.Predictive(model, posterior_samples=result.flat_samples())`` or
    :func:`pyrobnn.predict`.

    :param num_chains: chains run in lockstep as one batch, so on a CPU more chains cost far
        less than proportionally: on a 1-50-1 network a leapfrog step takes about 10.6 us per
        chain at 16 chains and 6.5 at 64 (``docs/benchmarks.md``). For many effective samples,
        raise the chains (32-64) rather than the draws.
    :param compile: compile each leapfrog step (potential, gradient and the tree bookkeeping)
        with ``torch.compile`` (default): seconds of compilation, then about ten times less time
        per step on small networks. Falls back to eager code with a warning if compilation fails.
    """
    _check_model(model)
    x, y = validate_training_data(model, x, y)
    x, y = x.to(model.device), y.to(model.device)
    was_training = model.training
    model.eval()
    try:
        potential = FlatPotential(model, x, y)
        generator = torch.Generator(device=model.device).manual_seed(seed)
        z0 = potential.initial(num_chains, init_radius, generator)
        start = time.perf_counter()
        run = functools.partial(
            sample_nuts,
            z_init=z0,
            num_samples=num_samples,
            num_warmup=num_warmup,
            max_tree_depth=max_tree_depth,
            target_accept=target_accept,
            generator=generator,
            progress=progress,
        )
        with torch.no_grad():
            if compile:
                try:
                    draws, stats = run(potential.value_and_grad_functional, compile=True)
                except Exception as e:  # no C++ compiler, an unsupported operation, ...
                    warnings.warn(f"NUTS runs eagerly: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
                    generator.manual_seed(seed)
                    z0 = potential.initial(num_chains, init_radius, generator)
                    run = functools.partial(run, z_init=z0)
                    draws, stats = run(potential.value_and_grad)
            else:
                draws, stats = run(potential.value_and_grad)
        seconds = time.perf_counter() - start
        values = potential.unpack(draws.reshape(num_chains * num_samples, potential.dim))
    finally:
        model.train(was_training)
    samples = {k: v.reshape((num_chains, num_samples) + v.shape[1:]) for k, v in values.items()}
    return MCMCResult(samples, stats, seconds, "pyrobnn NUTS")


def pyro_nuts(
    model,
    x,
    y,
    num_samples: int = 500,
    num_warmup: int = 500,
    num_chains: int = 1,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    seed: int = 0,
    jit_compile: bool = False,
    progress: bool = True,
) -> MCMCResult:
    """The reference path: ``pyro.infer.MCMC(pyro.infer.NUTS(model))``, one chain after the
    other in this process, the samples stacked by chain."""
    _check_model(model)
    x, y = validate_training_data(model, x, y)
    names = [s.name for s in model.sites] + list(model.likelihood.latent_sites())
    chains, stats = [], {"diverging": []}
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for c in range(num_chains):
            pyro.set_rng_seed(seed + c)
            kernel = pyro.infer.NUTS(
                model, max_tree_depth=max_tree_depth, target_accept_prob=target_accept, jit_compile=jit_compile, ignore_jit_warnings=True
            )
            mcmc = pyro.infer.MCMC(kernel, num_samples=num_samples, warmup_steps=num_warmup, num_chains=1, disable_progbar=not progress)
            mcmc.run(x, y)
            chains.append(mcmc.get_samples())
            diagnostics = mcmc.diagnostics()
            stats["diverging"].append(torch.tensor([len(diagnostics.get("divergences", {}).get("chain 0", []))]))
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    samples = {k: torch.stack([c[k] for c in chains]) for k in names}
    return MCMCResult(samples, {"diverging_total": torch.cat(stats["diverging"])}, seconds, "pyro NUTS")
