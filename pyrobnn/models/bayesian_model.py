"""Turning an ordinary ``torch.nn.Module`` into a Pyro model."""

from __future__ import annotations

import copy
import fnmatch

import numpy as np
import pyro
import torch
from torch import nn

from pyrobnn.models.functional import call_with_weights
from pyrobnn.models.likelihoods import Likelihood
from pyrobnn.models.params import call_substituted, pyro_params
from pyrobnn.models.priors import NormalPrior, Prior
from pyrobnn.models.sites import DEFAULT_EXCLUDE, select_sites
from pyrobnn.utils.validation import FiniteOnce, as_tensor, check_inputs, expected_input

__all__ = ["BayesianModel"]


def _key(site_name: str) -> str:
    # nn.ParameterDict keys may not contain dots
    return site_name.replace(".", ":")


class BayesianModel(nn.Module):
    r"""A Pyro model built from a network, a prior and a likelihood.

    The chosen parameters of ``net`` become Pyro sample sites with the prior; the others
    (and the likelihood's and prior's own parameters) stay point parameters. Calling the model
    runs

    .. math:: w \sim p(w), \qquad f = \text{net}_w(x), \qquad
              y_n \sim p(y_n \mid f_n) \;\; (n \in \text{minibatch}, \text{scaled by } N/B)

    and returns the network's output ``f``, a tensor. The model is an ordinary Pyro callable:
    ``pyro.infer.SVI(model, guide, optim, Trace_ELBO())``, ``Predictive(model, guide=guide,
    num_samples=S, parallel=True)`` and ``MCMC(NUTS(model))`` all take it directly.

    Sample sites are named by the parameter's path in ``net`` (``"0.weight"``); the
    observations are ``"obs"`` inside the plate ``"data"``. Weights sampled with leading
    sample dimensions (vectorized prediction or particles) run through the network in one
    vmapped pass, so any ``forward`` works, not only layers that accept batched weights.

    :param net: the network; it is used as is (not copied) and its random parameters keep
        their initial values, which guides read to initialize their means.
    :param likelihood: a :class:`~pyrobnn.models.likelihoods.Likelihood`; its tensors (a fixed or
        learned noise scale) are moved to the random parameters' dtype and device, as
        ``model.to(...)`` would move them.
    :param prior: a :class:`~pyrobnn.models.priors.Prior` for every random parameter, or a dict
        from glob patterns over site names to priors (the first matching pattern wins).
        Default :class:`~pyrobnn.models.priors.NormalPrior` with scale 1.
    :param random: which parameters are random; see :func:`~pyrobnn.models.sites.select_sites`
        (``"all"``, ``"weights"``, ``"last_layer"``, modules, types, names, or a callable).
    :param exclude: module types kept deterministic by default (normalization layers).

    Example::

        net = nn.Sequential(nn.Linear(1, 50), nn.Tanh(), nn.Linear(50, 1))
        model = BayesianModel(net, GaussianLikelihood(scale="learned"), NormalPrior(1.0))
        guide = MeanFieldNormal(model)
        pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO()).step(x, y)
    """

    #: prefix of the point parameters' Pyro ``param`` names (their paths in the model, e.g.
    #: ``"likelihood.scale_unconstrained"``); see :attr:`pyrobnn.guides.WeightGuide.pyro_prefix`
    pyro_prefix = ""

    def __init__(
        self,
        net: nn.Module,
        likelihood: Likelihood,
        prior=None,
        random="all",
        exclude=DEFAULT_EXCLUDE,
    ):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        if not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a pyrobnn Likelihood, got {type(likelihood).__name__}")
        self.net = net
        self.likelihood = likelihood
        self.sites = select_sites(net, random, exclude)
        self._site_by_name = {s.name: s for s in self.sites}
        self._site_priors = {s.name: self._resolve_prior(prior, s) for s in self.sites}
        self.prior_params = nn.ParameterDict()
        for site in self.sites:
            for pname, value in self._site_priors[site.name].init_parameters(site, self.init_value(site)).items():
                self.prior_params[f"{_key(site.name)}:{pname}"] = value
        self._expected_input = expected_input(net)
        self._prior_cache = {}
        self._finite = FiniteOnce()
        random_ids = {id(self.init_value(s)) for s in self.sites}
        if self.sites:
            # the likelihood's tensors (a fixed or learned noise scale) made apart from the network,
            # in torch's defaults, move to the network's precision and device as one module's would
            likelihood.to(device=self.device, dtype=self.dtype)
        self._point_params = [(n, p) for n, p in self.named_parameters() if id(p) not in random_ids]

    @staticmethod
    def _resolve_prior(prior, site) -> Prior:
        if prior is None:
            return NormalPrior(1.0)
        if isinstance(prior, Prior):
            return prior
        if isinstance(prior, dict):
            for pattern, p in prior.items():
                if fnmatch.fnmatchcase(site.name, pattern):
                    return p
            raise ValueError(f"no prior pattern matches site {site.name!r}; patterns: {list(prior)}")
        raise TypeError(f"prior must be a pyrobnn Prior or a dict of them, got {type(prior).__name__}")

    # ----------------------------------------------------------------- introspection
    def init_value(self, site) -> torch.Tensor:
        """The network's own value of a random parameter (its initialization)."""
        return site.value

    def site(self, name: str):
        return self._site_by_name[name]

    def site_prior(self, site) -> Prior:
        return self._site_priors[site.name]

    @property
    def dtype(self) -> torch.dtype:
        return self.init_value(self.sites[0]).dtype

    @property
    def device(self) -> torch.device:
        return self.init_value(self.sites[0]).device

    def point_parameters(self):
        """``(name, parameter)`` for everything optimized as a point estimate: the network's
        non-random parameters, the likelihood's (a learned noise scale) and the prior's."""
        return self._point_params

    def prior_distribution(self, site):
        """The prior over ``site`` as a distribution with event shape ``site.shape``."""
        prior = self._site_priors[site.name]
        dtype, device = self.dtype, self.device
        key = (site.name, dtype, device)
        if prior.cacheable and key in self._prior_cache:
            return self._prior_cache[key]
        params = {
            k.rsplit(":", 1)[1]: v
            for k, v in self.prior_params.items()
            if k.rsplit(":", 1)[0] == _key(site.name)
        }
        d = prior.distribution(site, params, dtype=dtype, device=device).to_event(len(site.shape))
        if prior.cacheable:
            self._prior_cache[key] = d
        return d

    # ------------------------------------------------------------------ the model
    def check_x(self, x) -> None:
        """Dtype, emptiness and feature dimension of ``x`` (cheap; no pass over the data)."""
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a torch.Tensor or numpy array, got {type(x).__name__}")
        check_inputs(self._expected_input, x, self.dtype)

    def forward(self, x, y=None, dataset_size=None):
        """Sample weights from the prior, run the network, observe ``y``; return the output.
        NaN or infinite values in ``x`` or ``y`` are refused (a ``ValueError``), checked once
        per tensor object (:class:`~pyrobnn.utils.validation.FiniteOnce`).

        :param x: a batch of inputs (a tensor, or a NumPy array: a floating one is converted to
            the model's dtype).
        :param y: targets (``None`` to sample them; a NumPy array is converted as ``x`` is).
        :param dataset_size: size of the full data set when ``x`` is a minibatch (overrides
            the likelihood's ``dataset_size``).
        """
        if isinstance(x, np.ndarray):
            x = as_tensor(x, "x", self.dtype).to(self.device)
        self.check_x(x)
        self._finite(x, "x")
        if y is not None:
            y = as_tensor(y, "y", self.dtype).to(self.device) if isinstance(y, np.ndarray) else y
            self._finite(torch.as_tensor(y, device=getattr(y, "device", "cpu")), "y")
        replaced = pyro_params(self.point_parameters(), self.pyro_prefix)
        if replaced:
            return call_substituted(self, replaced, self._run, x, y, dataset_size)
        return self._run(x, y, dataset_size)

    def _run(self, x, y, dataset_size):
        values = {s.name: pyro.sample(s.name, self.prior_distribution(s)) for s in self.sites}
        latents = self.likelihood.sample_latents()
        output = call_with_weights(self.net, self.sites, values, x)
        self.likelihood(output, y, dataset_size=dataset_size, **latents)
        return output

    def deterministic_net(self, values: dict) -> nn.Module:
        """A copy of the network with each random parameter set to ``values[name]`` (e.g. the
        posterior means), as an ordinary deterministic ``nn.Module``."""
        net = copy.deepcopy(self.net)
        params = dict(net.named_parameters())
        with torch.no_grad():
            for site in self.sites:
                if site.name not in values:
                    raise ValueError(f"no value for site {site.name!r}")
                params[site.name].copy_(values[site.name].reshape(site.shape))
        return net
