r"""Deep ensembles of a BayesianModel, trained as one batched computation, and
ensemble-initialized sampling.

A deep ensemble (Lakshminarayanan, Pritzel & Blundell 2017) is :math:`K` copies of the network
trained from independent initializations; its predictive is the equal-weight mixture
:math:`\frac1K \sum_k p(y \mid x, w_k)`. Here the members are the rows of one ``(K, dim)``
tensor of the model's latent sites (in the unconstrained space of
:class:`~pyrobnn.infer.core.potential.FlatPotential`) and every step is one vmapped pass of the
network over all members, not a loop over :math:`K` models. Since the loss is a sum over
members and AdamW acts element-wise, each member follows exactly the path it would follow alone.

The objective per member is either the negative log joint (``objective="map"``: the model's
prior, and the log-Jacobian of any constrained latent site, plus the likelihood, MAP in the
unconstrained space) or the negative log-likelihood alone (``"likelihood"``; AdamW's weight
decay is then the only regularizer, as in the MILE protocol), or the **anchored** (randomized MAP)
objective ``"anchored"``: member :math:`k` draws an anchor :math:`a_k \sim p(w)` from the
Gaussian prior and perturbed targets :math:`\tilde y_k = y + \sigma \epsilon_k`,
:math:`\epsilon_k \sim N(0, I)`, and minimizes :math:`-\log N(\tilde y_k; f(x, w), \sigma^2) -
\log p(w - a_k)`, starting from its anchor (Pearce et al.'s algorithm). For a model linear in
its weights each member is then an exact, independent draw of the posterior (perturb-and-MAP:
Papandreou & Yuille 2010; randomized prior functions: Osband et al. 2018, NeurIPS; anchored
ensembles: Pearce et al. 2020, AISTATS), so away from the data the members disagree as much as
the prior does; a MAP ensemble's members agree there and are over-confident. A network is not
linear, and a member keeps much of where it started in the directions the data do not
determine: started at the network's own initialization (PyTorch's, weights of standard deviation
0.58/sqrt(fan-in), below a calibrated prior's), the members agreed more than their anchors and
the ensemble was over-confident at 20 points (docs/bayesopt.md, "Anchored members start at
their anchors"). All three objectives are divided by the number of training points, so that
learning rates mean the same at any data size; minibatches scale the likelihood by :math:`N / B`.

Ensemble-initialized sampling (Sommer et al. 2024, ICML, "Connecting the dots"; Sommer et al.
2025, ICLR, MILE) then starts one sampling chain at each member: the chains begin in regions of
high posterior density, each explores its own, and the predictive is the mixture over chains
and draws.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field

import torch

from pyrobnn.infer.core import native as native_kernels
from pyrobnn.infer.core.checkpoints import Checkpointing, RunCheckpoint, watching
from pyrobnn.infer.core.execution import ExecutionPath
from pyrobnn.infer.core.minibatch import MinibatchLoop, minibatch_log_joint
from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.infer.core.problem import flat_problem
from pyrobnn.infer.core.processes import concat_rows, run_in_processes, split_rows
from pyrobnn.infer.core.starts import initial_positions, member_initializations
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.methods import MethodSpec, WarmStart, checked, latent_only_support, register, scaled_budget
from pyrobnn.models.likelihoods import GaussianLikelihood
from pyrobnn.models.priors import NormalPrior
from pyrobnn.utils.constraints import Budget, Either, Interval, NonNegative, OneOf, Positive, PositiveInt
from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.validation import validate_training_data

__all__ = ["EnsemblePosterior", "deep_ensemble", "train_members", "warm_map", "anchored_log_joint", "anchored_refusal", "anchored_draws",
           "gradient_path", "BACKENDS"]


@dataclass
class EnsemblePosterior(Posterior):
    """A deep ensemble as posterior draws: ``samples[name]`` has shape ``(K, 1, *shape)``, one
    chain of one draw per member, so :func:`pyrobnn.predict` (the equal-weight mixture),
    ``pyro.infer.Predictive(model, posterior_samples=result.flat_samples())`` and
    :func:`pyrobnn.infer.results.diagnostics.inference_data` take it as they take MCMC draws, and the samplers
    take it as starting positions (``init=``).

    ``stats`` holds per member the best validation negative log-likelihood per point
    (``val_nll``; training loss when there is no validation data), the epoch it was reached
    (``best_epoch``) and the epochs trained (``epochs``); ``history`` the validation (or
    training) loss of every member after every epoch, ``(epochs, K)``."""

    history: torch.Tensor = field(default_factory=lambda: torch.zeros(0, device="cpu"))
    family: str = "ensemble"

    @property
    def num_members(self) -> int:
        return self.num_chains

    def _extra_state(self) -> dict:
        return {"history": self.history.detach().cpu()}

    @classmethod
    def _from_saved(cls, fields, extra, model):
        return cls(**fields, model=model, history=extra["history"])

    def _diagnostics(self) -> list:
        out = super()._diagnostics()
        for key, what in (("val_nll", "best validation NLL per point"), ("train_loss", "final training loss per point")):
            value = self.stats.get(key)
            if isinstance(value, torch.Tensor):
                out.append(f"{what} per member: {[round(v, 4) for v in value.tolist()]}")
        if isinstance(self.stats.get("epochs"), torch.Tensor):
            out.append(f"epochs trained per member: {self.stats['epochs'].tolist()}")
        return out

    def member(self, k: int) -> "EnsemblePosterior":
        """Member ``k`` alone, as a one-member ensemble (e.g. the MAP that Laplace or SWAG start from)."""
        if not -self.num_members <= k < self.num_members:
            raise IndexError(f"member {k} out of range for an ensemble of {self.num_members}")
        k = k % self.num_members
        return EnsemblePosterior(
            {name: v[k : k + 1] for name, v in self.samples.items()}, {}, self.seconds, f"{self.method}, member {k}",
            settings=self.settings, model=self.model,
        )


def train_members(
    potential,
    z_init,
    x,
    y,
    x_val=None,
    y_val=None,
    *,
    objective: str = "map",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    batch_size=None,
    max_epochs: int = 500,
    patience: int = 10,
    seed: int = 0,
    progress: bool = True,
    checkpoint=None,
    anchors=None,
    targets=None,
    path: str = "eager",
):
    r"""Train the members ``z_init`` (``(K, dim)``) with AdamW in one batched computation.
    ``objective="anchored"`` takes each member's anchor ``anchors`` ``(K, dim)`` and perturbed
    targets ``targets`` ``(K, *y.shape)`` (:func:`anchored_draws`). ``path="native"`` evaluates
    the loss and its gradient by the native kernels
    (:class:`~pyrobnn.infer.core.native.NativeMLP` of ``potential``, which holds ``(x, y)``),
    for ``objective="map"`` or ``"anchored"`` on full batches (:func:`gradient_path` decides):
    the anchored loss of member :math:`k` is the potential :math:`U_k` of its own targets plus
    :math:`\log p(z) - \log p(z - a_k) = -\sum_j (z_j a_{kj} - a_{kj}^2/2) / s_j^2` for Gaussian
    priors of scales :math:`s_j`, whose gradient is :math:`-a_{kj} / s_j^2`.

    Every epoch visits the training points in a fresh random order (the same for all members,
    from ``seed``), in minibatches of ``batch_size`` (all points if ``None``). With validation
    data, each member's validation negative log-likelihood per point is measured after each
    epoch; the member keeps its best state, and stops (its rows frozen) after ``patience``
    epochs without improvement. A non-finite step is handled by the one policy of
    :mod:`pyrobnn.infer.core.minibatch` (skipped, and reported at the end of the epoch).
    ``checkpoint``: a :class:`~pyrobnn.infer.core.checkpoints.RunCheckpoint` to resume from and
    write to (once per epoch when due). Returns ``(z, stats, history)``. The arguments are those
    :func:`deep_ensemble` checked (its declaration's constraints).
    """
    n = x.shape[0]
    if batch_size is None:
        batch_size = n
    natives = precision = None
    if path == "native":
        if objective not in ("map", "anchored") or batch_size < n or potential.x.shape[0] != n:
            raise ValueError(f"the native path trains objective='map' or 'anchored' on full batches of the potential's data, "
                             f"got objective={objective!r}, batch_size={batch_size} of {n} points")
        if objective == "map":
            natives = [native_kernels.NativeMLP(potential, threads=1)]
        else:  # one potential per member, of its own perturbed targets
            natives = [native_kernels.NativeMLP(FlatPotential(potential.model, x, t), threads=1) for t in targets]
            precision = _prior_precisions(potential)
    members = z_init.shape[0]
    z = torch.nn.Parameter(z_init.detach().clone())
    # fused: a failed step is skipped on the device, without a host synchronization
    optimizer = torch.optim.AdamW([z], lr=lr, weight_decay=weight_decay, fused=z.device.type in ("cpu", "cuda"))
    loop = MinibatchLoop(n, batch_size, seed, x.device, advice=f"Lower lr (now {lr}).")
    validate = x_val is not None
    best = z_init.detach().clone()
    best_loss = torch.full((members,), math.inf, dtype=z.dtype, device=z.device)
    best_epoch = torch.zeros(members, dtype=torch.long, device=z.device)
    active = torch.ones(members, dtype=torch.bool, device=z.device)
    epochs = torch.zeros(members, dtype=torch.long, device=z.device)
    history = []
    start_epoch, done = 0, False
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        device = z.device
        z.data = saved["z"].to(device)
        optimizer.load_state_dict(saved["optimizer"])
        loop.load_state_dict(saved["loop"])
        best, best_loss, active = saved["best"].to(device), saved["best_loss"].to(device), saved["active"].to(device)
        best_epoch, epochs = saved["best_epoch"], saved["epochs"]
        history = list(saved["history"])
        start_epoch, done = int(saved["epoch"]), bool(saved["done"])

    def state(finished):
        return {
            "epoch": epoch + 1, "done": finished, "z": z.detach().cpu(), "optimizer": optimizer.state_dict(), "loop": loop.state_dict(),
            "best": best.cpu(), "best_loss": best_loss.cpu(), "best_epoch": best_epoch, "active": active.cpu(), "epochs": epochs,
            "history": torch.stack(history),
        }

    bar = tqdm(total=max_epochs, initial=start_epoch, disable=not progress, desc="deep ensemble", unit="epoch", dynamic_ncols=True)
    with watching(checkpoint):
        try:
            for epoch in range(start_epoch, 0 if done else max_epochs):
                train_loss = torch.zeros(members, dtype=z.dtype, device=z.device)
                for idx in loop.epoch_batches():
                    if checkpoint is not None and checkpoint.stop_overdue():
                        raise checkpoint.interrupted(epoch, "epochs")
                    if natives is not None:  # the full batch, whatever its order: U(z) and its gradient
                        point = z.detach()
                        if precision is None:
                            energy, grad = natives[0].value_and_grad(point)
                        else:
                            parts = [native.value_and_grad(point[k : k + 1]) for k, native in enumerate(natives)]
                            energy, grad = torch.cat([u for u, _ in parts]), torch.cat([g for _, g in parts])
                            energy = energy - (precision * (point - 0.5 * anchors) * anchors).sum(-1)
                            grad = grad - precision * anchors
                        per_member = energy / n
                        z.grad = grad / n
                    else:
                        if objective == "anchored":
                            per_member = -anchored_log_joint(potential, z, anchors, x[idx], targets[:, idx], n) / n
                        else:
                            per_member = -minibatch_log_joint(potential, z, x[idx], y[idx], n, prior=objective == "map") / n
                        optimizer.zero_grad(set_to_none=True)
                        per_member.sum().backward()
                    loop.optimizer_step(optimizer, per_member, [z])
                    with torch.no_grad():
                        # stopped members stay where they stopped (their AdamW moments move on unused)
                        z.data = torch.where(active.unsqueeze(-1), z.data, best)
                    train_loss += per_member.detach() * idx.shape[0] / n
                loop.end_epoch([z])
                epochs += active.cpu().long()
                with torch.no_grad():
                    loss = -potential.pointwise_log_likelihood(z, x_val, y_val).mean(-1) if validate else train_loss
                history.append(loss.detach().cpu())
                improved = active & (loss < best_loss)
                best = torch.where(improved.unsqueeze(-1), z.detach(), best)
                best_loss = torch.where(improved, loss.detach(), best_loss)
                best_epoch = torch.where(improved.cpu(), torch.full_like(best_epoch, epoch + 1), best_epoch)
                if validate:
                    active = active & ((epoch + 1 - best_epoch.to(z.device)) < patience)
                bar.set_postfix({"loss": f"{loss.mean().item():.3f}", "training": int(active.sum())}, refresh=False)
                bar.update(1)
                finished = not bool(active.any()) or epoch + 1 == max_epochs
                if checkpoint is not None:
                    checkpoint.after(epoch + 1, lambda: state(finished), last=finished, unit="epochs")
                if finished:
                    break
        finally:
            bar.close()
            for native in natives or ():
                native.close()
    if not validate:
        best = z.detach().clone()
    stats = {"val_nll" if validate else "train_loss": best_loss.cpu(), "best_epoch": best_epoch, "epochs": epochs}
    return best, stats, torch.stack(history)


def _prior_precisions(potential) -> torch.Tensor:
    """The Gaussian weight priors' precisions :math:`1/s_j^2`, one per coordinate of
    ``potential``'s flat weights ``(dim,)`` (its sites all have Normal priors and it no latent
    sites: :func:`anchored_refusal`)."""
    model = potential.model
    blocks = [torch.full((site.shape.numel(),), model.site_prior(site).site_scale(site) ** -2.0, dtype=model.dtype, device=model.device)
              for site in potential.sites]
    return torch.cat(blocks)


def anchored_log_joint(potential, z, anchors, x, targets, dataset_size: int):
    r"""Per member :math:`k`, :math:`\log p(z_k - a_k) + \frac{N}{B} \sum_{n \in \mathcal B}
    \log N(\tilde y_{kn}; f(x_n, z_k), \sigma^2)`: the anchored (randomized MAP) log joint of the
    batch ``x`` with each member's own perturbed targets ``targets`` ``(K, B, ...)``."""
    members = z.shape[0]
    _, log_lik = potential.log_joint_terms(z, x.expand((members,) + tuple(x.shape)), targets, batched_inputs=True)
    return potential.log_weight_prior(z - anchors) + (dataset_size / x.shape[0]) * log_lik


def anchored_refusal(model):
    """Why ``objective="anchored"`` cannot run on ``model`` (``None`` when it can): its anchors are
    draws of zero-mean Gaussian weight priors and its target noise the likelihood's fixed
    Gaussian noise scale."""
    if not isinstance(model.likelihood, GaussianLikelihood) or model.likelihood.noise_kind != "fixed":
        return ("objective='anchored' perturbs the targets with the likelihood's noise: it needs a GaussianLikelihood with a fixed "
                f"scale, got {type(model.likelihood).__name__} ({getattr(model.likelihood, 'noise_kind', 'no noise scale')}); "
                "objective='map' trains MAP members instead")
    others = [s.name for s in model.sites if not isinstance(model.site_prior(s), NormalPrior)]
    if others:
        return (f"objective='anchored' draws its anchors from zero-mean Gaussian priors: the sites {others} have other priors; "
                "objective='map' trains MAP members instead")
    return None


def anchored_draws(model, potential, y, members: int, seed: int):
    """Each member's anchor (a draw of the weight priors, ``(K, dim)``) and perturbed targets
    (``y`` plus the noise scale times standard normals, ``(K, *y.shape)``), drawn on the host
    under ``seed`` (the same on every device) and moved to the model's."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype, device = model.dtype, model.device
    blocks = []
    for site in potential.sites:
        scale = model.site_prior(site).site_scale(site)
        blocks.append(scale * torch.randn((members, site.shape.numel()), generator=g, dtype=dtype, device="cpu"))
    anchors = torch.cat(blocks, 1).to(device)
    noise = model.likelihood.scale().detach().to("cpu", dtype)
    targets = y.to("cpu", dtype) + noise * torch.randn((members,) + tuple(y.shape), generator=g, dtype=dtype, device="cpu")
    return anchors, targets.to(device)


@checked("deep_ensemble")
def deep_ensemble(
    model,
    x,
    y,
    *,
    num_members: int = 12,
    x_val=None,
    y_val=None,
    validation: float = 0.0,
    objective: str = "map",
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    batch_size=32,
    max_epochs: int = 500,
    patience: int = 10,
    seed: int = 0,
    progress: bool = True,
    num_processes: int = 1,
    checkpoint=None,
    init=None,
    backend: str = "auto",
) -> EnsemblePosterior:
    """A deep ensemble of ``num_members`` members of ``model`` trained on ``(x, y)``.

    :param x_val: validation data for early stopping; or ``validation``, the fraction of
        ``(x, y)`` to hold out for it (a seeded random subset); with neither, members train for
        ``max_epochs``.
    :param y_val: see ``x_val``.
    :param objective: ``"map"`` (log joint: the model's prior and likelihood),
        ``"likelihood"`` (the likelihood alone) or ``"anchored"`` (randomized MAP: each member
        its own prior draw as the prior's centre and its own perturbed targets; a Gaussian
        likelihood with a fixed noise scale and Normal priors); see the module docstring.
    :param lr: AdamW's learning rate, on the objective divided by the number of training points.
    :param batch_size: points per minibatch (``None``: all of them, full batch).
    :param max_epochs: the most epochs a member trains.
    :param patience: epochs without a better validation loss after which a member stops (with
        validation data).
    :param progress: show a progress bar.
    :param weight_decay: AdamW's decoupled weight decay (MILE: ``1e-3`` with
        ``objective="likelihood"``).
    :param seed: member ``k`` starts from the network's initialization under the seed
        ``seed + k``, or with ``objective="anchored"`` at its anchor (the anchors and perturbed
        targets drawn under ``seed``, :func:`anchored_draws`); the data order follows ``seed``.
    :param num_processes: train the members in this many groups, one process each
        (:mod:`pyrobnn.infer.core.processes`); every member follows the path it follows in one
        process (the same initialization and data order), up to floating-point rounding.
    :param checkpoint: a file to write the training state to, or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` epochs or
        ``seconds`` seconds), and at the end; the same call with the same
        file resumes from it and trains the members an uninterrupted run trains
        (:mod:`pyrobnn.infer.core.checkpoints`). With ``num_processes``, each process writes its own
        file, ``<checkpoint>.group<i>-of-<k>``.
    :param init: where the members start instead of their default (the network's own
        initialization; with ``objective="anchored"``, each member's anchor): a
        :class:`~pyrobnn.infer.results.posterior.Posterior` with ``num_members`` chains (the last
        draw of each: a previous ensemble's members, a sampler's last draws), or a tensor of
        unconstrained positions ``(num_members, dim)``. A warm start, e.g. to refit after new data
        arrive (:mod:`pyrobnn.integrations.botorch`).
    :param backend: the code that evaluates each step's loss and gradient (:func:`gradient_path`):
        ``"auto"`` takes the samplers' native kernels where they apply (``objective="map"`` or
        ``"anchored"`` on full batches of a common Bayesian MLP on the CPU, with a C++ compiler)
        and torch otherwise; ``"native"`` or ``"eager"`` names one (``"native"`` is refused, with the
        reason, where it does not apply). Both give the same members up to floating-point
        rounding; ``stats["path"]`` and ``stats["path_reason"]`` say which ran and why.
    :returns: an :class:`EnsemblePosterior`: the members as ``(K, 1, *shape)`` draws.

    Example::

        ensemble = deep_ensemble(model, x, y, num_members=12, validation=0.1)
        pred = pyrobnn.predict(model, ensemble, x_test, num_samples=None)   # the mixture
    """
    checkpointing = Checkpointing.of(checkpoint)
    held_out = "x_val, y_val" if x_val is not None else validation
    x, y = validate_training_data(model, x, y)
    if objective == "anchored" and (reason := anchored_refusal(model)) is not None:
        raise ValueError(reason)
    if validation:
        n_val = max(1, round(validation * x.shape[0]))
        if n_val >= x.shape[0]:
            raise ValueError(f"validation={validation} leaves no training points")
        perm = torch.randperm(x.shape[0], generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu").to(x.device)  # one split per seed on every device
        x_val, y_val, x, y = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
    if x_val is not None:
        x_val, y_val = validate_training_data(model, x_val, y_val)
    device, dtype = model.device, model.dtype
    with flat_problem(model, x, y, seed) as problem:
        x, potential = problem.x, problem.potential
        if x_val is not None:
            x_val, y_val = potential.check_data(x_val.to(device, dtype), y_val.to(device))
        y_checked = potential.y
        anchors = targets = None
        if objective == "anchored":
            anchors, targets = anchored_draws(model, potential, y_checked, num_members, seed)
        if init is None:
            z0 = anchors.clone() if anchors is not None else member_initializations(model, potential, num_members, seed)
        else:
            z0 = initial_positions(potential, init, num_members, 0.0, None)
            if z0.shape[0] != num_members:
                raise ValueError(f"init gives {z0.shape[0]} starting points; num_members={num_members} needs one per member")
        path = gradient_path(backend, potential, objective, batch_size)
        start = time.perf_counter()
        options = dict(
            objective=objective, lr=lr, weight_decay=weight_decay, batch_size=batch_size, max_epochs=max_epochs,
            patience=patience, seed=seed,
        )
        def run_checkpoint(rows, suffix=""):
            if checkpointing is None:
                return None
            return RunCheckpoint.of_run(checkpointing.with_suffix(suffix), "deep ensemble", options, model, (x, y_checked, x_val, y_val), rows)

        if num_processes == 1:
            z, stats, history = train_members(
                potential, z0, x, y_checked, x_val, y_val, progress=progress, checkpoint=run_checkpoint(z0), anchors=anchors,
                targets=targets, path=path.kind, **options
            )
        else:
            groups = split_rows(z0, num_processes)
            parts = [(None, None)] * len(groups)
            if anchors is not None:  # each group its members' anchors and targets
                parts = list(zip(split_rows(anchors, num_processes), split_rows(targets, num_processes)))
            calls = [
                ((potential, g, x, y_checked, x_val, y_val),
                 dict(options, progress=False, checkpoint=run_checkpoint(g, f".group{i}-of-{len(groups)}"), anchors=a, targets=t,
                      path=path.kind))
                for i, (g, (a, t)) in enumerate(zip(groups, parts))
            ]
            results = run_in_processes(train_members, calls, progress=progress, desc=f"deep ensemble, {len(groups)} processes")
            z = torch.cat([r[0] for r in results], 0)
            stats = concat_rows([r[1] for r in results])
            history = _join_histories([r[2] for r in results], [r[1]["val_nll" if x_val is not None else "train_loss"] for r in results])
        seconds = time.perf_counter() - start
        samples = potential.unpack_draws(z.detach().unsqueeze(1))
    stats = {**stats, **path.stats()}
    label = {"map": "deep ensemble (MAP)", "likelihood": "deep ensemble (likelihood)", "anchored": "deep ensemble (anchored, randomized MAP)"}[objective]
    settings = dict(
        num_members=num_members, validation=held_out, num_processes=num_processes, **options,
        init=init, backend=backend,
    )
    return EnsemblePosterior(samples, stats, seconds, label, settings=settings, model=model, history=history)


#: the values ``backend=`` takes (:func:`gradient_path` says what each runs)
BACKENDS = ("auto", "native", "eager")


def gradient_path(backend: str, potential, objective: str, batch_size) -> ExecutionPath:
    """The code that evaluates the members' loss and gradient in :func:`train_members` on
    ``potential``'s data: the native kernels (:mod:`pyrobnn.infer.core.native`: the potential
    :math:`U(z)`, the negative log joint, and its gradient by hand-written backpropagation, a
    member's evaluation in one pass) or torch's autograd (``"eager"``). ``backend="auto"``
    takes the native kernels wherever they apply, by a rule on the model and the run (never on
    timings or a cache): ``objective="map"`` or ``"anchored"`` (their :math:`U` is the MAP
    objective times the number of points; :func:`train_members` shifts it to each member's
    anchor and targets), full batches (``batch_size`` ``None`` or at least the points: they
    evaluate the whole data), a model :func:`~pyrobnn.infer.core.native.unsupported_reason`
    accepts, a C++ compiler found and the library built or loaded (a library the loader refuses
    leaves the torch path, saying why, as in the samplers' rule). ``"native"`` is refused, naming
    the reason, where they do not apply. On the Bayesian-optimization surrogates' 50-50 erf network at 30-42 points a warm
    refit's step (its set-up included) took 1.7-1.8 ms through torch and 0.38-0.42 ms native for
    one member, 2.6-3.1 ms and 0.85-0.91 ms for 8 anchored members (``benchmarks/map_paths.py``;
    docs/bayesopt.md, "The MAP's steps in the native kernels")."""
    if backend == "eager":
        return ExecutionPath("eager", "backend='eager'")
    n = potential.x.shape[0]
    if objective == "likelihood":
        reason = "objective='likelihood' (the native kernels evaluate the log joint, with the prior)"
    elif batch_size is not None and batch_size < n:
        reason = f"batch_size={batch_size} < {n} points (the native kernels evaluate the full data)"
    else:
        reason = native_kernels.native_refusal(potential.model, potential.x)
    if backend == "native":
        if reason is not None:
            raise ValueError(f"backend='native' does not apply to this run: {reason}; use backend='eager' or 'auto'")
        _, record = native_kernels.library()  # raises NativeUnavailable where it cannot be built or loaded
        return ExecutionPath("native", f"backend='native'; {native_kernels.loading_note(record)}")
    if reason is None:
        try:
            _, record = native_kernels.library()  # built or loaded once per process; train_members' kernels find it
        except native_kernels.NativeUnavailable as e:
            reason = str(e)
    if reason is not None:
        return ExecutionPath("eager", f"backend='auto': the native kernels do not apply: {reason}")
    return ExecutionPath("native", f"backend='auto': full-batch {objective!r} objective of a network the native kernels take; "
                                   f"{native_kernels.loading_note(record)}")


def warm_map(model, x, y, start, num_members: int, map_options, fraction: float, seed: int) -> EnsemblePosterior:
    """The MAP of a refit on more data (the warm start of Laplace and SWAG): ``num_members``
    members trained from ``start`` (a result or positions, as ``init`` takes them) with
    ``map_options`` for ``fraction`` of their cold fit's epochs."""
    options = dict(map_options or {})
    default = inspect.signature(deep_ensemble).parameters["max_epochs"].default
    options["max_epochs"] = scaled_budget(options.get("max_epochs", default), fraction)
    options.setdefault("progress", False)
    return deep_ensemble(model, x, y, num_members=num_members, init=start, seed=seed, **options)


def _join_histories(histories: list, final: list) -> torch.Tensor:
    """Groups' ``(epochs_i, K_i)`` loss histories side by side. A group that stopped early is
    extended with ``final`` (its members' best validation loss): in one process the stopped
    members sit at their best state, whose loss that is, until every member has stopped."""
    epochs = max(h.shape[0] for h in histories)
    padded = [torch.cat([h, f.to(h.dtype).unsqueeze(0).expand(epochs - h.shape[0], -1)], 0) for h, f in zip(histories, final)]
    return torch.cat(padded, 1)


def _validation_data(options):
    if (options["x_val"] is None) != (options["y_val"] is None):
        return "give both x_val and y_val, or neither"
    if options["x_val"] is not None and options["validation"]:
        return "give either x_val/y_val or validation, not both"
    return None


register(MethodSpec(
    "deep_ensemble", "deep ensemble: members trained as one batched computation", "ensemble", deep_ensemble, latent_only_support(),
    budgets={"num_members": 1, "max_epochs": 1, "patience": 1, "batch_size": 1},
    constraints={
        "batch_size": Either(Budget(1), None), "validation": Interval(0.0, 1.0, "left", "a fraction"), "objective": OneOf(("map", "likelihood", "anchored")),
        "lr": Positive(), "weight_decay": NonNegative(), "num_processes": PositiveInt(), "backend": OneOf(BACKENDS),
    },
    rules=(_validation_data,),
    quick={"num_members": 2, "max_epochs": 2, "progress": False},
    # as a surrogate: anchored members disagree away from the data as the prior does, where MAP
    # members agree (benchmarks/bo_calibration.py); the calibrated default model fits its needs;
    # with its limit's network and each member started at its anchor, held-out NLL at n = 20
    # within 1.5x of the GP's on 8 of 8 problems (from the network's initialization 6 of 8; 16
    # members instead of 8 changed neither failure; docs/bayesopt.md, 2026-11-28)
    bo_options=dict(num_members=8, max_epochs=1000, lr=1e-2, batch_size=None, patience=1000, objective="anchored"),
    bo_limit_network=True,
    warm_start=WarmStart(init="init", count="num_members", scaled=("max_epochs",)),
))
