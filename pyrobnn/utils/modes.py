"""A module's training mode, held for a block: :func:`eval_mode` puts modules in evaluation mode
(dropout off, batch normalization on its running statistics) and gives every submodule back the
mode it had on the way out, also after an error."""

from __future__ import annotations

import contextlib

__all__ = ["eval_mode"]


@contextlib.contextmanager
def eval_mode(*modules):
    """Within the block, every one of ``modules`` (``torch.nn.Module`` s; ``None`` is passed over)
    is in evaluation mode; afterwards each of their submodules has its own earlier mode again (a
    user's network with one layer kept in evaluation mode keeps it so)."""
    modules = [m for m in modules if m is not None]
    modes = [[(m, m.training) for m in module.modules()] for module in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, inner in zip(modules, modes):
            module.train(inner[0][1])  # the module's own train(), which a subclass may extend
            for m, training in inner[1:]:
                m.training = training
