"""The ELBO of a pyrobnn model and guide evaluated directly, without Pyro's traces.

:class:`SplitELBO` runs the guide and the model under ``poutine.trace`` and walks the two
traces: general, and the reference. For a :class:`~pyrobnn.models.BayesianModel` with one of
our guides the structure is known in advance (one factor per weight site, a likelihood, its
latent sites), so :class:`TraceFreeELBO` computes the same estimator straight from the same
objects: the guide's factors (:meth:`~pyrobnn.guides.WeightGuide.posterior`), the model's
priors, the KLs registered in :mod:`pyrobnn.models.kl`, the estimators' layer formulas and the
likelihood's distribution. No Pyro messenger is involved, and under local reparameterization
or flipout no weight sample is drawn at all (none would be used).

With one weight sample per minibatch the two paths consume random numbers in the same order
and give identical values; the test suite checks that, and checks agreement in distribution
under the estimators. :class:`~pyrobnn.infer.SVITrainer` uses this path when it applies.
"""

from __future__ import annotations

import torch
from torch.distributions import kl_divergence

from pyrobnn.guides.base import WeightGuide
from pyrobnn.infer.svi.elbo import ELBOTerms
from pyrobnn.models import BayesianModel
from pyrobnn.models.distributions import UnitNoiseWeights
from pyrobnn.models.estimators import SUPPORTED_LAYERS, Estimator, Factor, unit_noise_shape
from pyrobnn.models.functional import swap_parameters
from pyrobnn.models.kl import base_distribution, kl_method
from pyrobnn.utils.runtime import compiled

__all__ = ["TraceFreeELBO"]


class TraceFreeELBO:
    """:class:`SplitELBO`'s estimator for a :class:`~pyrobnn.models.BayesianModel` and a
    :class:`~pyrobnn.guides.WeightGuide`, without tracing.

    :param kl: ``"monte_carlo"`` or ``"analytic"``, as in :class:`SplitELBO`.
    :param estimator: ``None`` (one weight sample per minibatch) or an
        :class:`~pyrobnn.models.estimators.Estimator` whose layer formulas to use.
    :param num_particles: samples per estimate, in a loop (:class:`SplitELBO` vectorizes them;
        the trainer uses this class for one particle).
    :param compile: compile the guides' fused per-site computations (factor scale and KL,
        see :meth:`~pyrobnn.guides.WeightGuide.fused_terms`) with ``torch.compile``: one
        pass over the weights instead of about ten, worth it for large layers; the first
        step pays the compilation (tens of seconds, cached on disk by PyTorch afterwards).
    """

    def __init__(self, model, guide, kl: str = "analytic", estimator=None, num_particles: int = 1, compile: bool = False):
        if not self.supports(model, guide, estimator):
            raise ValueError("TraceFreeELBO needs a pyrobnn BayesianModel, a pyrobnn guide, and supported layers")
        self.model, self.guide = model, guide
        self.kl = kl
        self.estimator = estimator
        self.num_particles = num_particles
        self.kl_weight = 1.0
        self.kl_methods = {}
        self.compile = compile
        self._compiled = {}
        self._layers = {}
        for site in model.sites:
            self._layers.setdefault(id(site.module), (site.module, {}))[1][site.param_name] = site

    @staticmethod
    def supports(model, guide, estimator=None) -> bool:
        if not isinstance(model, BayesianModel) or not isinstance(guide, WeightGuide):
            return False
        if guide.sites is not model.sites:
            return False
        if estimator is not None:
            if not isinstance(estimator, Estimator):
                return False
            if not all(isinstance(s.module, SUPPORTED_LAYERS) for s in model.sites):
                return False
        return True

    # ------------------------------------------------------------------ pieces
    def _site_kl(self, name, q, p, value):
        """KL of one latent site: registered where the ELBO is analytic and a KL is
        registered, else ``log q(w) - log p(w)`` at ``value`` (drawn if ``None``)."""
        method = self.kl_methods.get(name)
        if method is None:
            method = self.kl_methods[name] = "monte_carlo" if self.kl == "monte_carlo" else kl_method(q, p)
        if method != "monte_carlo":
            return kl_divergence(q, p).sum()
        if value is None:
            value = q.rsample()
        return q.log_prob(value).sum() - p.log_prob(value).sum()

    def _factor(self, q, site):
        base = base_distribution(q)
        if isinstance(base, UnitNoiseWeights):
            return Factor("units", base.loc, dist=base)
        if isinstance(base, torch.distributions.Normal):
            return Factor("gaussian", base.loc, base.scale, base)
        raise ValueError(f"{self.estimator.name} needs a factorized Gaussian or dropout-style posterior at site {site.name!r}")

    def _fused_all(self):
        """``{site name: (loc, scale, kl_sum)}`` for the sites whose guide has a fused form.

        Compiled, all sites sharing a function go through one call (one set of guards, one
        fused backward), which matters when a step takes a few milliseconds."""
        groups = {}
        for site in self.model.sites:
            prior = self.model.prior_distribution(site)
            fused = self.guide.fused_terms(site, base_distribution(prior)) if self.kl == "analytic" else None
            if fused is None:
                continue
            fn, args = fused
            if site.name not in self.kl_methods:
                self.kl_methods[site.name] = kl_method(self.guide.posterior(site), prior)
            groups.setdefault(fn, []).append((site, args))
        out = {}
        for fn, members in groups.items():
            if self.compile:
                if fn not in self._compiled:
                    self._compiled[fn] = compiled(_map_over_sites(fn), dynamic=True)
                results = self._compiled[fn]([args for _, args in members])
            else:
                results = [fn(*args) for _, args in members]
            for (site, _), terms in zip(members, results):
                out[site.name] = terms
        return out

    def _particle(self, x, y, dataset_size):
        model, guide = self.model, self.guide
        kl = 0.0
        values, factors = {}, {}
        fused_sites = self._fused_all()
        for site in model.sites:
            prior = model.prior_distribution(site)
            fused = fused_sites.get(site.name)
            if fused is not None:
                loc, scale, site_kl = fused
                kl = kl + site_kl
                if self.estimator is None:
                    # as Normal.rsample draws it, so that both paths use the same numbers
                    values[site.name] = loc + torch.randn_like(loc) * scale
                else:
                    factors[site.name] = Factor("gaussian", loc, scale)
                continue
            # element-wise factors and priors (sums taken here, not through Independent)
            q = guide.posterior(site)
            p = base_distribution(prior)
            if self.estimator is None:
                w = q.rsample()
                values[site.name] = w
                kl = kl + self._site_kl(site.name, q, p, w)
            else:
                factors[site.name] = self._factor(q, site)
                kl = kl + self._site_kl(site.name, q, p, None)
        latents = {}
        for name, prior in guide.latent_priors.items():
            q = guide.latent_posterior(name)
            latents[name] = q.rsample()
            kl = kl + self._site_kl(name, q, prior, latents[name])

        if self.estimator is None:
            with swap_parameters([(s.module, s.param_name, values[s.name]) for s in model.sites]):
                output = model.net(x)
        else:
            output = self._run_with_estimator(x, factors)

        likelihood = model.likelihood
        y = likelihood.check_targets(y, output.shape[-2:])
        log_lik = likelihood.distribution(output, **latents).log_prob(y).sum()
        n = x.shape[0]
        size = dataset_size if dataset_size is not None else likelihood.dataset_size
        if size is not None:
            log_lik = log_lik * (float(size) / n)
        return log_lik, kl

    def _run_with_estimator(self, x, factors):
        estimator = self.estimator
        layers = []
        for module, sites in self._layers.values():

            def forward(inp, module=module, sites=sites):
                w = factors[sites["weight"].name] if "weight" in sites else _point(module, "weight")
                b = factors[sites["bias"].name] if "bias" in sites else _point(module, "bias")
                if w is not None and w.kind == "units":
                    inp = inp * w.dist.noise(unit_noise_shape(module, inp))
                    w = Factor("point", w.mean)
                if b is not None and b.kind == "units":
                    b = Factor("point", b.mean)
                return estimator.layer_output(module, inp, w, b)

            layers.append((module, forward))
        for module, forward in layers:
            module.forward = forward
        try:
            return self.model.net(x)
        finally:
            for module, _ in layers:
                del module.__dict__["forward"]

    # ------------------------------------------------------------------ estimate
    def terms(self, x, y, dataset_size=None) -> ELBOTerms:
        log_lik, kl = 0.0, 0.0
        for _ in range(self.num_particles):
            ll_i, kl_i = self._particle(x, y, dataset_size)
            log_lik, kl = log_lik + ll_i, kl + kl_i
        log_lik = log_lik / self.num_particles  # a tensor: every particle's log-likelihood is
        kl = torch.as_tensor(kl, device=log_lik.device) / self.num_particles  # 0.0 without latent sites
        loss = -(log_lik - self.kl_weight * kl)
        return ELBOTerms(loss, log_lik.detach(), kl.detach(), self.kl_weight, dict(self.kl_methods))


def _map_over_sites(fn):
    def mapped(arg_lists):
        return [fn(*args) for args in arg_lists]

    return mapped


def _point(module, name):
    param = module._parameters.get(name)
    return None if param is None else Factor("point", param)
