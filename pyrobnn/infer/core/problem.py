"""The setup every method on the flat weight vector shares, written once: check the training
data against the model and move them to its device and dtype, build the
:class:`~pyrobnn.infer.core.potential.FlatPotential` over them and a generator seeded for the run,
and hold the model in evaluation mode while the method runs (a network's Dropout and BatchNorm
then act as at prediction time; the mode the user had is restored on the way out, also after an
error)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from pyrobnn.infer.core.potential import FlatPotential
from pyrobnn.utils.modes import eval_mode
from pyrobnn.utils.validation import validate_training_data

__all__ = ["FlatProblem", "flat_problem", "training_data"]


@dataclass
class FlatProblem:
    """A method's view of ``model`` on ``(x, y)``: the checked data (``y`` as the likelihood
    reads it), the potential over the flat unconstrained weights, the run's generator."""

    model: object
    x: torch.Tensor
    y: torch.Tensor
    potential: FlatPotential
    generator: torch.Generator


def training_data(model, x, y):
    """``(x, y)`` checked for ``model`` (:func:`~pyrobnn.utils.validation.validate_training_data`:
    numpy or tensors, shapes, finiteness, labels) and moved to its device, ``x`` in its dtype."""
    x, y = validate_training_data(model, x, y)
    return x.to(model.device, model.dtype), y.to(model.device)


@contextlib.contextmanager
def flat_problem(model, x, y, seed: int):
    """The :class:`FlatProblem` of ``model`` on ``(x, y)`` with a generator on the model's
    device seeded with ``seed``, the model in evaluation mode inside the block."""
    x, y = training_data(model, x, y)
    with eval_mode(model):
        potential = FlatPotential(model, x, y)
        generator = torch.Generator(device=model.device).manual_seed(seed)
        yield FlatProblem(model, x, potential.y, potential, generator)
