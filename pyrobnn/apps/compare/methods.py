"""The methods of ``pyrobnn compare``, one registry entry each, and the effort each gets.

A :class:`Method` says how to build its model's prior and how to fit it on a split; every fit
returns a result of the protocol :class:`~pyrobnn.infer.results.protocol.Result`, whose ``predict`` the
runner scores. Each entry names the method of the library's registry (:mod:`pyrobnn.methods`)
that it runs, with the effort the comparison gives it; adding a method to the comparison is one
:func:`register` call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import pyro.distributions as dist

import pyrobnn
from pyrobnn.infer.ensemble_sampling import ensemble_sampling
from pyrobnn.infer.mcmc import nuts
from pyrobnn.infer.modes import deep_ensemble, laplace, swag
from pyrobnn.infer.sgmcmc import sghmc, sgld, smile
from pyrobnn.infer.svi import ivon

__all__ = ["Method", "METHODS", "REFERENCES", "register", "Settings", "settings", "build_model", "split_ensemble", "predict_on"]


def _normal_prior():
    return pyrobnn.NormalPrior(1.0)


@dataclass(frozen=True)
class Method:
    """One row of the comparison.

    :ivar fit: ``fit(model, split, settings, seed, progress, shared) -> posterior``; ``shared``
        holds what the methods of one split share (its deep ensemble, :func:`split_ensemble`).
    :ivar prior: the weight prior its family is defined with.
    :ivar on_ensemble: built on the split's deep ensemble, whose training time then counts in
        its fit time even when another method trained it first.
    :ivar method: the key of the method it runs in the library's registry (:mod:`pyrobnn.methods`).
    """

    key: str
    label: str
    fit: Callable
    prior: Callable = _normal_prior
    on_ensemble: bool = False
    method: str = ""


#: the compared methods, by key (``pyrobnn compare --methods``); the reference's row (key
#: ``"reference"``) always runs, with the sampler chosen from :data:`REFERENCES`
METHODS: dict = {}
#: the reference samplers, by key (``pyrobnn compare --reference``); their rows are keyed "reference"
REFERENCES: dict = {}


def register(method: Method, reference: bool = False) -> Method:
    """Add ``method`` to the comparison (to the reference samplers with ``reference=True``)."""
    table = REFERENCES if reference else METHODS
    if method.key in table:
        raise ValueError(f"a method with key {method.key!r} is registered already")
    table[method.key] = method
    return method


@dataclass
class Settings:
    """Effort per method; :func:`settings` gives the defaults and the ``--quick`` ones."""

    epochs: int
    batch_size: Optional[int]
    lr: float
    num_predictive: int
    chains: int  # random-start NUTS chains
    warmup: int  # NUTS warm-up iterations
    samples: int  # NUTS draws per chain
    max_tree_depth: int
    members: int  # deep-ensemble members (one chain each for the ensemble-initialized reference)
    ensemble_epochs: int
    mclmc_warmup: tuple  # steps of MCLMC's three tuning phases
    mclmc_samples: int  # MCLMC steps after tuning
    mclmc_thinning: int
    sg_epochs: int  # SGLD/SGHMC epochs (half burn-in) and SWAG's SGD epochs after the MAP (step sizes "auto")


def settings(dataset: str, quick: bool) -> Settings:
    if quick:
        return Settings(epochs=150, batch_size=None, lr=1e-2, num_predictive=100, chains=2, warmup=60, samples=60, max_tree_depth=5,
                        members=2, ensemble_epochs=500, mclmc_warmup=(300, 50, 50), mclmc_samples=400, mclmc_thinning=4,
                        sg_epochs=20)
    if dataset == "toy":
        return Settings(epochs=3000, batch_size=None, lr=1e-2, num_predictive=500, chains=8, warmup=300, samples=300, max_tree_depth=10,
                        members=8, ensemble_epochs=2000, mclmc_warmup=(16_000, 2_000, 2_000), mclmc_samples=10_000, mclmc_thinning=10,
                        sg_epochs=200)
    return Settings(epochs=400, batch_size=32, lr=1e-2, num_predictive=500, chains=4, warmup=200, samples=200, max_tree_depth=8,
                    members=8, ensemble_epochs=400, mclmc_warmup=(16_000, 2_000, 2_000), mclmc_samples=10_000, mclmc_thinning=10,
                    sg_epochs=100)


def _noise_prior():
    # log-normal on the noise scale in standardized units: median 0.25, covering 0.03-2
    return dist.LogNormal(math.log(0.25), 1.0)


def build_model(method: Method, in_features: int, hidden: int, activation: str):
    """The network every method fits (one hidden layer), with the Gaussian likelihood whose noise
    scale has a log-normal prior, and the method's weight prior."""
    net = pyrobnn.MLP(in_features, 1, hidden=(hidden,), activation=activation)
    return pyrobnn.BayesianModel(net, pyrobnn.GaussianLikelihood(scale=_noise_prior()), method.prior())


def split_ensemble(model, split, s, seed, progress, shared):
    """The split's deep ensemble (MAP under the model's prior), trained once per split."""
    if "ensemble" not in shared:
        shared["ensemble"] = deep_ensemble(
            model, split["x_train"], split["y_train"], num_members=s.members, validation=0.1, objective="map", lr=s.lr,
            batch_size=s.batch_size, max_epochs=s.ensemble_epochs, patience=20, seed=seed, progress=progress,
        )
    return shared["ensemble"]


def predict_on(posterior, x, s, seed):
    """A method's predictive at ``x`` from the result's own draws (all of a posterior's stored
    draws; ``num_predictive`` draws of a guide, which the guide methods set as its ``num_draws``)."""
    return posterior.predict(x, seed=seed)


# -- the reference samplers ------------------------------------------------------------------

def _random_start_nuts(model, split, s, seed, progress, shared):
    return nuts(model, split["x_train"], split["y_train"], num_samples=s.samples, num_warmup=s.warmup, num_chains=s.chains,
                max_tree_depth=s.max_tree_depth, seed=seed, progress=progress)


def _ensemble_initialized(sampler):
    def fit(model, split, s, seed, progress, shared):
        ensemble = split_ensemble(model, split, s, seed, progress, shared)
        options = (
            dict(num_samples=s.mclmc_samples, num_warmup=s.mclmc_warmup, thinning=s.mclmc_thinning)
            if sampler == "mclmc" else dict(num_samples=s.samples, num_warmup=s.warmup, max_tree_depth=s.max_tree_depth)
        )
        return ensemble_sampling(model, split["x_train"], split["y_train"], ensemble=ensemble, sampler=sampler, seed=seed, progress=progress, **options)

    return fit


register(Method("ensemble-mclmc", "DE-initialized MCLMC (reference)", _ensemble_initialized("mclmc"), on_ensemble=True, method="ensemble_sampling"), reference=True)
register(Method("ensemble-nuts", "DE-initialized NUTS (reference)", _ensemble_initialized("nuts"), on_ensemble=True, method="ensemble_sampling"), reference=True)
register(Method("nuts", "NUTS from random starts (reference)", _random_start_nuts, method="nuts"), reference=True)


# -- the compared methods --------------------------------------------------------------------

def _the_ensemble(model, split, s, seed, progress, shared):
    return split_ensemble(model, split, s, seed, progress, shared)


def _minibatch(split, s):
    return min(s.batch_size or 32, split["x_train"].shape[0])  # minibatches even where the VI methods take full batches


def _laplace(model, split, s, seed, progress, shared):
    first = split_ensemble(model, split, s, seed, progress, shared).member(0)
    return laplace(model, split["x_train"], split["y_train"], subset="all", hessian="kron", map_estimate=first, num_samples=s.num_predictive, seed=seed)


def _swag(model, split, s, seed, progress, shared):
    first = split_ensemble(model, split, s, seed, progress, shared).member(0)
    return swag(model, split["x_train"], split["y_train"], num_epochs=s.sg_epochs, lr="auto", batch_size=_minibatch(split, s), rank=20,
                num_samples=s.num_predictive, map_estimate=first, seed=seed, progress=progress)


def _sg_mcmc(sampler, **extra):
    def fit(model, split, s, seed, progress, shared):
        ensemble = split_ensemble(model, split, s, seed, progress, shared)
        batch = _minibatch(split, s)
        steps = s.sg_epochs * math.ceil(split["x_train"].shape[0] / batch)
        kept_per_chain = max(1, s.num_predictive // ensemble.num_chains)
        thinning = max(1, (steps - steps // 2) // kept_per_chain)
        return sampler(model, split["x_train"], split["y_train"], step_size="auto", num_steps=steps, num_burnin=steps // 2,
                       thinning=thinning, batch_size=batch, init=ensemble, seed=seed, progress=progress, **extra)

    return fit


def _smile(model, split, s, seed, progress, shared):
    """SMILE from the split's ensemble (one chain per member), with SGLD's budget of minibatch
    steps: half tuning, half sampling."""
    ensemble = split_ensemble(model, split, s, seed, progress, shared)
    batch = _minibatch(split, s)
    steps = s.sg_epochs * math.ceil(split["x_train"].shape[0] / batch)
    kept_per_chain = max(1, s.num_predictive // ensemble.num_chains)
    thinning = max(1, (steps - steps // 2) // kept_per_chain)
    return smile(model, split["x_train"], split["y_train"], num_warmup=steps // 2, num_samples=steps - steps // 2, thinning=thinning,
                 batch_size=batch, init=ensemble, seed=seed, progress=progress)


def _ivon(model, split, s, seed, progress, shared):
    result = ivon(model, split["x_train"], split["y_train"], epochs=s.epochs, batch_size=s.batch_size or split["x_train"].shape[0],
                  seed=seed, progress=progress)
    result.num_draws = s.num_predictive
    return result


def _vi(make_guide, elbo="meanfield", estimator="local"):
    def fit(model, split, s, seed, progress, shared):
        guide = make_guide(model)
        result = pyrobnn.fit(model, guide, split["x_train"], split["y_train"], epochs=s.epochs, batch_size=s.batch_size, lr=s.lr,
                             elbo=elbo, estimator=estimator, progress=progress, seed=seed)
        result.num_draws = s.num_predictive
        return result

    return fit


for _method in (
    Method("ensemble", "deep ensemble", _the_ensemble, on_ensemble=True, method="deep_ensemble"),
    Method("laplace", "Laplace (KFAC, all weights, GLM predictive)", _laplace, on_ensemble=True, method="laplace"),
    Method("swag", "SWAG", _swag, on_ensemble=True, method="swag"),
    Method("sgld", "SGLD (from the ensemble)", _sg_mcmc(sgld), on_ensemble=True, method="sgld"),
    Method("sghmc", "SGHMC (from the ensemble)", _sg_mcmc(sghmc, friction=0.1), on_ensemble=True, method="sghmc"),
    Method("smile", "pSMILE (from the ensemble)", _smile, on_ensemble=True, method="smile"),
    Method("ivon", "IVON (diagonal Gaussian, natural gradient)", _ivon, method="ivon"),
    Method("meanfield", "mean-field, Gaussian prior", _vi(lambda m: pyrobnn.MeanFieldNormal(m)), method="meanfield"),
    Method("meanfield_mixture", "mean-field, scale-mixture prior", _vi(lambda m: pyrobnn.MeanFieldNormal(m), elbo="trace"),
           prior=lambda: pyrobnn.ScaleMixturePrior(0.5, 1.0, math.exp(-6)), method="meanfield"),
    Method("variational_dropout", "variational dropout", _vi(lambda m: pyrobnn.VariationalDropout(m, log_alpha_range=(-8.0, 0.0))),
           prior=lambda: pyrobnn.LogUniformPrior(), method="variational_dropout"),
    Method("sparse_vd", "sparse VD, log-uniform prior", _vi(lambda m: pyrobnn.SparseVariationalDropout(m)), prior=lambda: pyrobnn.LogUniformPrior(),
           method="sparse_vd"),
    Method("mc_dropout", "MC dropout", _vi(lambda m: pyrobnn.MCDropout(m, p=0.05)), method="mc_dropout"),
    Method("concrete_dropout", "concrete dropout", _vi(lambda m: pyrobnn.ConcreteDropout(m)), method="concrete_dropout"),
):
    register(_method)
