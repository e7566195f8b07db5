"""An ELBO that reports its expected log-likelihood and its KL apart."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyro
import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.poutine.util import prune_subsample_sites
from torch.distributions import kl_divergence

from pyrobnn.models.kl import base_distribution, kl_method

__all__ = ["SplitELBO", "ELBOTerms", "make_elbo"]


@dataclass
class ELBOTerms:
    """One evaluation of the ELBO.

    :ivar loss: ``-(log_likelihood - kl_weight * kl)``, differentiable.
    :ivar log_likelihood: expected log-likelihood of the minibatch, scaled to the data set.
    :ivar kl: KL(q || p) summed over all latent sites (unweighted).
    :ivar kl_weight: the weight the loss gave the KL.
    """

    loss: torch.Tensor
    log_likelihood: torch.Tensor
    kl: torch.Tensor
    kl_weight: float = 1.0
    kl_methods: dict = field(default_factory=dict)


class SplitELBO(pyro.infer.ELBO):
    r"""The evidence lower bound :math:`E_q[\log p(y \mid w)] - \beta\, KL(q(w) \| p(w))`
    with its two terms kept apart, for progress bars and KL annealing.

    :param kl: ``"monte_carlo"`` estimates each latent site's KL as
        :math:`\log q(w) - \log p(w)` at the sampled ``w`` (the estimator of Pyro's
        ``Trace_ELBO``); ``"analytic"`` uses ``torch.distributions.kl_divergence`` where a
        closed form or approximation is registered and Monte Carlo elsewhere (the estimator
        of ``TraceMeanField_ELBO``). :attr:`kl_methods` records which each site used.
    :param strict: with ``kl="analytic"``, raise instead of falling back to Monte Carlo.
    :param num_particles: samples per estimate.
    :param vectorize_particles: draw the particles in one batched pass (a ``pyro.plate``
        outside the model) rather than a Python loop.
    :ivar kl_weight: :math:`\beta`, 1 by default; set it for KL annealing.

    Site scales set by handlers (``poutine.scale``, subsampled plates) are honoured exactly as
    Pyro's ELBOs honour them. Every guide site must be reparameterized; the guides of pyrobnn
    and Pyro's autoguides for continuous latents are.

    For a model and guide with the same randomness, ``SplitELBO(kl="monte_carlo")`` gives the
    same value as ``pyro.infer.Trace_ELBO`` and ``SplitELBO(kl="analytic")`` the same as
    ``pyro.infer.TraceMeanField_ELBO`` (the test suite checks both); it is a drop-in loss for
    ``pyro.infer.SVI``.
    """

    def __init__(
        self,
        kl: str = "monte_carlo",
        num_particles: int = 1,
        vectorize_particles: bool = True,
        max_plate_nesting: float = float("inf"),
        strict: bool = False,
    ):
        if kl not in ("monte_carlo", "analytic"):
            raise ValueError(f"kl must be 'monte_carlo' or 'analytic', got {kl!r}")
        super().__init__(
            num_particles=num_particles,
            max_plate_nesting=max_plate_nesting,
            vectorize_particles=vectorize_particles and num_particles > 1,
        )
        self.kl = kl
        self.strict = strict
        self.kl_weight = 1.0
        self.kl_methods: dict = {}
        self._method_cache: dict = {}

    # ---------------------------------------------------------------- estimation
    def _site_method(self, name, q, p) -> str:
        key = (name, type(q), type(p))
        method = self._method_cache.get(key)
        if method is None:
            method = "monte_carlo" if self.kl == "monte_carlo" else kl_method(q, p)
            if self.strict and self.kl == "analytic" and method == "monte_carlo":
                raise ValueError(
                    f"no KL between {type(base_distribution(q)).__name__} and "
                    f"{type(base_distribution(p)).__name__} is registered "
                    f"(site {name!r}); use kl='monte_carlo' or strict=False"
                )
            self._method_cache[key] = method
            self.kl_methods[name] = method
        return method

    def _particle_terms(self, model, guide, args, kwargs):
        guide_trace = prune_subsample_sites(poutine.trace(guide).get_trace(*args, **kwargs))
        model_trace = prune_subsample_sites(
            poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        )
        log_lik = 0.0
        kl = 0.0
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample":
                continue
            if site["is_observed"]:
                log_lik = log_lik + scale_and_mask(
                    site["fn"].log_prob(site["value"]), site["scale"], site["mask"]
                ).sum()
                continue
            guide_site = guide_trace.nodes.get(name)
            if guide_site is None:
                raise ValueError(f"the guide has no sample site {name!r}, which the model samples")
            q, p = guide_site["fn"], site["fn"]
            if not q.has_rsample:
                raise ValueError(
                    f"site {name!r}: {type(q).__name__} is not reparameterized; this ELBO needs "
                    "pathwise gradients (use pyro.infer.TraceGraph_ELBO for score-function terms)"
                )
            if self._site_method(name, q, p) != "monte_carlo":
                try:
                    site_kl = scale_and_mask(kl_divergence(q, p), guide_site["scale"], guide_site["mask"])
                    kl = kl + site_kl.sum()
                    continue
                except NotImplementedError:
                    if self.strict:
                        raise
                    self.kl_methods[name] = "monte_carlo"
            value = site["value"]
            kl = kl + scale_and_mask(q.log_prob(value), guide_site["scale"], guide_site["mask"]).sum()
            kl = kl - scale_and_mask(p.log_prob(value), site["scale"], site["mask"]).sum()
        for name, guide_site in guide_trace.nodes.items():
            # auxiliary guide-only sites (e.g. the unconstrained draws of Pyro's autoguides)
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                if not guide_site["fn"].has_rsample:
                    raise ValueError(f"guide site {name!r} is not reparameterized")
                kl = kl + scale_and_mask(
                    guide_site["fn"].log_prob(guide_site["value"]), guide_site["scale"], guide_site["mask"]
                ).sum()
        return log_lik, kl

    def _vectorized(self, fn):
        def vectorized(*args, **kwargs):
            with pyro.plate("num_particles_vectorized", self.num_particles, dim=-self.max_plate_nesting):
                return fn(*args, **kwargs)

        return vectorized

    def _guess_plate_nesting(self, model, guide, args, kwargs):
        # as pyro.infer.ELBO._guess_max_plate_nesting, without its log line on every new ELBO,
        # and without drawing from the caller's random stream: a trainer resumed from a
        # checkpoint guesses again, and would otherwise draw other weights than the
        # uninterrupted run from then on
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with poutine.block(), torch.random.fork_rng(devices=devices):
            guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        dims = [
            frame.dim
            for trace in (prune_subsample_sites(model_trace), prune_subsample_sites(guide_trace))
            for site in trace.nodes.values()
            if site["type"] == "sample"
            for frame in site["cond_indep_stack"]
            if frame.vectorized
        ]
        self.max_plate_nesting = (-min(dims) if dims else 0) + 1

    def terms(self, model, guide, *args, **kwargs) -> ELBOTerms:
        """Estimate the ELBO's terms with ``num_particles`` samples."""
        if self.vectorize_particles:
            if self.max_plate_nesting == float("inf"):
                self._guess_plate_nesting(model, guide, args, kwargs)
            log_lik, kl = self._particle_terms(self._vectorized(model), self._vectorized(guide), args, kwargs)
        else:
            log_lik, kl = 0.0, 0.0
            for _ in range(self.num_particles):
                ll_i, kl_i = self._particle_terms(model, guide, args, kwargs)
                log_lik, kl = log_lik + ll_i, kl + kl_i
        n = self.num_particles
        log_lik = log_lik / n  # a tensor: every particle's log-likelihood is
        kl = torch.as_tensor(kl, device=log_lik.device) / n  # 0.0 without latent sites
        loss = -(log_lik - self.kl_weight * kl)
        return ELBOTerms(loss, log_lik.detach(), kl.detach(), self.kl_weight, dict(self.kl_methods))

    # ------------------------------------------------------------- Pyro's interface
    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        return model_trace, guide_trace

    def differentiable_loss(self, model, guide, *args, **kwargs):
        return self.terms(model, guide, *args, **kwargs).loss

    def loss(self, model, guide, *args, **kwargs):
        with torch.no_grad():
            return self.terms(model, guide, *args, **kwargs).loss.item()

    def loss_and_grads(self, model, guide, *args, **kwargs):
        loss = self.terms(model, guide, *args, **kwargs).loss
        if loss.requires_grad:
            loss.backward()
        return loss.item()


def make_elbo(elbo=None, guide=None, num_particles: int = 1):
    """An ELBO object from a name: ``"trace"`` (Monte Carlo KL, as ``Trace_ELBO``),
    ``"meanfield"`` (registered KLs, as ``TraceMeanField_ELBO``), ``None`` (the guide's
    ``default_elbo``), or an ELBO instance (returned unchanged)."""
    if elbo is None:
        elbo = getattr(guide, "default_elbo", "trace")
    if isinstance(elbo, pyro.infer.ELBO):
        return elbo
    if elbo == "trace":
        return SplitELBO("monte_carlo", num_particles=num_particles)
    if elbo == "meanfield":
        return SplitELBO("analytic", num_particles=num_particles)
    raise ValueError(f"elbo must be 'trace', 'meanfield', None or a pyro.infer.ELBO, got {elbo!r}")
