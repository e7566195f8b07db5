"""Every name a pyrobnn module lists in ``__all__`` is there: ``from module import *`` and the API
pages read that list, and a name listed but not defined or imported fails only there."""

import importlib
import pkgutil

import pytest

import pyrobnn

OPTIONAL = {"botorch", "gpytorch", "ax", "lightning", "laplace", "laplace_bayesopt"}


def modules():
    for info in pkgutil.walk_packages(pyrobnn.__path__, "pyrobnn."):
        yield info.name


@pytest.mark.parametrize("name", ["pyrobnn"] + list(modules()))
def test_every_name_in_all_is_defined(name):
    try:
        module = importlib.import_module(name)
    except ImportError as error:  # an optional extra that is not installed
        root = (error.name or "").split(".")[0]
        if root in OPTIONAL:
            pytest.skip(f"{name} needs {root}, not installed")
        raise
    missing = [n for n in getattr(module, "__all__", []) if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists names it does not define: {missing}"
