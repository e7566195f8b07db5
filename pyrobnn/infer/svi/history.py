"""The record of a variational run, epoch by epoch: the ``history`` of the
:class:`~pyrobnn.infer.svi.variational.VariationalPosterior` that :func:`pyrobnn.fit` and
:func:`pyrobnn.ivon` return."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["History"]


@dataclass
class History:
    """Per-epoch record of training. ``nll`` is the negative expected log-likelihood and
    ``kl`` the (unweighted) KL, both for the whole data set, averaged over the epoch's steps;
    ``loss = nll + kl_weight * kl``; ``seconds`` the time since the run began, at the end of
    each epoch. ``extra`` holds what an epoch callback returned."""

    epoch: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    nll: list = field(default_factory=list)
    kl: list = field(default_factory=list)
    kl_weight: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    kl_methods: dict = field(default_factory=dict)
    steps: int = 0

    def __len__(self):
        return len(self.epoch)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "History":
        return cls(**d)
