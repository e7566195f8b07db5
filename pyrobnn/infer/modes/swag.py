r"""SWAG: the SWA-Gaussian posterior of a BayesianModel (Maddox et al. 2019, NeurIPS).

From the MAP of the model's log joint, SGD with a constant learning rate runs on, and the
iterates :math:`w_1, \dots, w_T` collected once per epoch give the Gaussian

.. math:: q(w) = N\!\big(\bar w,\; \tfrac12 \Sigma_{\text{diag}} + \tfrac{1}{2(K-1)} \hat D \hat D^\top\big),
          \qquad \bar w = \tfrac1T \sum_t w_t, \quad
          \Sigma_{\text{diag}} = \operatorname{diag}\big(\tfrac1T \sum_t w_t^2 - \bar w^2\big),

where the columns of :math:`\hat D` are the deviations :math:`w_t - \bar w_t` of the last
:math:`K` iterates from the running mean at their time (Maddox et al., sec. 3). Draws
:math:`w = \bar w + \tfrac{1}{\sqrt2} \Sigma_{\text{diag}}^{1/2} z_1 + \tfrac{1}{\sqrt{2(K-1)}} \hat D z_2`
with :math:`z_1 \sim N(0, I_d)`, :math:`z_2 \sim N(0, I_K)`.

Several SWAG runs (``num_runs``, from different MAP members) batch as rows of one tensor,
MultiSWAG (Wilson & Izmailov 2020); the draws of each run form one chain.
Everything lives in the unconstrained space of :class:`~pyrobnn.infer.core.potential.FlatPotential`.
The network is evaluated as by every method that builds a potential (:data:`pyrobnn.methods.NETWORK_EVALUATION`):
batch normalization uses the running statistics the network holds, for the SGD iterates and for
every draw (Maddox et al. recompute them per draw instead, on the training data).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import torch

from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint, watching
from pyrobnn.infer.core.curvature import largest_curvature
from pyrobnn.infer.core.minibatch import MinibatchLoop, minibatch_log_joint
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.problem import flat_problem, training_data
from pyrobnn.infer.modes.ensemble import EnsemblePosterior, deep_ensemble, warm_map
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.methods import MethodSpec, WarmStart, checked, latent_only_support, register
from pyrobnn.utils.constraints import Either, Interval, Positive
from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.validation import check_positive_int

__all__ = ["SWAGMoments", "SWAGPosterior", "swag", "swag_moments", "AUTO_LR"]

#: ``lr="auto"``: SGD's learning rate times the largest curvature of the per-point loss at the
#: MAP. Well below the stability limit 2 (1 + momentum) of SGD with momentum, because the
#: power iteration can underestimate the curvature and the trajectory can reach sharper regions:
#: at 1.0 SWAG's SGD left the MAP for a dead network on MNIST (LeNet-300-100)
AUTO_LR = 0.1


@dataclass
class SWAGMoments:
    """The SWAG Gaussian per run: ``mean`` and ``diagonal`` ``(R, d)``, ``deviations``
    ``(R, K, d)`` (rows of :math:`\\hat D^\\top`)."""

    mean: torch.Tensor
    diagonal: torch.Tensor
    deviations: torch.Tensor

    def covariance(self) -> torch.Tensor:
        """``(R, d, d)``: :math:`\\tfrac12 \\Sigma_{diag} + \\hat D \\hat D^\\top / (2(K-1))`."""
        k = self.deviations.shape[1]
        low_rank = self.deviations.transpose(1, 2) @ self.deviations / (2 * max(k - 1, 1))
        return torch.diag_embed(0.5 * self.diagonal) + low_rank

    def sample(self, num_samples: int, generator=None) -> torch.Tensor:
        """``(R, S, d)`` draws."""
        runs, k, d = self.deviations.shape
        opts = {"generator": generator, "dtype": self.mean.dtype, "device": self.mean.device}
        z1 = torch.randn(runs, num_samples, d, **opts)
        z2 = torch.randn(runs, num_samples, k, **opts)
        diag_part = z1 * self.diagonal.clamp_min(0).sqrt().unsqueeze(1) / math.sqrt(2)
        low_rank = (z2 @ self.deviations) / math.sqrt(2 * max(k - 1, 1))
        return self.mean.unsqueeze(1) + diag_part + low_rank


def swag_moments(iterates: torch.Tensor, rank: int) -> SWAGMoments:
    """The SWAG moments from collected iterates ``(R, T, d)`` (each run's snapshots in order),
    keeping the deviations of the last ``rank`` of them from the running mean at their time."""
    if iterates.dim() != 3 or iterates.shape[1] < 2:
        raise ValueError(f"need iterates of shape (runs, T >= 2, dim), got {tuple(iterates.shape)}")
    t = iterates.shape[1]
    counts = torch.arange(1, t + 1, dtype=iterates.dtype, device=iterates.device).reshape(1, -1, 1)
    running_mean = iterates.cumsum(1) / counts
    mean = running_mean[:, -1]
    diagonal = (iterates**2).mean(1) - mean**2
    deviations = (iterates - running_mean)[:, -min(rank, t):]
    return SWAGMoments(mean, diagonal.clamp_min(0), deviations)


@dataclass
class SWAGPosterior(Posterior):
    """SWAG draws, one chain per run (``{site: (R, S, *shape)}``), with the Gaussian's
    ``moments`` in the unconstrained space (saved with the draws, so that a loaded posterior can
    draw more: :meth:`sample`)."""

    moments: SWAGMoments = None
    family: str = "swag"

    def _extra_state(self) -> dict:
        m = self.moments
        return {"mean": m.mean.detach().cpu(), "diagonal": m.diagonal.detach().cpu(), "deviations": m.deviations.detach().cpu()}

    @classmethod
    def _from_saved(cls, fields, extra, model):
        device = model.device
        moments = SWAGMoments(extra["mean"].to(device), extra["diagonal"].to(device), extra["deviations"].to(device))
        return cls(**fields, model=model, moments=moments)

    def sample(self, num_samples: int, seed: int = 0) -> dict:
        """``num_samples`` new draws per run from the SWAG Gaussian, ``{site: (R, S, *shape)}``."""
        check_positive_int("num_samples", num_samples)
        model = self._require_model("sample")
        generator = torch.Generator(device=self.moments.mean.device).manual_seed(seed)
        return FlatPotential(model).unpack_draws(self.moments.sample(num_samples, generator))

    def _diagnostics(self) -> list:
        out = super()._diagnostics()
        loss = self.stats.get("epoch_loss")
        if isinstance(loss, torch.Tensor) and loss.numel():
            out.append(f"SGD's training loss per point: {loss[0]:.4g} after the first epoch, {loss[-1]:.4g} after the last")
        rank = self.moments.deviations.shape[1] if self.moments is not None else 0
        out.append(f"covariance: diagonal plus rank {rank} (deviations of the last iterates)")
        return out


@checked("swag")
def swag(
    model,
    x,
    y,
    *,
    num_epochs: int = 50,
    lr="auto",
    momentum: float = 0.9,
    batch_size: int = 128,
    rank: int = 20,
    num_samples: int = 100,
    num_runs: int = 1,
    map_estimate=None,
    map_options=None,
    seed: int = 0,
    progress: bool = True,
    checkpoint=None,
) -> SWAGPosterior:
    """SWAG on ``model`` given ``(x, y)``.

    :param num_epochs: epochs of SGD from the MAP; one iterate is collected after each.
    :param lr: SGD's constant learning rate on the negative log joint divided by the number of
        training points (so it means the same at any data size), with ``momentum``; ``"auto"``:
        ``AUTO_LR`` over the largest curvature of that loss at the MAP
        (:func:`~pyrobnn.infer.core.curvature.largest_curvature`, the largest over runs).
    :param batch_size: points per SGD minibatch.
    :param rank: :math:`K`, deviation columns kept.
    :param num_samples: draws per run from the SWAG Gaussian kept in the result (more later:
        :meth:`SWAGPosterior.sample`).
    :param seed: seeds the MAP trained here, SGD's data order and the draws.
    :param progress: show a progress bar.
    :param num_runs: independent SWAG runs, each from its own MAP member (MultiSWAG).
    :param checkpoint: a file to write the run's state to (the SGD phase's position, momentum,
        data order and snapshots), every ``every`` epochs or ``seconds`` of a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing`
        seconds and at the end; the same call with the same file resumes from it and gives the
        uninterrupted run's posterior (:mod:`pyrobnn.infer.core.checkpoints`). A MAP trained here
        checkpoints to ``<checkpoint>.map``.
    :param map_estimate: an :class:`~pyrobnn.infer.modes.ensemble.EnsemblePosterior` of ``num_runs``
        members; default: trained here (``deep_ensemble(objective="map", **map_options)``).
    """
    checkpoint = Checkpointing.of(checkpoint)
    x, y = training_data(model, x, y)
    settings_given = dict(
        num_epochs=num_epochs, lr=lr, momentum=momentum, batch_size=batch_size, rank=rank, num_samples=num_samples,
        num_runs=num_runs, map_options=map_options, seed=seed,
    )
    if map_estimate is None:
        options = {"progress": False, **(map_options or {})}
        if checkpoint is not None:  # the MAP's training resumes too
            options.setdefault("checkpoint", checkpoint.with_suffix(".map"))
        map_estimate = deep_ensemble(model, x, y, num_members=num_runs, objective="map", seed=seed, **options)
    if not isinstance(map_estimate, EnsemblePosterior) or map_estimate.num_chains != num_runs:
        raise ValueError(f"map_estimate must be an EnsemblePosterior of num_runs={num_runs} members")
    with flat_problem(model, x, y, seed) as problem:
        y, potential, generator = problem.y, problem.potential, problem.generator
        z = torch.nn.Parameter(potential.pack({k: v[:, 0] for k, v in map_estimate.samples.items()}))
        n = x.shape[0]
        if lr == "auto":
            lr = AUTO_LR * n / float(largest_curvature(potential, z.detach()).max())
        # fused: a failed step is skipped on the device (the policy of pyrobnn.infer.core.minibatch)
        optimizer = torch.optim.SGD([z], lr=lr, momentum=momentum, fused=z.device.type in ("cpu", "cuda"))
        loop = MinibatchLoop(n, batch_size, seed, x.device, advice=f"Lower lr (now {lr:.3g}).")
        snapshots, epoch_losses, first_epoch = [], [], 0
        run = None
        if checkpoint is not None:
            run = RunCheckpoint.of_run(checkpoint, "SWAG", settings_given, model, (x, y), z)
            saved = run.load()
            if saved is not None:
                z.data = saved["z"].to(z.device)
                optimizer.load_state_dict(saved["optimizer"])
                loop.load_state_dict(saved["loop"])
                snapshots = list(saved["snapshots"].to(z.device).unbind(1))
                epoch_losses = list(saved["epoch_losses"])
                first_epoch = len(snapshots)
        start = time.perf_counter()
        bar = tqdm(total=num_epochs, initial=first_epoch, disable=not progress, desc="SWAG", unit="epoch", dynamic_ncols=True)
        with watching(run):
            try:
                for epoch in range(first_epoch, num_epochs):
                    total = torch.zeros((), dtype=z.dtype, device=z.device)
                    for idx in loop.epoch_batches():
                        if run is not None and run.stop_overdue():
                            raise run.interrupted(epoch, "epochs")
                        loss = -minibatch_log_joint(potential, z, x[idx], y[idx], n) / n
                        optimizer.zero_grad(set_to_none=True)
                        loss.sum().backward()
                        loop.optimizer_step(optimizer, loss, [z])
                        total += loss.detach().sum() * idx.shape[0] / n
                    loop.end_epoch([z])
                    epoch_losses.append(float(total) / num_runs)
                    snapshots.append(z.detach().clone())
                    bar.update(1)
                    if run is not None:
                        run.after(epoch + 1, lambda: {
                            "z": z.detach().cpu(), "optimizer": optimizer.state_dict(), "loop": loop.state_dict(),
                            "snapshots": torch.stack(snapshots, 1).cpu(), "epoch_losses": list(epoch_losses),
                        }, last=epoch + 1 == num_epochs, unit="epochs")
            finally:
                bar.close()
        if epoch_losses[-1] > 2 * abs(epoch_losses[0]) + 0.1:
            warnings.warn(
                f"SWAG's SGD moved away from the MAP: the training loss per point rose from {epoch_losses[0]:.4g} "
                f"(first epoch) to {epoch_losses[-1]:.4g} (last); the Gaussian describes where it went, not the "
                f"MAP's neighbourhood. Lower lr (now {lr:.3g})."
            )
        moments = swag_moments(torch.stack(snapshots, 1), rank)
        draws = moments.sample(num_samples, generator)
        seconds = time.perf_counter() - start
        samples = potential.unpack_draws(draws)
    label = "SWAG" if num_runs == 1 else f"MultiSWAG ({num_runs} runs)"
    stats = {"lr": float(lr), "epoch_loss": torch.tensor(epoch_losses, device="cpu")}
    settings = dict(settings_given, map_estimate=map_estimate)
    return SWAGPosterior(samples, stats, seconds, label, settings=settings, model=model, moments=moments)


def _warm_start(model, previous, x, y, options, fraction, seed):
    """A refit from each run's SWAG mean: a MAP trained from it for ``fraction`` of the cold fit's
    epochs (SWAG's own epochs are scaled by the declaration)."""
    start = previous.moments.mean  # (runs, dim): each run's SWAG mean, unconstrained
    return dict(options, map_estimate=warm_map(model, x, y, start, start.shape[0], options.get("map_options"), fraction, seed))


register(MethodSpec(
    "swag", "SWAG: a Gaussian (diagonal + low rank) from SGD's iterates around the MAP", "swag", swag, latent_only_support(),
    budgets={"num_epochs": 2, "batch_size": 1, "rank": 1, "num_samples": 1, "num_runs": 1},
    constraints={"lr": Either(Positive(), "auto"), "momentum": Interval(0.0, 1.0, "left")},
    quick={"num_epochs": 2, "batch_size": 16, "num_samples": 4, "map_options": {"max_epochs": 2, "progress": False}, "progress": False},
    bo_options=dict(num_epochs=100, rank=10, num_samples=64, batch_size=32, map_options=dict(max_epochs=1000, lr=1e-2, batch_size=None, patience=1000)),
    # the limit's network (its activation and mean) moved the median regret (5 seeds, 42 evaluations)
    # on all four development problems: Branin -0.47 to -0.97, Hartmann-6 +0.29 to +0.24,
    # Ackley-10 +1.30 to +1.26, Levy-20 +2.10 to +2.02 (docs/bayesopt.md, "IVON and SWAG take their limit's network")
    bo_limit_network=True,
    warm_start=WarmStart(init=None, prepare=_warm_start, scaled=("num_epochs",), names=("map_estimate", "map_options")),
))
