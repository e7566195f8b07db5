r"""The result protocol: what every method returns, and what every consumer takes.

Every registered method (:mod:`pyrobnn.methods`) returns a :class:`Result`: draws of a
:class:`~pyrobnn.models.BayesianModel`'s latent sites (:class:`~pyrobnn.infer.results.posterior.Posterior`
and its subclasses: samplers, ensembles, Laplace, SWAG) or a trained guide that draws them on
demand (:class:`~pyrobnn.infer.svi.variational.VariationalPosterior`: SVI, IVON). Both answer the same
verbs with the same signatures:

- ``predict(x, num_samples=None, *, seed=None, batch_size=None)``: the posterior predictive
  (a :class:`~pyrobnn.evaluation.predictions.RegressionPrediction` or
  :class:`~pyrobnn.evaluation.predictions.ClassificationPrediction`); ``num_samples=None`` uses the
  result's own draws: all draws of a sample-based result, ``num_draws`` fresh draws of a guide;
  ``batch_size`` bounds the points per pass (default: chosen from the memory budget,
  :mod:`pyrobnn.utils.memory`);
- ``to_arviz(x, y=None)``: an ``arviz.InferenceData``;
- ``save(path)`` and ``load(path, model)``: one file, written atomically, read with
  ``torch.load(weights_only=True)`` into a model of the same structure; nothing else is needed
  to load (a guide's class and settings are saved and it is rebuilt);
- ``summary()``: what it is, how it was made, and the diagnostics that apply;
- ``as_draws(num_samples=None, *, seed=None)``: the result as draws
  ``{site: (chains, draws, *shape)}`` in a :class:`~pyrobnn.infer.results.posterior.Posterior`, which
  ArviZ conversion, diagnostics and ``compare`` read;

and carry ``family`` (a :data:`FAMILIES` key), ``method`` (a label), ``settings`` (how it was
made: plain numbers, strings, tensors and lists or dicts of them, an object given as an argument
recorded by its description, so a reloaded result has the same settings), ``stats`` (what the method recorded, in the :data:`STATS` schema), ``seconds`` and
``model``. Consumers (:func:`pyrobnn.predict`, :mod:`pyrobnn.infer.results.diagnostics`,
:mod:`pyrobnn.apps.compare`) dispatch on ``isinstance(result, Result)``, never on attribute checks.
"""

from __future__ import annotations

import abc

import torch

__all__ = ["Result", "STATS", "FAMILIES", "check_stats", "plain", "describe_settings", "describe_result", "structure", "check_structure", "evenly_spaced"]

#: What a result's ``stats`` may hold, and in which shape: ``"draw"`` values are
#: ``(chains, draws, ...)``, ``"chain"`` values ``(chains, ...)`` and ``"run"`` values describe
#: the whole run (a number, a string, or a tensor without a chain axis). Any other key is refused,
#: so that no method records a statistic that the verbs would then not find.
STATS = {
    # per draw
    "diverging": ("draw", "whether the NUTS transition to this draw diverged"),
    "accept_prob": ("draw", "NUTS's mean acceptance probability over the tree"),
    "tree_depth": ("draw", "the depth of the NUTS tree"),
    "num_steps": ("draw", "leapfrog steps of the NUTS transition"),
    "energy": ("draw", "the potential, -log p(w, D) up to a constant, at the draw"),
    "energy_change": ("draw", "the energy error of the MCLMC or SMILE step that made the draw"),
    # per chain (or member, or run of MultiSWAG)
    "step_size": ("chain", "the sampler's (final) step size"),
    "L": ("chain", "MCLMC's momentum decoherence length"),
    "inv_mass": ("chain", "the diagonal inverse mass matrix (preconditioner)"),
    "nonfinite": ("chain", "steps undone because they gave a non-finite value, while sampling"),
    "nonfinite_warmup": ("chain", "steps undone because they gave a non-finite value, while tuning"),
    "resets": ("chain", "SMILE steps undone by the energy-error guardrail, while sampling"),
    "resets_warmup": ("chain", "SMILE steps undone by the energy-error guardrail, while tuning"),
    "val_nll": ("chain", "a member's best validation negative log-likelihood per point"),
    "train_loss": ("chain", "a member's final training loss per point"),
    "best_epoch": ("chain", "the epoch of a member's best validation loss"),
    "epochs": ("chain", "epochs a member trained"),
    # the run
    "step": ("run", "the step (counted from 1) that made each kept draw (SG-MCMC)"),
    "lr": ("run", "the learning rate (SWAG's SGD)"),
    "epoch_loss": ("run", "the training loss per point after each epoch (SWAG)"),
    "elbo_loss": ("run", "the negative ELBO after each epoch (SVI, IVON): expected NLL + KL weight x KL"),
    "elbo_nll": ("run", "the expected negative log-likelihood of the data after each epoch (SVI, IVON)"),
    "elbo_kl": ("run", "the KL of the variational posterior to the prior after each epoch (SVI, IVON)"),
    "path": ("run", "which code ran the sampler: native, torch.compile or eager"),
    "path_reason": ("run", "why that code ran"),
}

#: a result's family: what its draws are, and so which diagnostics apply
FAMILIES = {
    "mcmc": "Markov chains of a full-batch sampler",
    "sgmcmc": "Markov chains of a stochastic-gradient sampler (no Metropolis correction)",
    "ensemble": "one draw per member of a deep ensemble (independent optima)",
    "laplace": "independent draws from a Gaussian at the MAP (Laplace)",
    "swag": "independent draws from the SWAG Gaussian",
    "variational": "draws from a trained guide",
}


def check_stats(stats: dict, chains: int, draws: int) -> None:
    """Refuse a ``stats`` dict outside the :data:`STATS` schema, naming the key."""
    for key, value in stats.items():
        if key not in STATS:
            raise ValueError(f"stats key {key!r} is not in the schema (pyrobnn.infer.results.protocol.STATS)")
        kind = STATS[key][0]
        if kind == "run" or not isinstance(value, torch.Tensor):
            continue
        expected = (chains, draws) if kind == "draw" else (chains,)
        if tuple(value.shape[: len(expected)]) != expected:
            raise ValueError(f"stats[{key!r}] has shape {tuple(value.shape)}; a {kind} statistic needs {expected} first")


class Result(abc.ABC):
    """The protocol of every method's result (the module docstring lists the verbs). A class
    of one's own joins by subclassing it and implementing the abstract methods."""

    family: str
    method: str
    settings: dict
    stats: dict
    seconds: float
    model: object
    #: the ``method=`` values its ``predict`` takes: ``"sample"`` (the mixture over weight draws)
    #: for every result; a guide's also ``"mean"`` (every weight at its posterior mean)
    predict_methods: tuple = ("sample",)

    @abc.abstractmethod
    def predict(self, x, num_samples=None, *, seed=None, batch_size=None, **options):
        """The posterior predictive at ``x``."""

    @abc.abstractmethod
    def to_arviz(self, x, y=None, **options):
        """An ``arviz.InferenceData`` of the draws, the network's output at ``x`` and, with
        ``y``, the pointwise log-likelihood."""

    @abc.abstractmethod
    def save(self, path) -> None:
        """Write the result to ``path`` atomically."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path, model, map_location=None) -> "Result":
        """Read a result written by :meth:`save` for ``model``."""

    @abc.abstractmethod
    def summary(self) -> str:
        """What the result is, how it was made, and its diagnostics, as text."""

    @abc.abstractmethod
    def as_draws(self, num_samples=None, *, seed=None):
        """The result as draws of every latent site, a
        :class:`~pyrobnn.infer.results.posterior.Posterior`."""


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


def describe_result(result) -> str:
    """A result in a few words: its kind, its method and, for draws, its chains."""
    chains = getattr(result, "num_chains", None)
    return f"{type(result).__name__}({result.method}" + (f", {chains} chains)" if chains is not None else ")")


def describe_settings(settings: dict) -> str:
    """``settings`` in one line: a tensor by its shape, a posterior by its kind, long values cut."""

    def short(v):
        if isinstance(v, torch.Tensor):
            return f"tensor{tuple(v.shape)}"
        if isinstance(v, Result):
            return describe_result(v)
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
    if isinstance(value, Result):
        return describe_result(value)
    return f"{type(value).__name__}"


def evenly_spaced(available: int, wanted: int) -> torch.Tensor:
    """``wanted`` indices spread evenly over ``range(available)`` (all draws when ``wanted`` is
    at least ``available``): a subset of a posterior's flattened draws that covers every chain."""
    if wanted >= available:
        return torch.arange(available, device="cpu")
    return torch.linspace(0, available - 1, wanted, dtype=torch.float64, device="cpu").round().long()
