"""Where chains and members start, as unconstrained positions ``(chains, dim)`` of a
:class:`~pyrobnn.infer.core.potential.FlatPotential`: uniform draws in a box (Stan's and Pyro's
rule, :func:`initial_positions`), draws from the prior (``init="prior"``, Pyro's
``init_to_sample``: :func:`prior_draws`), the network's own initialization under one seed per chain (as
deep-ensemble members start, :func:`member_initializations`), or the positions a result gives
(the last draw of each chain of a :class:`~pyrobnn.infer.results.posterior.Posterior`, so one chain per
ensemble member). :func:`chain_starts` is the rule of the stochastic-gradient samplers. The counts
are the methods' arguments, checked at their call by their declarations (:mod:`pyrobnn.methods`)."""

from __future__ import annotations

import copy

import torch

from pyrobnn.infer.results.posterior import Posterior

__all__ = ["initial_positions", "prior_draws", "member_initializations", "chain_starts"]


def initial_positions(potential, init, num_chains, init_radius, generator):
    """Unconstrained starting positions ``(chains, dim)``: uniform on ``[-init_radius,
    init_radius]`` (``init=None``), draws from the prior (``init="prior"``, :func:`prior_draws`),
    or from ``init`` (a :class:`~pyrobnn.infer.results.posterior.Posterior`: the last draw of each
    chain, so one chain per ensemble member; or a tensor)."""
    if init is None:
        return potential.initial(num_chains, init_radius, generator)
    if isinstance(init, str):
        if init != "prior":
            raise ValueError(f"init must be 'prior', a Posterior or a tensor of positions, got {init!r}")
        return prior_draws(potential, num_chains, generator)
    if isinstance(init, Posterior):
        z = potential.pack({k: v[:, -1] for k, v in init.samples.items()})
    elif isinstance(init, torch.Tensor):
        z = init
    else:
        raise TypeError(f"init must be 'prior', a Posterior (a deep ensemble, or a sampler's result: its last draws) or a tensor, "
                        f"got {type(init).__name__}")
    if z.dim() != 2 or z.shape[1] != potential.dim:
        raise ValueError(f"init must hold positions of shape (chains, {potential.dim}), got {tuple(z.shape)}")
    if not torch.isfinite(z).all():
        raise ValueError("init holds non-finite positions")
    return z.detach().to(dtype=potential.model.dtype, device=potential.model.device).clone()


def prior_draws(potential, num_chains: int, generator):
    r"""``(chains, dim)`` unconstrained positions, one independent draw from the model's prior per
    chain (every weight site from its prior, every latent likelihood site, a noise scale, from
    its own, mapped to the real line), as Pyro's ``init_to_sample`` starts a chain.

    Why not the box: Stan's and Pyro's uniform draws on :math:`[-2, 2]` suit parameters of unit
    scale; a network's weights under a fan-in prior have standard deviations near
    :math:`\sigma/\sqrt{\text{fan-in}}` (:math:`0.14\,\sigma` over 50 units) where the box's
    draws have 1.15, so a start in the box is a network several times its prior's scale in every
    layer, whose function is orders of magnitude too large, and a short warm-up need not bring
    every chain back (docs/bayesopt.md, "Where the chains start"). A prior draw is a network of
    its prior's scale in every layer.

    The draws are made on the model's device under a seed taken from ``generator`` (the run's),
    with the global random state of the CPU (and of the model's CUDA device) saved and restored
    around them, so the same run seed gives the same starts and the caller's random stream is
    untouched."""
    model = potential.model
    device = model.device
    seed = int(torch.randint(0, 2**62, (), generator=generator, device=generator.device))
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        # the weight priors are built on the model's device and dtype; a latent's may not be
        values = {site.name: prior.sample((num_chains,)) for site, prior in zip(potential.sites, potential.priors)}
        for name, prior in potential.latents:
            values[name] = prior.sample((num_chains,)).to(device=device, dtype=model.dtype)
    return potential.pack(values)


def member_initializations(model, potential, num_members: int, seed: int = 0):
    """``(K, dim)`` unconstrained starting points: member ``k`` re-initializes a copy of the
    network with its modules' own ``reset_parameters`` under the seed ``seed + k`` (PyTorch's
    default initialization, or the user's), and draws latent sites (a noise scale with a prior)
    from their prior."""
    rows = []
    for k in range(num_members):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + k)
            net = copy.deepcopy(model.net)
            for module in net.modules():
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()
            params = dict(net.named_parameters())
            values = {s.name: params[s.name].detach().unsqueeze(0) for s in model.sites}
            for name, prior in model.likelihood.latent_sites().items():
                values[name] = prior.sample((1,)).to(device=model.device, dtype=model.dtype)
        rows.append(potential.pack(values))
    return torch.cat(rows, 0).to(device=model.device, dtype=model.dtype)


def chain_starts(model, potential, init, num_chains, seed, generator):
    """The stochastic-gradient samplers' starting points ``(chains, dim)``: without ``init``,
    ``num_chains`` re-initializations of the network under seeds ``seed + k`` (as deep-ensemble
    members start); else the positions ``init`` gives (:func:`initial_positions`)."""
    if init is None:
        return member_initializations(model, potential, num_chains, seed)
    return initial_positions(potential, init, num_chains, 2.0, generator)
