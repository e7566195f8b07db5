"""Making module parameters visible to Pyro without the global parameter store.

``pyro.infer.SVI`` finds what to optimize by recording ``param`` sites while it evaluates the
loss, and calls ``site["value"].unconstrained()`` on each. Our models and guides keep their
parameters as ordinary ``nn.Parameter`` attributes (so two BNNs in one process never share
a name in Pyro's global store, and ``state_dict`` round-trips) and announce them with
:func:`announce_param`, which emits such a site and nothing else.
"""

from __future__ import annotations

import weakref

from pyro.poutine.runtime import am_i_wrapped, effectful
from torch.distributions import constraints

__all__ = ["announce_param"]


def _identity(name, value, constraint=None, event_dim=None):
    return value


_param = effectful(_identity, type="param")


def announce_param(name: str, param) -> None:
    """Emit a Pyro ``param`` site for ``param`` (a leaf tensor) when any handler is active."""
    if not am_i_wrapped():
        return
    value = param.detach()
    value.unconstrained = weakref.ref(param)
    _param(name, value, constraints.real, None, name=name)
