"""Ensemble-initialized sampling: a method made of two families, a deep ensemble
(:mod:`pyrobnn.infer.modes`) whose members start the chains of a sampler (:mod:`pyrobnn.infer.mcmc`
or :mod:`pyrobnn.infer.sgmcmc`). It sits above the families so that none of them imports
another (Sommer et al. 2024, ICML, "Connecting the dots: is mode-connectedness the key to
feasible sample-based inference in Bayesian neural networks?"; MILE, Sommer et al. 2025, ICLR)."""

from __future__ import annotations

from pyrobnn.infer.mcmc.samplers import mclmc, nuts
from pyrobnn.infer.modes.ensemble import deep_ensemble
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.sgmcmc.smile import smile
from pyrobnn.methods import MethodSpec, checked, latent_only_support, register, spec
from pyrobnn.utils.constraints import OneOf, Phases

__all__ = ["ensemble_sampling"]


@checked("ensemble_sampling")
def ensemble_sampling(model, x, y, *, ensemble: Posterior = None, sampler: str = "mclmc", ensemble_options=None, **kwargs) -> Posterior:
    """Ensemble-initialized sampling (Sommer et al. 2024, ICML; MILE, Sommer et al. 2025, ICLR):
    one chain per member of ``ensemble`` (:func:`pyrobnn.deep_ensemble`; trained here with
    ``ensemble_options`` when not given, the ``seed`` shared), run by ``sampler`` (``"mclmc"``:
    :func:`~pyrobnn.infer.mcmc.samplers.mclmc` with MILE's settings by default; ``"nuts"``: :func:`~pyrobnn.infer.mcmc.samplers.nuts`, MILE's baseline
    uses ``num_warmup=100, num_samples=1000``; ``"smile"``: the minibatch sampler
    :func:`pyrobnn.smile`, SMILE's ensemble); ``kwargs`` go to the sampler. The chains sit in
    different regions by design: judge each one on its own
    (:func:`pyrobnn.infer.results.diagnostics.within_chain_summary`, or the result's ``summary()``)."""
    spec(sampler).check_call(model, x, y, init=ensemble, **kwargs)  # the sampler's arguments, before the ensemble trains
    if ensemble is None:
        options = {"seed": kwargs.get("seed", 0), "progress": kwargs.get("progress", True), **(ensemble_options or {})}
        ensemble = deep_ensemble(model, x, y, **options)
    elif ensemble_options is not None:
        raise ValueError("give ensemble= or ensemble_options= (to train one here), not both")
    if not isinstance(ensemble, Posterior):
        raise TypeError(f"ensemble_sampling needs ensemble=deep_ensemble(...), got {type(ensemble).__name__}")
    if sampler == "mclmc":
        return mclmc(model, x, y, init=ensemble, **kwargs)
    if sampler == "nuts":
        return nuts(model, x, y, init=ensemble, **kwargs)
    return smile(model, x, y, init=ensemble, **kwargs)


register(MethodSpec(
    "ensemble_sampling", "ensemble-initialized sampling (MILE): a chain per deep-ensemble member", "mcmc", ensemble_sampling,
    latent_only_support(), budgets={"num_samples": 1, "num_warmup": 0},
    constraints={"sampler": OneOf(("mclmc", "nuts", "smile")), "num_warmup": Phases(3, least=0)},
    quick={"sampler": "nuts", "num_samples": 3, "num_warmup": 3, "max_tree_depth": 3, "progress": False,
           "ensemble_options": {"num_members": 2, "max_epochs": 2, "progress": False}},
))
