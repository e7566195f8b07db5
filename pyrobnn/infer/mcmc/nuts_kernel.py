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
``(U, grad)``; :func:`pyrobnn.infer.mcmc.samplers.nuts` connects them to a model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from pyrobnn.infer.core.checkpoints import watching
from pyrobnn.infer.core.integrators import MAX_DELTA_ENERGY, kinetic_energy, leapfrog
from pyrobnn.utils.progress import tqdm
from pyrobnn.utils.runtime import compiled, raised_recompile_limits

__all__ = [
    "NUTSState", "nuts_init", "nuts_step", "transition_uniforms", "find_step_size", "DualAveraging", "WelfordVariance", "warmup_windows",
    "WindowAdaptation", "sample_nuts",
]


@dataclass
class NUTSState:
    z: torch.Tensor  # (C, D)
    energy: torch.Tensor  # potential U, (C,)
    grad: torch.Tensor  # (C, D)


def nuts_init(potential, z) -> NUTSState:
    """The state at positions ``z`` (``(C, D)``): the potential and its gradient there (the
    kernel's ``init``; :func:`nuts_step` is its ``step`` and :class:`WindowAdaptation` its
    warm-up, as in BlackJAX)."""
    energy, grad = potential(z)
    return NUTSState(z, energy, grad)


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
    subtree, and the U-turn checks of the sub-subtrees the leaf completes (``check_slots``, a
    mask over the checkpoints). Chains with ``active`` false are left unchanged."""
    z_new, r_new, u_new, g_new = leapfrog(potential, z, r, g, step, inv_mass)
    delta = u_new + kinetic_energy(r_new, inv_mass) - h0
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


def _checkpoint_tables(max_tree_depth: int, device):
    """For every leaf ``n`` of a subtree (at most ``2**(max_tree_depth - 1)``): the checkpoint
    slots an odd leaf checks (NumPyro's leaf_idx_to_ckpt_idxs) and the one slot an even leaf
    stores into, as boolean rows ``(leaves, max_tree_depth)``."""
    key = (max_tree_depth, str(device))
    if key not in _TABLES:
        leaves = 2 ** (max_tree_depth - 1)
        check = torch.zeros(leaves, max_tree_depth, dtype=torch.bool)
        store = torch.zeros(leaves, max_tree_depth, dtype=torch.bool)
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


def _double(potential, while_loop, trajectory, forward, log_u, log_u_merge, n_leaves, check_table, store_table, step, inv_mass, h0):
    """Double every unfinished chain's trajectory once: build a subtree of ``n_leaves`` leaves
    in the direction ``forward`` (per chain), leaf by leaf inside one ``torch.while_loop`` that
    stops early once every chain's subtree has turned or diverged, then merge it (biased
    progressive sampling of the proposal, Betancourt 2017) and check the whole trajectory's
    U-turn. Pure tensor code with the random numbers given (``log_u``: one per leaf and chain,
    ``log_u_merge``: one per chain), so that one compiled graph serves every depth and the
    only host sync per doubling is the caller's question whether all chains are done.

    ``trajectory`` is the tuple (left z, r, g; right z, r, g; proposal z, U, g; log weight,
    momentum sum, done, diverging, depth, acceptance sum, leapfrog steps, momentum
    checkpoints, momentum-sum checkpoints); the same tuple comes back updated. ``while_loop`` is
    ``torch.while_loop`` where this is compiled, :func:`_eager_while_loop` where not."""
    (zl, rl, gl, zr, rr, gr, pz, pu, pg, log_w, r_sum, done, diverging, depth, accept_sum, n_steps, r_ckpt, r_sum_ckpt) = trajectory
    signed_step = torch.where(forward, 1.0, -1.0).to(step.dtype).unsqueeze(-1) * step
    building = ~done

    def go_on(i, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging):
        return (i < n_leaves) & (building & ~sub_bad).any()

    def leaf(i, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging):
        row = i.reshape(1)
        (z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, accept_sum, n_steps, diverging) = _leaf(
            potential, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt,
            building & ~sub_bad, accept_sum, n_steps, diverging, signed_step, inv_mass, h0,
            log_u.index_select(0, row)[0], check_table.index_select(0, row)[0],
        )
        store = store_table.index_select(0, row).reshape(1, -1, 1)  # an even leaf's checkpoint
        r_ckpt = torch.where(store, r.unsqueeze(1), r_ckpt)
        r_sum_ckpt = torch.where(store, sub_r_sum.unsqueeze(1), r_sum_ckpt)
        return i + 1, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging

    z, r, g = _where(forward, zr, zl), _where(forward, rr, rl), _where(forward, gr, gl)
    start = (
        torch.zeros((), dtype=torch.long, device=z.device), z, r, g, z.clone(), pu.clone(), g.clone(),
        torch.full_like(log_w, -math.inf), torch.zeros_like(r), torch.zeros_like(done), r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging,
    )
    (_, z, r, g, sub_z, sub_u, sub_g, sub_log_w, sub_r_sum, sub_bad, r_ckpt, r_sum_ckpt, accept_sum, n_steps, diverging) = while_loop(go_on, leaf, start)

    # merge the subtree where it is valid; otherwise the trajectory ends there
    ok = building & ~sub_bad
    accept = ok & (log_u_merge < sub_log_w - log_w)
    pz, pu, pg = _where(accept, sub_z, pz), torch.where(accept, sub_u, pu), _where(accept, sub_g, pg)
    log_w = torch.where(ok, torch.logaddexp(log_w, sub_log_w), log_w)
    zr, rr, gr = (_where(ok & forward, a, b) for a, b in ((z, zr), (r, rr), (g, gr)))
    zl, rl, gl = (_where(ok & ~forward, a, b) for a, b in ((z, zl), (r, rl), (g, gl)))
    r_sum = _where(ok, r_sum + sub_r_sum, r_sum)
    depth = torch.where(building, depth + 1, depth)
    done = done | (building & (sub_bad | _is_turning(inv_mass, rl, rr, r_sum)))
    return (zl, rl, gl, zr, rr, gr, pz, pu, pg, log_w, r_sum, done, diverging, depth, accept_sum, n_steps, r_ckpt, r_sum_ckpt)


def transition_uniforms(chains: int, max_tree_depth: int, generator=None, dtype=torch.float32, device=None):
    """The uniforms one NUTS transition may use, per chain in one row of
    ``2 * max_tree_depth + 2**max_tree_depth - 1``: the direction of each doubling (forward where
    below 0.5), the merge uniform of each doubling, then one per leaf (doubling ``j`` reads leaves
    ``2**j - 1`` to ``2**(j + 1) - 2``). Drawn at once, so that the batched torch path and the
    native kernels (:mod:`pyrobnn.infer.mcmc.native`), which build each chain's tree on its own, follow
    the same random stream."""
    return torch.rand(chains, 2 * max_tree_depth + 2**max_tree_depth - 1, generator=generator, dtype=dtype, device=device)


def nuts_step(potential, state: NUTSState, step_size, inv_mass, max_tree_depth: int = 10, generator=None, double=None, native=None):
    """One NUTS transition for every chain.

    :param step_size: ``(C,)``.
    :param inv_mass: diagonal inverse mass matrices, ``(C, D)``.
    :param double: ``_double`` bound to ``potential``, possibly compiled; default the eager one.
    :param native: a :class:`~pyrobnn.infer.mcmc.native.NativeMLP` of the same potential: the
        transition runs there instead (each chain's tree built on its own), on the same random
        numbers.
    :returns: the new state and per-chain statistics: ``accept_prob`` (mean Metropolis
        acceptance over the trajectory, for adaptation), ``tree_depth``, ``num_steps``,
        ``diverging``.
    """
    z0, u0, g0 = state.z, state.energy, state.grad
    chains, dim = z0.shape
    dtype, device = z0.dtype, z0.device
    r0 = torch.randn(chains, dim, generator=generator, dtype=dtype, device=device) / inv_mass.sqrt()
    uniforms = transition_uniforms(chains, max_tree_depth, generator, dtype, device)
    if native is not None:
        z, u, g = z0.clone(), u0.clone(), g0.clone()
        out = native.nuts(z, u, g, r0, inv_mass.contiguous(), step_size.contiguous(), max_tree_depth, uniforms)
        stats = {"accept_prob": out[:, 0], "tree_depth": out[:, 1].long(), "num_steps": out[:, 2], "diverging": out[:, 3] > 0}
        return NUTSState(z, u, g), stats
    if double is None:
        double = functools.partial(_double, potential, _eager_while_loop)
    h0 = u0 + kinetic_energy(r0, inv_mass)
    step = step_size.reshape(chains, 1)
    check_table, store_table = _checkpoint_tables(max_tree_depth, device)
    log_u = torch.zeros(check_table.shape[0], chains, dtype=dtype, device=device)  # rows past 2**j unread
    zeros = torch.zeros(chains, dtype=dtype, device=device)
    done = torch.zeros(chains, dtype=torch.bool, device=device)
    # distinct tensors throughout: inputs that alias each other make Dynamo compile a second graph
    trajectory = (
        z0, r0, g0, z0.clone(), r0.clone(), g0.clone(), z0.clone(), u0.clone(), g0.clone(), zeros, r0.clone(), done, done.clone(),
        torch.zeros(chains, dtype=torch.long, device=device), zeros.clone(), zeros.clone(),
        torch.zeros(chains, max_tree_depth, dim, dtype=dtype, device=device), torch.zeros(chains, max_tree_depth, dim, dtype=dtype, device=device),
    )
    leaves = 2 * max_tree_depth
    for j in range(max_tree_depth):
        forward = uniforms[:, j] < 0.5
        log_u[: 2**j] = uniforms[:, leaves + 2**j - 1 : leaves + 2 ** (j + 1) - 1].T.log()
        log_u_merge = uniforms[:, max_tree_depth + j].log()
        n_leaves = torch.tensor(2**j, device=device)
        trajectory = double(trajectory, forward, log_u, log_u_merge, n_leaves, check_table, store_table, step, inv_mass, h0)
        if trajectory[11].all():
            break
    _, _, _, _, _, _, pz, pu, pg, _, _, _, diverging, depth, accept_sum, n_steps, _, _ = trajectory
    stats = {
        "accept_prob": accept_sum / n_steps.clamp_min(1.0),
        "tree_depth": depth,
        "num_steps": n_steps,
        "diverging": diverging,
    }
    return NUTSState(pz, pu, pg), stats


def find_step_size(potential, state, inv_mass, initial=1.0, generator=None):
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


class WindowAdaptation:
    """Stan's warm-up for NUTS, per chain (BlackJAX's ``window_adaptation``): dual averaging of
    the step size towards ``target_accept`` throughout, and a diagonal inverse mass matrix
    estimated in doubling windows (:func:`warmup_windows`), each ending with a fresh step-size
    search. :meth:`update` takes one warm-up transition's result; ``step_size`` and
    ``inv_mass`` are what the next transition uses."""

    def __init__(self, potential, state: NUTSState, num_warmup: int, target_accept: float = 0.8, generator=None):
        self.potential, self.generator, self.num_warmup = potential, generator, num_warmup
        self.inv_mass = torch.ones_like(state.z)
        self.step_size = find_step_size(potential, state, self.inv_mass, generator=generator)
        self.adapter = DualAveraging(self.step_size, target_accept)
        self.variance = WelfordVariance(state.z)
        self.window_ends = set(warmup_windows(num_warmup))
        self.window_start = 75 if num_warmup >= 150 else int(0.15 * num_warmup)

    def update(self, i: int, state: NUTSState, accept_prob) -> None:
        """After warm-up transition ``i`` (0-based) to ``state``."""
        self.step_size = self.adapter.update(accept_prob)
        if i >= self.window_start:
            self.variance.update(state.z)
        if i + 1 in self.window_ends:
            self.inv_mass = self.variance.regularized()
            self.variance = WelfordVariance(state.z)
            self.step_size = find_step_size(self.potential, state, self.inv_mass, initial=1.0, generator=self.generator)
            self.adapter.reset(self.step_size)
        if i + 1 == self.num_warmup:
            self.step_size = self.adapter.final_step_size

    def state_dict(self) -> dict:
        a, v = self.adapter, self.variance
        return {
            "step_size": self.step_size, "inv_mass": self.inv_mass,
            "adapter": {"mu": a.mu, "h_bar": a.h_bar, "log_step_bar": a.log_step_bar, "t": a.t},
            "variance": {"n": v.n, "mean": v.mean, "m2": v.m2},
        }

    def load_state_dict(self, state: dict) -> None:
        device = self.inv_mass.device
        self.step_size, self.inv_mass = state["step_size"].to(device), state["inv_mass"].to(device)
        a, v = state["adapter"], state["variance"]
        self.adapter.mu, self.adapter.h_bar, self.adapter.log_step_bar = a["mu"].to(device), a["h_bar"].to(device), a["log_step_bar"].to(device)
        self.adapter.t = int(a["t"])
        self.variance.n, self.variance.mean, self.variance.m2 = int(v["n"]), v["mean"].to(device), v["m2"].to(device)


def sample_nuts(
    potential,
    z_init,
    num_samples: int,
    num_warmup: int,
    max_tree_depth: int = 10,
    target_accept: float = 0.8,
    generator=None,
    progress: bool = True,
    compile: bool = False,
    native=None,
    checkpoint=None,
):
    """Run NUTS on every chain of ``z_init`` (``(C, D)``) with Stan's warm-up
    (:class:`WindowAdaptation`); returns the samples ``(C, S, D)`` and per-draw statistics.

    :param native: a :class:`~pyrobnn.infer.mcmc.native.NativeMLP` of ``potential``: every
        transition runs in its native code (``compile`` is then not used).
    :param compile: compile each trajectory doubling (``_double``: the subtree's leapfrog
        steps with the potential's gradient inside a ``torch.while_loop``, the U-turn checks and
        the merge) with ``torch.compile`` and Inductor's C++ wrapper, so that the loop over
        leaves runs in compiled code: one call and one host sync per doubling, not per leaf.
        On a 1-50-1 network at 4 chains that is about 3x less time per leaf than a compiled
        call per leaf, and a few seconds of compilation (``docs/logs/benchmarks.md``).
    :param checkpoint: a :class:`~pyrobnn.infer.core.checkpoints.RunCheckpoint`: the run starts
        from its saved state if there is one, and writes its state (the chains, the warm-up's
        adaptation, the random generator, the draws so far) when due and at the end."""
    chains, dim = z_init.shape
    if native is not None:
        double, compile = None, False
    elif compile:
        double = compiled(functools.partial(_double, potential, torch.while_loop), dynamic=False, fullgraph=True, options={"cpp_wrapper": True})
    else:
        double = functools.partial(_double, potential, _eager_while_loop)
    state = nuts_init(potential, z_init)
    warmup = WindowAdaptation(potential, state, num_warmup, target_accept, generator)
    # the potential at each draw comes with the state: no pass over the data afterwards
    draws, stats_all = [], {"accept_prob": [], "tree_depth": [], "num_steps": [], "diverging": [], "energy": []}
    first = 0
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        device = z_init.device
        state = NUTSState(*(saved["state"][k].to(device) for k in ("z", "energy", "grad")))
        warmup.load_state_dict(saved["warmup"])
        generator.set_state(saved["generator"])
        if saved["draws"] is not None:
            draws = list(saved["draws"].to(device).unbind(1))
            stats_all.update({k: list(v.to(device).unbind(1)) for k, v in saved["stats"].items()})
        first = int(saved["iteration"])

    def snapshot(done):
        return {
            "iteration": done, "state": {"z": state.z.cpu(), "energy": state.energy.cpu(), "grad": state.grad.cpu()},
            "warmup": warmup.state_dict(), "generator": generator.get_state(),
            "draws": torch.stack(draws, 1).cpu() if draws else None,
            "stats": {k: torch.stack(v, 1).cpu() for k, v in stats_all.items()} if draws else None,
        }

    total = num_warmup + num_samples
    bar = tqdm(total=total, initial=first, disable=not progress, desc="NUTS", unit="it", dynamic_ncols=True)
    # Dynamo guards the compiled leaf on the potential object, so each run compiles anew; past
    # its default limit of 8 recompilations per function it would silently run the leaf
    # eagerly (10x slower) from the ninth run in a process on (e.g. the ninth UCI split).
    with raised_recompile_limits(enabled=compile), watching(checkpoint):
        try:
            for i in range(first, total):
                warming = i < num_warmup
                state, stats = nuts_step(potential, state, warmup.step_size, warmup.inv_mass, max_tree_depth, generator, double, native)
                if warming:
                    warmup.update(i, state, stats["accept_prob"])
                else:
                    draws.append(state.z.clone())
                    for k in stats_all:
                        stats_all[k].append(state.energy.clone() if k == "energy" else stats[k])
                if progress and (i % 10 == 0 or i + 1 == total):
                    bar.set_postfix(
                        {"phase": "warmup" if warming else "sample", "step": f"{warmup.step_size.mean().item():.2g}", "depth": int(stats["tree_depth"].max())},
                        refresh=False,
                    )
                bar.update(1)
                if checkpoint is not None:
                    checkpoint.after(i + 1, lambda: snapshot(i + 1), last=i + 1 == total)
        finally:
            bar.close()
    stacked = {k: torch.stack(v, 1) for k, v in stats_all.items()} if draws else {}
    stacked["step_size"] = warmup.step_size
    stacked["inv_mass"] = warmup.inv_mass
    return torch.stack(draws, 1) if draws else z_init.new_zeros(chains, 0, dim), stacked
