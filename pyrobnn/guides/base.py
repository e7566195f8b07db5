"""What every pyrobnn guide shares."""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import pyro
import torch
from torch import nn

from pyrobnn.models.distributions import unchecked_log_normal, without_validation
from pyrobnn.models.numerics import softplus
from pyrobnn.models.params import call_substituted, pyro_params
from pyrobnn.utils.validation import check_same_placement

__all__ = ["WeightGuide", "MeanGuide", "inverse_softplus", "site_key"]


def inverse_softplus(x):
    x = x if isinstance(x, torch.Tensor) else torch.tensor(x, device="cpu")
    return x + torch.log(-torch.expm1(-x))


def site_key(name: str) -> str:
    """``nn.ParameterDict`` keys may not contain dots."""
    return name.replace(".", ":")


@runtime_checkable
class MeanGuide(Protocol):
    """A guide that knows its posterior mean, ``{site: E_q[w]}`` for every weight site and latent
    likelihood site: ours (:class:`WeightGuide`) and guides built on them
    (:class:`~pyrobnn.guides.sparsity.PrunedGuide`). ``pyrobnn.predict(..., method="mean")`` takes them."""

    def posterior_mean(self) -> dict: ...


class WeightGuide(nn.Module):
    r"""Base class of our guides: one variational factor per weight site of a
    :class:`~pyrobnn.models.BayesianModel`, each placed at the site as the real distribution
    (never a ``Delta`` fed from a hidden site), so that an analytic-KL ELBO
    (``TraceMeanField_ELBO``) finds the registered KL and the estimators of
    :mod:`pyrobnn.models.estimators` can read the factor's moments.

    Latent sites of the likelihood (a noise scale with a prior) get a log-normal factor
    :math:`q(\sigma) = \text{LogNormal}(m, \text{softplus}(\rho)^2)`, initialized at the
    prior's mean (or 1 if it has none) with log-scale 0.1.

    The guide keeps its parameters as ordinary ``nn.Parameter`` attributes and, when called
    under Pyro, emits each as a ``param`` site named :attr:`pyro_prefix` + its path in the module
    (``"guide.loc.0:weight"``; :mod:`pyrobnn.models.params`): ``pyro.infer.SVI`` optimizes them,
    ``pyro.optim`` options per name and its saved state apply, ``JitTrace_ELBO`` works, and
    two guides never share a value.

    Subclasses implement :meth:`posterior` (batch shape ``site.shape``) and
    :meth:`posterior_mean_of`.
    """

    #: prefix of the guide's Pyro ``param`` names; set another on one of two guides with the
    #: same parameter paths that are trained in alternation under ``JitTrace_ELBO`` (the JIT
    #: looks each name up in Pyro's store before a step)
    pyro_prefix = "guide."

    #: the ELBO :func:`pyrobnn.fit` uses by default: "trace" (Monte Carlo KL, Pyro's
    #: ``Trace_ELBO``) or "meanfield" (registered KL, ``TraceMeanField_ELBO``)
    default_elbo = "trace"

    def __init__(self, model):
        super().__init__()
        self.sites = model.sites
        self._site_by_name = {s.name: s for s in self.sites}
        # scored at the guide's draws, which lie in the support: unchecked, as the posterior is
        self.latent_priors = {name: without_validation(p) for name, p in model.likelihood.latent_sites().items()}
        self.latent_loc = nn.ParameterDict()
        self.latent_rho = nn.ParameterDict()
        for name, prior in self.latent_priors.items():
            try:
                mean = float(prior.mean)
            except (NotImplementedError, ValueError, TypeError):
                mean = float("nan")
            init = math.log(mean) if math.isfinite(mean) and mean > 0 else 0.0
            self.latent_loc[site_key(name)] = nn.Parameter(torch.tensor(init, dtype=model.dtype, device=model.device))
            self.latent_rho[site_key(name)] = nn.Parameter(inverse_softplus(torch.tensor(0.1, dtype=model.dtype, device=model.device)))
        self._site_priors = {s.name: model.site_prior(s) for s in self.sites}
        self._prior_cache = {}

    # ------------------------------------------------------------------ interface
    def posterior(self, site):
        """The variational distribution of one weight site, batch shape ``site.shape``."""
        raise NotImplementedError

    def posterior_mean_of(self, site) -> torch.Tensor:
        raise NotImplementedError

    def config(self) -> dict:
        """The constructor's settings that shape the guide (its class and these rebuild it
        before its state is loaded: :meth:`VariationalPosterior.load
        <pyrobnn.infer.svi.variational.VariationalPosterior.load>`); plain values only."""
        return {}

    def fused_terms(self, site, prior):
        """A pure function and its tensor arguments computing ``(loc, scale, kl_sum)`` of a
        Gaussian factor (``loc`` equal to :meth:`posterior_mean_of`) together with its KL against
        ``prior`` (the site's prior, batch shape ``site.shape``), or ``None`` where this
        guide has no such form for the pair. :class:`~pyrobnn.infer.svi.trace_free.TraceFreeELBO` uses it
        to compute a layer's moments and KL in one pass, compiled when asked; the function
        must equal :meth:`posterior` and the registered KL (the tests check that)."""
        return None

    def latent_posterior(self, name):
        """The LogNormal posterior of a latent site (a noise scale), without torch's checks
        (:func:`~pyrobnn.models.distributions.unchecked_log_normal`: its scale is positive by
        construction, and a check would read a value back to the host at every step)."""
        key = site_key(name)
        return unchecked_log_normal(self.latent_loc[key], softplus(self.latent_rho[key]))

    # ------------------------------------------------------------------ derived
    def site_prior(self, site, like: torch.Tensor):
        """The model's prior over ``site`` (batch shape ``site.shape``) for factors whose
        ``log_prob`` is defined against it; ``None`` for priors with learned parameters."""
        prior = self._site_priors[site.name]
        if not prior.cacheable:
            return None
        key = (site.name, like.dtype, like.device)
        if key not in self._prior_cache:
            self._prior_cache[key] = prior.distribution(site, dtype=like.dtype, device=like.device)
        return self._prior_cache[key]

    def site(self, name):
        return self._site_by_name[name]

    @torch.no_grad()
    def posterior_mean(self) -> dict:
        """``{site name: E_q[w]}`` for every weight site and latent likelihood site; the
        weights of the "naive" prediction at the posterior mean."""
        means = {s.name: self.posterior_mean_of(s).detach().clone() for s in self.sites}
        for name in self.latent_priors:
            means[name] = self.latent_posterior(name).mean.detach().clone()
        return means

    def forward(self, *args, **kwargs):
        """Sample every weight site (and latent likelihood site) from its factor. The model's
        arguments are accepted and ignored: the factors do not depend on the data."""
        check_same_placement(self.sites[0].value, self)
        replaced = pyro_params(self.named_parameters(), self.pyro_prefix)
        if replaced:
            return call_substituted(self, replaced, self._sample_sites)
        return self._sample_sites()

    def _sample_sites(self):
        samples = {}
        for site in self.sites:
            samples[site.name] = pyro.sample(site.name, self.posterior(site).to_event(len(site.shape)))
        for name in self.latent_priors:
            samples[name] = pyro.sample(name, self.latent_posterior(name))
        return samples

    def extra_repr(self):
        return f"sites={[s.name for s in self.sites]}"
