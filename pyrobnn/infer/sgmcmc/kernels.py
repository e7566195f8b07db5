"""The SG-MCMC kernels: one update of every chain given a minibatch estimate of the log joint's
gradient (the math is in :mod:`pyrobnn.infer.sgmcmc.samplers`), as BlackJAX's SGLD and SGHMC
take one, pure functions of their state and noise; the step-size schedule (constant or
cyclical) that sets each step's step size and noise and says which steps are kept."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from pyrobnn.infer.core.kernel import Adaptation, Kernel

__all__ = [
    "SGLDState", "SGHMCState", "SGSettings", "SGInfo", "SGLD", "SGHMC", "sgld_step", "sghmc_step", "cyclical_step_size",
    "StepSizeSchedule", "SCHEDULES",
]

SCHEDULES = ("constant", "cyclical")


def sgld_step(z, grad, step_size: float, noise: Optional[torch.Tensor] = None):
    """One SGLD update of ``z`` (``(C, D)``) given the log-density gradient estimate ``grad`` and
    standard normal ``noise`` of ``z``'s shape (``None``: no noise, an optimization step)."""
    z = z + 0.5 * step_size * grad
    if noise is not None:
        z = z + math.sqrt(step_size) * noise
    return z


def sghmc_step(z, v, grad, lr: float, friction: float, noise: Optional[torch.Tensor] = None):
    """One SGHMC update from standard normal ``noise`` (``None``: none); returns ``(z, v)``."""
    v = (1.0 - friction) * v + lr * grad
    if noise is not None:
        v = v + math.sqrt(2.0 * friction * lr) * noise
    return z + v, v


def cyclical_step_size(k: int, num_steps: int, num_cycles: int, initial: float) -> float:
    """Zhang et al. (2020)'s cosine step size at step ``k`` (0-based) of ``num_steps``."""
    period = math.ceil(num_steps / num_cycles)
    return 0.5 * initial * (math.cos(math.pi * (k % period) / period) + 1.0)


class SGLDState(NamedTuple):
    """The chains' positions ``(C, D)``."""

    z: torch.Tensor


class SGHMCState(NamedTuple):
    """The chains' positions and momenta ``(C, D)``."""

    z: torch.Tensor
    v: torch.Tensor


class SGSettings(NamedTuple):
    """A step's step size (SGHMC's learning rate) and whether it adds noise (the exploration
    stretch of a cyclical schedule does not)."""

    step_size: float
    noise: bool


class SGInfo(NamedTuple):
    """The gradient estimate a step used (the step-failure policy checks it)."""

    grad: torch.Tensor


class SGLD(Kernel):
    """The SGLD kernel (Welling & Teh 2011) on a minibatch target ``z -> (log p̂, grad log p̂)``."""

    name, unit = "SGLD", "steps"
    State = SGLDState

    def init(self, position, data, generator) -> SGLDState:
        return SGLDState(position)

    def randoms(self, state, settings: SGSettings, generator):
        z = state.z
        return torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device) if settings.noise else None

    def step(self, state: SGLDState, target, noise, settings: SGSettings):
        _, grad = target(state.z)
        return SGLDState(sgld_step(state.z, grad, settings.step_size, noise)), SGInfo(grad)

    def record(self, state, info) -> dict:
        return {"z": state.z.detach().clone()}


class SGHMC(SGLD):
    """The SGHMC kernel (Chen, Fox & Guestrin 2014) with ``friction``, its learning rate the
    step size of the settings."""

    name = "SGHMC"
    State = SGHMCState

    def __init__(self, friction: float):
        self.friction = friction

    def init(self, position, data, generator) -> SGHMCState:
        return SGHMCState(position, torch.zeros_like(position))

    def step(self, state: SGHMCState, target, noise, settings: SGSettings):
        _, grad = target(state.z)
        return SGHMCState(*sghmc_step(state.z, state.v, grad, settings.step_size, self.friction, noise)), SGInfo(grad)


class StepSizeSchedule(Adaptation):
    """The step size of every step of ``num_steps`` and which steps are kept: constant, with the
    draws of every ``thinning``-th step from ``num_burnin`` on, or cyclical (Zhang et al. 2020):
    in each of ``num_cycles`` cycles, the first ``exploration`` fraction without noise, then a
    draw every ``thinning``-th step. It adapts nothing (no warm-up, no state)."""

    def __init__(self, step_size: float, num_steps: int, schedule: str = "constant", num_cycles: int = 4, exploration: float = 0.5,
                 num_burnin: int = 0):
        self.step_size, self.total, self.schedule = float(step_size), num_steps, schedule
        self.num_cycles, self.exploration, self.num_burnin = num_cycles, exploration, num_burnin
        self.period = math.ceil(num_steps / num_cycles)
        self._constant = SGSettings(self.step_size, True)

    def _sampling(self, k: int) -> bool:
        return (k % self.period) >= self.exploration * self.period

    def settings(self, tuning, k: int) -> SGSettings:
        if self.schedule == "constant":
            return self._constant
        return SGSettings(cyclical_step_size(k, self.total, self.num_cycles, self.step_size), self._sampling(k))

    def keeps(self, k: int, thinning: int) -> bool:
        if self.schedule == "constant":
            return k >= self.num_burnin and (k + 1) % thinning == 0
        return self._sampling(k) and (k + 1) % thinning == 0

    def final(self, tuning) -> dict:
        return {"step_size": self.step_size}
