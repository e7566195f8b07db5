"""The import paths and call forms of pyrobnn 0.1, kept for one release.

``pyrobnn.infer`` was one flat folder; it is now one subpackage per method family. Importing an
old module (``pyrobnn.infer.fit``, ``pyrobnn.infer.hmc``, ...) gives a stand-in module that
warns once with :class:`PyrobnnDeprecationWarning`, naming the new path, and hands out the
names it held from their new homes (a renamed class under its old name too:
``MCMCResult`` is :class:`~pyrobnn.infer.posterior.Posterior`). The stand-ins hold no code of
their own; they go in the release after next.

Every method is now called ``method(model, x, y, *, ...)``; :func:`data_then_keywords` lets
0.1's positional calls (``deep_ensemble(model, x, y, 8)``) through for one release, with the
same warning.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import types
import warnings

__all__ = ["MOVED", "PyrobnnDeprecationWarning", "install", "data_then_keywords"]


class PyrobnnDeprecationWarning(DeprecationWarning):
    """An import path or name of pyrobnn 0.1 that goes in the release after next."""


#: old module -> (its new homes, searched in order; names renamed on the way)
MOVED = {
    "pyrobnn.infer.fit": (("pyrobnn.infer.svi.trainer", "pyrobnn.infer.svi.history", "pyrobnn.infer.failures", "pyrobnn.infer.svi.schedules", "pyrobnn.validation"), {}),
    "pyrobnn.infer.elbo": (("pyrobnn.infer.svi.elbo",), {}),
    "pyrobnn.infer.flat": (("pyrobnn.infer.svi.trace_free",), {"FlatELBO": "TraceFreeELBO"}),
    "pyrobnn.infer.objective": (("pyrobnn.infer.svi.objective",), {}),
    "pyrobnn.infer.hmc": (
        ("pyrobnn.infer.mcmc.samplers", "pyrobnn.infer.mcmc.runner", "pyrobnn.infer.posterior", "pyrobnn.validation"),
        {"MCMCResult": "Posterior"},
    ),
    "pyrobnn.infer.nuts": (("pyrobnn.infer.mcmc.nuts_kernel",), {}),
    "pyrobnn.infer.mclmc": (("pyrobnn.infer.mcmc.mclmc_kernel",), {}),
    "pyrobnn.infer.native": (("pyrobnn.infer.mcmc.native",), {}),
    "pyrobnn.infer.budget": (("pyrobnn.infer.mcmc.budget",), {}),
    "pyrobnn.infer.autocorrelation": (("pyrobnn.infer.mcmc.autocorrelation",), {}),
    "pyrobnn.infer.ensemble": (("pyrobnn.infer.modes.ensemble", "pyrobnn.infer.mcmc.samplers"), {"EnsembleResult": "EnsemblePosterior"}),
    "pyrobnn.infer.laplace": (("pyrobnn.infer.modes.laplace",), {"LaplaceResult": "LaplacePosterior"}),
    "pyrobnn.infer.swag": (("pyrobnn.infer.modes.swag",), {"SWAGResult": "SWAGPosterior"}),
    "pyrobnn.infer.lightning_modules": (("pyrobnn.infer.lightning.modules",), {}),
    "pyrobnn.predict": (("pyrobnn.predictive",), {}),
}


class _StandIn(types.ModuleType):
    """An old module: its attributes come from the new homes."""

    def __init__(self, name, homes, renames):
        super().__init__(name, f"pyrobnn 0.1's {name}, moved to {', '.join(homes)}")
        self._homes, self._renames = homes, renames

    def __getattr__(self, attr):
        if attr.startswith("__") and attr != "__all__":
            raise AttributeError(attr)
        modules = [importlib.import_module(h) for h in self._homes]
        if attr == "__all__":
            names = [n for m in modules for n in getattr(m, "__all__", ())]
            return names + list(self._renames)
        new = self._renames.get(attr, attr)
        for module in modules:
            if hasattr(module, new):
                value = getattr(module, new)
                if new != attr:
                    home = getattr(value, "__module__", module.__name__)
                    warnings.warn(f"{self.__name__}.{attr} is now {home}.{new}", PyrobnnDeprecationWarning, stacklevel=2)
                return value
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self._homes)}) has no attribute {attr!r}")

    def __call__(self, *args, **kwargs):
        # pyrobnn.predict is the function; importing the old module pyrobnn.predict makes the
        # package attribute this stand-in, which then still predicts
        if self.__name__ != "pyrobnn.predict":
            raise TypeError(f"module {self.__name__!r} is not callable")
        from pyrobnn.predictive import predict

        return predict(*args, **kwargs)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self, origin="moved")
        return None

    def create_module(self, spec):
        homes, renames = MOVED[spec.name]
        return _StandIn(spec.name, homes, renames)

    def exec_module(self, module):
        warnings.warn(
            f"{module.__name__} moved to {' and '.join(module._homes)}; the old path goes in the release after next",
            PyrobnnDeprecationWarning,
            stacklevel=2,
        )


_FINDER = _Finder()


def install() -> None:
    """Let the old paths import (once per process), and show their warnings once per place."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
        warnings.filterwarnings("default", category=PyrobnnDeprecationWarning)


def data_then_keywords(fn):
    """Make every parameter of ``fn`` after ``(model, x, y)`` keyword-only, accepting 0.1's
    positional form for one release with a :class:`PyrobnnDeprecationWarning` that names the
    arguments."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    movable = [p.name for p in params[3:] if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword_only = params[:3] + [p.replace(kind=p.KEYWORD_ONLY) if p.kind is p.POSITIONAL_OR_KEYWORD else p for p in params[3:]]

    @functools.wraps(fn)
    def method(*args, **kwargs):
        if len(args) > 3:
            extra = args[3:]
            if len(extra) > len(movable):
                raise TypeError(f"{fn.__name__}() takes (model, x, y) and keyword arguments, got {len(args)} positional arguments")
            names = movable[: len(extra)]
            twice = [n for n in names if n in kwargs]
            if twice:
                raise TypeError(f"{fn.__name__}() got {twice[0]!r} both by position and by keyword")
            shown = ", ".join(f"{n}=..." for n in names)
            warnings.warn(
                f"{fn.__name__}: passing {', '.join(names)} by position is deprecated; write {fn.__name__}(model, x, y, {shown})",
                PyrobnnDeprecationWarning,
                stacklevel=2,
            )
            kwargs.update(zip(names, extra))
            args = args[:3]
        return fn(*args, **kwargs)

    method.__signature__ = signature.replace(parameters=keyword_only)
    return method
