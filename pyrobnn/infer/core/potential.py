"""The posterior of a BayesianModel as a potential energy over a flat parameter vector."""

from __future__ import annotations

import torch
from torch.distributions import biject_to

from pyrobnn.models.functional import call_with_weights
from pyrobnn.utils import memory

__all__ = ["FlatPotential"]


class FlatPotential:
    r"""Potential energy :math:`U(z) = -\log p(y \mid x, w) - \log p(w) - \log|J|` of a
    :class:`~pyrobnn.models.BayesianModel` on a flat unconstrained vector ``z``, for a batch of
    chains at once: ``z`` has shape ``(chains, dim)`` and calling it returns one energy per
    chain from a single vmapped pass of the network over all chains.

    The latent sites are the model's weight sites (real-valued) and its likelihood's latent
    sites (a noise scale with a prior), mapped from the real line by
    ``torch.distributions.biject_to`` of their support, with the log-Jacobian added. Point
    parameters of the model (deterministic layers, a *learned* noise scale) enter as the
    constants they currently are. This evaluates the same density as Pyro's ``NUTS(model)``
    would trace, without tracing: the test suite checks the two against each other.

    On a large network and data set the full-data energy and gradient are summed over chunks of
    the data that fit the memory budget (:meth:`chunks`, :mod:`pyrobnn.utils.memory`); a small network
    takes the data in one pass.

    :param x: the data (all of it: no minibatch scaling); ``None`` for a potential whose
        callers pass every batch to :meth:`log_joint_terms` (minibatch training).
    :param y: see ``x``.
    """

    def __init__(self, model, x=None, y=None):
        self.model = model
        self.x, self.y = self.check_data(x, y) if x is not None else (None, None)
        self.sites = list(model.sites)
        self.priors = [model.prior_distribution(s) for s in self.sites]
        self.latents = list(model.likelihood.latent_sites().items())
        self.transforms = [biject_to(prior.support) for _, prior in self.latents]
        shapes = [s.shape for s in self.sites] + [prior.event_shape for _, prior in self.latents]
        names = [s.name for s in self.sites] + [name for name, _ in self.latents]
        self.blocks = []
        offset = 0
        for name, shape in zip(names, shapes):
            size = shape.numel()
            self.blocks.append((name, offset, offset + size, shape))
            offset += size
        self.dim = offset
        self._chunks = {}

    def check_data(self, x, y):
        """``(x, y)`` with ``y`` in the shape the likelihood scores (checked against the
        network's output on ``x``)."""
        return x, self.model.likelihood.check_targets(y, _output_shape(self.model, x))

    @property
    def names(self):
        return [b[0] for b in self.blocks]

    def unpack(self, z) -> dict:
        """Constrained values ``{site: tensor (chains, *shape)}`` from ``z`` of shape
        ``(chains, dim)``."""
        values = {}
        n_weights = len(self.sites)
        for i, (name, start, stop, shape) in enumerate(self.blocks):
            block = z[:, start:stop].reshape((z.shape[0],) + tuple(shape))
            values[name] = block if i < n_weights else self.transforms[i - n_weights](block)
        return values

    def unpack_draws(self, draws) -> dict:
        """Posterior draws ``{site: (chains, draws, *shape)}`` from flat draws ``(chains, draws,
        dim)``: the one place where every method's flat draws become a posterior's sites."""
        chains, kept, dim = draws.shape
        values = self.unpack(draws.reshape(chains * kept, dim))
        return {k: v.reshape((chains, kept) + v.shape[1:]) for k, v in values.items()}

    def pack(self, values: dict):
        """The inverse of :meth:`unpack`: ``z`` of shape ``(chains, dim)`` from constrained values
        ``{site: (chains, *shape)}``."""
        missing = [name for name in self.names if name not in values]
        if missing:
            raise ValueError(f"no values for the latent sites {missing}")
        n_weights = len(self.sites)
        blocks = []
        for i, (name, _, _, shape) in enumerate(self.blocks):
            v = values[name]
            if v.dim() < len(shape) or tuple(v.shape[v.dim() - len(shape):]) != tuple(shape):
                raise ValueError(f"site {name!r}: values of shape {tuple(v.shape)} do not end with {tuple(shape)}")
            v = v.reshape((-1,) + tuple(shape))
            if i >= n_weights:
                v = self.transforms[i - n_weights].inv(v)
            blocks.append(v.reshape(v.shape[0], -1))
        chains = {b.shape[0] for b in blocks}
        if len(chains) != 1:
            raise ValueError(f"the sites hold different numbers of chains: {sorted(chains)}")
        return torch.cat(blocks, 1)

    def pack_draws(self, samples: dict):
        """The inverse of :meth:`unpack_draws`: flat unconstrained draws ``(chains, draws, dim)``
        from a posterior's ``{site: (chains, draws, *shape)}``."""
        shapes = {tuple(v.shape[:2]) for v in samples.values()}
        if len(shapes) != 1:
            raise ValueError(f"the sites hold different (chains, draws): {sorted(shapes)}")
        (chains, draws), = shapes
        z = self.pack({k: v.reshape((chains * draws,) + tuple(v.shape[2:])) for k, v in samples.items()})
        return z.reshape(chains, draws, self.dim)

    def log_weight_prior(self, w):
        """``log p(w)`` per row of ``w`` ``(rows, dim)``, over the weight sites only (the latent
        sites' blocks are not read): e.g. at ``z - anchors`` for the anchored (randomized MAP)
        objective of :mod:`pyrobnn.infer.modes.ensemble`."""
        rows = w.shape[0]
        log_p = torch.zeros(rows, dtype=w.dtype, device=w.device)
        for site, prior, (_, start, stop, _) in zip(self.sites, self.priors, self.blocks):
            log_p = log_p + prior.log_prob(w[:, start:stop].reshape((rows,) + tuple(site.shape)))
        return log_p

    def log_joint_terms(self, z, x=None, y=None, batched_inputs: bool = False):
        r"""``(log p(w) + log|J|, log p(y | x, w))`` per chain, each of shape ``(chains,)``.

        The prior term covers every latent site (with the log-Jacobian of the latent sites'
        transforms); the likelihood term is summed over the points of ``(x, y)``, the full data
        by default. A caller that passes a minibatch scales it by ``N / B`` itself. With
        ``batched_inputs``, ``x`` and ``y`` hold a batch per chain (``(chains, B, ...)``)."""
        x = self.x if x is None else x
        y = self.y if y is None else y
        if x is None:
            raise ValueError("this potential holds no data: pass the batch (x, y)")
        chains = z.shape[0]
        log_p = torch.zeros(chains, dtype=z.dtype, device=z.device)
        weights = {}
        for site, prior, (name, start, stop, _) in zip(self.sites, self.priors, self.blocks):
            w = z[:, start:stop].reshape((chains,) + tuple(site.shape))
            weights[name] = w
            log_p = log_p + prior.log_prob(w)
        latents = {}
        for (name, prior), transform, (_, start, stop, shape) in zip(
            self.latents, self.transforms, self.blocks[len(self.sites):]
        ):
            u = z[:, start:stop].reshape((chains,) + tuple(shape))
            value = transform(u)
            log_p = log_p + prior.log_prob(value) + transform.log_abs_det_jacobian(u, value)
            # the likelihood reads latent samples with Pyro's plate slot: (chains, 1)
            latents[name] = value.unsqueeze(-1)
        output = call_with_weights(self.model.net, self.sites, weights, x, batched_inputs=batched_inputs)
        log_lik = self.model.likelihood.distribution(output, **latents).log_prob(y)
        return log_p, log_lik.reshape(chains, -1).sum(-1)

    def pointwise_log_likelihood(self, z, x, y):
        """``log p(y_n | x_n, w)`` per chain and point, shape ``(chains, N)`` (the points in
        chunks within the memory budget)."""
        chains = z.shape[0]
        values = self.unpack(z)
        weights = {s.name: values[s.name] for s in self.sites}
        latents = {name: values[name].unsqueeze(-1) for name, _ in self.latents}
        step = memory.points_per_chunk(x.shape[0], chains, memory.activation_bytes(self.model.net, x), memory.FORWARD_FACTOR)
        out = []
        for i in range(0, x.shape[0], step):
            output = call_with_weights(self.model.net, self.sites, weights, x[i : i + step])
            out.append(self.model.likelihood.distribution(output, **latents).log_prob(y[i : i + step]).reshape(chains, -1))
        return out[0] if len(out) == 1 else torch.cat(out, 1)

    def chunks(self, chains: int, factor: int = memory.GRADIENT_FACTOR) -> list:
        """The held data as ``[(x, y)]`` chunks whose pass for ``chains`` chains fits the memory
        budget (:mod:`pyrobnn.utils.memory`): one chunk, the whole data, for a small network."""
        if self.x is None:
            raise ValueError("this potential holds no data: pass the batch (x, y)")
        key = (chains, factor)
        if key not in self._chunks:
            step = memory.points_per_chunk(self.x.shape[0], chains, memory.activation_bytes(self.model.net, self.x), factor)
            self._chunks[key] = [(self.x[i : i + step], self.y[i : i + step]) for i in range(0, self.x.shape[0], step)]
        return self._chunks[key]

    def __call__(self, z):
        """``U(z)``, shape ``(chains,)`` (the data in chunks, :meth:`chunks`)."""
        parts = self.chunks(z.shape[0], memory.FORWARD_FACTOR)
        if len(parts) == 1:
            log_prior, log_lik = self.log_joint_terms(z)
            return -(log_prior + log_lik)
        energy = None
        for i, (x, y) in enumerate(parts):
            log_prior, log_lik = self.log_joint_terms(z, x, y)
            energy = -(log_prior + log_lik) if energy is None else energy - log_lik
        return energy

    def _chunk_energies(self, z):
        """The energy's terms, one per data chunk: the first with the prior's."""
        parts = self.chunks(z.shape[0])
        for i, (x, y) in enumerate(parts):
            yield (lambda z, x=x, y=y, first=i == 0: _chunk_energy(self, z, x, y, first))

    def value_and_grad(self, z):
        """``(U(z), dU/dz)`` for every chain; on a large network and data set the gradient is
        accumulated over data chunks (:meth:`chunks`), so memory stays within the budget."""
        energy, grad = 0.0, 0.0
        with torch.enable_grad():
            for part in self._chunk_energies(z):
                zz = z.detach().requires_grad_(True)
                value = part(zz)
                (g,) = torch.autograd.grad(value.sum(), zz)
                energy, grad = energy + value.detach(), grad + g
        return energy, grad

    def value_and_grad_functional(self, z):
        """As :meth:`value_and_grad`, through ``torch.func`` (traceable by ``torch.compile``)."""
        energy, grad = 0.0, 0.0
        for part in self._chunk_energies(z):

            def total(z, part=part):
                value = part(z)
                return value.sum(), value

            g, (_, value) = torch.func.grad_and_value(total, has_aux=True)(z)
            energy, grad = energy + value, grad + g
        return energy, grad

    def initial(self, chains: int, radius: float = 2.0, generator=None):
        """Uniform draws on ``[-radius, radius]`` in unconstrained space (Stan's and Pyro's
        default initialization)."""
        return (torch.rand(chains, self.dim, generator=generator, dtype=self.model.dtype, device=self.model.device) * 2 - 1).mul_(radius)


def _chunk_energy(potential, z, x, y, with_prior: bool):
    log_prior, log_lik = potential.log_joint_terms(z, x, y)
    return -(log_prior + log_lik) if with_prior else -log_lik


def _output_shape(model, x):
    from pyrobnn.utils.validation import check_forward

    shape = check_forward(model.net, x)
    return (x.shape[0], shape[-1])
