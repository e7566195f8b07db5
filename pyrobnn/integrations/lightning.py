"""Our training objectives as Lightning modules: SVI of a model and guide (the loss of
:func:`pyrobnn.fit`) and the members of a deep ensemble (the loss of
:func:`pyrobnn.deep_ensemble`), run by a Lightning ``Trainer``: data-parallel over processes
with DDP on CPUs and GPUs, its checkpoints, its progress bar and loggers."""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import lightning as L
import torch

from pyrobnn.infer.core.failures import NonFiniteLossError, StepFailures, clear_skip, grads_not_finite, skip_if_failed
from pyrobnn.infer.core.minibatch import minibatch_log_joint
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.starts import member_initializations
from pyrobnn.infer.modes.ensemble import EnsemblePosterior
from pyrobnn.infer.svi.objective import SVIObjective, trainable_parameters
from pyrobnn.infer.svi.schedules import make_kl_schedule
from pyrobnn.infer.svi.trainer import default_optimizer
from pyrobnn.methods import refuse_unsupported
from pyrobnn.utils.validation import check_forward, check_positive_int, check_positive_number, check_same_placement, loader_pair

__all__ = ["SVIModule", "EnsembleModule", "EndProcessGroup"]

# Lightning 2.x flattens every training step's output with torch's LeafSpec, which torch 2.14
# deprecates: a FutureWarning at each fit about Lightning's code, raised from Lightning's own
# loop, which nobody fitting one of these modules can change. Matched by message, category and
# the Lightning module that raises it, so the same deprecation elsewhere still shows.
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning,
    module=r"lightning\.pytorch\.utilities\._pytree",
)


def _dataset_size(module, given):
    """``given``, else the length of the training DataLoader's data set (a DistributedSampler
    leaves that the full data set)."""
    if given is not None:
        return given
    try:
        return len(module.trainer.train_dataloader.dataset)
    except (AttributeError, TypeError):
        raise ValueError(f"the training DataLoader has no sized data set: pass {type(module).__name__}(..., dataset_size=N)") from None


def _check_dataset_size(dataset_size):
    if dataset_size is not None and (not isinstance(dataset_size, int) or isinstance(dataset_size, bool) or dataset_size < 1):
        raise ValueError(f"dataset_size must be a positive integer or None, got {dataset_size!r}")


class _FrozenWhileFitting:
    """Parameters that receive no gradient from the module's loss do not require one while a
    ``Trainer`` runs it (``setup`` to ``teardown``), so that DDP does not wait for them."""

    def _freeze(self, params):
        self._frozen = [p for p in params if p.requires_grad]
        for p in self._frozen:
            p.requires_grad_(False)

    def teardown(self, stage: str) -> None:
        for p in getattr(self, "_frozen", []):
            p.requires_grad_(True)
        self._frozen = []


class _SkipsNonFiniteSteps:
    """A non-finite loss or gradient handled as in :func:`pyrobnn.fit`: flagged on the device
    (:class:`~pyrobnn.infer.core.failures.StepFailures`), that update and every later one skipped
    (PyTorch's fused optimizers take the flag; others check at once, a host sync), and at the
    end of the epoch, on every rank, :class:`~pyrobnn.infer.core.failures.NonFiniteLossError` names the
    step. The module sets ``_params`` (what its optimizer updates) and ``_last_loss`` (each
    training step's loss)."""

    failures: StepFailures
    _params: list
    _last_loss: torch.Tensor

    def on_before_optimizer_step(self, optimizer) -> None:
        # after backward (and DDP's all-reduce, so every rank sees the same gradients) and
        # before the update: a flagged step is not applied
        value = self._last_loss
        bad_loss = ~torch.isfinite(value)
        bad_grad = grads_not_finite(self._params)
        if bad_grad is None:
            bad_grad = torch.zeros_like(bad_loss)
        self.failures.record(self.global_step, self.current_epoch, None, bad_loss, bad_grad, value)
        skip_if_failed(optimizer, self.failures, lambda: self.failures.raise_if_any(self._params))

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        for optimizer in self.trainer.optimizers:
            clear_skip(optimizer)

    def on_train_epoch_end(self) -> None:
        # one host synchronization per epoch; every rank raises if any rank failed
        if self.trainer.strategy.reduce_boolean_decision(self.failures.any(), all=False):
            if not self.failures.any():
                raise NonFiniteLossError(f"another rank's training failed in epoch {self.current_epoch}", self.global_step, self.current_epoch)
            self.failures.raise_if_any(self._params)


class SVIModule(_SkipsNonFiniteSteps, _FrozenWhileFitting, L.LightningModule):
    r"""A ``LightningModule`` that trains ``model`` and ``guide`` by SVI.

    Each training step returns :class:`~pyrobnn.infer.svi.objective.SVIObjective`'s loss on the
    batch it is given: the likelihood scaled by the data set's size ``N`` over the batch, the
    KL counted once. Under DDP every rank sees its own batch of ``B`` examples and the
    gradients are *averaged* over the ``R`` ranks, so the update is that of one process seeing
    the union of the batches (``R B`` examples): :math:`\frac{1}{R}\sum_r \big(\frac{N}{B}
    \sum_{n \in b_r} \ell_n + \mathrm{KL}\big) = \frac{N}{RB}\sum_{n \in \cup b_r} \ell_n +
    \mathrm{KL}` (tested against exactly that, two processes with gloo). ``nll``, ``kl`` and
    ``loss`` are logged per epoch, averaged over steps and ranks (one synchronization per
    epoch), and shown in Lightning's progress bar.

    :param dataset_size: ``N``; default the length of the training ``DataLoader``'s data set
        (a ``DistributedSampler`` leaves that the full data set).
    :param lr: Adam with learning rate ``lr`` (fused where the parameters allow),
        or ``optimizer(params)``; a picklable function for ``strategy="ddp_spawn"``.
    :param optimizer: see ``lr``.
    :param elbo: as in
        :class:`~pyrobnn.infer.svi.trainer.SVITrainer` (the KL annealing's epoch is Lightning's).
    :param num_particles: see ``elbo``.
    :param kl_annealing: see ``elbo``.
    :param estimator: see ``elbo``.
    :param compile: see ``elbo``.

    A non-finite loss or gradient is skipped and reported as in :func:`pyrobnn.fit` (see
    ``_SkipsNonFiniteSteps``).

    The network's random weights only initialize the guide and are never trained by SVI; so
    that DDP does not wait for gradients they never get, they do not require a gradient while
    a ``Trainer`` runs the module (``setup`` to ``teardown``). Checkpoints are Lightning's
    (``model.*`` and ``guide.*`` in the state dict, with the optimizer's state).

    Example::

        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=20)
        trainer.fit(SVIModule(model, guide, lr=1e-3), DataLoader(TensorDataset(x, y), batch_size=100))
    """

    def __init__(
        self,
        model,
        guide,
        dataset_size: Optional[int] = None,
        *,
        lr: float = 1e-3,
        optimizer: Optional[Callable] = None,
        elbo=None,
        num_particles: int = 1,
        kl_annealing=None,
        estimator=None,
        compile: bool = False,
    ):
        super().__init__()
        check_same_placement(model.init_value(model.sites[0]), guide)
        _check_dataset_size(dataset_size)
        if optimizer is None:
            check_positive_number("lr", lr)
        self.model = model
        self.guide = guide
        self.objective = SVIObjective(model, guide, elbo, num_particles, estimator, compile)
        self.kl_annealing = make_kl_schedule(kl_annealing, self.objective)
        self.dataset_size = dataset_size
        self.lr = lr
        self.optimizer_factory = optimizer
        self.failures = StepFailures()
        self._params = None
        self._last_loss = None

    def setup(self, stage: str) -> None:
        self._freeze([self.model.init_value(s) for s in self.model.sites])

    def training_step(self, batch, batch_idx):
        x, y = loader_pair(batch, "SVIModule")
        self.model.check_x(x)  # dtype, emptiness and width, before torch's own shape error
        beta = 1.0
        if self.kl_annealing is not None:
            beta = self.kl_annealing(self.current_epoch + batch_idx / max(1, self.trainer.num_training_batches))
        loss, nll, kl = self.objective(x, y, _dataset_size(self, self.dataset_size), beta)
        self._last_loss = loss.detach()
        # every step's loss estimates the whole data set's: steps weigh equally (batch_size=1)
        self.log("loss", loss.detach(), on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        self.log_dict({"nll": nll, "kl": kl}, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=1)
        return loss

    def configure_optimizers(self):
        params = self._params = trainable_parameters(self.model, self.guide)
        if self.optimizer_factory is None:
            return default_optimizer(params, self.lr)
        return self.optimizer_factory(params)


class EnsembleModule(_SkipsNonFiniteSteps, _FrozenWhileFitting, L.LightningModule):
    r"""A ``LightningModule`` that trains the ``K`` members of a deep ensemble of ``model``: the
    members are the rows of one ``(K, dim)`` parameter (as in :func:`pyrobnn.deep_ensemble`,
    member ``k`` initialized under the seed ``seed + k``), every step one vmapped pass of the
    network over all members. Each member's loss on a batch of ``B`` points is that of
    :func:`~pyrobnn.infer.modes.ensemble.train_members`, :math:`\frac{1}{N}\big(-\frac{N}{B}\sum_{n}
    \log p(y_n \mid x_n, w_k) - \log p(w_k)\big)` (``objective="map"``; without the prior for
    ``"likelihood"``), and the step minimizes their sum, so every member follows its own path.
    Under DDP the ranks' gradients are averaged, which is the step on the union of their
    batches (tested against exactly that, two processes with gloo).

    A non-finite loss or gradient is skipped and reported as in :func:`pyrobnn.fit`. Lightning
    has no per-member early stopping: use :func:`pyrobnn.deep_ensemble` where that
    matters, or Lightning's callbacks on the logged mean ``loss``. :meth:`result` gives the
    members as an :class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior` (for ``predict``,
    ``Predictive``, ArviZ, and as starting points of ``ensemble_sampling``).

    :param dataset_size: ``N``; default the length of the training ``DataLoader``'s data set.
    :param lr: AdamW, or ``optimizer(params)``.
    :param weight_decay: see ``lr``.
    :param optimizer: see ``lr``.
    """

    def __init__(
        self,
        model,
        num_members: int,
        dataset_size: Optional[int] = None,
        *,
        objective: str = "map",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        optimizer: Optional[Callable] = None,
        seed: int = 0,
    ):
        super().__init__()
        refuse_unsupported("deep_ensemble", model, "EnsembleModule")
        check_positive_int("num_members", num_members)
        _check_dataset_size(dataset_size)
        if objective not in ("map", "likelihood"):
            raise ValueError(f"objective must be 'map' or 'likelihood', got {objective!r}")
        if optimizer is None:
            check_positive_number("lr", lr)
        self.model = model
        self.potential = FlatPotential(model)
        self.members = torch.nn.Parameter(member_initializations(model, self.potential, num_members, seed))
        self.dataset_size = dataset_size
        self.objective, self.lr, self.weight_decay = objective, lr, weight_decay
        self.optimizer_factory = optimizer
        self._outputs = None
        self.failures = StepFailures()
        self._params = [self.members]
        self._last_loss = None

    def setup(self, stage: str) -> None:
        self._freeze(self.model.parameters())  # the members are the rows of self.members

    def training_step(self, batch, batch_idx):
        x, y = loader_pair(batch, "EnsembleModule")
        self.model.check_x(x)
        if self._outputs is None:
            self._outputs = check_forward(self.model.net, x)[-1]
        y = self.model.likelihood.check_targets(y, (x.shape[0], self._outputs))
        n = _dataset_size(self, self.dataset_size)
        per_member = -minibatch_log_joint(self.potential, self.members, x, y, n, prior=self.objective == "map") / n
        loss = per_member.sum()
        self._last_loss = loss.detach()
        self.log("loss", per_member.detach().mean(), on_step=False, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=1)
        return loss

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            # fused where it can be: it skips a failed step on the device, without a sync
            fused = self.members.device.type in ("cpu", "cuda")
            return torch.optim.AdamW([self.members], lr=self.lr, weight_decay=self.weight_decay, fused=fused)
        return self.optimizer_factory([self.members])

    @torch.no_grad()
    def result(self) -> EnsemblePosterior:
        """The members as draws ``(K, 1, *shape)`` per site."""
        samples = self.potential.unpack_draws(self.members.detach().unsqueeze(1))
        label = "deep ensemble (MAP)" if self.objective == "map" else "deep ensemble (likelihood)"
        settings = dict(num_members=self.members.shape[0], objective=self.objective, lr=self.lr, weight_decay=self.weight_decay)
        return EnsemblePosterior(samples, {}, 0.0, label + ", Lightning", settings=settings, model=self.model)


class EndProcessGroup(L.Callback):
    """Destroys the ``torch.distributed`` process group when a ``Trainer`` has finished.

    With torch 2.14, a gloo process that exits with its process group still alive aborts now
    and then while the group's threads are torn down ("terminate called without an active
    exception", SIGABRT: 2 of 15 two-process runs of a bare ``all_reduce`` on the reference
    machine, none once the group was destroyed). Lightning leaves the group alive after
    ``fit``, so a ``ddp_spawn`` worker can die on its way out and ``fit`` then raises in the
    main process. Pass ``callbacks=[EndProcessGroup()]`` to a ``Trainer`` that is not used
    again for another stage in the same processes.
    """

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
