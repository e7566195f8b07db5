r"""What a sampler is, to the one runner that drives them all (:mod:`pyrobnn.infer.core.runner`):
a **kernel**, its **adaptation**, and the **data** each step is evaluated on. As BlackJAX writes
its samplers, each part is small and its state is explicit.

- A :class:`Kernel` is a state record (:mod:`pyrobnn.infer.core.records`), ``init`` (the state
  at a position), ``randoms`` (every random number one step uses, drawn from the run's generator
  in a fixed order) and ``step``, a pure function: the state, the target, the random numbers and
  the settings in, a new state and the step's information out. No I/O, no generator, no loop.
  ``stepper`` gives the step in the form an :class:`~pyrobnn.infer.core.execution.ExecutionPath`
  asks for (eager torch, compiled, native kernels).
- An :class:`Adaptation` sets the kernel's settings step by step over a state record of its own:
  ``init``, ``update`` (after each warm-up step), ``settings`` and ``final`` (NUTS's window
  adaptation, MCLMC's three tuning phases, SG-MCMC's step-size schedule, which has no state).
  It also says how many steps are warm-up, which steps are kept, and where a run cannot be
  written (MCLMC's third phase).
- The data give the target of each step: :class:`FullBatch` (one potential, every step) or
  :class:`~pyrobnn.infer.core.minibatch.Minibatches` (a batch per step, with the step-failure
  policy of minibatch training).

The runner owns everything else: the loop over steps, thinning, the checkpoint (the records
themselves), progress, interrupts and the execution path.
"""

from __future__ import annotations

__all__ = ["Kernel", "Adaptation", "Fixed", "FullBatch"]


class Kernel:
    """A Markov kernel over a batch of chains ``(C, D)``: subclasses define the methods below
    and describe themselves with the class attributes.

    :cvar name: how progress bars, checkpoints and messages name it (``"NUTS"``).
    :cvar unit: what one step is called in messages (``"iterations"``, ``"steps"``).
    :cvar tallies: the per-chain counts :meth:`tally` returns, summed over the run, apart for
        warm-up (``<name>_warmup``) and sampling (``<name>``).
    :cvar evaluations_per_step: gradient evaluations per chain and step (for NUTS, the most a
        tree can take), which the choice of an execution path reads.
    """

    name = "kernel"
    unit = "steps"
    tallies: tuple = ()
    evaluations_per_step = 1

    def init(self, position, data, generator):
        """The state at ``position`` (``(C, D)``); ``data`` is the run's data source (its
        ``next_target()`` gives the target, a batch's for minibatch kernels)."""
        raise NotImplementedError

    def randoms(self, state, settings, generator):
        """Every random number the next step uses, drawn from ``generator`` in a fixed order."""
        raise NotImplementedError

    def step(self, state, target, randoms, settings):
        """One step of every chain in eager torch code: ``(state, info)``."""
        raise NotImplementedError

    def stepper(self, path, target):
        """The step as ``path`` runs it, ``fn(state, target, randoms, settings) -> (state,
        info)``; ``target`` is the fixed target of a full-batch run (``None`` for minibatches).
        Eager code here; a kernel with compiled or native forms overrides it."""
        if path.kind != "eager":
            raise ValueError(f"{self.name} runs eagerly only, not on the {path.kind} path")
        return self.step

    def record(self, state, info) -> dict:
        """What a kept step adds to the result: ``"z"`` (the draw) and per-draw statistics, each
        ``(C, ...)``."""
        return {"z": state.z}

    def tally(self, info) -> dict:
        """Per-chain counts of this step (``{name: (C,)}`` over :attr:`tallies`)."""
        return {}

    def final(self, state) -> dict:
        """Statistics read from the last state (a per-chain step size the kernel adapts itself)."""
        return {}

    def progress(self, state, info, settings):
        """What the progress bar shows beside the count (``None``: nothing); called every tenth
        step, so it may read values back from the device."""
        return None


class Adaptation:
    """What sets a kernel's settings step by step. Subclasses define :meth:`settings` and, if
    they adapt, the state they carry (:meth:`init`, :meth:`update`).

    :ivar num_steps: the warm-up steps, which :meth:`update` follows and no draw is kept from.
    """

    num_steps = 0

    def init(self, state, data, generator):
        """The adaptation's state record at the kernel's first state (``None``: no state)."""
        return None

    def update(self, tuning, i, state, info, target, generator):
        """The state after warm-up step ``i`` (0-based) reached the kernel's ``state``."""
        return tuning

    def settings(self, tuning, i):
        """The kernel's settings for step ``i``."""
        raise NotImplementedError

    def final(self, tuning) -> dict:
        """The settings the run ended with, as statistics of the result."""
        return {}

    def resumable_after(self, steps: int) -> bool:
        """Whether the run's state after ``steps`` steps can be written and resumed from."""
        return True

    def keeps(self, i: int, thinning: int) -> bool:
        """Whether step ``i`` gives a draw: every ``thinning``-th step after the warm-up."""
        return i >= self.num_steps and (i - self.num_steps + 1) % thinning == 0


class Fixed(Adaptation):
    """No adaptation: ``warmup`` as the settings of the first ``num_steps`` steps (a kernel that
    adapts inside its own state while told so), ``sampling`` after them."""

    def __init__(self, num_steps: int, warmup, sampling):
        self.num_steps, self._warmup, self._sampling = num_steps, warmup, sampling

    def settings(self, tuning, i):
        return self._warmup if i < self.num_steps else self._sampling


class FullBatch:
    """The data of a full-batch run: the same ``target`` (the potential, ``z -> (U, grad U)``)
    at every step."""

    def __init__(self, target):
        #: ``z -> (U, grad U)``, the same at every step
        self.fixed_target = target

    def next_target(self):
        return self.fixed_target

    def guard(self, old, new, info):
        """A full-batch kernel handles a failed step itself (undone, or counted as divergent)."""
        return new

    def after_step(self, i: int, state, last: bool) -> None:
        pass

    def before_save(self, state) -> None:
        pass

    def state_dict(self):
        return None

    def load_state_dict(self, state) -> None:
        pass
