r"""Autocorrelation and effective sample size of single chains, batched over chains and
coordinates (torch, so that samplers can tune on it without leaving the device).

For a chain :math:`x_1, \dots, x_n` with autocorrelations :math:`\rho_t` (from the FFT of the
centred chain), the effective sample size is :math:`n / \tau` with
:math:`\tau = -1 + 2 \sum_{k < K} P_k`, :math:`P_k = \rho_{2k} + \rho_{2k+1}`, truncated at the
first negative pair sum and made monotone (Geyer 1992's initial monotone sequence estimator, as in
Stan and BlackJAX).
"""

from __future__ import annotations

import torch

__all__ = ["autocorrelation", "effective_sample_size", "MIN_ESS_DRAWS"]

#: the fewest draws per chain an effective sample size is computed from
MIN_ESS_DRAWS = 4


def autocorrelation(x: torch.Tensor) -> torch.Tensor:
    """Autocorrelation of each chain along dimension 1 of ``x`` (``(C, n, ...)``), same shape."""
    n = x.shape[1]
    centred = x - x.mean(1, keepdim=True)
    size = 1 << (2 * n - 1).bit_length()
    f = torch.fft.rfft(centred.double(), n=size, dim=1)
    acov = torch.fft.irfft(f * f.conj(), n=size, dim=1)[:, :n]
    return (acov / acov[:, :1].clamp_min(1e-300)).to(x.dtype)


def effective_sample_size(x: torch.Tensor) -> torch.Tensor:
    """Effective sample size of each chain and coordinate: ``x`` of shape ``(C, n, ...)`` gives
    ``(C, ...)``. A constant chain has an ESS of 1."""
    n = x.shape[1]
    if n < MIN_ESS_DRAWS:
        raise ValueError(f"the effective sample size needs at least {MIN_ESS_DRAWS} draws per chain, got {n}")
    rho = autocorrelation(x).double()
    m = n // 2
    pairs = rho[:, 0 : 2 * m : 2] + rho[:, 1 : 2 * m : 2]  # (C, m, ...)
    positive = torch.cumprod((pairs > 0).double(), dim=1)
    monotone = torch.cummin(torch.where(positive > 0, pairs, torch.zeros_like(pairs)), dim=1).values
    floor = 1.0 / torch.log10(torch.tensor(float(n), device=x.device))  # float32, as it always was
    tau = (-1.0 + 2.0 * (monotone * positive).sum(1)).clamp_min(floor)
    constant = x.std(1) == 0
    ess = n / tau
    return torch.where(constant, torch.ones_like(ess), ess).to(x.dtype)
