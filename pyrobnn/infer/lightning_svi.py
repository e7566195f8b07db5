"""SVI of a model and guide under PyTorch Lightning: the same loss as :func:`pyrobnn.fit`, run
by a Lightning ``Trainer`` (data-parallel over processes with DDP on CPUs and GPUs, its
checkpoints, its progress bar and loggers)."""

from __future__ import annotations

from typing import Callable, Optional

import lightning as L
import torch

from pyrobnn.infer.fit import default_optimizer, make_kl_schedule
from pyrobnn.infer.objective import SVIObjective, trainable_parameters
from pyrobnn.validation import check_same_placement

__all__ = ["SVIModule", "EndProcessGroup"]


class SVIModule(L.LightningModule):
    r"""A ``LightningModule`` that trains ``model`` and ``guide`` by SVI.

    Each training step returns :class:`~pyrobnn.infer.objective.SVIObjective`'s loss on the
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
    :param lr, optimizer: Adam with learning rate ``lr`` (fused where the parameters allow),
        or ``optimizer(params)``; a picklable function for ``strategy="ddp_spawn"``.
    :param elbo, num_particles, kl_annealing, estimator, compile: as in
        :class:`~pyrobnn.infer.fit.SVITrainer` (the KL annealing's epoch is Lightning's).

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
        if dataset_size is not None and (not isinstance(dataset_size, int) or dataset_size < 1):
            raise ValueError(f"dataset_size must be a positive integer or None, got {dataset_size!r}")
        self.model = model
        self.guide = guide
        self.objective = SVIObjective(model, guide, elbo, num_particles, estimator, compile)
        self.kl_annealing = make_kl_schedule(kl_annealing, self.objective)
        self.dataset_size = dataset_size
        self.lr = lr
        self.optimizer_factory = optimizer
        self._frozen = []

    def setup(self, stage: str) -> None:
        random = {id(self.model.init_value(s)) for s in self.model.sites}
        self._frozen = [p for p in self.model.parameters() if id(p) in random and p.requires_grad]
        for p in self._frozen:
            p.requires_grad_(False)

    def teardown(self, stage: str) -> None:
        for p in self._frozen:
            p.requires_grad_(True)
        self._frozen = []

    def _full_size(self) -> int:
        if self.dataset_size is not None:
            return self.dataset_size
        loader = self.trainer.train_dataloader
        try:
            return len(loader.dataset)
        except (AttributeError, TypeError):
            raise ValueError("the training DataLoader has no sized data set: pass SVIModule(..., dataset_size=N)") from None

    def training_step(self, batch, batch_idx):
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise ValueError("SVIModule's training data must yield (x, y) pairs")
        x, y = batch
        beta = 1.0
        if self.kl_annealing is not None:
            beta = self.kl_annealing(self.current_epoch + batch_idx / max(1, self.trainer.num_training_batches))
        loss, nll, kl = self.objective(x, y, self._full_size(), beta)
        # every step's loss estimates the whole data set's: steps weigh equally (batch_size=1)
        self.log("loss", loss.detach(), on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        self.log_dict({"nll": nll, "kl": kl}, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=1)
        return loss

    def configure_optimizers(self):
        params = trainable_parameters(self.model, self.guide)
        if self.optimizer_factory is None:
            return default_optimizer(params, self.lr)
        return self.optimizer_factory(params)


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
