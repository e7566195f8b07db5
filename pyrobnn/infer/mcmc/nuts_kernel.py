"""The No-U-Turn Sampler for several chains as one batched computation, as a kernel of the one
runner (:mod:`pyrobnn.infer.core.runner`).

Multinomial NUTS with the generalized U-turn criterion (Hoffman & Gelman 2014; Betancourt
2017), in the iterative form of NumPyro (Phan et al. 2019): each iteration doubles the
trajectory in a random direction, building each new subtree leaf by leaf while checking the
U-turn criterion of every sub-subtree that the new leaf completes. The chains advance in
lockstep: one leapfrog step is one batched evaluation of the potential and its gradient for all
chains, and a chain whose trajectory has ended waits, masked, until the others finish.

Warm-up follows Stan (:class:`WindowAdaptation`): dual-averaging step size adaptation towards a
target acceptance statistic (0.8), and a diagonal inverse mass matrix estimated from the samples
of doubling windows (75-sample initial buffer, 50-sample final buffer), regularized towards 1e-3.

The kernel (:class:`NUTS`) is its state record (:class:`NUTSState`), ``init``, the random
numbers of one transition (:class:`NUTSRandoms`) and the pure transition :func:`nuts_step` over a
potential ``z -> (U, grad U)`` for ``z`` of shape ``(chains, dim)``; its adaptation is
:class:`WindowAdaptation` over :class:`WindowAdaptationState`, as BlackJAX's
``window_adaptation``. :func:`pyrobnn.infer.mcmc.samplers.nuts` connects them to a model.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from pyrobnn.infer.core.graphs import RecordedFunction
from pyrobnn.infer.core.integrators import MAX_DELTA_ENERGY, kinetic_energy, leapfrog
from pyrobnn.infer.core.kernel import Adaptation, Kernel
from pyrobnn.utils.runtime import compiled

__all__ = [
    "NUTSState", "NUTSSettings", "NUTSRandoms", "NUTSInfo", "Trajectory", "NUTS", "nuts_step", "nuts_transition", "native_nuts_step", "transition_uniforms",
    "find_step_size", "DualAveraging", "dual_averaging_init", "dual_averaging_update", "Welford", "welford_init", "welford_update",
    "welford_variance", "draws_variance", "warmup_windows", "WindowAdaptationState", "WindowAdaptation",
]


class NUTSState(NamedTuple):
    """Where each chain is: positions ``z`` ``(C, D)``, the potential ``energy`` ``(C,)`` and its
    gradient ``grad`` ``(C, D)`` there."""

    z: torch.Tensor
    energy: torch.Tensor
    grad: torch.Tensor


class NUTSSettings(NamedTuple):
    """What the warm-up sets for each transition: per-chain ``step_size`` ``(C,)`` and diagonal
    inverse mass matrix ``inv_mass`` ``(C, D)``."""

    step_size: torch.Tensor
    inv_mass: torch.Tensor


class NUTSRandoms(NamedTuple):
    """The random numbers of one transition: standard normal ``momentum`` ``(C, D)`` (scaled by
    the mass matrix in the step) and the ``uniforms`` of :func:`transition_uniforms`."""

    momentum: torch.Tensor
    uniforms: torch.Tensor


class NUTSInfo(NamedTuple):
    """Per chain, of one transition: the mean Metropolis ``accept_prob`` over the trajectory (what
    the step size adapts to), the ``tree_depth``, the leapfrog steps ``num_steps`` and whether
    it ``diverging``."""

    accept_prob: torch.Tensor
    tree_depth: torch.Tensor
    num_steps: torch.Tensor
    diverging: torch.Tensor


class Trajectory(NamedTuple):
    """A trajectory being doubled, per chain: its left and right ends (position, momentum,
    gradient), the proposal drawn from it so far (position, potential, gradient), its log weight
    and momentum sum, whether it is ``done`` (turned or diverged) or ``diverging``, its ``depth``,
    the acceptance sum and leapfrog steps so far, and the momenta and momentum sums stored at the
    U-turn checkpoints of the subtree being built (``(C, max_tree_depth, D)``)."""

    z_left: torch.Tensor
    r_left: torch.Tensor
    grad_left: torch.Tensor
    z_right: torch.Tensor
    r_right: torch.Tensor
    grad_right: torch.Tensor
    z_proposal: torch.Tensor
    energy_proposal: torch.Tensor
    grad_proposal: torch.Tensor
    log_weight: torch.Tensor
    r_sum: torch.Tensor
    done: torch.Tensor
    diverging: torch.Tensor
    depth: torch.Tensor
    accept_sum: torch.Tensor
    num_steps: torch.Tensor
    r_checkpoints: torch.Tensor
    r_sum_checkpoints: torch.Tensor


class Subtree(NamedTuple):
    """The subtree a doubling builds, per chain: its last leaf (position, momentum, gradient),
    the proposal drawn within it (position, potential, gradient), its log weight and momentum
    sum, whether it went ``bad`` (turned or diverged), the U-turn checkpoints, and the
    trajectory's acceptance sum, leapfrog steps and divergence, carried through the leaves."""

    z: torch.Tensor
    r: torch.Tensor
    grad: torch.Tensor
    z_proposal: torch.Tensor
    energy_proposal: torch.Tensor
    grad_proposal: torch.Tensor
    log_weight: torch.Tensor
    r_sum: torch.Tensor
    bad: torch.Tensor
    r_checkpoints: torch.Tensor
    r_sum_checkpoints: torch.Tensor
    accept_sum: torch.Tensor
    num_steps: torch.Tensor
    diverging: torch.Tensor


def _is_turning(inv_mass, r_left, r_right, r_sum):
    # generalized criterion: the velocities at both ends against the momentum sum, less half
    # of the end momenta (Betancourt 2017, appendix A.4.2; as in NumPyro and Stan)
    rho = r_sum - 0.5 * (r_left + r_right)
    return ((inv_mass * r_left * rho).sum(-1) <= 0) | ((inv_mass * r_right * rho).sum(-1) <= 0)


def _where(mask, a, b):
    return torch.where(mask.reshape(mask.shape + (1,) * (a.dim() - mask.dim())), a, b)


class _Leapfrog(NamedTuple):
    """What every leaf of one doubling shares: the signed step ``(C, 1)``, the inverse mass and
    the starting Hamiltonian ``h0``."""

    step: torch.Tensor
    inv_mass: torch.Tensor
    h0: torch.Tensor


def _leaf(potential, sub: Subtree, active, dynamics: _Leapfrog, log_u, check_slots) -> Subtree:
    """One leaf of a subtree for every chain: a leapfrog step, multinomial sampling within the
    subtree, and the U-turn checks of the sub-subtrees the leaf completes (``check_slots``, a
    mask over the checkpoints). Chains with ``active`` false are left unchanged."""
    z_new, r_new, u_new, g_new = leapfrog(potential, sub.z, sub.r, sub.grad, dynamics.step, dynamics.inv_mass)
    delta = u_new + kinetic_energy(r_new, dynamics.inv_mass) - dynamics.h0
    delta = torch.where(torch.isnan(delta), torch.full_like(delta, math.inf), delta)
    divergent = delta > MAX_DELTA_ENERGY
    accept_sum = sub.accept_sum + torch.where(active, torch.exp(torch.clamp(-delta, max=0.0)), 0.0)
    num_steps = sub.num_steps + active.to(sub.num_steps.dtype)
    new_log_weight = torch.logaddexp(sub.log_weight, -delta)
    take = active & (log_u < -delta - new_log_weight)
    r_sum = _where(active, sub.r_sum + r_new, sub.r_sum)
    block_sum = r_sum.unsqueeze(1) - sub.r_sum_checkpoints + sub.r_checkpoints
    turning = (_is_turning(dynamics.inv_mass.unsqueeze(1), sub.r_checkpoints, r_new.unsqueeze(1), block_sum) & check_slots).any(-1)
    return Subtree(
        z=_where(active, z_new, sub.z), r=_where(active, r_new, sub.r), grad=_where(active, g_new, sub.grad),
        z_proposal=_where(take, z_new, sub.z_proposal), energy_proposal=torch.where(take, u_new, sub.energy_proposal),
        grad_proposal=_where(take, g_new, sub.grad_proposal), log_weight=torch.where(active, new_log_weight, sub.log_weight),
        r_sum=r_sum, bad=sub.bad | (active & (turning | divergent)), r_checkpoints=sub.r_checkpoints,
        r_sum_checkpoints=sub.r_sum_checkpoints, accept_sum=accept_sum, num_steps=num_steps, diverging=sub.diverging | (active & divergent),
    )


def _ckpt_indices(n: int):
    """Checkpoint slots touched by leaf ``n`` of a subtree (NumPyro's leaf_idx_to_ckpt_idxs)."""
    idx_max = bin(n >> 1).count("1")
    trailing_ones = 0
    while (n >> trailing_ones) & 1:
        trailing_ones += 1
    return idx_max - trailing_ones + 1, idx_max


def _checkpoint_tables(max_tree_depth: int, device):
    """For every leaf ``n`` of a subtree (at most ``2**(max_tree_depth - 1)``): the checkpoint
    slots an odd leaf checks (NumPyro's leaf_idx_to_ckpt_idxs) and the one slot an even leaf
    stores into, as boolean rows ``(leaves, max_tree_depth)``."""
    key = (max_tree_depth, str(device))
    if key not in _TABLES:
        leaves = 2 ** (max_tree_depth - 1)
        # filled entry by entry on the host, then moved to the chains' device once
        check = torch.zeros(leaves, max_tree_depth, dtype=torch.bool, device="cpu")
        store = torch.zeros(leaves, max_tree_depth, dtype=torch.bool, device="cpu")
        for n in range(leaves):
            lo, hi = _ckpt_indices(n)
            if n % 2 == 1:
                check[n, lo : hi + 1] = True
            else:
                store[n, hi] = True
        _TABLES[key] = (check.to(device), store.to(device))
    return _TABLES[key]


_TABLES = {}


def _eager_while_loop(cond, body, carried):
    """``torch.while_loop``'s semantics in plain Python (that operator runs only inside
    ``torch.compile``, and the eager potential's ``autograd.grad`` cannot be traced)."""
    while bool(cond(*carried)):
        carried = body(*carried)
    return carried


def _leaf_step(potential, i, building, step, inv_mass, h0, log_u, check_table, store_table, *fields):
    """Leaf ``i`` of a subtree as a pure function of tensors (a leapfrog step for every chain
    still ``building`` and not finished, and the even leaves' checkpoints): returns ``i + 1`` and
    the :class:`Subtree`'s fields, so that it can be recorded once and replayed
    (:class:`~pyrobnn.infer.core.graphs.RecordedFunction`)."""
    sub = Subtree(*fields)
    row = i.reshape(1)
    sub = _leaf(potential, sub, building & ~sub.bad, _Leapfrog(step, inv_mass, h0), log_u.index_select(0, row)[0], check_table.index_select(0, row)[0])
    store = store_table.index_select(0, row).reshape(1, -1, 1)  # an even leaf's checkpoint
    sub = sub._replace(
        r_checkpoints=torch.where(store, sub.r.unsqueeze(1), sub.r_checkpoints),
        r_sum_checkpoints=torch.where(store, sub.r_sum.unsqueeze(1), sub.r_sum_checkpoints),
    )
    return (i + 1, *sub)


def _double(potential, while_loop, trajectory: Trajectory, forward, log_u, log_u_merge, n_leaves, tables, dynamics: _Leapfrog,
            leaf_step=None) -> Trajectory:
    """Double every unfinished chain's trajectory once: build a subtree of ``n_leaves`` leaves
    in the direction ``forward`` (per chain), leaf by leaf inside one ``torch.while_loop`` that
    stops early once every chain's subtree has turned or diverged, then merge it (biased
    progressive sampling of the proposal, Betancourt 2017) and check the whole trajectory's
    U-turn. Pure tensor code with the random numbers given (``log_u``: one per leaf and chain,
    ``log_u_merge``: one per chain), so that one compiled graph serves every depth and the
    only host sync per doubling is the caller's question whether all chains are done.

    ``tables`` are the checkpoint slots each leaf checks and stores (:func:`_checkpoint_tables`);
    ``while_loop`` is ``torch.while_loop`` where this is compiled, :func:`_eager_while_loop` where
    not (its body takes and returns the carried tensors positionally: the leaf index and a
    :class:`Subtree`'s fields), or ``None``: every one of the ``n_leaves`` leaves (an ``int``)
    is taken, chains whose subtree has finished masked in each, so that no leaf waits for the
    host (a leaf after a chain's subtree turned changes nothing of that chain: the results are
    those of the early-stopping loop); each leaf is then ``leaf_step`` (default
    :func:`_leaf_step` bound to ``potential``; a recorded one on CUDA)."""
    t = trajectory
    check_table, store_table = tables
    signed = dynamics._replace(step=torch.where(forward, 1.0, -1.0).to(dynamics.step.dtype).unsqueeze(-1) * dynamics.step)
    building = ~t.done

    def go_on(i, *carried):
        return (i < n_leaves) & (building & ~Subtree(*carried).bad).any()

    def leaf(i, *carried):
        return _leaf_step(potential, i, building, *signed, log_u, check_table, store_table, *carried)

    z, r, g = _where(forward, t.z_right, t.z_left), _where(forward, t.r_right, t.r_left), _where(forward, t.grad_right, t.grad_left)
    start = Subtree(
        z, r, g, z.clone(), t.energy_proposal.clone(), g.clone(), torch.full_like(t.log_weight, -math.inf), torch.zeros_like(r),
        torch.zeros_like(t.done), t.r_checkpoints, t.r_sum_checkpoints, t.accept_sum, t.num_steps, t.diverging,
    )
    carried = (torch.zeros((), dtype=torch.long, device=z.device), *start)
    if while_loop is None:
        step = leaf_step if leaf_step is not None else functools.partial(_leaf_step, potential)
        for _ in range(n_leaves):
            carried = step(carried[0], building, *signed, log_u, check_table, store_table, *carried[1:])
    else:
        carried = while_loop(go_on, leaf, carried)
    sub = Subtree(*carried[1:])

    # merge the subtree where it is valid; otherwise the trajectory ends there
    ok = building & ~sub.bad
    accept = ok & (log_u_merge < sub.log_weight - t.log_weight)
    right, left = ok & forward, ok & ~forward
    r_sum = _where(ok, t.r_sum + sub.r_sum, t.r_sum)
    r_left, r_right = _where(left, sub.r, t.r_left), _where(right, sub.r, t.r_right)
    return Trajectory(
        z_left=_where(left, sub.z, t.z_left), r_left=r_left, grad_left=_where(left, sub.grad, t.grad_left),
        z_right=_where(right, sub.z, t.z_right), r_right=r_right, grad_right=_where(right, sub.grad, t.grad_right),
        z_proposal=_where(accept, sub.z_proposal, t.z_proposal), energy_proposal=torch.where(accept, sub.energy_proposal, t.energy_proposal),
        grad_proposal=_where(accept, sub.grad_proposal, t.grad_proposal), log_weight=torch.where(ok, torch.logaddexp(t.log_weight, sub.log_weight), t.log_weight),
        r_sum=r_sum, done=t.done | (building & (sub.bad | _is_turning(dynamics.inv_mass, r_left, r_right, r_sum))), diverging=sub.diverging,
        depth=torch.where(building, t.depth + 1, t.depth), accept_sum=sub.accept_sum, num_steps=sub.num_steps,
        r_checkpoints=sub.r_checkpoints, r_sum_checkpoints=sub.r_sum_checkpoints,
    )


def transition_uniforms(chains: int, max_tree_depth: int, generator=None, dtype=torch.float32, device=None):
    """The uniforms one NUTS transition may use, per chain in one row of
    ``2 * max_tree_depth + 2**max_tree_depth - 1``: the direction of each doubling (forward where
    below 0.5), the merge uniform of each doubling, then one per leaf (doubling ``j`` reads leaves
    ``2**j - 1`` to ``2**(j + 1) - 2``). Drawn at once, so that the batched torch path and the
    native kernels (:mod:`pyrobnn.infer.core.native`), which build each chain's tree on its own, follow
    the same random stream."""
    return torch.rand(chains, 2 * max_tree_depth + 2**max_tree_depth - 1, generator=generator, dtype=dtype, device=device)


def nuts_step(potential, state: NUTSState, randoms: NUTSRandoms, settings: NUTSSettings, max_tree_depth: int = 10, double=None):
    """One NUTS transition for every chain, on the random numbers given (a pure function).

    :param potential: ``z -> (U, grad U)``.
    :param double: ``_double`` bound to ``potential`` and a while loop, possibly compiled; default
        the eager one.
    :returns: the new :class:`NUTSState` and the :class:`NUTSInfo`.
    """
    new, info, _ = nuts_transition(potential, state, randoms, settings, max_tree_depth, double)
    return new, info


def nuts_transition(potential, state: NUTSState, randoms: NUTSRandoms, settings: NUTSSettings, max_tree_depth: int = 10, double=None,
                    check_from: int = 1):
    """:func:`nuts_step`, with the host's checks placed: whether every chain's trajectory has
    finished is read (a host synchronization) after doubling ``check_from`` and after each one
    past it, not before. A doubling after every chain finished changes nothing, so the draws do
    not depend on ``check_from``; only the work and the synchronizations do. Returns the state,
    the :class:`NUTSInfo` and the number of doublings the deepest chain took (where it was read;
    else ``max_tree_depth``)."""
    z0, u0, g0 = state
    chains, dim = z0.shape
    dtype, device = z0.dtype, z0.device
    inv_mass = settings.inv_mass
    r0 = randoms.momentum / inv_mass.sqrt()
    uniforms = randoms.uniforms
    if double is None:
        double = functools.partial(_double, potential, _eager_while_loop)
    dynamics = _Leapfrog(settings.step_size.reshape(chains, 1), inv_mass, u0 + kinetic_energy(r0, inv_mass))
    tables = _checkpoint_tables(max_tree_depth, device)
    log_u = torch.zeros(tables[0].shape[0], chains, dtype=dtype, device=device)  # rows past 2**j unread
    zeros = torch.zeros(chains, dtype=dtype, device=device)
    done = torch.zeros(chains, dtype=torch.bool, device=device)
    # distinct tensors throughout: inputs that alias each other make Dynamo compile a second graph
    trajectory = Trajectory(
        z0, r0, g0, z0.clone(), r0.clone(), g0.clone(), z0.clone(), u0.clone(), g0.clone(), zeros, r0.clone(), done, done.clone(),
        torch.zeros(chains, dtype=torch.long, device=device), zeros.clone(), zeros.clone(),
        torch.zeros(chains, max_tree_depth, dim, dtype=dtype, device=device), torch.zeros(chains, max_tree_depth, dim, dtype=dtype, device=device),
    )
    leaves = 2 * max_tree_depth
    doublings = max_tree_depth
    for j in range(max_tree_depth):
        forward = uniforms[:, j] < 0.5
        log_u[: 2**j] = uniforms[:, leaves + 2**j - 1 : leaves + 2 ** (j + 1) - 1].T.log()
        log_u_merge = uniforms[:, max_tree_depth + j].log()
        trajectory = double(trajectory, forward, log_u, log_u_merge, 2**j, tables, dynamics)
        if j + 1 >= check_from and j + 1 < max_tree_depth:
            # one read: whether every chain is done, and the deepest chain's doublings (where the
            # last one finished, which can be before this check)
            done, deepest = torch.stack([trajectory.done.all().to(trajectory.depth.dtype), trajectory.depth.max()]).tolist()
            if done:
                doublings = int(deepest)
                break
    t = trajectory
    info = NUTSInfo(t.accept_sum / t.num_steps.clamp_min(1.0), t.depth, t.num_steps, t.diverging)
    return NUTSState(t.z_proposal, t.energy_proposal, t.grad_proposal), info, doublings


def native_nuts_step(native, state: NUTSState, randoms: NUTSRandoms, settings: NUTSSettings, max_tree_depth: int = 10):
    """:func:`nuts_step` in the native kernels (:class:`~pyrobnn.infer.core.native.NativeMLP` of
    the same potential): each chain's tree built on its own, on the same random numbers."""
    inv_mass = settings.inv_mass
    r0 = randoms.momentum / inv_mass.sqrt()
    z, u, g = state.z.clone(), state.energy.clone(), state.grad.clone()
    out = native.nuts(z, u, g, r0, inv_mass.contiguous(), settings.step_size.contiguous(), max_tree_depth, randoms.uniforms)
    return NUTSState(z, u, g), NUTSInfo(out[:, 0], out[:, 1].long(), out[:, 2], out[:, 3] > 0)


def find_step_size(potential, state: NUTSState, inv_mass, initial=1.0, generator=None):
    """Per chain, halve or double the step size until one leapfrog step's acceptance
    probability crosses 0.5 (Hoffman & Gelman 2014, algorithm 4)."""
    chains, dim = state.z.shape
    step = torch.full((chains,), float(initial), dtype=state.z.dtype, device=state.z.device)

    def log_accept(step):
        r = torch.randn(chains, dim, generator=generator, dtype=state.z.dtype, device=state.z.device) / inv_mass.sqrt()
        h0 = state.energy + kinetic_energy(r, inv_mass)
        _, r1, u1, _ = leapfrog(potential, state.z, r, state.grad, step.reshape(chains, 1), inv_mass)
        d = h0 - (u1 + kinetic_energy(r1, inv_mass))
        return torch.where(torch.isnan(d), torch.full_like(d, -math.inf), d)

    direction = torch.where(log_accept(step) > math.log(0.5), 1.0, -1.0).to(step.dtype)
    settled = torch.zeros(chains, dtype=torch.bool, device=step.device)
    for _ in range(100):
        trial = step * 2.0**direction
        crossed = (direction > 0) & ~(log_accept(trial) > math.log(0.5)) | (direction < 0) & (log_accept(trial) > math.log(0.5))
        step = torch.where(settled, step, trial)
        settled = settled | crossed | (step < 1e-7) | (step > 1e7)
        if settled.all():
            break
    return step


class DualAveraging(NamedTuple):
    """Nesterov dual averaging of log step sizes per chain (Hoffman & Gelman 2014, sec. 3.2):
    the shrinkage point ``mu`` (``log(10 eps0)``), the running acceptance gap ``h_bar``, the
    averaged iterate ``log_step_bar`` and the count ``t``."""

    mu: torch.Tensor
    h_bar: torch.Tensor
    log_step_bar: torch.Tensor
    t: int


def dual_averaging_init(step_size) -> DualAveraging:
    return DualAveraging(torch.log(10.0 * step_size), torch.zeros_like(step_size), torch.zeros_like(step_size), 0)


def dual_averaging_update(state: DualAveraging, accept_prob, target: float, t0: float = 10.0, gamma: float = 0.05, kappa: float = 0.75):
    r"""After one more acceptance statistic: :math:`\bar h_t = (1 - \frac{1}{t + t_0}) \bar h_{t-1}
    + \frac{\delta - \alpha_t}{t + t_0}`, :math:`\log\epsilon_t = \mu - \frac{\sqrt t}{\gamma} \bar h_t`,
    :math:`\log\bar\epsilon_t = t^{-\kappa} \log\epsilon_t + (1 - t^{-\kappa}) \log\bar\epsilon_{t-1}`.
    Returns the new state and the step size :math:`\epsilon_t`."""
    t = state.t + 1
    h_bar = (1 - 1 / (t + t0)) * state.h_bar + (target - accept_prob) / (t + t0)
    log_step = state.mu - math.sqrt(t) / gamma * h_bar
    eta = t ** (-kappa)
    log_step_bar = eta * log_step + (1 - eta) * state.log_step_bar
    return DualAveraging(state.mu, h_bar, log_step_bar, t), torch.exp(log_step)


class Welford(NamedTuple):
    """Running per-chain mean and sum of squared deviations of ``n`` samples (Welford 1962)."""

    n: int
    mean: torch.Tensor
    m2: torch.Tensor


def welford_init(like) -> Welford:
    return Welford(0, torch.zeros_like(like), torch.zeros_like(like))


def welford_update(state: Welford, x) -> Welford:
    n = state.n + 1
    delta = x - state.mean
    mean = state.mean + delta / n
    return Welford(n, mean, state.m2 + delta * (x - mean))


def welford_variance(state: Welford):
    """The sample variance, regularized as Stan's: shrunk towards 1e-3 with weight 5 / (n + 5)."""
    n = state.n
    var = state.m2 / max(n - 1, 1)
    return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))


def draws_variance(draws):
    """Per chain, the regularized variance (:func:`welford_variance`) of ``draws`` ``(chains, n,
    dim)``: a diagonal inverse mass matrix ``(chains, dim)`` estimated from a run's kept draws, as
    a window of the warm-up estimates it from its own."""
    n = draws.shape[1]
    mean = draws.mean(1)
    return welford_variance(Welford(n, mean, ((draws - mean.unsqueeze(1)) ** 2).sum(1)))


def warmup_windows(num_warmup: int, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25, min_term_buffer: int = 20):
    """Iterations at which the windowed adaptation ends a mass-matrix window (Stan's schedule).

    A warm-up too short for Stan's buffers (under 150 iterations) gets an initial buffer of 15%,
    as Stan's, and a terminal buffer of at least ``min_term_buffer`` iterations or half the
    warm-up, where Stan's 10% leaves 3-14: the step-size search at the last window's end restarts
    the dual averaging, and its average over a few iterations is still the search's large first
    trials. On a 1-50-1 tanh network (100 points, 4 chains, 30 warm-up iterations) that left one
    or two chains with every draw divergent in three runs of four; with the longer buffer no chain
    in 38 runs at 20-149 iterations (``docs/logs/benchmarks.md``). A window that would hold fewer
    than 10 draws estimates nothing: none is made, and the step size adapts through the whole
    warm-up on the unit mass matrix."""
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer = int(0.15 * num_warmup)
        term_buffer = max(int(0.1 * num_warmup), min(min_term_buffer, num_warmup // 2))
        base_window = num_warmup - init_buffer - term_buffer
        if base_window < 10:
            return []
    ends = []
    start, window = init_buffer, base_window
    last = num_warmup - term_buffer
    while start < last:
        end = start + window
        if end + 2 * window > last:
            end = last
        ends.append(end)
        start, window = end, 2 * window
    return ends


class WindowAdaptationState(NamedTuple):
    """The warm-up's state: the ``step_size`` and ``inv_mass`` the next transition uses, the dual
    averaging of the step size and the running variance of the current window."""

    step_size: torch.Tensor
    inv_mass: torch.Tensor
    dual: DualAveraging
    variance: Welford


class WindowAdaptation(Adaptation):
    """Stan's warm-up for NUTS, per chain (BlackJAX's ``window_adaptation``), over
    ``num_warmup`` transitions: dual averaging of the step size towards ``target_accept``
    throughout, and a diagonal inverse mass matrix estimated in doubling windows
    (:func:`warmup_windows`), each ending with a fresh step-size search (:func:`find_step_size`);
    the last transition of the warm-up takes the averaged step size.

    Started from a given ``step_size`` (``()`` or ``(C,)``) the first search is skipped; a given
    ``inv_mass`` (``()``, ``(D,)`` or ``(C, D)``) replaces the unit matrix the warm-up starts
    from. With ``adapt_mass_matrix=False`` (NumPyro's and Pyro's name) no window is made: the
    matrix is held and the step size adapts by dual averaging through the whole warm-up, as a
    refit on a few more points may start from the previous fit's."""

    State = WindowAdaptationState

    def __init__(self, num_warmup: int, target_accept: float = 0.8, step_size=None, inv_mass=None, adapt_mass_matrix: bool = True):
        self.num_steps, self.target_accept = num_warmup, target_accept
        self.step_size, self.inv_mass = step_size, inv_mass
        self.window_ends = frozenset(warmup_windows(num_warmup)) if adapt_mass_matrix else frozenset()
        self.window_start = 75 if num_warmup >= 150 else int(0.15 * num_warmup)

    def init(self, state: NUTSState, data, generator) -> WindowAdaptationState:
        z = state.z
        chains, dim = z.shape
        if self.inv_mass is None:
            inv_mass = torch.ones_like(z)
        else:
            if tuple(self.inv_mass.shape) not in ((), (dim,), (chains, dim)):
                raise ValueError(f"inv_mass must be a number or have shape ({dim},) or ({chains}, {dim}) (the chains, the model's "
                                 f"unconstrained parameters), got shape {tuple(self.inv_mass.shape)}")
            inv_mass = self.inv_mass.to(z).expand(chains, dim).clone()
        if self.step_size is None:
            step_size = find_step_size(data.next_target(), state, inv_mass, generator=generator)
        else:
            if tuple(self.step_size.shape) not in ((), (chains,)):
                raise ValueError(f"step_size must be a number or have shape ({chains},) (one per chain), got shape {tuple(self.step_size.shape)}")
            step_size = self.step_size.to(z).expand(chains).clone()
        return WindowAdaptationState(step_size, inv_mass, dual_averaging_init(step_size), welford_init(z))

    def update(self, tuning: WindowAdaptationState, i, state: NUTSState, info: NUTSInfo, target, generator) -> WindowAdaptationState:
        dual, step_size = dual_averaging_update(tuning.dual, info.accept_prob, self.target_accept)
        inv_mass, variance = tuning.inv_mass, tuning.variance
        if self.window_ends and i >= self.window_start:
            variance = welford_update(variance, state.z)
        if i + 1 in self.window_ends:
            inv_mass, variance = welford_variance(variance), welford_init(state.z)
            step_size = find_step_size(target, state, inv_mass, initial=1.0, generator=generator)
            dual = dual_averaging_init(step_size)
        if i + 1 == self.num_steps:
            step_size = torch.exp(dual.log_step_bar)
        return WindowAdaptationState(step_size, inv_mass, dual, variance)

    def settings(self, tuning: WindowAdaptationState, i) -> NUTSSettings:
        return NUTSSettings(tuning.step_size, tuning.inv_mass)

    def final(self, tuning: WindowAdaptationState) -> dict:
        return {"step_size": tuning.step_size, "inv_mass": tuning.inv_mass}


class NUTS(Kernel):
    """The NUTS kernel with trees of at most ``max_tree_depth`` doublings: :func:`nuts_step` on
    the eager and compiled paths, :func:`native_nuts_step` on the native one."""

    name, unit = "NUTS", "iterations"
    State = NUTSState

    def __init__(self, max_tree_depth: int = 10, host_checks=None, graphs=None):
        if host_checks not in (None, "per_leaf", "few"):
            raise ValueError(f"host_checks must be None, 'per_leaf' or 'few', got {host_checks!r}")
        self.max_tree_depth = max_tree_depth
        self.evaluations_per_step = 2**max_tree_depth - 1
        #: where the eager path asks the host whether the chains are done: ``"per_leaf"`` (stop
        #: every subtree as soon as all chains' subtrees end: the least work, a synchronization
        #: per leaf), ``"few"`` (every leaf of a subtree taken, finished chains masked, and the
        #: trajectory's end read from the doubling where the last transition's was found on: one
        #: or two synchronizations per transition), ``None``: ``"per_leaf"`` on the CPU, where a
        #: synchronization costs nothing, ``"few"`` on an accelerator. The draws are the same.
        self.host_checks = host_checks
        #: whether, with ``"few"``, each leaf is recorded once as a CUDA graph and replayed
        #: (:class:`~pyrobnn.infer.core.graphs.RecordedFunction`); ``None``: on a CUDA device
        self.graphs = graphs

    def init(self, position, data, generator) -> NUTSState:
        energy, grad = data.next_target()(position)
        return NUTSState(position, energy, grad)

    def randoms(self, state: NUTSState, settings, generator) -> NUTSRandoms:
        z = state.z
        momentum = torch.randn(z.shape[0], z.shape[1], generator=generator, dtype=z.dtype, device=z.device)
        return NUTSRandoms(momentum, transition_uniforms(z.shape[0], self.max_tree_depth, generator, z.dtype, z.device))

    def step(self, state, target, randoms, settings):
        return nuts_step(target, state, randoms, settings, self.max_tree_depth)

    def stepper(self, path, target):
        """Native: :func:`native_nuts_step`. Compiled: each trajectory doubling (``_double``: the
        subtree's leapfrog steps with the potential's gradient inside a ``torch.while_loop``, the
        U-turn checks and the merge) compiled by ``torch.compile`` with Inductor's C++ wrapper, so
        that the loop over leaves runs in compiled code: one call and one host sync per
        doubling, not per leaf (on a 1-50-1 network at 4 chains about 3x less time per leaf
        than a compiled call per leaf, for a few seconds of compilation;
        ``docs/logs/benchmarks.md``). Eager: the same doubling in plain Python."""
        depth = self.max_tree_depth
        if path.kind == "native":
            native = path.native
            return lambda state, target, randoms, settings: native_nuts_step(native, state, randoms, settings, depth)
        if path.compiled:
            inner = compiled(functools.partial(_double, target, torch.while_loop), dynamic=False, fullgraph=True, options={"cpp_wrapper": True})

            def double(t, forward, log_u, log_u_merge, n_leaves, tables, dynamics):
                # the leaf count a tensor: one graph for every depth
                count = torch.full((), n_leaves, dtype=torch.long, device=forward.device)
                return inner(t, forward, log_u, log_u_merge, count, tables, dynamics)

            return lambda state, target, randoms, settings: nuts_step(target, state, randoms, settings, depth, double)
        per_leaf = functools.partial(_double, target, _eager_while_loop)
        masked = functools.partial(_double, target, None)
        recorded = functools.partial(_double, target, None, leaf_step=RecordedFunction(functools.partial(_leaf_step, target)))
        last = [1]  # the doublings the last transition took (the first reads after each): where the next starts reading

        def step(state, target, randoms, settings):
            checks = self.host_checks or ("per_leaf" if state.z.device.type == "cpu" else "few")
            if checks == "per_leaf":
                return nuts_step(target, state, randoms, settings, depth, per_leaf)
            graphs = self.graphs if self.graphs is not None else state.z.device.type == "cuda"
            double = recorded if graphs else masked
            new, info, last[0] = nuts_transition(target, state, randoms, settings, depth, double, check_from=max(1, last[0] - 1))
            return new, info

        return step

    def record(self, state: NUTSState, info: NUTSInfo) -> dict:
        # the potential at each draw comes with the state: no pass over the data afterwards
        return {"z": state.z.clone(), "accept_prob": info.accept_prob, "tree_depth": info.tree_depth, "num_steps": info.num_steps,
                "diverging": info.diverging, "energy": state.energy.clone()}

    def progress(self, state, info: NUTSInfo, settings: NUTSSettings):
        step, depth = torch.stack([settings.step_size.mean(), info.tree_depth.max().to(settings.step_size.dtype)]).tolist()  # one read
        return {"step": f"{step:.2g}", "depth": int(depth)}
