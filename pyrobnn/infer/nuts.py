"""The No-U-Turn Sampler for several chains as one batched computation.

Multinomial NUTS with the generalized U-turn criterion (Hoffman & Gelman 2014; Betancourt
2017), in the iterative form of NumPyro (Phan et al. 2019): each iteration doubles the
trajectory in a random direction, building each new subtree leaf by leaf while checking the
U-turn criterion of every sub-subtree that the new leaf completes. The chains advance in
lockstep: one leapfrog step is one batched evaluation of the potential and its gradient for all
chains, and a chain whose trajectory has ended waits, masked, until the others finish.

Warm-up follows Stan: dual-averaging step size adaptation towards a target acceptance
statistic (0.8), and a diagonal inverse mass matrix estimated from the samples of doubling
windows (75-sample initial buffer, 50-sample final buffer), regularized towards 1e-3.

The functions here take a potential ``U(z)`` over ``z`` of shape ``(chains, dim)`` returning
``(U, grad)``; :func:`pyrobnn.infer.hmc.nuts` connects them to a model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from pyrobnn.runtime import raised_recompile_limits

__all__ = ["NUTSState", "nuts_step", "find_step_size", "DualAveraging", "WelfordVariance", "warmup_windows", "sample_nuts"]

MAX_DELTA_ENERGY = 1000.0


@dataclass
class NUTSState:
    z: torch.Tensor  # (C, D)
    energy: torch.Tensor  # potential U, (C,)
    grad: torch.Tensor  # (C, D)


def _kinetic(r, inv_mass):
    return 0.5 * (r * r * inv_mass).sum(-1)


def _leapfrog(potential, z, r, grad, step, inv_mass):
    # step: (C, 1), signed by the direction
    r = r - 0.5 * step * grad
    z = z + step * inv_mass * r
    energy, grad = potential(z)
    r = r - 0.5 * step * grad
    return z, r, energy, grad


def _is_turning(inv_mass, r_left, r_right, r_sum):
    # generalized criterion: the velocities at both ends against the momentum sum, less half
    # of the end momenta (Betancourt 2017, appendix A.4.2; as in NumPyro and Stan)
    rho = r_sum - 0.5 * (r_left + r_right)
    return ((inv_mass * r_left * rho).sum(-1) <= 0) | ((inv_mass * r_right * rho).sum(-1) <= 0)


def _ckpt_indices(n: int):
    """Checkpoint slots touched by leaf ``n`` of a subtree (NumPyro's leaf_idx_to_ckpt_idxs)."""
    idx_max = bin(n >> 1).count("1")
    trailing_ones = 0
    while (n >> trailing_ones) & 1:
        trailing_ones += 1
    return idx_max - trailing_ones + 1, idx_max


def _where(mask, a, b):
    return torch.where(mask.reshape(mask.shape + (1,) * (a.dim() - mask.dim())), a, b)


def _leaf(
    potential, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt,
    active, accept_sum, n_steps, diverging, step, inv_mass, h0, log_u, check_slots,
):
    """One leaf of a subtree for every chain: a leapfrog step, multinomial sampling within the
    subtree, and the U-turn checks of the sub-subtrees the leaf completes. Pure tensor code
    (the checkpoint slots to check are a mask), so that one compiled graph serves every leaf;
    chains with ``active`` false are left unchanged.

    The checkpoints ``r_ckpt`` and ``r_sum_ckpt`` (``(C, T, D)``) are only read here: an odd
    leaf checks, an even leaf stores (after this call), never both."""
    z_new, r_new, u_new, g_new = _leapfrog(potential, z, r, g, step, inv_mass)
    delta = u_new + _kinetic(r_new, inv_mass) - h0
    delta = torch.where(torch.isnan(delta), torch.full_like(delta, math.inf), delta)
    divergent = delta > MAX_DELTA_ENERGY
    accept_sum = accept_sum + torch.where(active, torch.exp(torch.clamp(-delta, max=0.0)), 0.0)
    n_steps = n_steps + active.to(n_steps.dtype)
    new_sub_log_w = torch.logaddexp(sub_log_w, -delta)
    take = active & (log_u < -delta - new_sub_log_w)
    sub_z, sub_u, sub_g = _where(take, z_new, sub_z), torch.where(take, u_new, sub_u), _where(take, g_new, sub_g)
    sub_log_w = torch.where(active, new_sub_log_w, sub_log_w)
    sub_r_sum = _where(active, sub_r_sum + r_new, sub_r_sum)
    block_sum = sub_r_sum.unsqueeze(1) - r_sum_ckpt + r_ckpt
    turning = (_is_turning(inv_mass.unsqueeze(1), r_ckpt, r_new.unsqueeze(1), block_sum) & check_slots).any(-1)
    sub_bad = sub_bad | (active & (turning | divergent))
    diverging = diverging | (active & divergent)
    z, r, g = _where(active, z_new, z), _where(active, r_new, r), _where(active, g_new, g)
    return z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, accept_sum, n_steps, diverging


def _leaf_block(
    potential, size, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt,
    building, accept_sum, n_steps, diverging, step, inv_mass, h0, log_u, check_slots, store_slots, exists,
):
    """``size`` consecutive leaves of a subtree in one graph (unrolled): for each, the chains
    still building a valid subtree take a leaf (:func:`_leaf`), and an even leaf stores its
    checkpoint (``store_slots[i]``, a one-hot row, or all false). Leaves past the subtree's end
    (``exists[i]`` false) and chains that have turned or diverged are masked, so a block may
    compute a few leapfrog steps that count for nothing; in exchange the per-call cost (Python,
    Dynamo's guards, the host sync that asks whether any chain is still going) is paid once per
    block instead of once per leaf, which is what dominates at a few chains."""
    for i in range(size):
        active = building & ~sub_bad & exists[i]
        (z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, accept_sum, n_steps, diverging) = _leaf(
            potential, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt,
            active, accept_sum, n_steps, diverging, step, inv_mass, h0, log_u[i], check_slots[i],
        )
        store = store_slots[i].reshape(1, -1, 1)
        r_ckpt = torch.where(store, r.unsqueeze(1), r_ckpt)
        r_sum_ckpt = torch.where(store, sub_r_sum.unsqueeze(1), r_sum_ckpt)
    return z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging


def nuts_step(potential, state: NUTSState, step_size, inv_mass, max_tree_depth: int = 10, generator=None, leaf=None, block: int = 1):
    """One NUTS transition for every chain.

    :param step_size: ``(C,)``.
    :param inv_mass: diagonal inverse mass matrices, ``(C, D)``.
    :param leaf: the function to use, possibly compiled: :func:`_leaf` bound to ``potential``
        when ``block`` is 1, else :func:`_leaf_block` bound to ``potential`` and ``block``;
        default the eager one.
    :param block: leaves per call of ``leaf``.
    :returns: the new state and per-chain statistics: ``accept_prob`` (mean Metropolis
        acceptance over the trajectory, for adaptation), ``tree_depth``, ``num_steps``,
        ``diverging``.
    """
    if leaf is None:
        leaf = functools.partial(_leaf, potential) if block == 1 else functools.partial(_leaf_block, potential, block)
    z0, u0, g0 = state.z, state.energy, state.grad
    chains, dim = z0.shape
    dtype, device = z0.dtype, z0.device
    r0 = torch.randn(chains, dim, generator=generator, dtype=dtype, device=device) / inv_mass.sqrt()
    h0 = u0 + _kinetic(r0, inv_mass)
    step = step_size.reshape(chains, 1)

    left = [z0, r0, g0]
    right = [z0, r0, g0]
    prop = [z0, u0, g0]
    log_w = torch.zeros(chains, dtype=dtype, device=device)
    r_sum = r0.clone()
    done = torch.zeros(chains, dtype=torch.bool, device=device)
    diverging = torch.zeros_like(done)
    depth = torch.zeros(chains, dtype=torch.long, device=device)
    accept_sum = torch.zeros(chains, dtype=dtype, device=device)
    n_steps = torch.zeros(chains, dtype=dtype, device=device)
    r_ckpt = torch.zeros(chains, max_tree_depth, dim, dtype=dtype, device=device)
    r_sum_ckpt = torch.zeros_like(r_ckpt)

    def uniform():
        return torch.rand(chains, generator=generator, dtype=dtype, device=device)

    for j in range(max_tree_depth):
        forward = uniform() < 0.5
        direction = torch.where(forward, 1.0, -1.0).to(dtype).reshape(chains, 1)
        signed_step = direction * step
        z, r, g = (_where(forward, a, b) for a, b in zip(right, left))
        building = ~done
        sub_log_w = torch.full((chains,), -math.inf, dtype=dtype, device=device)
        # fresh tensors: an input that aliases another makes Dynamo compile a second graph
        sub_z, sub_u, sub_g = z.clone(), u0, g.clone()
        sub_r_sum = torch.zeros_like(r0)
        sub_bad = torch.zeros_like(done)  # turned or diverged inside the subtree
        if block == 1:
            # leaf by leaf, checkpoints stored in place after the call: inside a compiled graph a
            # store writes a fresh copy of both (C, T, D) arrays (14% of a leaf at 128 chains)
            for n in range(2**j):
                active = building & ~sub_bad
                if not active.any():
                    break
                check, store, _ = _block_masks(max_tree_depth, 1, j, n, device)
                (z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, accept_sum, n_steps, diverging) = leaf(
                    z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt,
                    active, accept_sum, n_steps, diverging, signed_step, inv_mass, h0, torch.log(uniform()), check[0],
                )
                if n % 2 == 0:
                    slot = _ckpt_indices(n)[1]
                    r_ckpt[:, slot] = r
                    r_sum_ckpt[:, slot] = sub_r_sum
            block_range = range(0)
        else:
            block_range = range(0, 2**j, block)
        for first in block_range:
            if first and not (building & ~sub_bad).any():
                break
            check, store, exists = _block_masks(max_tree_depth, block, j, first, device)
            log_u = torch.log(torch.rand(block, chains, generator=generator, dtype=dtype, device=device))
            (z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging) = leaf(
                z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt,
                building, accept_sum, n_steps, diverging, signed_step, inv_mass, h0, log_u, check, store, exists,
            )
        # merge the subtree where it is valid; otherwise the trajectory ends there
        ok = building & ~sub_bad
        accept = ok & (torch.log(uniform()) < sub_log_w - log_w)
        prop = [_where(accept, a, b) for a, b in zip((sub_z, sub_u, sub_g), prop)]
        log_w = torch.where(ok, torch.logaddexp(log_w, sub_log_w), log_w)
        right = [_where(ok & forward, a, b) for a, b in zip((z, r, g), right)]
        left = [_where(ok & ~forward, a, b) for a, b in zip((z, r, g), left)]
        r_sum = _where(ok, r_sum + sub_r_sum, r_sum)
        depth = torch.where(building, depth + 1, depth)
        turned = _is_turning(inv_mass, left[1], right[1], r_sum)
        done = done | (building & (sub_bad | turned))
        if done.all():
            break
    stats = {
        "accept_prob": accept_sum / n_steps.clamp_min(1.0),
        "tree_depth": depth,
        "num_steps": n_steps,
        "diverging": diverging,
    }
    return NUTSState(prop[0], prop[1], prop[2]), stats


_MASK_CACHE = {}


def _block_masks(max_tree_depth, block, depth, first, device):
    """For leaves ``first .. first + block - 1`` of a subtree of ``2**depth`` leaves: the
    checkpoint slots each odd leaf checks (``(block, T)``, NumPyro's leaf_idx_to_ckpt_idxs), the
    slot each even leaf stores into (one-hot rows), and which leaves exist."""
    key = (max_tree_depth, block, depth, first, str(device))
    if key not in _MASK_CACHE:
        check = torch.zeros(block, max_tree_depth, dtype=torch.bool)
        store = torch.zeros(block, max_tree_depth, dtype=torch.bool)
        exists = torch.zeros(block, dtype=torch.bool)
        for i in range(block):
            n = first + i
            if n >= 2**depth:
                continue
            exists[i] = True
            lo, hi = _ckpt_indices(n)
            if n % 2 == 1:
                check[i, lo : hi + 1] = True
            else:
                store[i, hi] = True
        _MASK_CACHE[key] = (check.to(device), store.to(device), exists.to(device))
    return _MASK_CACHE[key]


def find_step_size(potential, state, inv_mass, initial=1.0, generator=None):
    """Per chain, halve or double the step size until one leapfrog step's acceptance
    probability crosses 0.5 (Hoffman & Gelman 2014, algorithm 4)."""
    chains, dim = state.z.shape
    step = torch.full((chains,), float(initial), dtype=state.z.dtype, device=state.z.device)

    def log_accept(step):
        r = torch.randn(chains, dim, generator=generator, dtype=state.z.dtype, device=state.z.device) / inv_mass.sqrt()
        h0 = state.energy + _kinetic(r, inv_mass)
        _, r1, u1, _ = _leapfrog(potential, state.z, r, state.grad, step.reshape(chains, 1), inv_mass)
        d = h0 - (u1 + _kinetic(r1, inv_mass))
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


class DualAveraging:
    """Nesterov dual averaging of log step sizes per chain (Hoffman & Gelman 2014, sec. 3.2)."""

    def __init__(self, step_size, target: float = 0.8, t0: float = 10.0, gamma: float = 0.05, kappa: float = 0.75):
        self.target, self.t0, self.gamma, self.kappa = target, t0, gamma, kappa
        self.reset(step_size)

    def reset(self, step_size):
        self.mu = torch.log(10.0 * step_size)
        self.h_bar = torch.zeros_like(step_size)
        self.log_step_bar = torch.zeros_like(step_size)
        self.t = 0

    def update(self, accept_prob):
        self.t += 1
        t = self.t
        self.h_bar = (1 - 1 / (t + self.t0)) * self.h_bar + (self.target - accept_prob) / (t + self.t0)
        log_step = self.mu - math.sqrt(t) / self.gamma * self.h_bar
        eta = t ** (-self.kappa)
        self.log_step_bar = eta * log_step + (1 - eta) * self.log_step_bar
        return torch.exp(log_step)

    @property
    def final_step_size(self):
        return torch.exp(self.log_step_bar)


class WelfordVariance:
    """Running per-chain variance of samples."""

    def __init__(self, like):
        self.n = 0
        self.mean = torch.zeros_like(like)
        self.m2 = torch.zeros_like(like)

    def update(self, x):
        self.n += 1
        delta = x - self.mean
        self.mean = self.mean + delta / self.n
        self.m2 = self.m2 + delta * (x - self.mean)

    def regularized(self):
        # Stan: shrink towards 1e-3 with weight 5 / (n + 5)
        n = self.n
        var = self.m2 / max(n - 1, 1)
        return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))


def warmup_windows(num_warmup: int, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25):
    """Iterations at which Stan's windowed adaptation ends a mass-matrix window."""
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer, term_buffer = int(0.15 * num_warmup), int(0.1 * num_warmup)
        base_window = num_warmup - init_buffer - term_buffer
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


def sample_nuts(
    potential,
    z_init,
    num_samples: int,
    num_warmup: int,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    adapt_mass: bool = True,
    generator=None,
    progress: bool = True,
    transform=None,
    compile: bool = False,
    leaf_block=None,
):
    """Run NUTS on every chain of ``z_init`` (``(C, D)``); returns the samples ``(C, S, D)``
    (mapped through ``transform`` per draw if given) and per-draw statistics.

    :param compile: compile the leaf update (leapfrog with the potential's gradient, and the
        bookkeeping) with ``torch.compile``: about ten times fewer microseconds per leapfrog
        step on small networks, for a few seconds of compilation.
    :param leaf_block: leaves of a subtree computed per call (:func:`_leaf_block`), a power of
        two. Default: 8 for up to 16 chains, where the per-call cost dominates (measured at 4
        chains on a 1-50-1 network: 46 us per leaf in blocks of 8 against 107 alone, one thread;
        ``docs/benchmarks.md``), and 1 above, where the batch amortizes that cost and the
        leaves a block computes past a short subtree's end would be paid for by every chain."""
    chains, dim = z_init.shape
    if leaf_block is None:
        leaf_block = 8 if chains <= 16 else 1
    if not isinstance(leaf_block, int) or leaf_block < 1 or leaf_block & (leaf_block - 1):
        raise ValueError(f"leaf_block must be a power of two, got {leaf_block!r}")
    leaf = functools.partial(_leaf, potential) if leaf_block == 1 else functools.partial(_leaf_block, potential, leaf_block)
    if compile:
        leaf = torch.compile(leaf, dynamic=False)
    energy, grad = potential(z_init)
    state = NUTSState(z_init, energy, grad)
    inv_mass = torch.ones_like(z_init)
    step = find_step_size(potential, state, inv_mass, generator=generator)
    adapter = DualAveraging(step, target_accept)
    variance = WelfordVariance(z_init)
    window_ends = set(warmup_windows(num_warmup)) if adapt_mass else set()
    window_start = 75 if num_warmup >= 150 else int(0.15 * num_warmup)
    draws, stats_all = [], {"accept_prob": [], "tree_depth": [], "num_steps": [], "diverging": []}
    bar = tqdm(total=num_warmup + num_samples, disable=not progress, desc="NUTS", unit="it", dynamic_ncols=True)
    # Dynamo guards the compiled leaf on the potential object, so each run compiles anew; past
    # its default limit of 8 recompilations per function it would silently run the leaf
    # eagerly (10x slower) from the ninth run in a process on (e.g. the ninth UCI split).
    with raised_recompile_limits(enabled=compile):
        try:
            for i in range(num_warmup + num_samples):
                warming = i < num_warmup
                state, stats = nuts_step(potential, state, step, inv_mass, max_tree_depth, generator, leaf, leaf_block)
                if warming:
                    step = adapter.update(stats["accept_prob"])
                    if adapt_mass and i >= window_start:
                        variance.update(state.z)
                    if i + 1 in window_ends:
                        inv_mass = variance.regularized()
                        variance = WelfordVariance(z_init)
                        step = find_step_size(potential, state, inv_mass, initial=1.0, generator=generator)
                        adapter.reset(step)
                    if i + 1 == num_warmup:
                        step = adapter.final_step_size
                else:
                    draws.append(transform(state.z) if transform is not None else state.z.clone())
                    for k in stats_all:
                        stats_all[k].append(stats[k])
                if progress and (i % 10 == 0 or i + 1 == num_warmup + num_samples):
                    bar.set_postfix(
                        {"phase": "warmup" if warming else "sample", "step": f"{step.mean().item():.2g}", "depth": int(stats["tree_depth"].max())},
                        refresh=False,
                    )
                bar.update(1)
        finally:
            bar.close()
    stacked = {k: torch.stack(v, 1) for k, v in stats_all.items()} if draws else {}
    stacked["step_size"] = step
    stacked["inv_mass"] = inv_mass
    if transform is None:
        return torch.stack(draws, 1) if draws else z_init.new_zeros(chains, 0, dim), stacked
    return draws, stacked
