"""Module parameters as Pyro ``param`` sites, owned by their module.

Our models and guides keep their parameters as ordinary ``nn.Parameter`` attributes: the
module is the only place a value lives, so ``state_dict``, ``.to()`` and ``copy.deepcopy``
behave as in PyTorch, and two BNNs in one process never share a value (where Pyro's global
parameter store, read by ``pyro.param(name, init)``, hands the second model the first one's
tensor when their names agree).

Pyro still needs to *name* each parameter: ``pyro.optim`` looks names up in the parameter
store (per-parameter options, ``get_state``/``set_state``), and ``JitTrace_ELBO`` fetches each
parameter by name before every call. So while a Pyro handler is active, :func:`pyro_param`

* registers ``name -> parameter`` in the store, replacing the tensor of a module of ours that
  the name pointed at (the module wins; nothing is ever read *from* the store into a module),
  and refusing a name the store holds for anything else (a ``pyro.param`` of the user's), and
* emits a ``param`` site whose value the caller computes with, so handlers that substitute
  parameters (``poutine.replay(params=...)``, ``poutine.substitute``, ``poutine.lift``, the
  JIT's replay) act on our modules as on ``pyro.param``.

Outside any handler (plain PyTorch use, our trace-free ``fit``) it returns the parameter and
touches nothing.
"""

from __future__ import annotations

import weakref

import pyro
import torch
from pyro.poutine.runtime import am_i_wrapped, effectful
from torch.distributions import constraints

__all__ = ["pyro_param", "pyro_params", "call_substituted"]


def _identity(name, value, constraint=None, event_dim=None):
    return value


_param = effectful(_identity, type="param")


#: the parameter registered under each name by :func:`_register`: a name that the store holds
#: for another tensor was given by someone else (a ``pyro.param`` of the user's), which a module's
#: parameter must not silently replace
_REGISTERED: dict = {}


def _register(name: str, param: torch.Tensor) -> None:
    """Point ``name`` in Pyro's parameter store at ``param`` (public store API only). A name
    the store holds for a tensor that no module of ours put there is refused."""
    store = pyro.get_param_store()
    if store.param_name(param) == name and name in store:
        return
    if name in store:
        ours = _REGISTERED.get(name)
        # an unconstrained parameter of ours reads back as the very tensor registered
        if ours is None or ours() is not store[name]:
            raise ValueError(
                f"Pyro's parameter store holds a parameter {name!r} that pyrobnn did not put there (a pyro.param "
                "of your own, or a store loaded from a file); a pyrobnn module names its parameter so and would "
                "replace it. Rename yours, clear the store (pyro.clear_param_store()), or give the guide another "
                "prefix (guide.pyro_prefix = 'guide2.'). pyrobnn's values live in the modules: load them with "
                "pyrobnn.load or load_state_dict."
            )
        del store[name]  # drops the old tensor's reverse mapping as well
    # for an unconstrained name the store keeps the very tensor given (contiguous parameters)
    store[name] = param
    _REGISTERED[name] = weakref.ref(param)


def pyro_param(name: str, param: torch.Tensor) -> torch.Tensor:
    """The tensor to compute with for ``param`` under the Pyro ``param`` site ``name``: the
    parameter itself unless an active handler substitutes another value."""
    if not am_i_wrapped():
        return param
    if param.requires_grad and param.is_contiguous():
        # the store sets requires_grad (a frozen parameter stays unregistered and frozen)
        _register(name, param)
    # the site's value is a detached stand-in that leads back to the parameter, as Pyro's
    # own constrained values do; attaching the weak reference to the parameter itself
    # would make ``torch.save(module)`` fail
    placeholder = param.detach()
    placeholder.unconstrained = weakref.ref(param)
    value = _param(name, placeholder, constraints.real, None, name=name)
    return param if value is placeholder else value


def pyro_params(named, prefix: str = "") -> dict:
    """Emit a site for each ``(path, parameter)`` in ``named`` under ``prefix + path``;
    returns ``{path: value}`` for those a handler replaced (empty in ordinary use)."""
    replaced = {}
    for path, param in named:
        value = pyro_param(prefix + path, param)
        if value is not param:
            replaced[path] = value
    return replaced


def call_substituted(module: torch.nn.Module, replaced: dict, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` with ``module``'s parameters at paths ``replaced`` swapped
    for the given tensors (``torch.func.functional_call``'s swap, undone afterwards)."""

    class _Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self):
            return fn(*args, **kwargs)

    return torch.func.functional_call(_Call(), {"inner." + k: v for k, v in replaced.items()}, (), strict=False)
