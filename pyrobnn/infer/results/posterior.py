r"""One result type for every posterior method: draws of the model's latent sites with the verbs
every method shares (the protocol :class:`~pyrobnn.infer.results.protocol.Result`).

A :class:`Posterior` holds draws ``{site: (chains, draws, *shape)}`` of a
:class:`~pyrobnn.models.BayesianModel`'s latent sites (its random weights and any latent noise
scale), the statistics the method recorded (a fixed schema, :data:`~pyrobnn.infer.results.protocol.STATS`), the wall time and
how it was made. NUTS, MCLMC, SGLD and SGHMC fill it with Markov chains; a deep ensemble with one
draw per member (:class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior`); Laplace and SWAG
with draws from their Gaussians (:class:`~pyrobnn.infer.modes.laplace.LaplacePosterior`,
:class:`~pyrobnn.infer.modes.swag.SWAGPosterior`, which add what is theirs: the linearized
predictive, the moments). A trained guide gets the same verbs through
:class:`~pyrobnn.infer.svi.variational.VariationalPosterior`.

The verbs:

- ``predict(x)``: the posterior predictive (:func:`~pyrobnn.infer.results.predictive.predict_draws`), the
  mixture over all draws;
- ``to_arviz(x, y)``: an ``arviz.InferenceData`` (:func:`pyrobnn.infer.results.diagnostics.inference_data`);
- ``as_draws()``: itself, or a subset of its draws;
- ``save(path)`` / ``Posterior.load(path, model)``: one file written atomically and read with
  ``torch.load(weights_only=True)``; the model's structure is recorded and a model that differs is
  refused, naming what differs;
- ``summary()``: what it is, how it was made, and the diagnostics that apply to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pyrobnn.infer.results.diagnostics import between_chain_rhat, inference_data, within_chain_rhat
from pyrobnn.infer.results.predictive import predict_draws
from pyrobnn.infer.results.protocol import FAMILIES, STATS, Result, check_stats, check_structure, describe_settings, evenly_spaced, plain, structure
from pyrobnn.utils.io import atomic_save, safe_load
from pyrobnn.utils.validation import check_positive_int

__all__ = ["Posterior", "FORMAT"]

FORMAT = "pyrobnn-posterior"
VERSION = 1


_KINDS: dict = {}


@dataclass
class Posterior(Result):
    """Draws of every latent site, ``{name: (chains, draws, *shape)}``, with the method's
    statistics (:data:`~pyrobnn.infer.results.protocol.STATS`), its wall time in seconds, a label, its family
    (:data:`~pyrobnn.infer.results.protocol.FAMILIES`), the settings it was made with, and the model it
    belongs to."""

    samples: dict
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0
    method: str = ""
    family: str = "mcmc"
    settings: dict = field(default_factory=dict)
    model: object = field(default=None, repr=False, compare=False)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _KINDS[cls.__name__] = cls

    def __post_init__(self):
        if not isinstance(self.samples, dict) or not self.samples:
            raise ValueError("a posterior needs draws: samples must be a non-empty dict {site: (chains, draws, *shape)}")
        shapes = {k: tuple(v.shape[:2]) for k, v in self.samples.items()}
        if len(set(shapes.values())) != 1 or any(len(s) != 2 for s in shapes.values()):
            raise ValueError(f"every site needs draws of shape (chains, draws, ...) with the same chains and draws, got {shapes}")
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {self.family!r}")
        check_stats(self.stats, self.num_chains, self.num_draws)
        self.settings = plain(dict(self.settings))  # as save writes them, so a reloaded result has the same

    # -- shape -------------------------------------------------------------------------------
    @property
    def num_chains(self) -> int:
        return next(iter(self.samples.values())).shape[0]

    @property
    def num_draws(self) -> int:
        """Draws per chain."""
        return next(iter(self.samples.values())).shape[1]

    def flat_samples(self) -> dict:
        """``{name: (chains * draws, *shape)}``, as ``pyro.infer.Predictive`` takes them."""
        return {k: v.reshape((-1,) + v.shape[2:]) for k, v in self.samples.items()}

    @property
    def num_divergences(self) -> int:
        """Divergent transitions over all chains (NUTS; 0 for a method without transitions)."""
        d = self.stats.get("diverging")
        return int(d.sum()) if isinstance(d, torch.Tensor) else 0

    def _require_model(self, verb):
        if self.model is None:
            raise ValueError(f"{verb} needs the model: this posterior was made without one; set posterior.model = model")
        return self.model

    # -- verbs -------------------------------------------------------------------------------
    def predict(self, x, num_samples=None, *, seed=None, batch_size=None, sample_batch_size=None):
        """The posterior predictive at ``x`` (:func:`~pyrobnn.infer.results.predictive.predict_draws`): the
        equal-weight mixture over all draws, or over ``num_samples`` of them spread evenly over
        the chains. ``seed`` is accepted for the protocol: stored draws need no randomness."""
        model = self._require_model("predict")
        return predict_draws(model, self.flat_samples(), x, num_samples, batch_size=batch_size, sample_batch_size=sample_batch_size)

    def as_draws(self, num_samples=None, *, seed=None) -> "Posterior":
        """This posterior (all draws), or ``num_samples`` draws spread evenly over each chain's
        (at least one per chain). ``seed`` is accepted for the protocol."""
        if num_samples is None or num_samples >= self.num_chains * self.num_draws:
            return self
        check_positive_int("num_samples", num_samples)
        per_chain = max(1, num_samples // self.num_chains)
        keep = evenly_spaced(self.num_draws, per_chain).to(next(iter(self.samples.values())).device)
        samples = {k: v[:, keep] for k, v in self.samples.items()}
        stats = {k: (v[:, keep.to(v.device)] if STATS[k][0] == "draw" and isinstance(v, torch.Tensor) else v) for k, v in self.stats.items()}
        return Posterior(samples, stats, self.seconds, self.method, self.family, self.settings, self.model)

    def to_arviz(self, x, y=None, *, num_samples=None, seed=None, observed: bool = True):
        """An ``arviz.InferenceData`` (:func:`pyrobnn.infer.results.diagnostics.inference_data`): the sites and
        the network's output at ``x`` per chain and draw (``num_samples`` of them, default all),
        simulated targets, and with ``y`` the pointwise log-likelihood (for ``az.loo``) and the
        observed data; the sampler's per-draw statistics in ``sample_stats``."""
        return inference_data(self._require_model("to_arviz"), self.as_draws(num_samples), x, y, observed)

    def _extra_state(self) -> dict:
        """What a subclass saves beside the draws (tensors and plain values)."""
        return {}

    @classmethod
    def _from_saved(cls, fields: dict, extra: dict, model):
        return cls(**fields, model=model)

    def save(self, path) -> None:
        """Write the posterior to ``path`` atomically (a temporary file renamed over it), as
        tensors and plain values that ``torch.load(weights_only=True)`` reads."""
        model = self._require_model("save")
        stats = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in self.stats.items()}
        atomic_save(
            {
                "format": FORMAT,
                "version": VERSION,
                "kind": type(self).__name__,
                "structure": structure(model),
                "samples": {k: v.detach().cpu() for k, v in self.samples.items()},
                "stats": stats,
                "seconds": float(self.seconds),
                "method": self.method,
                "family": self.family,
                "settings": plain(self.settings),
                "extra": self._extra_state(),
            },
            path,
        )

    @classmethod
    def load(cls, path, model, map_location=None) -> "Posterior":
        """Read a posterior written by :meth:`save` for ``model``: the file must hold a
        posterior (of this class or a subclass of it) saved for a model of the same structure
        (:func:`structure`); the draws are moved to the model's device."""
        obj = safe_load(path, map_location)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError(f"{path} is not a saved pyrobnn posterior")
        if obj.get("version") != VERSION:
            raise ValueError(f"{path} has posterior format version {obj.get('version')}; this pyrobnn reads {VERSION}")
        kind = _KINDS.get(obj.get("kind"), Posterior if obj.get("kind") == "Posterior" else None)
        if kind is None:
            raise ValueError(f"{path} holds a posterior of unknown kind {obj.get('kind')!r}")
        if not issubclass(kind, cls):
            raise ValueError(f"{path} holds a {kind.__name__}, not a {cls.__name__}")
        check_structure(obj["structure"], model, path)
        device = model.device
        fields = {
            "samples": {k: v.to(device) for k, v in obj["samples"].items()},
            "stats": obj["stats"],
            "seconds": obj["seconds"],
            "method": obj["method"],
            "family": obj["family"],
            "settings": obj["settings"],
        }
        return kind._from_saved(fields, obj.get("extra", {}), model)

    def summary(self) -> str:
        """What this posterior is, how it was made, and the diagnostics that apply to it, in a
        few lines of text."""
        lines = [self._headline(), self._provenance()]
        lines += [f"  {line}" for line in self._diagnostics()]
        return "\n".join(lines)

    def _headline(self) -> str:
        dim = sum(v[0, 0].numel() for v in self.samples.values())
        model = f" of {type(self.model.net).__name__} with {type(self.model.likelihood).__name__}" if self.model is not None else ""
        return (
            f"{self.method or type(self).__name__}{model}: {self.num_chains} chain(s) x {self.num_draws} draw(s) of "
            f"{len(self.samples)} site(s), {dim} numbers per draw ({FAMILIES[self.family]})"
        )

    def _provenance(self) -> str:
        made = f"made in {self.seconds:.1f} s"
        if "path" in self.stats:
            made += f" on the {self.stats['path']} path ({self.stats.get('path_reason', '')})"
        if self.settings:
            made += "; settings: " + describe_settings(self.settings)
        return made

    #: a chain with at least this share of divergent draws is named as stuck in :meth:`summary`
    STUCK_SHARE = 0.5

    def _stuck_chains(self) -> list:
        """The chains most of whose transitions diverged: a step size too large for where they are
        (a warm-up too short to adapt it), or a start so far from the posterior that no step size
        fits; their draws barely move."""
        diverging = self.stats.get("diverging")
        if not isinstance(diverging, torch.Tensor) or diverging.dim() != 2 or diverging.shape[1] == 0:
            return []
        share = diverging.float().mean(1)
        stuck = [c for c, v in enumerate(share.tolist()) if v >= self.STUCK_SHARE]
        if not stuck:
            return []
        shares = ", ".join(f"chain {c}: {share[c]:.0%}" for c in stuck)
        step = self.stats.get("step_size")
        steps = ""
        if isinstance(step, torch.Tensor) and step.shape == share.shape:
            others = [step[c].item() for c in range(len(share)) if c not in stuck]
            steps = f"; step size {', '.join(f'{step[c].item():.3g}' for c in stuck)}"
            steps += f" against {min(others):.3g}-{max(others):.3g} for the others" if others else ""
        return [f"stuck chains, their draws mostly divergent ({shares}{steps}): they do not describe the posterior; run again "
                "with a longer warm-up (num_warmup >= 150), a higher target_accept (0.9-0.95), or from a deep ensemble's members "
                "(init=pyrobnn.deep_ensemble(...)) where random starts lie far from the posterior"]

    def _diagnostics(self) -> list:
        out = []
        for key in ("nonfinite_warmup", "nonfinite"):
            value = self.stats.get(key)
            if isinstance(value, torch.Tensor) and int(value.sum()):
                out.append(f"{key}: {int(value.sum())} steps undone for a non-finite value, per chain {value.tolist()}")
        resets = self.stats.get("resets")
        if isinstance(resets, torch.Tensor):
            warm = self.stats.get("resets_warmup", torch.zeros_like(resets))
            out.append(f"steps undone by the energy-error guardrail: {int(warm.sum())} while tuning, {int(resets.sum())} while sampling")
        step = self.stats.get("step_size")
        if self.family == "sgmcmc" and isinstance(step, torch.Tensor) and bool((step <= 1e-7).any()):
            stuck = int((step <= 1e-7).sum())
            out.append(f"{stuck} chain(s) ended with a step size at the floor (<= 1e-7): they barely moved; start with a smaller step_size")
        if "diverging" in self.stats:
            out.append(f"divergent transitions: {self.num_divergences} of {self.num_chains * self.num_draws}")
            out += self._stuck_chains()
        energy = self.stats.get("energy")
        if self.family in ("mcmc", "sgmcmc") and isinstance(energy, torch.Tensor) and energy.shape[1] >= 8:
            within = within_chain_rhat(energy)
            out.append(f"within-chain split R-hat of the log density: worst {np.nanmax(within):.3f} (per chain {np.round(within, 3).tolist()})")
            if self.num_chains > 1:
                out.append(
                    f"between-chain R-hat of the log density: {between_chain_rhat(energy):.3f} (chains started apart, as from an "
                    "ensemble, explore different modes by design: judge them within chains)"
                )
        if self.family == "sgmcmc":
            out.append("no Metropolis correction: the draws carry a step-size bias")
        return out
