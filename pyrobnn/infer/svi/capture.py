"""An SVI step recorded once as a CUDA graph and replayed.

Eager PyTorch launches every kernel of a step from Python: on a GPU, a LeNet-300-100 step of
Bayes by Backprop is about 360 kernels, and the host time of launching them (about 2 ms) is most
of the step. Recorded once as a CUDA graph, the whole step (weight noise, forward pass, ELBO,
backward pass, the finiteness flags, the fused Adam update) is replayed by one launch.

This follows PyTorch's whole-network capture (``torch.cuda.graphs``, with the recorder of
:mod:`pyrobnn.infer.core.graphs`): the first
:data:`~pyrobnn.infer.core.graphs.WARMUP_CALLS` steps run eagerly on a side stream (they are
ordinary training steps: they create the optimizer's state and the gradients' storage), then
the step is recorded with the
batch, the KL weight, the step and epoch numbers and the failure flags in fixed buffers, and
from then on every step copies its batch into the buffers and replays the graph. A recorded
graph holds no Python value that changes from step to step: the learning rate is a tensor of
the optimizer (changed in place by a schedule), the failure record is written in place
(:class:`~pyrobnn.infer.core.failures.StepFailures`), and the weight noise comes from the CUDA
generator's graph-safe offsets (each replay draws fresh numbers).

A batch of another shape (the last, shorter batch of an epoch) runs eagerly; so does a step whose
update could overflow (:meth:`~pyrobnn.infer.core.failures.OverflowGuard.needed`), whose guard
reads the parameters back.
"""

from __future__ import annotations

import torch

from pyrobnn.infer.core.graphs import WARMUP_CALLS, CUDAGraph, RecordingFailed

__all__ = ["CapturedStep", "capture_refusal"]


def capture_refusal(trainer, device) -> str | None:
    """Why ``trainer``'s steps on ``device`` are not recorded (``None``: they are)."""
    if trainer.capture is False:
        return "capture=False"
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; the model is on {device.type}"
    if trainer.objective.flat is None:
        return "the step runs through Pyro's traces (another model, guide or ELBO, or several particles), which are not recorded"
    if trainer.objective.flat.compile:
        return "compile=True: the compiled step is not recorded"
    if trainer._optimizer_factory is not None:
        return "a user's optimizer: only the default Adam is made capturable"
    return None


class CapturedStep:
    """The device work of an :class:`~pyrobnn.infer.svi.trainer.SVITrainer` step (its
    ``_update``: loss, backward pass, checks and guarded update) on batches of one shape, run eagerly
    for :data:`~pyrobnn.infer.core.graphs.WARMUP_CALLS` steps, then recorded and replayed. Unlike a
    :class:`~pyrobnn.infer.core.graphs.RecordedFunction` it changes state in place (the parameters,
    the optimizer's moments, the gradients, the failure record), which the graph keeps addressing.

    ``graph`` records and replays (:class:`~pyrobnn.infer.core.graphs.CUDAGraph`, the default on
    the trainer's device).
    """

    def __init__(self, trainer, x, y, dataset_size, graph=None):
        self.trainer = trainer
        self.shape = (tuple(x.shape), tuple(y.shape), x.dtype, y.dtype)
        self.dataset_size = dataset_size
        device = x.device
        self.graph = graph if graph is not None else CUDAGraph(device)
        self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        self.kl_weight = torch.ones((), dtype=trainer.model.dtype, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.epoch = torch.zeros((), dtype=torch.long, device=device)
        self.data_cause = torch.zeros((), dtype=torch.long, device=device)
        self.out = None
        self.warm_steps = 0
        self.recorded = False

    def fits(self, x, y, dataset_size) -> bool:
        """Whether a batch can take the recorded step (same shapes, dtypes and data set size)."""
        return (tuple(x.shape), tuple(y.shape), x.dtype, y.dtype) == self.shape and dataset_size == self.dataset_size

    def _body(self):
        # the gradients zeroed in place and accumulated into: their storage stays the one that
        # the recorded backward pass and update use, whatever ran eagerly in between
        self.trainer.optimizer.zero_grad(set_to_none=False)
        value, nll, kl = self.trainer._update(self.x, self.y, self.dataset_size, self.kl_weight, self.step, self.epoch, self.data_cause)
        if self.out is None:
            self.out = torch.empty(3, dtype=nll.dtype, device=nll.device)
        self.out.copy_(torch.stack([value.to(self.out.dtype), nll.to(self.out.dtype), kl.to(self.out.dtype)]))

    def __call__(self, x, y, kl_weight: float, step: int, epoch: int, data_cause=None):
        """One step on ``(x, y)``; returns ``(loss, nll, kl)`` as 0-d tensors of their own."""
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.kl_weight.fill_(kl_weight)
        self.step.fill_(step)
        self.epoch.fill_(epoch)
        if data_cause is None:
            self.data_cause.zero_()
        else:
            self.data_cause.copy_(data_cause)
        if not self.recorded and self.warm_steps < WARMUP_CALLS:
            with self.graph.warm_up():
                self._body()
            self.warm_steps += 1
        else:
            if not self.recorded:
                try:
                    self.graph.record(self._body)  # recorded, not run: the replay runs it
                except RecordingFailed:
                    raise
                except Exception as e:  # a recorder that does not say so itself
                    raise RecordingFailed(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}") from e
                self.recorded = True
            self.graph.replay()
        return tuple(self.out.clone().unbind())
