"""Schedules of the SVI loop: the weight of the KL term over training (KL annealing)."""

from __future__ import annotations

import math

__all__ = ["KLAnnealing", "make_kl_schedule"]


class KLAnnealing:
    r"""KL warm-up: the weight :math:`\beta` of the KL in the loss is 0 until epoch ``start``,
    then rises linearly to 1 at epoch ``end`` (fractional epochs, updated every step).
    Molchanov et al. 2017 use ``KLAnnealing(5, 20)`` for sparse variational dropout."""

    def __init__(self, start: float = 0.0, end: float = 0.0):
        if not (math.isfinite(start) and math.isfinite(end)) or end < start or start < 0:
            raise ValueError(f"KL annealing needs 0 <= start <= end, got {start}, {end}")
        self.start, self.end = float(start), float(end)

    def __call__(self, epoch: float) -> float:
        if epoch >= self.end:
            return 1.0
        if epoch < self.start:
            return 0.0
        return (epoch - self.start) / (self.end - self.start)

    def __repr__(self):
        return f"KLAnnealing(start={self.start}, end={self.end})"


def make_kl_schedule(kl_annealing, objective):
    """``None``, a :class:`KLAnnealing` or a ``(start, end)`` pair (or any function of the
    fractional epoch) as the KL weight's schedule, refused for ELBOs that do not split."""
    if isinstance(kl_annealing, tuple):
        kl_annealing = KLAnnealing(*kl_annealing)
    if kl_annealing is not None and not objective.splits:
        raise ValueError("KL annealing needs pyrobnn's SplitELBO (elbo='trace' or 'meanfield')")
    return kl_annealing
