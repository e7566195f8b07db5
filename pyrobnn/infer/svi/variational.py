"""A trained guide as a result: the verbs of every posterior (:class:`~pyrobnn.infer.results.protocol.Result`).

Guides stay guides: Pyro calls them (``SVI``, ``Predictive``), and they are ``nn.Module`` s that
:func:`pyrobnn.fit` trains. :func:`pyrobnn.fit` and :func:`pyrobnn.ivon` return a
:class:`VariationalPosterior`, which holds the model, the trained guide and the training history,
and answers the protocol: ``predict``, ``to_arviz``, ``save`` / ``load(path, model)``,
``summary``, ``as_draws``. A guide can draw without end; where a verb is not told how many draws to
use it takes ``num_draws`` of them (100 by default).
"""

from __future__ import annotations

import time

import pyro
import torch
from pyro.infer import Predictive

from pyrobnn.guides import build_guide, guide_config
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.results.predictive import predict_guide
from pyrobnn.infer.results.protocol import Result, describe_settings, plain
from pyrobnn.infer.svi.history import History
from pyrobnn.utils.io import load, safe_load, save
from pyrobnn.utils.modes import eval_mode
from pyrobnn.utils.validation import check_positive_int

__all__ = ["VariationalPosterior"]


class VariationalPosterior(Result):
    """``model`` with its trained ``guide``.

    :param history: the :class:`~pyrobnn.infer.svi.history.History` of the training (optional).
    :param seconds: the training time (default: the history's).
    :param settings: how it was trained.
    :param trainer: what trained it (``"SVI"``; :func:`pyrobnn.ivon` says ``"IVON"``).
    :param num_draws: the guide draws that stand for this posterior where a verb is not given a
        number (``predict``, ``to_arviz``, ``as_draws``).

    ``stats`` holds the history per epoch in the schema of :data:`~pyrobnn.infer.results.protocol.STATS`
    (``elbo_loss``, ``elbo_nll``, ``elbo_kl``).
    """

    family = "variational"
    predict_methods = ("sample", "mean")

    def __init__(self, model, guide, history: History | None = None, *, seconds: float | None = None, settings: dict | None = None,
                 trainer: str = "SVI", num_draws: int = 100):
        if not callable(guide):
            raise TypeError(f"guide must be a trained Pyro guide (a callable), got {type(guide).__name__}")
        if history is not None and not isinstance(history, History):
            raise TypeError(f"history must be the History that training recorded, got {type(history).__name__}")
        check_positive_int("num_draws", num_draws)
        self.model, self.guide, self.history = model, guide, history
        if seconds is None:
            seconds = float(history.seconds[-1]) if history is not None and history.seconds else 0.0
        self.seconds = float(seconds)
        self.settings = plain(dict(settings or {}))  # as save writes them
        self.trainer = str(trainer)
        self.num_draws = int(num_draws)
        self.method = f"{self.trainer} ({type(guide).__name__})"

    @property
    def stats(self) -> dict:
        h = self.history
        if h is None or not len(h):
            return {}
        return {"elbo_loss": torch.tensor(h.loss, device="cpu"), "elbo_nll": torch.tensor(h.nll, device="cpu"), "elbo_kl": torch.tensor(h.kl, device="cpu")}

    def predict(self, x, num_samples=None, *, seed=None, batch_size=None, sample_batch_size=None, method: str = "sample"):
        """The posterior predictive at ``x`` from ``num_samples`` weight draws of the guide
        (default ``num_draws``; :func:`~pyrobnn.infer.results.predictive.predict_guide`); ``method="mean"`` for
        the prediction at the posterior mean."""
        num_samples = self.num_draws if num_samples is None else num_samples
        return predict_guide(self.model, self.guide, x, num_samples, method=method, seed=seed, batch_size=batch_size,
                             sample_batch_size=sample_batch_size)

    @torch.no_grad()
    def as_draws(self, num_samples=None, *, seed=None, x=None) -> Posterior:
        """``num_samples`` draws (default ``num_draws``) of every latent site from the guide, as
        one chain of a :class:`~pyrobnn.infer.results.posterior.Posterior` (family ``"variational"``).
        ``x`` is passed to a guide that reads its inputs (ours do not)."""
        num_samples = self.num_draws if num_samples is None else num_samples
        check_positive_int("num_samples", num_samples)
        if seed is not None:
            pyro.set_rng_seed(seed)
        names = [s.name for s in self.model.sites] + list(self.model.likelihood.latent_sites())
        start = time.perf_counter()
        with eval_mode(self.guide if isinstance(self.guide, torch.nn.Module) else None):
            args = () if x is None else (x,)
            draws = Predictive(self.guide, num_samples=num_samples, parallel=True, return_sites=names)(*args)
        # detached: a draw may be a parameter itself (a bias without dropout noise)
        samples = {k: draws[k].detach().reshape((1, num_samples) + tuple(draws[k].shape[1:])) for k in names}
        settings = dict(self.settings, draws_seed=seed)
        return Posterior(samples, {}, time.perf_counter() - start, self.method, "variational", settings, self.model)

    def sample(self, num_samples: int = 1000, seed: int | None = None, x=None) -> Posterior:
        """``num_samples`` draws as a :class:`~pyrobnn.infer.results.posterior.Posterior` (:meth:`as_draws`)."""
        return self.as_draws(num_samples, seed=seed, x=x)

    def to_arviz(self, x, y=None, *, num_samples=None, seed=None, observed: bool = True):
        """An ``arviz.InferenceData`` of ``num_samples`` guide draws (default ``num_draws``) as one
        chain (see :meth:`Posterior.to_arviz <pyrobnn.infer.results.posterior.Posterior.to_arviz>`)."""
        return self.as_draws(num_samples, seed=seed, x=x).to_arviz(x, y, observed=observed)

    def save(self, path) -> None:
        """Write the model's and the guide's state with :func:`pyrobnn.save` (atomic;
        ``weights_only``), with the guide's class and settings (so that :meth:`load` rebuilds it),
        the training history and settings as metadata."""
        metadata = {
            "posterior": {
                "seconds": float(self.seconds),
                "trainer": self.trainer,
                "num_draws": self.num_draws,
                "settings": plain(self.settings),
                "history": plain(self.history.as_dict()) if self.history is not None else None,
                "guide": guide_config(self.guide),
            }
        }
        save(path, self.model, self.guide, metadata)

    @classmethod
    def load(cls, path, model, map_location=None, *, guide=None) -> "VariationalPosterior":
        """Read a file written by :meth:`save` (or :func:`pyrobnn.save`) for ``model``: the guide
        is rebuilt from the saved class and settings (a pyrobnn guide), or the state is loaded
        into ``guide`` where one is given (a guide of one's own, a Pyro autoguide)."""
        if guide is None:
            obj = safe_load(path, map_location)
            saved = ((obj.get("metadata") or {}).get("posterior") or {}) if isinstance(obj, dict) else {}
            config = saved.get("guide") or (obj.get("config", {}).get("guide") if isinstance(obj, dict) else None)
            guide = build_guide(config, model, path)
        metadata = load(path, model, guide, map_location)
        saved = metadata.get("posterior") or {}
        history = History.from_dict(saved["history"]) if saved.get("history") else None
        return cls(model, guide, history, seconds=saved.get("seconds", 0.0), settings=saved.get("settings"),
                   trainer=saved.get("trainer", "SVI"), num_draws=int(saved.get("num_draws", 100)))

    def summary(self) -> str:
        """What this posterior is, how it was trained, and its final ELBO terms."""
        params = sum(p.numel() for p in self.guide.parameters()) if isinstance(self.guide, torch.nn.Module) else 0
        sites = len(self.model.sites) + len(self.model.likelihood.latent_sites())
        lines = [
            f"{self.method} of {type(self.model.net).__name__} with {type(self.model.likelihood).__name__}: "
            f"{sites} latent site(s), {params} variational parameters (draws from a trained guide)"
        ]
        made = f"trained in {self.seconds:.1f} s"
        settings = dict(self.settings or {})
        capture = settings.pop("capture", None)
        if settings:
            made += "; settings: " + describe_settings(settings)
        lines.append(made)
        if capture is not None:
            lines.append(f"  the step: {capture}")
        h = self.history
        if h is not None and len(h):
            lines.append(
                f"  {len(h)} epochs, {h.steps} steps; last epoch: loss {h.loss[-1]:.5g} = expected NLL {h.nll[-1]:.5g} "
                f"+ {h.kl_weight[-1]:.3g} x KL {h.kl[-1]:.5g}"
            )
        return "\n".join(lines)
