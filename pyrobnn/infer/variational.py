"""A trained guide with the verbs of every posterior.

Guides stay guides: Pyro calls them (``SVI``, ``Predictive``), and they are ``nn.Module`` s that
:func:`pyrobnn.fit` trains. :class:`VariationalPosterior` wraps a model and its trained guide so
that they answer the same verbs as the other methods' :class:`~pyrobnn.infer.posterior.Posterior`:
``predict``, ``to_arviz``, ``save`` / ``load`` and ``summary``; ``sample`` draws from the guide
into a :class:`~pyrobnn.infer.posterior.Posterior`.
"""

from __future__ import annotations

import time

import pyro
import torch
from pyro.infer import Predictive

from pyrobnn.infer.posterior import Posterior, describe_settings
from pyrobnn.infer.svi.history import History
from pyrobnn.validation import check_positive_int

__all__ = ["VariationalPosterior"]


class VariationalPosterior:
    """``model`` with its trained ``guide``; ``history`` is what :func:`pyrobnn.fit` returned
    (optional), ``seconds`` the training time, ``settings`` how it was trained and ``trainer``
    what trained it (default ``"variational"``, SVI; :func:`pyrobnn.ivon` says ``"IVON"``)."""

    family = "variational"

    def __init__(self, model, guide, history: History | None = None, *, seconds: float | None = None, settings: dict | None = None,
                 trainer: str = "variational"):
        if not callable(guide):
            raise TypeError(f"guide must be a trained Pyro guide (a callable), got {type(guide).__name__}")
        if history is not None and not isinstance(history, History):
            raise TypeError(f"history must be the History that pyrobnn.fit returns, got {type(history).__name__}")
        self.model, self.guide, self.history = model, guide, history
        if seconds is None:
            seconds = float(sum(history.seconds)) if history is not None and history.seconds else 0.0
        self.seconds = seconds
        self.settings = dict(settings or {})
        self.trainer = str(trainer)
        self.method = f"{self.trainer} ({type(guide).__name__})"

    def predict(self, x, num_samples: int = 100, **kwargs):
        """The posterior predictive at ``x`` from ``num_samples`` weight draws of the guide
        (:func:`pyrobnn.predict`; ``method="mean"`` for the prediction at the posterior mean)."""
        from pyrobnn.predictive import predict

        return predict(self.model, self.guide, x, num_samples, **kwargs)

    @torch.no_grad()
    def sample(self, num_samples: int = 1000, seed: int | None = None, x=None) -> Posterior:
        """``num_samples`` draws of every latent site from the guide, as one chain of a
        :class:`~pyrobnn.infer.posterior.Posterior` (family ``"variational"``). ``x`` is passed
        to a guide that reads its inputs (ours do not)."""
        check_positive_int("num_samples", num_samples)
        if seed is not None:
            pyro.set_rng_seed(seed)
        names = [s.name for s in self.model.sites] + list(self.model.likelihood.latent_sites())
        was = getattr(self.guide, "training", False)
        if hasattr(self.guide, "eval"):
            self.guide.eval()
        start = time.perf_counter()
        try:
            args = () if x is None else (x,)
            draws = Predictive(self.guide, num_samples=num_samples, parallel=True, return_sites=names)(*args)
        finally:
            if hasattr(self.guide, "train"):
                self.guide.train(was)
        samples = {k: draws[k].reshape((1, num_samples) + tuple(draws[k].shape[1:])) for k in names}
        settings = dict(self.settings, draws_seed=seed)
        return Posterior(samples, {}, time.perf_counter() - start, self.method, "variational", settings, self.model)

    def to_arviz(self, x, y=None, num_samples: int = 1000, observed: bool = True, seed: int | None = None):
        """An ``arviz.InferenceData`` of ``num_samples`` guide draws as one chain (see
        :meth:`Posterior.to_arviz <pyrobnn.infer.posterior.Posterior.to_arviz>`)."""
        return self.sample(num_samples, seed, x).to_arviz(x, y, observed)

    def save(self, path) -> None:
        """Write the model and guide with :func:`pyrobnn.save` (atomic; ``weights_only``), with
        the training history and settings as metadata."""
        from pyrobnn.infer.posterior import plain
        from pyrobnn.io import save

        metadata = {
            "posterior": {
                "seconds": float(self.seconds),
                "trainer": self.trainer,
                "settings": plain(self.settings),
                "history": plain(self.history.as_dict()) if self.history is not None else None,
            }
        }
        save(path, self.model, self.guide, metadata)

    @classmethod
    def load(cls, path, model, guide, map_location=None) -> "VariationalPosterior":
        """Load a file written by :meth:`save` (or :func:`pyrobnn.save`) into ``model`` and
        ``guide``, built as they were when saved."""
        from pyrobnn.io import load

        metadata = load(path, model, guide, map_location)
        saved = metadata.get("posterior") or {}
        history = History.from_dict(saved["history"]) if saved.get("history") else None
        return cls(model, guide, history, seconds=saved.get("seconds", 0.0), settings=saved.get("settings"),
                   trainer=saved.get("trainer", "variational"))

    def summary(self) -> str:
        """What this posterior is, how it was trained, and its final ELBO terms."""
        params = sum(p.numel() for p in self.guide.parameters()) if hasattr(self.guide, "parameters") else 0
        sites = len(self.model.sites) + len(self.model.likelihood.latent_sites())
        lines = [
            f"{self.method} of {type(self.model.net).__name__} with {type(self.model.likelihood).__name__}: "
            f"{sites} latent site(s), {params} variational parameters (draws from a trained guide)"
        ]
        made = f"trained in {self.seconds:.1f} s"
        if self.settings:
            made += "; settings: " + describe_settings(self.settings)
        lines.append(made)
        h = self.history
        if h is not None and len(h):
            lines.append(
                f"  {len(h)} epochs, {h.steps} steps; last epoch: loss {h.loss[-1]:.5g} = expected NLL {h.nll[-1]:.5g} "
                f"+ {h.kl_weight[-1]:.3g} x KL {h.kl[-1]:.5g}"
            )
        return "\n".join(lines)
