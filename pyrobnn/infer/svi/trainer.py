"""Training a model and guide by stochastic variational inference."""

from __future__ import annotations

import inspect
import math
import numbers
import os
import time
import warnings
from typing import Callable, Optional

import pyro
import torch

from pyrobnn.guides import ConcreteDropout, GaussianDropout, MCDropout, MeanFieldNormal, SparseVariationalDropout, VariationalDropout
from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint
from pyrobnn.infer.core.failures import NonFiniteLossError, OverflowGuard, StepFailures, grads_not_finite, guarded_optimizer_step
from pyrobnn.infer.core.graphs import RecordingFailed
from pyrobnn.infer.svi.capture import CapturedStep, capture_refusal
from pyrobnn.infer.svi.history import History
from pyrobnn.infer.svi.objective import SVIObjective, trainable_parameters
from pyrobnn.infer.svi.schedules import make_kl_schedule
from pyrobnn.methods import MethodSpec, Support, register
from pyrobnn.models import BayesianModel
from pyrobnn.utils import memory
from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.validation import (
    as_tensor,
    check_forward,
    check_positive_int,
    check_positive_number,
    check_same_placement,
    loader_pair,
    validate_training_data,
)

__all__ = ["fit", "SVITrainer", "History", "TrainingCheckpoint", "default_optimizer", "with_guide"]


def _check_same_tensors(what, current: dict, saved: dict) -> None:
    """Refuse a saved state whose names or shapes differ from ``current``'s, naming them."""
    if not isinstance(saved, dict):
        raise ValueError(f"the saved {what} state is not a dict of tensors")
    absent, extra = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    if absent or extra:
        raise ValueError(f"the saved {what} state does not match this {what}: missing {absent[:5]}, unexpected {extra[:5]}")
    shapes = [k for k in current if tuple(current[k].shape) != tuple(saved[k].shape)]
    if shapes:
        k = shapes[0]
        raise ValueError(f"the saved {what} state has {k} of shape {tuple(saved[k].shape)}, this {what} {tuple(current[k].shape)}")


def _batches(loader_or_tensors, batch_size, generator):
    if isinstance(loader_or_tensors, tuple):
        x, y = loader_or_tensors
        n = x.shape[0]
        perm = torch.randperm(n, generator=generator, device="cpu").to(x.device, non_blocking=True)
        for i in range(0, n, batch_size):
            idx = perm[i : i + batch_size]
            yield x[idx], y[idx]
    else:
        for batch in loader_or_tensors:
            yield loader_pair(batch)


def _default_batch_size(model, x, particles: int) -> int:
    """All points, or where one step's activations and their gradients on all of them do not
    fit the memory budget (:mod:`pyrobnn.utils.memory`), equal batches that do."""
    if not isinstance(model, BayesianModel):
        return x.shape[0]
    n = x.shape[0]
    most = memory.points_per_chunk(n, particles, memory.activation_bytes(model.net, x[:1].to(model.device)), memory.GRADIENT_FACTOR)
    return math.ceil(n / math.ceil(n / most))


def default_optimizer(params, lr, capturable: bool = False):
    """Adam, with PyTorch's fused kernel (one pass over all parameters) where the parameters
    allow it, else its multi-tensor form. ``capturable``: its state and learning rate on the
    parameters' device (the rate a tensor, which a schedule changes in place), so that its step
    can be recorded in a CUDA graph (fused only)."""
    if all(p.dtype in (torch.float32, torch.float64) and p.device.type in ("cpu", "cuda") for p in params):
        try:
            if capturable:
                rate = torch.tensor(float(lr), dtype=torch.float32, device=params[0].device)
                return torch.optim.Adam(params, lr=rate, fused=True, capturable=True)
            return torch.optim.Adam(params, lr=lr, fused=True)
        except (RuntimeError, TypeError, ValueError):
            if capturable:
                return None
    return torch.optim.Adam(params, lr=lr, foreach=True)


class SVITrainer:
    r"""Stochastic variational inference for a model and guide, on a PyTorch optimizer.

    Each step evaluates the ELBO (:class:`~pyrobnn.infer.svi.objective.SVIObjective`: a
    :class:`~pyrobnn.infer.SplitELBO` by default, which equals ``Trace_ELBO`` or
    ``TraceMeanField_ELBO`` and also reports its two terms), back-propagates and steps the
    optimizer over the model's point parameters and the guide's parameters, without reading
    anything back to the host. A batch with NaN/inf values or refused targets, or a non-finite
    loss or gradient, is flagged on the device; that update and every later one are not
    applied, and :meth:`step` (at once) or :meth:`fit` (at the end of the epoch) raises
    :class:`~pyrobnn.infer.core.failures.InvalidBatchError` or :class:`~pyrobnn.infer.core.failures.NonFiniteLossError` naming the step.

    :param elbo: ``"trace"`` (Monte Carlo KL, as Pyro's ``Trace_ELBO``), ``"meanfield"``
        (registered KLs, as ``TraceMeanField_ELBO``), ``None`` for the guide's default
        (``"trace"`` for :class:`~pyrobnn.guides.MeanFieldNormal`, ``"meanfield"`` for
        the dropout family, whose KLs are approximations), or any ``pyro.infer.ELBO``.
    :param optimizer: a function from a parameter list to a ``torch.optim.Optimizer``;
        default Adam with learning rate ``lr``.
    :param num_particles: weight samples per step (vectorized).
    :param kl_annealing: a :class:`KLAnnealing`, a ``(start, end)`` pair in epochs, or a
        function of the fractional epoch returning the KL weight.
    :param lr_schedule: function of the fractional epoch returning a factor on ``lr``.
    :param clip_grad_norm: clip the gradient's global norm to this value.
    :param estimator: ``None`` (one weight sample per minibatch), ``"local"`` (local
        reparameterization), ``"flipout"``, ``"per_example"``, or an estimator handler from
        :mod:`pyrobnn.models.estimators`; the KL terms are unaffected.
    :param compile: compile the per-weight work with ``torch.compile`` (see
        :class:`~pyrobnn.infer.svi.trace_free.TraceFreeELBO`); pays tens of seconds once, saves most of the
        element-wise cost of large layers.
    :param capture: on a CUDA device, record the step once as a CUDA graph and replay it
        (:class:`~pyrobnn.infer.svi.capture.CapturedStep`): one launch instead of hundreds of
        kernels launched from Python. It applies to the steps evaluated without Pyro (below) with
        the default optimizer, for batches of the first batch's shape; ``capture_status`` says
        whether it applies, or why not.

    For a :class:`~pyrobnn.models.BayesianModel` with a pyrobnn guide, a :class:`SplitELBO`
    and one particle, steps are evaluated by :class:`~pyrobnn.infer.svi.trace_free.TraceFreeELBO` (the same
    estimator, without Pyro's traces); several particles (vectorized), any other model,
    guide or ELBO go through Pyro.
    The default optimizer is Adam with PyTorch's fused kernel where available.
    """

    def __init__(
        self,
        model,
        guide,
        elbo=None,
        optimizer: Optional[Callable] = None,
        lr: float = 1e-3,
        num_particles: int = 1,
        kl_annealing=None,
        lr_schedule: Optional[Callable[[float], float]] = None,
        clip_grad_norm: Optional[float] = None,
        estimator=None,
        compile: bool = False,
        capture: bool = True,
    ):
        if getattr(model, "sites", None):
            check_same_placement(model.init_value(model.sites[0]), guide)
        self.model = model
        self.guide = guide
        self.objective = SVIObjective(model, guide, elbo, num_particles, estimator, compile)
        self.kl_annealing = make_kl_schedule(kl_annealing, self.objective)
        self.lr_schedule = lr_schedule
        self.clip_grad_norm = clip_grad_norm
        if optimizer is None:
            check_positive_number("lr", lr)
        if clip_grad_norm is not None:
            check_positive_number("clip_grad_norm", clip_grad_norm)
        if not isinstance(capture, bool):
            raise TypeError(f"capture must be True or False, got {capture!r}")
        self.capture = capture
        self._captured = None
        self.capture_status = "not yet decided: the first step decides"
        self._optimizer_factory = optimizer
        self.lr = lr
        self.optimizer = None
        self._num_outputs = None
        self.failures = StepFailures()
        self.history = History()
        self.epoch = 0
        self.batch_size = None
        # the data order is drawn on the host (once an epoch), so a seed gives one order on every device
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(int(torch.randint(0, 2**62, (), device="cpu").item()))

    @property
    def elbo(self):
        return self.objective.elbo

    @property
    def flat(self):
        return self.objective.flat

    @property
    def estimator(self):
        return self.objective.estimator

    # -------------------------------------------------------------- parameters
    def parameters(self):
        return trainable_parameters(self.model, self.guide)

    def _setup(self, x, y, dataset_size):
        if self.optimizer is not None:
            return
        # Pyro's autoguides create their parameters on the first call
        with pyro.poutine.block(), torch.no_grad():
            self.guide(x, y, dataset_size=dataset_size)
        self._num_outputs = None
        if isinstance(self.model, BayesianModel):
            self._num_outputs = check_forward(self.model.net, x)[-1]
        params = self._params = self.parameters()
        refusal = capture_refusal(self, x.device)
        if refusal is None:
            self.optimizer = default_optimizer(params, self.lr, capturable=True)
            if self.optimizer is None:
                refusal = "this PyTorch has no fused capturable Adam for these parameters"
        if self.optimizer is None:
            if self._optimizer_factory is None:
                self.optimizer = default_optimizer(params, self.lr)
            else:
                self.optimizer = self._optimizer_factory(params)
        self._capture_refusal = refusal
        self.capture_status = "recorded as a CUDA graph" if refusal is None else f"not recorded: {refusal}"
        self._guard = OverflowGuard(params, self.optimizer)
        self._base_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        if any(isinstance(g["lr"], torch.Tensor) for g in self.optimizer.param_groups):
            self._guard.rates = list(self._base_lrs)

    # ----------------------------------------------------------------- a step
    def _step_tensors(self, x, y, dataset_size, epoch_fraction, validated=False):
        """One step with no host synchronization (for a fused optimizer): ``(loss, nll, kl)``
        as detached 0-d tensors on the model's device, and ``beta``.

        A batch with bad values, or a non-finite loss or gradient, is recorded on the device
        (:class:`StepFailures`) and the update is skipped, as is every later one until the
        failure is reported, so the parameters stay those from before the first failed step.
        ``validated``: the batch is a slice of data that :func:`validate_training_data` has
        checked whole and that sits on the model's device (``fit`` with tensors), so its
        per-batch checks are skipped."""
        if not validated:
            x, y = self._check_batch(x, y)
        self._setup(x, y, dataset_size)
        data_cause = None
        if not validated:
            y, data_cause = self._flag_batch(x, y)
        if self.lr_schedule is not None:
            factor = self.lr_schedule(epoch_fraction)
            for group, base in zip(self.optimizer.param_groups, self._base_lrs):
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(base * factor)  # in place: a recorded step reads it there
                else:
                    group["lr"] = base * factor
            if self._guard.rates is not None:
                self._guard.rates = [base * factor for base in self._base_lrs]
        beta = self.kl_annealing(epoch_fraction) if self.kl_annealing else 1.0
        step, epoch = self.history.steps, self.epoch
        self.history.steps += 1
        if self._capture_refusal is None and not self._guard.needed():
            if self._captured is None:
                self._captured = CapturedStep(self, x, y, dataset_size)
            if self._captured.fits(x, y, dataset_size):
                try:
                    loss, nll, kl = self._captured(x, y, beta, step, epoch, data_cause)
                    return loss, nll, kl, beta
                except RecordingFailed as e:
                    self._capture_refusal, self._captured = f"recording it failed ({e})", None
                    self.capture_status = f"not recorded: {self._capture_refusal}"
        self.optimizer.zero_grad(set_to_none=True)
        loss, nll, kl = self._update(x, y, dataset_size, beta, step, epoch, data_cause)
        return loss, nll, kl, beta

    def _update(self, x, y, dataset_size, kl_weight, step, epoch, data_cause):
        """The device work of a step, gradients zeroed: the loss, its gradient, the checks and
        the guarded update, with no host synchronization and nothing decided on a value, so
        that it can be recorded as a CUDA graph (``kl_weight``, ``step``, ``epoch`` may be
        device tensors). Returns ``(loss, nll, kl)`` as detached 0-d tensors."""
        loss, nll, kl = self.objective(x, y, dataset_size, kl_weight)
        loss.backward()
        value = loss.detach()
        bad_loss = ~torch.isfinite(value)
        bad_grad = grads_not_finite(self._params)
        if bad_grad is None:
            bad_grad = torch.zeros_like(bad_loss)
        elif self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for p in self._params if p.grad is not None], self.clip_grad_norm, foreach=True)
        self.failures.record(step, epoch, data_cause, bad_loss, bad_grad, value)
        self._guard.save()
        guarded_optimizer_step(self.optimizer, self.failures, self._raise_failures)
        with torch.no_grad():
            bad_update = self._guard.undo_overflow()
        if bad_update is not None:
            self.failures.record(step, epoch, None, torch.zeros_like(bad_update), torch.zeros_like(bad_update), value, bad_update)
        return value, nll.detach(), kl.detach()

    def _check_batch(self, x, y):
        """The checks of every batch that read no values (types, dtypes, shapes: no host
        synchronization); returns the batch on the model's device, floating targets in the
        model's dtype. Values are checked on the device by :meth:`_flag_batch`."""
        dtype = getattr(self.model, "dtype", None)
        x = as_tensor(x, "x", dtype)
        if y is None:
            raise ValueError("y is required for training")
        y = as_tensor(y, "y", dtype)
        if isinstance(self.model, BayesianModel):
            self.model.check_x(x)
        if y.dim() == 0 or y.shape[0] != x.shape[0]:
            raise ValueError(f"x has {x.shape[0]} examples but y has shape {tuple(y.shape)}")
        if y.is_floating_point() and dtype is not None and y.dtype != dtype:
            y = y.to(dtype)
        device = self.model.device
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def _flag_batch(self, x, y):
        """``(y, cause)``: the targets checked for type and shape (which reads no values) and
        made safe to score, and ``cause``, a 0-d device tensor: 0 for a good batch, else what
        is wrong with it (:data:`StepFailures.DATA_CAUSES`: NaN or infinite values in ``x`` or
        ``y``, targets the likelihood refuses). The step is not applied to a bad batch."""
        if self._num_outputs is not None:
            y = self.model.likelihood.check_targets(y, (x.shape[0], self._num_outputs))
        # the sum is NaN or infinite when some value is, or when finite values overflow it (past
        # 1e32 per entry at a million float32 entries): one read, five times faster than max |x|
        # and thirty times faster than isfinite(x).all() at a batch of 1000 MNIST images
        cause = torch.where(~torch.isfinite(x.sum()), 1, 0)
        if y.is_floating_point() and y.numel():
            cause = torch.where((cause == 0) & ~torch.isfinite(y.sum()), 2, cause)
        if self._num_outputs is not None:
            y, bad_targets = self.model.likelihood.flag_target_values(y, self._num_outputs)
            if bad_targets is not None:
                cause = torch.where((cause == 0) & bad_targets, 3, cause)
        return y, cause

    def _raise_failures(self):
        refused = "targets the likelihood refuses"
        if self._num_outputs is not None:
            refused = self.model.likelihood.refused_targets(self._num_outputs)
        self.failures.raise_if_any(self._params, refused)

    def step(self, x, y, dataset_size=None, epoch_fraction: float = 0.0):
        """One optimizer step on a minibatch; returns ``(loss, nll, kl, kl_weight)`` as floats.
        The batch gets the checks ``fit`` gives its data (types, shapes, finite values, label
        ranges); bad values in it raise :class:`~pyrobnn.infer.core.failures.InvalidBatchError`, a non-finite loss or
        gradient :class:`~pyrobnn.infer.core.failures.NonFiniteLossError`, with the parameters unchanged by the step.
        (``fit`` runs the same step without the per-step host synchronization that returning
        floats costs, and checks once per epoch.)"""
        loss, nll, kl, beta = self._step_tensors(x, y, dataset_size, epoch_fraction)
        self._raise_failures()
        loss, nll, kl = torch.stack([loss.to(nll.dtype), nll, kl]).tolist()
        return loss, nll, kl, beta

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "guide": self.guide.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "history": self.history.as_dict(),
            "epoch": self.epoch,
            "torch_rng": torch.get_rng_state(),
            # every GPU's generator, where CUDA has been used (weight noise is drawn there)
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
            "data_rng": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict, x=None, y=None, dataset_size=None) -> None:
        """Restore a training state. Everything is checked (the parts present, and the model's and
        the guide's parameter names and shapes) before anything is changed, so a refused state
        leaves the trainer as it was."""
        missing = [k for k in ("model", "guide", "optimizer", "history", "epoch", "torch_rng", "data_rng") if k not in state]
        if missing:
            raise ValueError(f"the training state lacks {missing}")
        if x is not None:
            self._setup(x[:1].to(self.model.device), y[:1].to(self.model.device), dataset_size)
        for what, module in (("model", self.model), ("guide", self.guide)):
            _check_same_tensors(what, module.state_dict(), state[what])
        cuda_rng = state.get("cuda_rng")  # absent from checkpoints written before it was saved
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if cuda_rng is not None and len(cuda_rng) != visible:
            warnings.warn(
                f"the state holds the random generators of {len(cuda_rng)} GPUs and this process sees "
                f"{visible}: they are not restored, so training goes on but does not repeat the "
                "uninterrupted run's random draws; resume in a process that sees as many GPUs "
                "(CUDA_VISIBLE_DEVICES) to repeat them",
                stacklevel=2,
            )
            cuda_rng = None
        self.model.load_state_dict(state["model"])
        self.guide.load_state_dict(state["guide"])
        if state["optimizer"] is not None:
            if self.optimizer is None:
                raise ValueError("pass a batch of data to set up the optimizer before loading its state")
            self.optimizer.load_state_dict(state["optimizer"])
            for group in self.optimizer.param_groups:
                if group.get("capturable") and not isinstance(group["lr"], torch.Tensor):
                    group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=group["params"][0].device)
            self._captured = None  # recorded against the state it replaced: recorded again
        self.history = History.from_dict(state["history"])
        self.epoch = int(state["epoch"])
        torch.set_rng_state(state["torch_rng"])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        self.generator.set_state(state["data_rng"])

    def _checkpoint_state(self, path) -> dict:
        """The state to write to ``path``; a state with non-finite parameters is refused, so a
        checkpoint always holds a state training can go on from."""
        bad = [n for n, p in (*self.model.named_parameters(), *self.guide.named_parameters()) if not bool(torch.isfinite(p).all())]
        if bad:
            raise NonFiniteLossError(f"not writing {path}: the parameters {bad[:5]} are not finite", self.history.steps, self.epoch)
        return self.state_dict()

    def save_checkpoint(self, path) -> None:
        """Write the training state atomically (:class:`TrainingCheckpoint`); a state with
        non-finite parameters is refused (and nothing is written)."""
        TrainingCheckpoint(path).save(self._checkpoint_state(path), self.epoch)

    def load_checkpoint(self, path, x=None, y=None, dataset_size=None) -> None:
        # onto the CPU: the random generators' states must be CPU tensors, and the module and
        # optimizer states are copied onto their parameters' devices as they load
        obj = TrainingCheckpoint.read(path)
        TrainingCheckpoint.check_digest(obj, path)
        self.load_state_dict(obj["state"], x, y, dataset_size)

    # -------------------------------------------------------------------- fit
    def fit(
        self,
        x=None,
        y=None,
        *,
        loader=None,
        epochs: int = 1,
        batch_size: Optional[int] = None,
        progress: bool = True,
        checkpoint=None,
        resume: bool = False,
        callback: Optional[Callable] = None,
        seed: Optional[int] = None,
    ) -> History:
        """Train for ``epochs`` epochs in total (a resumed run continues to that count).

        :param x: the training data as tensors, or
        :param y: see ``x``.
        :param loader: a ``DataLoader`` yielding ``(x, y)`` pairs.
        :param batch_size: minibatch size for tensors (default: the whole data set, or as many
            points as the memory budget of :mod:`pyrobnn.utils.memory` allows a step; ``batch_size``
            records the size used).
        :param checkpoint: a file to write the training state to atomically, or a
            :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` epochs or
            ``seconds`` seconds; by default every 60 seconds), and at the end. With a checkpoint,
            SIGTERM and SIGINT end training at the end of the epoch (within
            :data:`~pyrobnn.infer.core.interrupts.GRACE_SECONDS`, else where it is) with the
            state written, raising :class:`~pyrobnn.infer.core.interrupts.RunInterrupted`; a write
            that fails (a full disk) warns and training goes on.
        :param resume: continue from ``checkpoint`` if the file exists.
        :param callback: ``callback(trainer, epoch) -> dict`` after each epoch; its numbers go
            into ``history.extra`` and the progress bar.
        :param seed: seeds Pyro/torch and the shuffling (ignored when resuming).
        """
        source, batch_size, n, steps_per_epoch, first = self._training_data(x, y, loader, batch_size)
        if not isinstance(epochs, numbers.Integral) or isinstance(epochs, bool) or epochs < 0:
            raise ValueError(f"epochs must be a non-negative integer, got {epochs!r}")
        checkpoint = TrainingCheckpoint(Checkpointing.of(checkpoint))
        self.batch_size = batch_size
        if resume and checkpoint.enabled and os.path.exists(checkpoint.path):
            self.load_checkpoint(checkpoint.path, *first, n)
            checkpoint.written = self.epoch
        elif seed is not None:
            pyro.set_rng_seed(seed)
            self.generator.manual_seed(seed)

        bar = tqdm(total=epochs, initial=self.epoch, disable=not progress, desc="SVI", unit="epoch", dynamic_ncols=True)
        start_time = time.perf_counter() - (self.history.seconds[-1] if self.history.seconds else 0.0)
        with checkpoint.stoppable():
            try:
                while self.epoch < epochs:
                    means, kl_weight = self._epoch(source, batch_size, n, steps_per_epoch, loader is None, checkpoint)
                    bar.set_postfix(self._record_epoch(means, kl_weight, start_time, callback), refresh=False)
                    bar.update(1)
                    checkpoint.after(self.epoch, lambda: self._checkpoint_state(checkpoint.path), last=self.epoch == epochs, unit="epochs")
            finally:
                bar.close()
        return self.history

    def _training_data(self, x, y, loader, batch_size):
        """``(source, batch_size, n, steps_per_epoch, first)``: tensors checked whole and moved to
        the model's device (``batch_size`` chosen by the memory budget where not given) or the
        loader (and its batch size), the data set's size, the steps of an epoch and one example
        ``(x, y)``."""
        if loader is None:
            x, y = validate_training_data(self.model, x, y)
            n = x.shape[0]
            if batch_size is None:
                batch_size = _default_batch_size(self.model, x, self.objective.num_particles)
            check_positive_int("batch_size", batch_size)
            return (x.to(self.model.device), y.to(self.model.device)), batch_size, n, math.ceil(n / batch_size), (x[:1], y[:1])
        n = len(loader.dataset)
        if n == 0:
            raise ValueError("the DataLoader's dataset is empty")
        first = loader_pair(next(iter(loader)))
        validate_training_data(self.model, *first)
        return loader, loader.batch_size, n, len(loader), first

    def _epoch(self, source, batch_size, n: int, steps_per_epoch: int, validated: bool, checkpoint) -> tuple:
        """One pass over the data, one step per batch, without a host synchronization until its
        end, where a failed step is reported (:meth:`_raise_failures`). A stop signal that is
        :data:`~pyrobnn.infer.core.interrupts.GRACE_SECONDS` old stops it between batches.
        Returns the epoch's mean ``[loss, nll, kl]`` and mean KL weight."""
        sums, beta_sum, count = 0.0, 0.0, 0
        for i, (xb, yb) in enumerate(_batches(source, batch_size, self.generator)):
            if checkpoint.stop_overdue():
                raise checkpoint.interrupted(self.epoch, "epochs")
            loss, nll, kl, beta = self._step_tensors(xb, yb, n, self.epoch + i / steps_per_epoch, validated=validated)
            sums = sums + torch.stack([loss.to(nll.dtype), nll, kl])
            beta_sum += beta
            count += 1
        self._raise_failures()  # the epoch's one host synchronization, with the next line
        return (sums / count).tolist(), beta_sum / count

    def _record_epoch(self, means, kl_weight: float, start_time: float, callback) -> dict:
        """The epoch's figures into the history (and the ``callback``'s), the epoch counted; returns
        what the progress bar shows."""
        h = self.history
        h.epoch.append(self.epoch + 1)
        h.loss.append(means[0])
        h.nll.append(means[1])
        h.kl.append(means[2])
        h.kl_weight.append(kl_weight)
        h.seconds.append(time.perf_counter() - start_time)
        h.kl_methods = self.objective.kl_methods
        self.epoch += 1
        shown = {"nll": f"{h.nll[-1]:.4g}", "kl": f"{h.kl[-1]:.4g}"}
        if self.kl_annealing is not None:
            shown["beta"] = f"{h.kl_weight[-1]:.2f}"
        if callback is not None:
            for k, v in (callback(self, self.epoch) or {}).items():
                h.extra.setdefault(k, []).append(v)
                shown[k] = f"{v:.4g}" if isinstance(v, float) else v
        return shown


class TrainingCheckpoint(RunCheckpoint):
    """The checkpoint of :meth:`SVITrainer.fit`: the trainer's whole state (the model's and the
    guide's parameters, the optimizer, the history, the random generators) in a format of its own
    (``"pyrobnn-checkpoint"``), which :meth:`SVITrainer.load_checkpoint` reads, checking the
    modules' names and shapes, and ``fit(..., resume=True)`` goes on from. Written, timed,
    warned about and stopped on as every run's checkpoint
    (:class:`~pyrobnn.infer.core.checkpoints.RunCheckpoint`)."""

    FORMAT, DESCRIPTION = "pyrobnn-checkpoint", "training checkpoint"

    def __init__(self, checkpointing):
        super().__init__(checkpointing, "SVI", {})

    def position(self, count: int, unit: str) -> str:
        return f"epoch {count}"

    def resume_hint(self, finished: bool = False) -> str:
        return f"the same call with checkpoint={self.path!r} and resume=True " + ("returns it at once" if finished else "goes on from there")


#: what :func:`fit` passes to :class:`SVITrainer` and what to :meth:`SVITrainer.fit`: their own
#: keyword parameters, read from their signatures so that neither list is written twice
_TRAINER_OPTIONS = [p for p in inspect.signature(SVITrainer.__init__).parameters.values() if p.name not in ("self", "model", "guide")]
_RUN_OPTIONS = [p for p in inspect.signature(SVITrainer.fit).parameters.values() if p.name not in ("self", "x", "y", "epochs")]


def fit(model, guide, x=None, y=None, *, epochs: int = 100, **options):
    """Fit ``guide`` (and the model's point parameters) to data by SVI: an :class:`SVITrainer`
    built with the options it takes (``elbo``, ``optimizer``, ``lr``, ``num_particles``,
    ``kl_annealing``, ``lr_schedule``, ``clip_grad_norm``, ``estimator``, ``compile``), trained
    for ``epochs`` epochs by :meth:`SVITrainer.fit` with the options that takes (``loader``,
    ``batch_size``, ``progress``, ``checkpoint``, ``resume``, ``callback``, ``seed``).

    Returns a :class:`~pyrobnn.infer.svi.variational.VariationalPosterior` (the model and the
    trained guide, with the verbs of every result), whose ``history`` is the :class:`History` of
    the run.

    Example::

        vi = pyrobnn.fit(model, guide, x, y, epochs=1000, lr=1e-2)
        vi.history.nll[-1], vi.history.kl[-1]
        vi.predict(x_test).metrics(y_test)
    """
    from pyrobnn.infer.svi.variational import VariationalPosterior

    trainer_names = {p.name for p in _TRAINER_OPTIONS}
    run_names = {p.name for p in _RUN_OPTIONS}
    unknown = sorted(set(options) - trainer_names - run_names)
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument {unknown[0]!r}; it takes those of SVITrainer and SVITrainer.fit")
    trainer = SVITrainer(model, guide, **{k: v for k, v in options.items() if k in trainer_names})
    history = trainer.fit(x, y, epochs=epochs, **{k: v for k, v in options.items() if k in run_names})
    given = {p.name: options.get(p.name, p.default) for p in _TRAINER_OPTIONS + _RUN_OPTIONS}

    def described(value):
        return value if isinstance(value, (str, type(None))) else type(value).__name__

    settings = dict(
        epochs=epochs, batch_size=trainer.batch_size, lr=given["lr"], elbo=described(given["elbo"]),
        num_particles=given["num_particles"], estimator=described(given["estimator"]), seed=given["seed"],
        capture=trainer.capture_status,
    )
    return VariationalPosterior(model, guide, history, settings=settings)


fit.__signature__ = inspect.Signature(
    [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
     for name, default in (("model", inspect.Parameter.empty), ("guide", inspect.Parameter.empty), ("x", None), ("y", None))]
    + [inspect.Parameter("epochs", inspect.Parameter.KEYWORD_ONLY, default=100, annotation=int)]
    + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in _RUN_OPTIONS + _TRAINER_OPTIONS]
)


def with_guide(guide_class, **guide_options):
    """``run(model, x, y, **options)``: :func:`fit` of a new ``guide_class(model, **guide_options)``
    (the registry's form of a guide method)."""

    def run(model, x, y, **options):
        return fit(model, guide_class(model, **guide_options), x, y, **options)

    run.__name__ = run.__qualname__ = f"fit_{guide_class.__name__}"
    run.__doc__ = f"pyrobnn.fit(model, {guide_class.__name__}(model), x, y, **options)"
    return run


_DROPOUT_KL = "Gal & Ghahramani's KL (2016) is defined against a zero-mean Normal prior"
_SVI_BUDGETS = {"epochs": 0, "batch_size": 1, "num_particles": 1}
_SVI_QUICK = {"epochs": 3, "progress": False}
for _key, _label, _guide, _options, _support in (
    ("meanfield", "Bayes by Backprop: a mean-field Normal guide trained by SVI", MeanFieldNormal, {}, Support()),
    ("variational_dropout", "variational dropout (Kingma et al. 2015) by SVI", VariationalDropout, {}, Support()),
    ("sparse_vd", "sparse variational dropout (Molchanov et al. 2017) by SVI", SparseVariationalDropout, {}, Support()),
    ("gaussian_dropout", "Gaussian dropout with a fixed rate, as variational inference", GaussianDropout, {},
     Support(priors=("log_uniform",), reasons={"prior": "noise shared by an input unit has a KL only against the log-uniform prior (Kingma et al. 2015)"})),
    ("mc_dropout", "MC dropout as variational inference (Gal & Ghahramani 2016)", MCDropout, {"p": 0.1},
     Support(priors=("normal",), reasons={"prior": _DROPOUT_KL})),
    ("concrete_dropout", "concrete dropout: learned dropout rates (Gal, Hron & Kendall 2017)", ConcreteDropout, {},
     Support(priors=("normal",), reasons={"prior": _DROPOUT_KL})),
):
    register(MethodSpec(_key, _label, "variational", with_guide(_guide, **_options), _support, budgets=_SVI_BUDGETS, quick=_SVI_QUICK))
