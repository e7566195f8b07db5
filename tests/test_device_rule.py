"""The device rule, held on machines without a GPU: every tensor pyrobnn makes names its device.

A factory call without ``device=`` makes its tensor on the default device, which is the CPU
unless the user said otherwise: code that passes every test on a CPU then fails on CUDA (the
first GPU run found MCLMC stopped by a CPU scalar meeting a CUDA tensor), or fails for a user
who called ``torch.set_default_device("cuda")`` (a CPU generator then meets a CUDA ``randperm``).
So each ``torch.<factory>(...)`` in the package names its device: the input's (``x.device``), a
CPU tensor on purpose (``device="cpu"``, said where it is made), or the default device as
``nn.Linear`` uses it (``torch.get_default_device()``) for a module's own parameters.
Derived tensors (``zeros_like``, ``x.new_zeros``) carry their input's device and are not checked.
"""

import ast
import pathlib

import pytest
import torch

import pyrobnn

PACKAGE = pathlib.Path(pyrobnn.__file__).parent

#: torch functions that make a tensor (or a generator) from nothing but numbers and shapes
FACTORIES = {
    "tensor", "as_tensor", "scalar_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye",
    "rand", "randn", "randint", "randperm", "tril_indices", "triu_indices", "Generator",
}


def factory_calls_without_device(source: str):
    """``[(line, name)]``: the ``torch.<factory>(...)`` calls in ``source`` with neither a
    ``device=`` keyword nor a ``**options`` that may carry one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "torch" and node.func.attr in FACTORIES:
            if not any(k.arg in ("device", None) for k in node.keywords):
                found.append((node.lineno, node.func.attr))
    return found


def test_the_check_sees_a_call_without_a_device():
    source = "import torch\na = torch.zeros(3)\nb = torch.zeros(3, device=x.device)\nc = torch.randn(2, **opts)\ng = torch.Generator()\n"
    assert factory_calls_without_device(source) == [(2, "zeros"), (5, "Generator")]


def test_every_factory_call_in_the_package_names_its_device():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: torch.{name}(...) names no device"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in factory_calls_without_device(path.read_text())
    ]
    assert not offenders, "\n".join(offenders)


@pytest.fixture
def default_device_meta():
    """The default device set to one no pyrobnn code may fall back on."""
    before = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(before)


def test_data_made_on_the_host_whatever_the_default_device(default_device_meta):
    # the data sets and the conformance cases draw from a CPU generator; with the default
    # device elsewhere, a factory call without device= refuses the generator or lands there
    from pyrobnn.data import blundell_regression, gap_regression, two_moons

    for x, y in (blundell_regression(20), gap_regression(20), two_moons(20)):
        assert x.device.type == "cpu" and y.device.type == "cpu"
