"""Posterior predictive distributions over weight draws, chunked by memory.

Weight draws (a result's stored draws, or draws of a trained guide) run through the network
(:func:`network_outputs`: all draws as batched products for a stack of ``nn.Linear``, one draw
after another for any other network). The test points are split into chunks within the memory
budget of :mod:`pyrobnn.utils.memory`, so a CNN's predictive on a full test set runs in bounded memory;
every chunk of points sees the same weight draws, so each draw is one whole function of the
inputs.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import pyro
import torch
from pyro.infer import Predictive

from pyrobnn.infer.results.protocol import Result, evenly_spaced
from pyrobnn.models.functional import batched_stack, call_with_weights, swap_parameters
from pyrobnn.utils import memory
from pyrobnn.utils.modes import eval_mode
from pyrobnn.utils.validation import as_tensor, check_finite, check_forward, check_positive_int, check_same_placement

__all__ = ["predict", "predict_draws", "predict_guide", "network_outputs", "posterior_mean_values", "DEFAULT_GUIDE_DRAWS"]

#: weight draws of a guide where ``num_samples`` is not given
DEFAULT_GUIDE_DRAWS = 100
#: the most bytes of weight draws one pass takes where ``sample_batch_size`` is not given
DRAWS_BYTES = 256 << 20
#: the activations one chunk of points keeps where ``batch_size`` is not given: small chunks stay
#: in the processor's caches (a CNN's inference on 256 images ran 1.5x faster than on 1,000)
PASS_BYTES = 32 << 20


def posterior_mean_values(guide) -> dict:
    """Posterior mean of every latent site: ``guide.posterior_mean()`` for a
    :class:`~pyrobnn.guides.base.MeanGuide` (ours), the median for Pyro's autoguides (equal to
    the mean for their Normal families on unconstrained sites)."""
    from pyrobnn.guides.base import MeanGuide

    if isinstance(guide, MeanGuide):
        return guide.posterior_mean()
    if isinstance(guide, pyro.infer.autoguide.AutoGuide):
        return {k: v.detach() for k, v in guide.median().items()}
    raise ValueError(f"method='mean' needs a pyrobnn guide or a Pyro autoguide, got {type(guide).__name__}")


def _check_chunk(name, value):
    if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


def _weight_bytes(model) -> int:
    return sum(s.shape.numel() for s in model.sites) * torch.finfo(model.dtype).bits // 8


@torch.no_grad()
def network_outputs(model, draws: dict, x, *, batch_size=None, factor: int = memory.FORWARD_FACTOR) -> torch.Tensor:
    """The network's output at ``x`` for every weight draw, ``(S, N, ...)``: ``draws`` holds
    ``{site: (S, *shape)}`` for every random site of ``model``.

    A stack of ``nn.Linear`` layers (and element-wise modules) runs all draws at once as batched
    products; any other network (a CNN, a custom ``forward``) runs the draws one after another,
    each the network's own forward, which measured 2x faster than vmapping convolutions over
    draws (docs/logs/benchmarks.md). The points go in chunks of ``batch_size``; by default chunks
    whose activations stay near :data:`PASS_BYTES` (cache-friendly), and within the memory
    budget (:mod:`pyrobnn.utils.memory`)."""
    sites = model.sites
    rows = next(iter(draws.values())).shape[0] if draws else 1
    per_point = memory.activation_bytes(model.net, x)
    values = {s.name: draws[s.name] for s in sites}
    n = x.shape[0]
    if x.dim() == 2 and batched_stack(model.net) is not None:
        step = batch_size or max(1, min(memory.points_per_chunk(n, rows, per_point, factor, rows * _weight_bytes(model)),
                                        PASS_BYTES // max(rows * per_point, 1)))
        outputs = [call_with_weights(model.net, sites, values, x[i : i + step]) for i in range(0, n, step)]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, 1)
    step = batch_size or max(1, min(memory.points_per_chunk(n, 1, per_point, factor), PASS_BYTES // max(per_point, 1)))
    out = None
    for s in range(rows):
        with swap_parameters([(site.module, site.param_name, values[site.name][s].reshape(site.shape)) for site in sites]):
            for i in range(0, n, step):
                part = model.net(x[i : i + step])
                if out is None:
                    out = part.new_empty((rows, n) + tuple(part.shape[1:]))
                out[s, i : i + step] = part
    return out


def _prepare(model, x):
    x = as_tensor(x, "x", model.dtype)
    model.check_x(x)
    check_finite(x, "x")
    x = x.to(model.device)
    return x, check_forward(model.net, x)


#: the copies of the network outputs over all draws a prediction holds at its peak (the chunks,
#: their concatenation, the likelihood's summary of them)
OUTPUT_COPIES = 3


def _check_outputs_fit(model, x, out_shape, num_samples: int) -> None:
    """Every prediction holds the network's outputs for all draws and points at once: refuse one
    that cannot fit in free memory before it runs, naming what bounds it."""
    per_point = math.prod(out_shape[1:])
    need = OUTPUT_COPIES * num_samples * x.shape[0] * per_point * torch.finfo(model.dtype).bits // 8
    memory.check_fits(
        need, f"the predictive's outputs ({num_samples} weight draws x {x.shape[0]} points x {per_point} outputs)",
        "num_samples, or predict on fewer points per call", chunks=False,
    )


def _explicit_chunk_check(model, x, rows, batch_size, sample_batch_size):
    if batch_size is None and sample_batch_size is None:
        return
    points = min(batch_size or x.shape[0], x.shape[0])
    need = rows * points * memory.activation_bytes(model.net, x) * memory.FORWARD_FACTOR + rows * _weight_bytes(model)
    memory.check_fits(need, f"a predictive chunk of {points} points x {rows} weight draws", "batch_size or sample_batch_size")


def _sample_chunk(model, num_samples, sample_batch_size):
    if sample_batch_size is not None:
        return min(int(sample_batch_size), num_samples)
    # all draws at once, unless their weights alone pass DRAWS_BYTES: a constant, not the budget,
    # so that a guide's seeded draws (drawn chunk by chunk) are the same under any budget
    return int(min(num_samples, max(1, DRAWS_BYTES // max(_weight_bytes(model), 1))))


def _run_eval(model, fn, guide=None):
    with eval_mode(model, guide if isinstance(guide, torch.nn.Module) else None):
        return fn()


def predict_draws(model, draws: dict, x, num_samples: Optional[int] = None, *, batch_size=None, sample_batch_size=None):
    """The posterior predictive at ``x`` from stored weight draws ``{site: (S, *shape)}`` (every
    random site of ``model`` and its likelihood's latent sites): the equal-weight mixture over
    ``num_samples`` of them spread evenly over the draws (``None``: all)."""
    x, out_shape = _prepare(model, x)
    _check_chunk("batch_size", batch_size)
    _check_chunk("sample_batch_size", sample_batch_size)
    needed = [s.name for s in model.sites] + list(model.likelihood.latent_sites())
    missing = [name for name in needed if name not in draws]
    if missing:
        raise ValueError(f"the posterior samples lack the sites {missing}")
    counts = {name: draws[name].shape[0] for name in needed}
    if len(set(counts.values())) > 1:
        raise ValueError(f"the posterior samples hold different numbers of draws per site: {counts}")
    available = counts[needed[0]] if needed else 1
    if num_samples is not None:
        check_positive_int("num_samples", num_samples)
    num_samples = available if num_samples is None else min(int(num_samples), available)
    chosen = evenly_spaced(available, num_samples)
    draws = {k: draws[k][chosen.to(draws[k].device)].to(model.device) for k in needed}
    s = _sample_chunk(model, num_samples, sample_batch_size)
    _explicit_chunk_check(model, x, s, batch_size, sample_batch_size)
    _check_outputs_fit(model, x, out_shape, num_samples)

    def run():
        parts = [network_outputs(model, {k: v[i : i + s] for k, v in draws.items()}, x, batch_size=batch_size) for i in range(0, num_samples, s)]
        return torch.cat(parts, 0) if len(parts) > 1 else parts[0]

    outputs = _run_eval(model, run)
    latents = {k: draws[k].reshape(num_samples) for k in model.likelihood.latent_sites()}
    return model.likelihood.summarize(outputs, latents)


def predict_guide(model, guide, x, num_samples: Optional[int] = None, *, method: str = "sample", batch_size=None,
                  sample_batch_size=None, seed: Optional[int] = None):
    r"""The posterior predictive at ``x`` of a trained guide: the mixture over ``num_samples``
    weight draws (default :data:`DEFAULT_GUIDE_DRAWS`), drawn through
    ``pyro.infer.Predictive(guide, parallel=True)`` in chunks of ``sample_batch_size``, each chunk
    run on every point; or with ``method="mean"`` the naive prediction with every weight at its
    posterior mean (for dropout guides, the weight-scaling rule)."""
    if method not in ("sample", "mean"):
        raise ValueError(f"method must be 'sample' or 'mean', got {method!r}")
    if not callable(guide):
        raise TypeError(f"guide must be a trained Pyro guide (a callable), got {type(guide).__name__}")
    x, out_shape = _prepare(model, x)
    _check_chunk("batch_size", batch_size)
    _check_chunk("sample_batch_size", sample_batch_size)
    num_samples = DEFAULT_GUIDE_DRAWS if num_samples is None else num_samples
    check_positive_int("num_samples", num_samples)
    check_same_placement(model.init_value(model.sites[0]), guide)
    if seed is not None:
        pyro.set_rng_seed(seed)
    latent_names = list(model.likelihood.latent_sites())
    names = [s.name for s in model.sites] + latent_names

    if method == "mean":
        values = posterior_mean_values(guide)
        draws = {k: values[k].unsqueeze(0) for k in names}
        outputs = _run_eval(model, lambda: network_outputs(model, draws, x, batch_size=batch_size), guide)
        return model.likelihood.summarize(outputs, {k: draws[k].reshape(1) for k in latent_names})

    s = _sample_chunk(model, num_samples, sample_batch_size)
    _explicit_chunk_check(model, x, s, batch_size, sample_batch_size)
    _check_outputs_fit(model, x, out_shape, num_samples)

    def run():
        outputs, latents = [], {k: [] for k in latent_names}
        for done in range(0, num_samples, s):
            rows = min(s, num_samples - done)
            drawn = Predictive(guide, num_samples=rows, parallel=True, return_sites=names)(x[:1])
            draws = {k: drawn[k].detach().reshape(rows) if k in latent_names else drawn[k].detach() for k in names}
            outputs.append(network_outputs(model, draws, x, batch_size=batch_size))
            for k in latent_names:
                latents[k].append(draws[k])
        return torch.cat(outputs, 0), {k: torch.cat(v) for k, v in latents.items()}

    outputs, latents = _run_eval(model, run, guide)
    return model.likelihood.summarize(outputs, latents)


def predict(model, posterior, x, num_samples: Optional[int] = None, *, method: str = "sample", batch_size: Optional[int] = None,
            sample_batch_size: Optional[int] = None, seed: Optional[int] = None):
    r"""The posterior predictive at ``x``.

    :param posterior: any method's result (a :class:`~pyrobnn.infer.results.protocol.Result`: its own
        ``predict`` answers, so ``pyrobnn.predict(model, result, x)`` is ``result.predict(x)``),
        a trained guide, or posterior samples ``{site: (S, *shape)}``.
    :param num_samples: how many weight draws: ``None`` uses the result's own (all stored draws;
        :data:`DEFAULT_GUIDE_DRAWS` of a guide); a number of stored draws is spread evenly over
        them (so over every chain).
    :param method: ``"sample"`` averages over weight draws; ``"mean"`` (a guide only) is the
        naive prediction with every weight at its posterior mean.
    :param batch_size: points per chunk; default: chosen from the memory budget
        (:mod:`pyrobnn.utils.memory`). A chunk asked for that cannot fit in free memory is refused
        before it runs (:class:`~pyrobnn.utils.memory.MemoryBudgetError`).
    :param sample_batch_size: weight draws per vectorized pass (default: all, unless their
        weights alone pass :data:`DRAWS_BYTES`).
    :param seed: seeds the draws of a guide.
    :returns: a :class:`~pyrobnn.evaluation.predictions.RegressionPrediction` (predictive mean, total
        standard deviation and its epistemic and aleatoric parts) or a
        :class:`~pyrobnn.evaluation.predictions.ClassificationPrediction` (mean probabilities, predictive
        entropy, mutual information), as the likelihood defines.
    """
    options = dict(batch_size=batch_size, sample_batch_size=sample_batch_size)
    if isinstance(posterior, Result):
        owner = posterior.model
        if owner is not None and owner is not model:
            raise ValueError("this result belongs to another model object: call result.predict(x), or pass the result's model")
        if owner is None:  # draws made without a model: they are values of this model's sites
            if method != "sample":
                raise ValueError("method='mean' needs a guide; with posterior samples use method='sample'")
            return predict_draws(model, posterior.as_draws().flat_samples(), x, num_samples, **options)
        if method != "sample":
            if method not in posterior.predict_methods:
                raise ValueError(f"method={method!r} needs a guide; a {type(posterior).__name__} predicts from its draws (method='sample')")
            options["method"] = method
        return posterior.predict(x, num_samples, seed=seed, **options)
    if isinstance(posterior, dict):
        if method != "sample":
            raise ValueError("method='mean' needs a guide; with posterior samples use method='sample'")
        return predict_draws(model, posterior, x, num_samples, **options)
    return predict_guide(model, posterior, x, num_samples, method=method, seed=seed, **options)

