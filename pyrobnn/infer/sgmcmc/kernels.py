"""The SG-MCMC kernels: one update of every chain given a minibatch estimate of the log joint's
gradient (the math is in :mod:`pyrobnn.infer.sgmcmc.samplers`), as BlackJAX's SGLD and SGHMC
take one, and the cyclical step-size schedule."""

from __future__ import annotations

import math

import torch

__all__ = ["sgld_step", "sghmc_step", "cyclical_step_size", "SCHEDULES"]

SCHEDULES = ("constant", "cyclical")


def sgld_step(z, grad, step_size, generator=None, noise: bool = True):
    """One SGLD update of ``z`` (``(C, D)``) given the log-density gradient estimate ``grad``."""
    z = z + 0.5 * step_size * grad
    if noise:
        z = z + math.sqrt(step_size) * torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)
    return z


def sghmc_step(z, v, grad, lr, friction, generator=None, noise: bool = True):
    """One SGHMC update; returns ``(z, v)``."""
    v = (1.0 - friction) * v + lr * grad
    if noise:
        v = v + math.sqrt(2.0 * friction * lr) * torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)
    return z + v, v


def cyclical_step_size(k: int, num_steps: int, num_cycles: int, initial: float) -> float:
    """Zhang et al. (2020)'s cosine step size at step ``k`` (0-based) of ``num_steps``."""
    period = math.ceil(num_steps / num_cycles)
    return 0.5 * initial * (math.cos(math.pi * (k % period) / period) + 1.0)
