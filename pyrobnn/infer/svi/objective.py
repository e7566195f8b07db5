"""The loss that SVI minimizes for a model and guide, whoever runs the loop (:func:`fit`, a
Lightning ``Trainer``)."""

from __future__ import annotations

import contextlib
import math

import torch

from pyrobnn.infer.svi.elbo import SplitELBO, make_elbo
from pyrobnn.infer.svi.trace_free import TraceFreeELBO
from pyrobnn.models.estimators import ESTIMATORS, Estimator
from pyrobnn.utils.validation import check_positive_int

__all__ = ["SVIObjective", "make_estimator", "trainable_parameters"]


def make_estimator(estimator):
    """``None``, a name in ``pyrobnn.models.estimators.ESTIMATORS`` or an :class:`Estimator`."""
    if estimator is None or isinstance(estimator, Estimator):
        return estimator
    if estimator in ESTIMATORS:
        return ESTIMATORS[estimator]()
    raise ValueError(f"estimator must be None, {', '.join(map(repr, ESTIMATORS))} or an Estimator, got {estimator!r}")


def trainable_parameters(model, guide) -> list:
    """What SVI optimizes: the model's point parameters and the guide's, each once, those
    that require a gradient."""
    params = [p for _, p in model.point_parameters()] + list(guide.parameters())
    seen, unique = set(), []
    for p in params:
        if id(p) not in seen and p.requires_grad:
            seen.add(id(p))
            unique.append(p)
    return unique


class SVIObjective:
    r"""The negative ELBO on a minibatch, with its two terms:

    .. math:: \mathcal{L} = -\frac{N}{B}\sum_{n \in \text{batch}} \mathbb{E}_q \log p(y_n \mid x_n, w)
              + \beta\, \mathrm{KL}(q \,\|\, p),

    the likelihood scaled to the data set's size ``N`` and the KL counted once, so that its
    gradient is unbiased for the full-data ELBO's. Averaging it over minibatches (or over the
    ranks of a data-parallel run, which each see ``B`` examples) keeps that property.

    For a :class:`~pyrobnn.models.BayesianModel` with a pyrobnn guide, a :class:`SplitELBO`
    and one particle it is evaluated by :class:`~pyrobnn.infer.svi.trace_free.TraceFreeELBO` (the same
    estimator without Pyro's traces); otherwise through Pyro. See :class:`SVITrainer` for the
    arguments.
    """

    def __init__(self, model, guide, elbo=None, num_particles: int = 1, estimator=None, compile: bool = False):
        check_positive_int("num_particles", num_particles)
        self.model, self.guide = model, guide
        self.num_particles = int(num_particles)
        self.elbo = make_elbo(elbo, guide, num_particles)
        self.estimator = make_estimator(estimator)
        self.flat = None
        if (
            isinstance(self.elbo, SplitELBO)
            and not self.elbo.strict
            and self.elbo.num_particles == 1
            and TraceFreeELBO.supports(model, guide, self.estimator)
        ):
            self.flat = TraceFreeELBO(model, guide, self.elbo.kl, self.estimator, self.elbo.num_particles, compile=compile)

    @property
    def splits(self) -> bool:
        """Whether the loss reports its NLL and KL apart (and takes a KL weight)."""
        return isinstance(self.elbo, SplitELBO)

    @property
    def kl_methods(self) -> dict:
        """``{site: "analytic" | "monte_carlo"}`` as last evaluated."""
        if self.flat is not None:
            return dict(self.flat.kl_methods)
        return dict(self.elbo.kl_methods) if self.splits else {}

    def __call__(self, x, y, dataset_size=None, kl_weight: float = 1.0):
        """``(loss, nll, kl)``: the differentiable loss and its terms as detached 0-d tensors
        (NaN where the ELBO does not report them), with no host synchronization."""
        if self.flat is not None:
            self.flat.kl_weight = kl_weight
            terms = self.flat.terms(x, y, dataset_size)
            return terms.loss, -terms.log_likelihood.detach(), terms.kl.detach()
        with self.estimator if self.estimator is not None else contextlib.nullcontext():
            if self.splits:
                self.elbo.kl_weight = kl_weight
                terms = self.elbo.terms(self.model, self.guide, x, y, dataset_size=dataset_size)
                return terms.loss, -terms.log_likelihood.detach(), terms.kl.detach()
            loss = self.elbo.differentiable_loss(self.model, self.guide, x, y, dataset_size=dataset_size)
            nan = torch.full((), math.nan, dtype=loss.dtype, device=loss.device)
            return loss, nan, nan
