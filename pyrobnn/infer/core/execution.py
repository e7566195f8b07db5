"""The code that runs a kernel's steps, as the runner (:mod:`pyrobnn.infer.core.runner`) applies
it: an :class:`ExecutionPath` names it (``"native"``: hand-written kernels; ``"torch.compile"``:
the torch step compiled by Inductor; ``"eager"``: the torch step op by op), says why it was
chosen, and gives the full-batch target that path evaluates. Which path a run takes is a rule of
the sampler's family (:mod:`pyrobnn.infer.mcmc.backend` for the full-batch samplers); a run
without a rule runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["ExecutionPath", "EAGER"]


@dataclass(frozen=True)
class ExecutionPath:
    """How a run's steps execute: ``kind`` (``"native"``, ``"torch.compile"`` or ``"eager"``),
    the reason in words, and the native kernels' handle on the native path (an object with
    ``value_and_grad`` and ``close()``)."""

    kind: str
    reason: str
    native: Optional[object] = None

    @property
    def compiled(self) -> bool:
        return self.kind == "torch.compile"

    def target(self, potential):
        """The potential's ``z -> (U, grad U)`` as this path evaluates it."""
        if self.native is not None:
            return self.native.value_and_grad
        if self.compiled:
            return potential.value_and_grad_functional
        return potential.value_and_grad

    def stats(self) -> dict:
        return {"path": self.kind, "path_reason": self.reason}

    def close(self) -> None:
        if self.native is not None:
            self.native.close()


#: the path of a run without a rule: eager torch code
EAGER = ExecutionPath("eager", "eager torch code")
