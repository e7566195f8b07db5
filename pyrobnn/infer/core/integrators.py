r"""The integrators the samplers share, as pure tensor functions of a batch of chains
``(C, D)``.

- Hamiltonian dynamics with a diagonal mass matrix :math:`M` (NUTS): the kinetic energy
  :math:`K(r) = \tfrac12 r^\top M^{-1} r` (:func:`kinetic_energy`) and one velocity-Verlet
  (leapfrog) step :math:`r \leftarrow r - \tfrac\epsilon2 \nabla U`,
  :math:`z \leftarrow z + \epsilon M^{-1} r`, :math:`r \leftarrow r - \tfrac\epsilon2 \nabla U`
  (:func:`leapfrog`; Neal 2011, "MCMC using Hamiltonian dynamics").
- Isokinetic dynamics with a unit velocity :math:`u` (MCLMC and SMILE): the closed-form velocity
  update of Steeg & Galstyan (2021) (:func:`esh_velocity_update`), with :math:`g = -\sqrt{M^{-1}}
  \nabla U`, :math:`e = g / |g|`, :math:`\delta = \epsilon |g| / (d - 1)`, :math:`\zeta = e^{-\delta}`:

  .. math:: u' \propto e\,(1 - \zeta)\bigl(1 + \zeta + (u \cdot e)(1 - \zeta)\bigr) + 2 \zeta u,
            \qquad \Delta K = (d - 1)\bigl(\delta - \log 2 + \log(1 + u \cdot e + (1 - u \cdot e)\zeta^2)\bigr);

  the partial velocity refresh :math:`u \leftarrow (u + \nu \xi) / |u + \nu \xi|`,
  :math:`\nu = \sqrt{(e^{2\epsilon/L} - 1)/d}` (:func:`partial_refresh`; Robnik & Seljak 2024);
  and McLachlan's (1995) minimal-norm coefficient :data:`MCLACHLAN_B1` of the scheme
  :math:`V(b_1 \epsilon)\,T(\epsilon/2)\,V((1 - 2 b_1)\epsilon)\,T(\epsilon/2)\,V(b_1 \epsilon)`
  that both compose from them;
- the energy error :data:`MAX_DELTA_ENERGY` beyond which a trajectory counts as divergent.
"""

from __future__ import annotations

import math

import torch

__all__ = ["MCLACHLAN_B1", "MAX_DELTA_ENERGY", "kinetic_energy", "leapfrog", "unit_vector", "esh_velocity_update", "partial_refresh"]

#: McLachlan's minimal-norm coefficient (McLachlan 1995; Omelyan et al. 2003)
MCLACHLAN_B1 = 0.1931833275037836
#: the energy error above which a Hamiltonian trajectory counts as divergent (Stan's and Pyro's)
MAX_DELTA_ENERGY = 1000.0


def kinetic_energy(r, inv_mass):
    """:math:`\\tfrac12 r^\\top M^{-1} r` per chain, ``(C,)``."""
    return 0.5 * (r * r * inv_mass).sum(-1)


def leapfrog(potential, z, r, grad, step, inv_mass):
    """One velocity-Verlet step of ``step`` (``(C, 1)``, signed by the direction); ``potential``
    maps ``z`` to ``(U, grad U)``. Returns ``(z, r, U, grad U)`` at the new point."""
    r = r - 0.5 * step * grad
    z = z + step * inv_mass * r
    energy, grad = potential(z)
    r = r - 0.5 * step * grad
    return z, r, energy, grad


def unit_vector(v):
    """``v`` over its norm along the last axis (a zero vector stays finite)."""
    return v / v.norm(dim=-1, keepdim=True).clamp_min(1e-13)


def esh_velocity_update(u, grad, eps, sqrt_inv_mass):
    """ESH velocity update by ``eps`` (``(C, 1)``) along ``-grad U``; returns ``(u', dK)``."""
    d = u.shape[-1]
    g = -grad * sqrt_inv_mass
    g_norm = g.norm(dim=-1, keepdim=True)
    e = g / g_norm.clamp_min(1e-13)
    ue = (u * e).sum(-1, keepdim=True)
    delta = eps * g_norm / (d - 1)
    zeta = torch.exp(-delta)
    u_new = unit_vector(e * (1 - zeta) * (1 + zeta + ue * (1 - zeta)) + 2 * zeta * u)
    d_kinetic = (delta - math.log(2.0) + torch.log(1 + ue + (1 - ue) * zeta * zeta)) * (d - 1)
    return u_new, d_kinetic.squeeze(-1)


def partial_refresh(u, eps, L, noise):
    """Partial velocity refresh over a time ``eps`` (``(C, 1)``) with decoherence length ``L``
    from the standard normal ``noise``."""
    d = u.shape[-1]
    nu = torch.sqrt(torch.expm1(2 * eps / L) / d)
    return unit_vector(u + nu * noise)
