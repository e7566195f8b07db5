"""Posterior predictive distributions, vectorized over posterior samples."""

from __future__ import annotations

import numbers
from typing import Optional

import pyro
import torch
from pyro import poutine
from pyro.infer import Predictive

from pyrobnn.infer.posterior import Posterior, evenly_spaced
from pyrobnn.predictions import ClassificationPrediction, RegressionPrediction
from pyrobnn.validation import as_tensor, check_finite, check_forward, check_positive_int, check_same_placement

__all__ = ["predict", "posterior_mean_values"]


def posterior_mean_values(guide) -> dict:
    """Posterior mean of every latent site: ``guide.posterior_mean()`` for our guides, the
    median for Pyro's autoguides (equal to the mean for their Normal families on
    unconstrained sites)."""
    if hasattr(guide, "posterior_mean"):
        return guide.posterior_mean()
    if hasattr(guide, "median"):
        return {k: v.detach() for k, v in guide.median().items()}
    raise ValueError(f"{type(guide).__name__} has neither posterior_mean() nor median()")


def _concat(parts):
    first = parts[0]
    if isinstance(first, RegressionPrediction):
        return RegressionPrediction(
            torch.cat([p.loc_samples for p in parts], 1),
            torch.cat([p.scale_samples.expand_as(p.loc_samples) for p in parts], 1),
        )
    return ClassificationPrediction(torch.cat([p.sample_probs for p in parts], 1))


def _posterior_samples(posterior):
    """``{site: (S, *shape)}`` from a :class:`~pyrobnn.infer.posterior.Posterior` or a dict of
    samples; ``None`` for a guide."""
    if isinstance(posterior, Posterior):
        return posterior.flat_samples()
    if isinstance(posterior, dict):
        return posterior
    return None


@torch.no_grad()
def _sampled(model, guide, x, num_samples, sample_batch_size, samples_given=None):
    latent_names = list(model.likelihood.latent_sites())
    outputs, latents = [], {k: [] for k in latent_names}
    done = 0
    while done < num_samples:
        s = min(sample_batch_size, num_samples - done)
        if samples_given is not None:
            chunk = {k: v[done : done + s] for k, v in samples_given.items()}
            predictive = Predictive(model, posterior_samples=chunk, parallel=True, return_sites=["_RETURN", *latent_names])
        else:
            predictive = Predictive(model, guide=guide, num_samples=s, parallel=True, return_sites=["_RETURN", *latent_names])
        samples = predictive(x)
        outputs.append(samples["_RETURN"])
        for k in latent_names:
            latents[k].append(samples[k].reshape(s))
        done += s
    return torch.cat(outputs, 0), {k: torch.cat(v, 0) for k, v in latents.items()}


@torch.no_grad()
def _at_mean(model, guide, x):
    values = posterior_mean_values(guide)
    trace = poutine.trace(poutine.condition(model, data=values)).get_trace(x)
    output = trace.nodes["_RETURN"]["value"].unsqueeze(0)
    latents = {k: values[k].reshape(1) for k in model.likelihood.latent_sites()}
    return output, latents


def predict(
    model,
    guide,
    x,
    num_samples: Optional[int] = 100,
    *,
    method: str = "sample",
    batch_size: Optional[int] = None,
    sample_batch_size: Optional[int] = None,
    seed: Optional[int] = None,
):
    r"""The posterior predictive at ``x``.

    :param guide: a trained guide, or posterior samples: a
        :class:`~pyrobnn.infer.posterior.Posterior` (any method's result) or a dict
        ``{site: (S, *shape)}``.
    :param num_samples: weight samples to draw from a guide; with posterior samples, how many
        of them to use (``None``: all), spread evenly over the draws (so over every chain).
    :param method: ``"sample"`` averages over ``num_samples`` weight samples from the guide,
        drawn through ``pyro.infer.Predictive(parallel=True)``: one batched pass per chunk of
        samples, not a Python loop per sample. ``"mean"`` is the naive prediction with every
        weight at its posterior mean (for dropout guides, the weight-scaling rule).
    :param batch_size: points per chunk (default: all at once).
    :param sample_batch_size: samples per vectorized pass (default: all at once); lower it
        to bound memory for large networks.
    :param seed: seeds Pyro before sampling.
    :returns: a :class:`~pyrobnn.predictions.RegressionPrediction` (predictive mean, total
        standard deviation and its epistemic and aleatoric parts) or a
        :class:`~pyrobnn.predictions.ClassificationPrediction` (mean probabilities,
        predictive entropy, mutual information), as the likelihood defines.

    Different chunks of points use different posterior samples; every summary here is
    per point, so this does not change them.
    """
    x = as_tensor(x, "x")
    model.check_x(x)
    check_finite(x, "x")
    if method not in ("sample", "mean"):
        raise ValueError(f"method must be 'sample' or 'mean', got {method!r}")
    for name, value in (("batch_size", batch_size), ("sample_batch_size", sample_batch_size)):
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    if num_samples is not None:
        check_positive_int("num_samples", num_samples)
    given = _posterior_samples(guide)
    if given is not None:
        if method == "mean":
            raise ValueError("method='mean' needs a guide; with posterior samples use method='sample'")
        needed = [s.name for s in model.sites] + list(model.likelihood.latent_sites())
        missing = [name for name in needed if name not in given]
        if missing:
            raise ValueError(f"the posterior samples lack the sites {missing}")
        counts = {name: given[name].shape[0] for name in needed}
        if len(set(counts.values())) != 1:
            raise ValueError(f"the posterior samples hold different numbers of draws per site: {counts}")
        available = counts[needed[0]] if needed else next(iter(given.values())).shape[0]
        num_samples = available if num_samples is None else min(num_samples, available)
        # a subset spread over the draws, so that it takes from every chain of a Posterior
        chosen = evenly_spaced(available, num_samples)
        given = {k: v[chosen.to(v.device)].to(model.device) for k, v in given.items()}
    elif num_samples is None:
        raise ValueError("num_samples is required with a guide")
    else:
        check_same_placement(model.init_value(model.sites[0]), guide)
    if seed is not None:
        pyro.set_rng_seed(seed)
    x = x.to(model.device)
    check_forward(model.net, x)
    batch_size = x.shape[0] if batch_size is None else int(batch_size)
    sample_batch_size = num_samples if sample_batch_size is None else int(sample_batch_size)
    was_training = model.training, getattr(guide, "training", False)
    model.eval()
    if given is None:
        guide.eval()
    try:
        parts = []
        for i in range(0, x.shape[0], batch_size):
            xb = x[i : i + batch_size]
            if method == "sample":
                outputs, latents = _sampled(model, guide, xb, num_samples, sample_batch_size, given)
            else:
                outputs, latents = _at_mean(model, guide, xb)
            parts.append(model.likelihood.summarize(outputs, latents))
    finally:
        model.train(was_training[0])
        if given is None:
            guide.train(was_training[1])
    return parts[0] if len(parts) == 1 else _concat(parts)
