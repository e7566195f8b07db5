r"""The one minibatch loop over the flat vector, shared by deep ensembles, SWAG, SG-MCMC and
the Lightning ensemble module.

Each row of a ``(rows, dim)`` tensor (an ensemble member, a SWAG run, a chain) is a point in
the unconstrained space of :class:`~pyrobnn.infer.core.potential.FlatPotential`. On a minibatch
:math:`\mathcal B` of :math:`B` of the :math:`N` training points, every method here uses the
same unbiased estimate of the log joint,

.. math:: \widehat{\log p}(w, \mathcal D) = \log p(w) + \frac{N}{B} \sum_{n \in \mathcal B} \log p(y_n \mid x_n, w)

(:func:`minibatch_log_joint`), and the same answer to a step whose loss, gradient or new position
is not finite (:class:`MinibatchLoop`): it is recorded on the device without a host
synchronization, that update and every later one are skipped (the rows stay where they were
before the failed step), and at the next check, the end of the epoch, a
:class:`~pyrobnn.infer.core.failures.NonFiniteLossError` names the step, as :func:`pyrobnn.fit` does.
:class:`Minibatches` gives the stochastic-gradient samplers' kernels their target step by step
(:mod:`pyrobnn.infer.core.runner`), with that policy.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from pyrobnn.infer.core import records
from pyrobnn.infer.core.failures import StepFailures, guarded_optimizer_step, grads_not_finite

__all__ = [
    "minibatch_log_joint", "minibatch_log_joint_grad", "minibatch_log_joint_value_and_grad", "per_row_minibatch_log_joint_value_and_grad",
    "MinibatchLoop", "MinibatchTarget", "Minibatches",
]


def minibatch_log_joint(potential, z, x, y, dataset_size: int, prior: bool = True) -> torch.Tensor:
    r"""Per row of ``z``, :math:`\log p(w) + \frac{N}{B} \sum_{n \in \mathcal B} \log p(y_n \mid
    x_n, w)` with :math:`N` = ``dataset_size`` and the batch ``(x, y)``; without the prior (and
    the log-Jacobian of constrained latent sites) when ``prior`` is false."""
    log_prior, log_lik = potential.log_joint_terms(z, x, y)
    total = (dataset_size / x.shape[0]) * log_lik
    return total + log_prior if prior else total


def minibatch_log_joint_value_and_grad(potential, z, x, y, dataset_size: int):
    r""":func:`minibatch_log_joint` and its gradient for every row, ``((rows,), (rows, dim))``:
    both unbiased for the full log joint and its gradient when the batch is drawn uniformly."""
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        value = minibatch_log_joint(potential, z, x, y, dataset_size)
        (grad,) = torch.autograd.grad(value.sum(), z)
    return value.detach(), grad


def per_row_minibatch_log_joint_value_and_grad(potential, z, x, y, dataset_size: int):
    r"""As :func:`minibatch_log_joint_value_and_grad`, with a batch of its own for every row:
    ``x`` of shape ``(rows, B, ...)`` and ``y`` of shape ``(rows, B, ...)``, so that the chains'
    gradient noise is independent (one batched pass of the network over all rows)."""
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        log_prior, log_lik = potential.log_joint_terms(z, x, y, batched_inputs=True)
        value = log_prior + (dataset_size / x.shape[1]) * log_lik
        (grad,) = torch.autograd.grad(value.sum(), z)
    return value.detach(), grad


def minibatch_log_joint_grad(potential, z, x, y, dataset_size: int) -> torch.Tensor:
    r"""The gradient of :func:`minibatch_log_joint` for every row: unbiased for
    :math:`\nabla \log p(w \mid \mathcal D)` when the batch is drawn uniformly."""
    return minibatch_log_joint_value_and_grad(potential, z, x, y, dataset_size)[1]


class MinibatchLoop:
    """Minibatches of ``n`` training points in a seeded random order, and the failure record
    of the loop's steps.

    :param advice: what the error of a failed step tells the user to change (``"lower lr"``).
    """

    def __init__(self, n: int, batch_size, seed: int, device=None, advice: str = "Lower the learning rate."):
        self.n = n
        self.batch_size = n if batch_size is None else min(int(batch_size), n)
        self.device = device
        # on the host, so that the data order of a seed is the same on every device (it is drawn
        # once an epoch, and the indices copied over then)
        self.order = torch.Generator(device="cpu").manual_seed(seed)
        self.failures = StepFailures()
        self.advice = advice
        self.step = 0
        self.epoch = 0
        self._stream = None

    def epoch_batches(self):
        """The index batches of one epoch: every point once, in a fresh random order, the last
        batch smaller when ``batch_size`` does not divide ``n``."""
        perm = torch.randperm(self.n, generator=self.order, device="cpu").to(self.device)
        for i in range(0, self.n, self.batch_size):
            yield perm[i : i + self.batch_size]

    def next_batch(self):
        """The next full batch of an endless stream: the points of a random order in turn, a
        fresh order when fewer than ``batch_size`` are left (step-based samplers)."""
        perm, cursor = self._stream if self._stream is not None else (None, self.n)
        if cursor + self.batch_size > self.n:
            perm, cursor = torch.randperm(self.n, generator=self.order, device="cpu").to(self.device), 0
        self._stream = (perm, cursor + self.batch_size)
        return perm[cursor : cursor + self.batch_size]

    def next_batches(self, rows: int):
        """The next batch of every one of ``rows`` independent endless streams, ``(rows,
        batch_size)``: each row takes the points of its own random order in turn (per-chain
        minibatches, so that chains run from one start still see independent noise)."""
        perm, cursor = self._stream if self._stream is not None else (None, self.n)
        if cursor + self.batch_size > self.n:
            perm = torch.rand(rows, self.n, generator=self.order, device="cpu").argsort(-1).to(self.device)
            cursor = 0
        self._stream = (perm, cursor + self.batch_size)
        return perm[:, cursor : cursor + self.batch_size]

    def record(self, loss=None, params=None, new=None, grad=None):
        """Record this step's failure on the device: a non-finite ``loss`` (per row, or its
        sum), a non-finite gradient (of ``params``, or ``grad`` itself), or a non-finite ``new``
        position. Returns the 0-d flag that holds from the first failed step on (take the step
        only where it is false)."""
        reference = next(t for t in (loss, grad, new) if t is not None)
        value = loss.detach().sum() if loss is not None else torch.zeros((), dtype=reference.dtype, device=reference.device)
        bad_loss = ~torch.isfinite(value)
        bad_grad = grads_not_finite(params) if params is not None else None
        if bad_grad is None:
            bad_grad = torch.zeros_like(bad_loss)
        # max |.| is NaN or infinite exactly when some value is (a sum could overflow)
        for t in (grad, new):
            if t is not None:
                bad_grad = bad_grad | ~torch.isfinite(t.detach().abs().amax())
        self.failures.record(self.step, self.epoch, None, bad_loss, bad_grad, value)
        self.step += 1
        return self.failures.failed

    def optimizer_step(self, optimizer, loss, params) -> None:
        """``optimizer.step()`` unless this or an earlier step failed (after ``backward``): a
        fused optimizer skips on the device; another one makes the check at once (a host sync)."""
        self.record(loss, params)
        guarded_optimizer_step(optimizer, self.failures, lambda: self.check(params))

    def check(self, params) -> None:
        """Raise :class:`~pyrobnn.infer.core.failures.NonFiniteLossError` for the first failed step
        since the last check (a host synchronization); call it at the end of every epoch."""
        self.failures.raise_if_any(params, advice=self.advice)

    def end_epoch(self, params) -> None:
        self.check(params)
        self.epoch += 1

    def state_dict(self) -> dict:
        """The loop's position: the order generator, the step and epoch counts, the stream."""
        stream = None if self._stream is None else {"perm": self._stream[0].cpu(), "cursor": self._stream[1]}
        return {"order": self.order.get_state(), "step": self.step, "epoch": self.epoch, "stream": stream}

    def load_state_dict(self, state: dict) -> None:
        self.order.set_state(state["order"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        stream = state.get("stream")
        self._stream = None if stream is None else (stream["perm"].to(self.device), int(stream["cursor"]))


class MinibatchTarget(NamedTuple):
    """One step's target ``z -> (log p̂, grad log p̂)``: ``potential`` on the batch ``(x, y)`` of a
    data set of ``dataset_size`` points, one batch for all rows
    (:func:`minibatch_log_joint_value_and_grad`) or, with ``per_row``, one per row
    (:func:`per_row_minibatch_log_joint_value_and_grad`). Its tensors are in the open, so that a
    step recorded as a CUDA graph can take the batch as an input."""

    potential: object
    x: torch.Tensor
    y: torch.Tensor
    dataset_size: int
    per_row: bool

    def __call__(self, z):
        value_and_grad = per_row_minibatch_log_joint_value_and_grad if self.per_row else minibatch_log_joint_value_and_grad
        return value_and_grad(self.potential, z, self.x, self.y, self.dataset_size)


class Minibatches:
    """The data of a stochastic-gradient sampler's run (:mod:`pyrobnn.infer.core.runner`): each
    step's target is :func:`minibatch_log_joint_value_and_grad` on the next batch of ``loop``
    (one for all chains), or with ``per_chain`` chains a batch of its own for every chain
    (:func:`per_row_minibatch_log_joint_value_and_grad`, SMILE's). With ``guard``, a step whose
    gradient or new position is not finite is handled by :class:`MinibatchLoop`'s policy: from it
    on the chains stay where they were, and the check at the end of each epoch (and before a
    checkpoint) raises :class:`~pyrobnn.infer.core.failures.NonFiniteLossError`.

    :param potential: the :class:`~pyrobnn.infer.core.potential.FlatPotential` holding all the
        training data.
    """

    fixed_target = None

    def __init__(self, potential, loop: MinibatchLoop, *, per_chain: Optional[int] = None, guard: bool = False):
        self.potential, self.loop, self.per_chain, self.guarded = potential, loop, per_chain, guard
        self.x, self.y = potential.x, potential.y
        self.per_epoch = math.ceil(loop.n / loop.batch_size)  # steps between the checks for a failed step

    def next_target(self) -> MinibatchTarget:
        if self.per_chain is not None:
            idx = self.loop.next_batches(self.per_chain)  # (chains, batch_size)
        else:
            idx = self.loop.next_batch()
        return MinibatchTarget(self.potential, self.x[idx], self.y[idx], self.loop.n, self.per_chain is not None)

    def guard(self, old, new, info):
        """``new``, or where this or an earlier step failed (no host sync) ``old``."""
        if not self.guarded:
            return new
        failed = self.loop.record(grad=info.grad, new=new.z)
        return records.where(failed, old, new)

    def after_step(self, i: int, state, last: bool) -> None:
        if self.guarded and ((i + 1) % self.per_epoch == 0 or last):
            self.loop.check([state.z])

    def before_save(self, state) -> None:
        if self.guarded:
            self.loop.check([state.z])  # a failed step is never saved

    def state_dict(self) -> dict:
        return self.loop.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loop.load_state_dict(state)
