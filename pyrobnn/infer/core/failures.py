"""What every training loop (SVI's, and the minibatch loop over the flat vector of
:mod:`pyrobnn.infer.core.minibatch`) does with a failed step: the record of the first failed step,
kept on the device so that a step needs no host synchronization; that update and every later
one skipped; and at the next check (the end of the epoch) the error naming the step."""

from __future__ import annotations

import math

import torch

__all__ = [
    "NonFiniteLossError", "InvalidBatchError", "StepFailures", "OverflowGuard", "skips_on_device", "skip_if_failed", "clear_skip",
    "guarded_optimizer_step", "grads_not_finite", "not_finite",
]


class NonFiniteLossError(FloatingPointError):
    """The loss or its gradient was NaN or infinite. No update from the failed step on was
    applied; ``step`` and ``epoch`` say where, and the message says whether the
    parameters themselves are finite."""

    def __init__(self, message, step: int, epoch: int):
        super().__init__(message)
        self.step = step
        self.epoch = epoch


class InvalidBatchError(ValueError):
    """A training batch held NaN or infinite values or targets the likelihood refuses, found on
    the device without stopping the step; no update from that step on was applied.
    ``step`` and ``epoch`` say where."""

    def __init__(self, message, step: int, epoch: int):
        super().__init__(message)
        self.step = step
        self.epoch = epoch


class StepFailures:
    """The first failed training step since the last check, recorded on the device without a
    host synchronization: a batch with bad values, a non-finite loss, a non-finite gradient, or
    an update that made a parameter non-finite (a learning rate too large for the gradient: the
    step overflowed; the trainer puts the parameters back, :meth:`OverflowGuard.undo_overflow`). ``failed``
    is a 0-d boolean tensor that a fused optimizer takes as ``found_inf`` (the update is skipped,
    and so is every later one until :meth:`raise_if_any`), so the parameters stay those from
    before the first failed step.

    The record is written in place (its tensors keep their storage from step to step, and a
    check clears them rather than making new ones), so that a step recorded once as a CUDA graph
    (:class:`~pyrobnn.infer.svi.capture.CapturedStep`) goes on writing to the record that is
    read; ``step`` and ``epoch`` may be device tensors for the same reason."""

    CAUSES = ("data", "loss", "gradient", "update")
    #: what was wrong with a batch, by the code :meth:`record` takes as ``data_cause``
    DATA_CAUSES = {
        1: "x holds NaN or infinite values (or finite values so large that their sum overflows)",
        2: "y holds NaN or infinite values (or finite values so large that their sum overflows)",
        3: "targets",
    }

    def __init__(self):
        self._f = None

    @property
    def failed(self):
        return self._f["failed"] if self._f is not None else None

    def record(self, step: int, epoch: int, data_cause, bad_loss, bad_grad, value, bad_update=None) -> None:
        """Note step ``step`` as failed where the batch was bad (``data_cause``: a 0-d integer
        tensor, 0 for a good batch, else a key of :data:`DATA_CAUSES`; ``None``: not checked) or
        any 0-d flag is set (``bad_update``: the update made a parameter non-finite); ``value``
        is its loss."""
        f = self._f
        device = value.device
        if f is None or f["failed"].device != device:
            f = self._f = {
                "failed": torch.zeros((), dtype=torch.bool, device=device),
                "step": torch.zeros((), dtype=torch.long, device=device),
                "epoch": torch.zeros((), dtype=torch.long, device=device),
                "cause": torch.zeros((), dtype=torch.long, device=device),
                "data_cause": torch.zeros((), dtype=torch.long, device=device),
                "value": torch.zeros((), dtype=value.dtype, device=device),
            }
        if data_cause is None:
            data_cause = torch.zeros((), dtype=torch.long, device=device)
        bad_data = data_cause > 0
        if bad_update is None:
            bad_update = torch.zeros_like(bad_loss)
        bad = bad_data | bad_loss | bad_grad | bad_update
        first = bad & ~f["failed"]
        cause = torch.where(bad_data, 0, torch.where(bad_loss, 1, torch.where(bad_grad, 2, 3)))
        for key, new in (("step", step), ("epoch", epoch), ("cause", cause), ("data_cause", data_cause), ("value", value.to(f["value"].dtype))):
            f[key].copy_(torch.where(first, new, f[key]))
        f["failed"].logical_or_(bad)

    def any(self) -> bool:
        """Whether a step failed since the last check (a host synchronization)."""
        return self._f is not None and bool(self._f["failed"])

    def raise_if_any(
        self, params, refused_targets: str = "targets the likelihood refuses",
        advice: str = "Lower the learning rate, check the data, or clip gradients (clip_grad_norm=...).",
    ) -> None:
        """Raise :class:`InvalidBatchError` or :class:`NonFiniteLossError` for the first failed
        step since the last check, naming what was found (``refused_targets`` describes the
        targets the likelihood refuses) and saying whether ``params`` are finite; then forget it."""
        if not self.any():
            return
        f = {k: v.clone() for k, v in self._f.items()}
        for v in self._f.values():
            v.zero_()
        step, epoch = int(f["step"]), int(f["epoch"])
        cause = self.CAUSES[int(f["cause"])]
        if cause == "data":
            found = self.DATA_CAUSES[int(f["data_cause"])]
            found = f"y holds {refused_targets}" if found == "targets" else found
            what = f"the batch of step {step} (epoch {epoch}) is refused: {found}"
        elif cause == "loss":
            what = f"the loss is {float(f['value'])} at step {step} (epoch {epoch})"
        elif cause == "gradient":
            what = f"the gradient is not finite at step {step} (epoch {epoch})"
        else:
            what = f"the update of step {step} (epoch {epoch}) made the parameters non-finite (it overflowed) and was undone"
        if all(bool(torch.isfinite(p).all()) for p in params):
            where = f"the parameters are those from before step {step} (no later update was applied)"
        else:
            where = (
                f"no update from step {step} on was applied, but the parameters were already not "
                "finite: an earlier update overflowed"
            )
        if cause == "data":
            raise InvalidBatchError(f"{what}; {where}.", step, epoch)
        raise NonFiniteLossError(
            f"{what}; {where}. {advice}",
            step,
            epoch,
        )


def skips_on_device(optimizer) -> bool:
    """Whether ``optimizer`` can skip a step on a flag held on the device (PyTorch's fused Adam,
    AdamW and SGD take ``found_inf``, as under ``GradScaler``)."""
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)) and bool(optimizer.defaults.get("fused"))


def skip_if_failed(optimizer, failures: StepFailures, check_now) -> None:
    """Before ``optimizer.step()``: a fused optimizer takes the failure flag as ``found_inf`` and
    skips the update on the device (no host synchronization); any other optimizer cannot, so
    ``check_now()`` raises at once for a failed step (a host synchronization). :func:`clear_skip`
    after the step."""
    if skips_on_device(optimizer):
        optimizer.found_inf = failures.failed.to(torch.float32)
    else:
        check_now()


def clear_skip(optimizer) -> None:
    """Take the flag :func:`skip_if_failed` gave ``optimizer`` back (the next step gets its own)."""
    if hasattr(optimizer, "found_inf"):
        del optimizer.found_inf


def guarded_optimizer_step(optimizer, failures: StepFailures, check_now) -> None:
    """``optimizer.step()`` unless the step ``failures`` recorded last (or an earlier one)
    failed: the one guarded step of every training loop (:class:`~pyrobnn.infer.svi.trainer.SVITrainer`,
    :class:`~pyrobnn.infer.core.minibatch.MinibatchLoop`; Lightning's modules split it around
    Lightning's own call, :func:`skip_if_failed` and :func:`clear_skip`)."""
    skip_if_failed(optimizer, failures, check_now)
    try:
        optimizer.step()
    finally:
        clear_skip(optimizer)


def grads_not_finite(params):
    """A 0-d device tensor: whether any gradient of ``params`` is NaN or infinite (no sync), read
    as :func:`not_finite` reads tensors (one sum each: half the time of their norms, which
    also overflow from gradients of about 1e19 on)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    return not_finite(grads)


def not_finite(tensors):
    """A 0-d device tensor: whether any of ``tensors`` holds a NaN or an infinity (no sync): the
    sum of their sums is finite unless one does (or unless the values are within a factor of
    the number of entries of the largest float: far past any weight)."""
    return ~torch.isfinite(torch.stack([t.sum() for t in tensors]).sum())


class OverflowGuard:
    r"""The parameters before each update, so that an update that makes one non-finite (it
    overflowed: a learning rate too large for the gradient) is undone: one copy of the
    parameters kept, one copy per step. On the CPU the check is read at once (reading it costs
    nothing there) and the copy put back only when needed; on an accelerator the parameters are
    put back on the device, with no host synchronization.

    Not needed, and skipped, for Adam and AdamW at a learning rate ``lr`` below
    :attr:`BOUNDED_FRACTION` of the parameters' largest float: for finite gradients (checked
    before the update) their update is at most :math:`\text{lr} \cdot \max(1, (1-\beta_1) /
    \sqrt{1-\beta_2})` per coordinate (Kingma & Ba 2015, sec. 2.1), so it can overflow only
    parameters already within that distance of the largest float, and those overflow the
    forward pass first."""

    #: devices whose check is read on the host at once (nothing to wait for there)
    HOST_READ_DEVICES = ("cpu",)
    #: optimizers whose update is bounded by a multiple of the learning rate
    BOUNDED = (torch.optim.Adam, torch.optim.AdamW)
    #: the fraction of the largest float under which such an update cannot overflow a parameter
    #: that the forward pass does not overflow first
    BOUNDED_FRACTION = 2.0**-20

    def __init__(self, params, optimizer=None):
        self.params = [p.detach() for p in params]
        self.optimizer = optimizer
        #: the learning rates on the host where the optimizer holds them as device tensors (a
        #: capturable Adam's), kept by whoever sets them; reading the tensors would synchronize
        self.rates = None
        self.before = None
        self._saved = False
        self._largest = min((torch.finfo(p.dtype).max for p in self.params if p.is_floating_point()), default=math.inf) * self.BOUNDED_FRACTION

    def needed(self) -> bool:
        """Whether this step's update can overflow (read from the optimizer's settings alone)."""
        opt = self.optimizer
        if type(opt) not in self.BOUNDED:
            return True
        largest = self._largest
        rates = self.rates if self.rates is not None else [g["lr"] for g in opt.param_groups]
        for group, lr in zip(opt.param_groups, rates):
            beta1, beta2 = group["betas"]
            if isinstance(lr, torch.Tensor) or isinstance(beta1, torch.Tensor) or isinstance(beta2, torch.Tensor):
                return True  # reading them would synchronize
            if not lr * max(1.0, (1 - beta1) / (1 - beta2) ** 0.5) < largest:
                return True
        return False

    def save(self) -> None:
        self._saved = self.needed()
        if self._saved:
            if self.before is None:
                self.before = [torch.empty_like(p) for p in self.params]
            torch._foreach_copy_(self.before, self.params)

    def undo_overflow(self):
        """Put back the parameters saved last where the update made any non-finite; returns
        that 0-d flag, or ``None`` when nothing was saved (the update cannot overflow) or, on the
        CPU, when every parameter is finite (nothing to record)."""
        if not self._saved:
            return None
        bad = not_finite(self.params)
        if bad.device.type in self.HOST_READ_DEVICES:
            if not bool(bad):
                return None
            torch._foreach_copy_(self.params, self.before)
            return bad
        for p, b in zip(self.params, self.before):
            p.copy_(torch.where(bad, b, p))
        return bad
