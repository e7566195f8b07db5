r"""One result type for every posterior method: draws of the model's latent sites with the verbs
every method shares (the protocol :class:`~pyrobnn.infer.result.Result`).

A :class:`Posterior` holds draws ``{site: (chains, draws, *shape)}`` of a
:class:`~pyrobnn.models.BayesianModel`'s latent sites (its random weights and any latent noise
scale), the statistics the method recorded (a fixed schema, :data:`~pyrobnn.infer.result.STATS`), the wall time and
how it was made. NUTS, MCLMC, SGLD and SGHMC fill it with Markov chains; a deep ensemble with one
draw per member (:class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior`); Laplace and SWAG
with draws from their Gaussians (:class:`~pyrobnn.infer.modes.laplace.LaplacePosterior`,
:class:`~pyrobnn.infer.modes.swag.SWAGPosterior`, which add what is theirs: the linearized
predictive, the moments). A trained guide gets the same verbs through
:class:`~pyrobnn.infer.variational.VariationalPosterior`.

The verbs:

- ``predict(x)``: the posterior predictive (:func:`~pyrobnn.predictive.predict_draws`), the
  mixture over all draws;
- ``to_arviz(x, y)``: an ``arviz.InferenceData`` (:func:`pyrobnn.diagnostics.inference_data`);
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

from pyrobnn.infer.result import FAMILIES, STATS, Result, check_stats
from pyrobnn.validation import check_positive_int

__all__ = ["Posterior", "STATS", "FAMILIES", "structure", "check_structure", "load_posterior", "evenly_spaced", "FORMAT"]

FORMAT = "pyrobnn-posterior"
VERSION = 1


def structure(model) -> dict:
    """What a saved posterior must match in a model: the classes of its network and likelihood,
    its weight sites with their shapes, and its latent likelihood sites."""
    return {
        "net": type(model.net).__name__,
        "likelihood": type(model.likelihood).__name__,
        "sites": [[s.name, list(s.shape)] for s in model.sites],
        "latent_sites": list(model.likelihood.latent_sites()),
    }


def check_structure(saved: dict, model, path) -> None:
    """Refuse ``model`` where it differs from the ``saved`` structure, naming what differs."""
    current = structure(model)
    for key, what in (("net", "a network of type"), ("likelihood", "a likelihood of type")):
        if saved.get(key) != current[key]:
            raise ValueError(f"{path} was saved for {what} {saved.get(key)}; this model has {current[key]}")
    if saved.get("sites") != current["sites"]:
        theirs = {n: s for n, s in saved.get("sites", [])}
        ours = {n: s for n, s in current["sites"]}
        diff = sorted(set(theirs) ^ set(ours)) or [n for n in ours if theirs.get(n) != ours[n]]
        name = diff[0] if diff else None
        raise ValueError(
            f"{path} was saved for other weight sites: site {name!r} is {theirs.get(name, 'absent')} there "
            f"and {ours.get(name, 'absent')} in this model"
        )
    if saved.get("latent_sites") != current["latent_sites"]:
        raise ValueError(f"{path} was saved for the latent sites {saved.get('latent_sites')}; this model has {current['latent_sites']}")


_KINDS: dict = {}


@dataclass
class Posterior(Result):
    """Draws of every latent site, ``{name: (chains, draws, *shape)}``, with the method's
    statistics (:data:`~pyrobnn.infer.result.STATS`), its wall time in seconds, a label, its family
    (:data:`~pyrobnn.infer.result.FAMILIES`), the settings it was made with, and the model it
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
        """The posterior predictive at ``x`` (:func:`~pyrobnn.predictive.predict_draws`): the
        equal-weight mixture over all draws, or over ``num_samples`` of them spread evenly over
        the chains. ``seed`` is accepted for the protocol: stored draws need no randomness."""
        from pyrobnn.predictive import predict_draws

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
        """An ``arviz.InferenceData`` (:func:`pyrobnn.diagnostics.inference_data`): the sites and
        the network's output at ``x`` per chain and draw (``num_samples`` of them, default all),
        simulated targets, and with ``y`` the pointwise log-likelihood (for ``az.loo``) and the
        observed data; the sampler's per-draw statistics in ``sample_stats``."""
        from pyrobnn.diagnostics import inference_data

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
        from pyrobnn.io import atomic_save

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
        from pyrobnn.io import safe_load

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
        energy = self.stats.get("energy")
        if self.family in ("mcmc", "sgmcmc") and isinstance(energy, torch.Tensor) and energy.shape[1] >= 8:
            from pyrobnn.diagnostics import between_chain_rhat, within_chain_rhat

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


def describe_settings(settings: dict) -> str:
    """``settings`` in one line: a tensor by its shape, a posterior by its kind, long values cut."""

    def short(v):
        if isinstance(v, torch.Tensor):
            return f"tensor{tuple(v.shape)}"
        if isinstance(v, Posterior):
            return f"{type(v).__name__}({v.method}, {v.num_chains} chains)"
        text = repr(v)
        return text if len(text) <= 60 else text[:57] + "..."

    return ", ".join(f"{k}={short(v)}" for k, v in settings.items())


def plain(value):
    """``value`` with anything that is not a tensor, number, string or container of them
    replaced by a short description (the settings may hold an ensemble given as ``init``), tuples
    as lists: the settings as a result keeps and saves them."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Posterior):
        return f"{type(value).__name__} ({value.method}, {value.num_chains} chains)"
    return f"{type(value).__name__}"


def load_posterior(path, model, guide=None, map_location=None) -> Result:
    """Read any saved result for ``model``: a :class:`Posterior` (or subclass) written by its
    ``save``, or a trained guide written by ``VariationalPosterior.save`` (or :func:`pyrobnn.save`),
    which comes back as a :class:`~pyrobnn.infer.variational.VariationalPosterior` with its guide
    rebuilt from the saved class and settings (or loaded into ``guide`` where one is given)."""
    from pyrobnn.io import FORMAT as GUIDE_FORMAT, safe_load

    obj = safe_load(path, map_location)
    fmt = obj.get("format") if isinstance(obj, dict) else None
    if fmt == FORMAT:
        return Posterior.load(path, model, map_location)
    if fmt == GUIDE_FORMAT:
        from pyrobnn.infer.variational import VariationalPosterior

        return VariationalPosterior.load(path, model, map_location, guide=guide)
    raise ValueError(f"{path} is not a saved pyrobnn posterior or guide")


def evenly_spaced(available: int, wanted: int) -> torch.Tensor:
    """``wanted`` indices spread evenly over ``range(available)`` (all draws when ``wanted`` is
    at least ``available``): a subset of a posterior's flattened draws that covers every chain."""
    if wanted >= available:
        return torch.arange(available)
    return torch.linspace(0, available - 1, wanted, dtype=torch.float64).round().long()
