r"""Stochastic-gradient MCMC on a BayesianModel: SGLD and SGHMC, with a constant or cyclical
step size.

Both use the minibatch estimate of the log joint's gradient in the unconstrained space of
:class:`~pyrobnn.infer.core.potential.FlatPotential`,

.. math:: \hat g(w) = \nabla \log p(w) + \frac{N}{B} \sum_{n \in \mathcal B} \nabla \log p(y_n \mid x_n, w),

unbiased for :math:`\nabla \log p(w \mid \mathcal D)`, and run all chains as one batch.

- **SGLD** (Welling & Teh 2011): :math:`w \leftarrow w + \frac\epsilon2 \hat g(w) + \sqrt\epsilon\, \xi`,
  :math:`\xi \sim N(0, I)`.
- **SGHMC** (Chen, Fox & Guestrin 2014, eq. 15, with the noise estimate :math:`\hat\beta = 0`):
  :math:`v \leftarrow (1 - \alpha) v + \eta \hat g(w) + \sqrt{2 \alpha \eta}\, \xi`,
  :math:`w \leftarrow w + v`, with learning rate :math:`\eta` and friction :math:`\alpha`.
- **Cyclical schedule** (Zhang et al. 2020, ICLR, eq. 1): over :math:`K` steps in :math:`M`
  cycles, :math:`\epsilon_k = \frac{\epsilon_0}{2}\big[\cos\big(\pi \frac{(k-1) \bmod \lceil K/M \rceil}{\lceil K/M \rceil}\big) + 1\big]`;
  in the first ``exploration`` fraction of each cycle the noise is off (optimization), in the
  rest draws are kept every ``thinning`` steps.

With a constant step size, draws are kept every ``thinning`` steps after ``num_burnin``. Neither
sampler has a Metropolis correction: the draws are biased by the step size (for SGLD on a
Gaussian of precision :math:`\lambda` the stationary variance is
:math:`1 / (\lambda (1 - \epsilon\lambda/4))`, which the tests check).
"""

from __future__ import annotations


import torch

from pyrobnn.infer.core.checkpoints import Checkpointing
from pyrobnn.infer.core.curvature import largest_curvature
from pyrobnn.infer.core.minibatch import MinibatchLoop, Minibatches
from pyrobnn.infer.core.runner import RunSettings, Sampler, sample
from pyrobnn.infer.core.starts import chain_starts
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.sgmcmc.kernels import SCHEDULES, SGHMC, SGLD, StepSizeSchedule
from pyrobnn.methods import MethodSpec, WarmStart, checked, latent_only_support, register, scaled_budget
from pyrobnn.utils.constraints import Either, Interval, OneOf, Positive

__all__ = ["sgld", "sghmc", "MinibatchSampler", "AUTO_STEP"]

#: ``step_size="auto"``: this constant over the largest curvature at the start (SGLD's step,
#: SGHMC's learning rate); a tenth of SGLD's stability limit on a Gaussian, so that the
#: discretization bias is a few percent there (1 / (1 - eps lambda / 4))
AUTO_STEP = 0.1


class MinibatchSampler(Sampler):
    """A stochastic-gradient kernel as the runner takes it on a model: chains started at the
    network's own initialization under seeds ``seed + k`` (as deep-ensemble members are) or from
    ``init``, and minibatches of ``batch_size`` points in a seeded order; subclasses give the
    kernel and its adaptation (:meth:`kernel_and_adaptation`)."""

    def __init__(self, name: str, settings: dict, batch_size: int, per_chain: bool = False, guard: bool = True):
        super().__init__(name, "sgmcmc", settings)
        self.batch_size, self.per_chain, self.guard = batch_size, per_chain, guard

    def starts(self, potential, generator, run: RunSettings) -> torch.Tensor:
        return chain_starts(potential.model, potential, run.init, run.num_chains, run.seed, generator)

    def kernel_and_adaptation(self, problem, z0) -> tuple:
        raise NotImplementedError

    def advice(self, adaptation) -> str:
        """What the error of a failed step tells the user to change."""
        return "Lower the learning rate."

    def parts(self, problem, z0, path):
        kernel, adaptation = self.kernel_and_adaptation(problem, z0)
        loop = MinibatchLoop(problem.x.shape[0], self.batch_size, self.settings["seed"], problem.x.device, advice=self.advice(adaptation))
        data = Minibatches(problem.potential, loop, per_chain=z0.shape[0] if self.per_chain else None, guard=self.guard)
        return kernel, adaptation, data


class _SGMCMCSampler(MinibatchSampler):
    """SGLD or SGHMC with a :class:`~pyrobnn.infer.sgmcmc.kernels.StepSizeSchedule`, the step
    size ``"auto"`` resolved on the starting points."""

    def __init__(self, kind: str, settings: dict):
        super().__init__(kind.upper(), settings, settings["batch_size"])
        self.kind = kind

    def kernel_and_adaptation(self, problem, z0):
        s = self.settings
        step_size = s["step_size"]
        if step_size == "auto":
            step_size = AUTO_STEP / float(largest_curvature(problem.potential, z0, generator=problem.generator).max())
        num_burnin = s["num_steps"] // 2 if s["num_burnin"] is None else s["num_burnin"]
        schedule = StepSizeSchedule(step_size, s["num_steps"], s["schedule"], s["num_cycles"], s["exploration"], num_burnin)
        return (SGLD() if self.kind == "sgld" else SGHMC(s["friction"])), schedule

    def advice(self, adaptation) -> str:
        return f"Lower step_size (now {adaptation.step_size:.3g})."

    def label(self, run) -> str:
        return self.name + (" (cyclical)" if self.settings["schedule"] == "cyclical" else "")

    def stats(self, chains) -> dict:
        draws = chains.draws
        return {"step": torch.tensor(chains.kept, device=draws.device),
                "step_size": torch.full((draws.shape[0],), float(chains.stats["step_size"]), device=draws.device)}


def _sample(kind: str, model, x, y, settings: dict, progress: bool, checkpoint) -> Posterior:
    """SGLD or SGHMC with these ``settings`` (the call's, as the result records them)."""
    s = settings
    run = RunSettings(num_samples=s["num_steps"], thinning=s["thinning"], num_chains=s["num_chains"], init=s["init"], seed=s["seed"],
                      progress=progress, checkpoint=Checkpointing.of(checkpoint))
    return sample(model, x, y, _SGMCMCSampler(kind, settings), run)


@checked("sgld")
def sgld(
    model, x, y, *, step_size: float = 1e-4, num_steps: int = 10_000, num_burnin=None, thinning: int = 50,
    schedule: str = "constant", num_cycles: int = 4, exploration: float = 0.5, batch_size: int = 128, num_chains: int = 1,
    init=None, seed: int = 0, progress: bool = True, checkpoint=None,
) -> Posterior:
    """SGLD draws from ``model``'s posterior given ``(x, y)``, as an
    :class:`~pyrobnn.infer.results.posterior.Posterior` (``predict``, ``Predictive`` and ArviZ take it).

    :param step_size: :math:`\\epsilon` (the initial one with ``schedule="cyclical"``), or
        ``"auto"``: ``AUTO_STEP`` over the largest curvature of the log joint at the starting
        points (:func:`largest_curvature`, the largest over chains).
    :param num_steps: steps in all, burn-in included.
    :param num_burnin: steps before the first kept draw (constant schedule; default half of
        ``num_steps``).
    :param thinning: a draw is kept at every ``thinning``-th step (counted from the first step).
    :param schedule: ``"constant"`` or ``"cyclical"`` (cSGLD; ``num_cycles``, ``exploration``).
    :param num_cycles: the cyclical schedule's cycles.
    :param exploration: the fraction of each cycle run without noise and without draws.
    :param batch_size: training points per step, in a seeded random order.
    :param num_chains: chains run as one batch, each started at the network's own initialization
        under seed ``seed + k`` (as deep-ensemble members are), or from ``init``.
    :param init: starting positions: a :class:`~pyrobnn.infer.results.posterior.Posterior` (its
        last draws: one chain per ensemble member) or a ``(chains, dim)`` tensor.
    :param seed: seeds the starts, the data order and the noise.
    :param progress: show a progress bar.
    :param checkpoint: a file to write the chains' state to (positions, momenta, random
        generators, data order, draws so far), or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` steps or ``seconds``
        seconds), and at the end; the same call with the same file resumes
        from it and gives the uninterrupted run's draws (:mod:`pyrobnn.infer.core.checkpoints`).

    A step whose gradient or new position is not finite is handled by the one policy of
    :mod:`pyrobnn.infer.core.minibatch`: from it on the chains stay where they were, and at the end
    of the epoch (``ceil(N / batch_size)`` steps) a
    :class:`~pyrobnn.infer.core.failures.NonFiniteLossError` names the step.
    """
    settings = dict(step_size=step_size, friction=None, num_steps=num_steps, num_burnin=num_burnin, thinning=thinning, schedule=schedule,
                    num_cycles=num_cycles, exploration=exploration, batch_size=batch_size, num_chains=num_chains, seed=seed, init=init)
    return _sample("sgld", model, x, y, settings, progress, checkpoint)


@checked("sghmc")
def sghmc(
    model, x, y, *, step_size: float = 1e-5, friction: float = 0.1, num_steps: int = 10_000, num_burnin=None,
    thinning: int = 50, schedule: str = "constant", num_cycles: int = 4, exploration: float = 0.5, batch_size: int = 128,
    num_chains: int = 1, init=None, seed: int = 0, progress: bool = True, checkpoint=None,
) -> Posterior:
    """SGHMC draws (learning rate ``step_size`` :math:`= \\eta`, or ``"auto"`` as in :func:`sgld`;
    ``friction`` :math:`= \\alpha`, in (0, 1]); every other argument as in :func:`sgld`. With
    ``schedule="cyclical"`` this is cSGHMC."""
    settings = dict(step_size=step_size, friction=friction, num_steps=num_steps, num_burnin=num_burnin, thinning=thinning, schedule=schedule,
                    num_cycles=num_cycles, exploration=exploration, batch_size=batch_size, num_chains=num_chains, seed=seed, init=init)
    return _sample("sghmc", model, x, y, settings, progress, checkpoint)


def _burnin_in_range(options):
    burnin = options["num_burnin"]
    if options["schedule"] == "constant" and burnin is not None and not (
        isinstance(burnin, int) and not isinstance(burnin, bool) and 0 <= burnin < options["num_steps"]
    ):
        return f"num_burnin must be an integer in [0, num_steps), got {burnin!r}"
    return None


def _cycles_fit(options):
    if options["schedule"] == "cyclical" and options["num_cycles"] > options["num_steps"]:
        return f"num_cycles ({options['num_cycles']}) exceeds num_steps ({options['num_steps']})"
    return None


def _keeps_a_draw(options):
    """A run that would keep no draw is refused at the call, not after it."""
    if options["schedule"] not in SCHEDULES or _burnin_in_range(options) or _cycles_fit(options):
        return None  # refused by the rules above
    burnin = options["num_steps"] // 2 if options["num_burnin"] is None else options["num_burnin"]
    schedule = StepSizeSchedule(1.0, options["num_steps"], options["schedule"], options["num_cycles"], options["exploration"], burnin)
    if not any(schedule.keeps(k, options["thinning"]) for k in range(options["num_steps"])):
        return f"no draws kept: num_steps={options['num_steps']} with thinning={options['thinning']} keeps none after burn-in"
    return None


def _cut_burnin(model, previous, x, y, options, fraction, seed):
    """A refit's burn-in cut to ``fraction``, the steps after it as many as before."""
    warm = dict(options)
    steps = options.get("num_steps", 10_000)
    burnin = options.get("num_burnin")
    burnin = steps // 2 if burnin is None else burnin
    warm["num_burnin"] = scaled_budget(burnin, fraction)
    warm["num_steps"] = steps - burnin + warm["num_burnin"]
    return warm


_SG_BUDGETS = {"num_steps": 1, "thinning": 1, "num_cycles": 1, "batch_size": 1, "num_chains": 1}
_SG_CONSTRAINTS = {
    "step_size": Either(Positive(), "auto"), "schedule": OneOf(SCHEDULES), "exploration": Interval(0.0, 1.0, "left", "a fraction"),
}
_SG_RULES = (_burnin_in_range, _cycles_fit, _keeps_a_draw)
_SG_QUICK = {"num_steps": 6, "thinning": 2, "batch_size": 16, "num_chains": 2, "step_size": "auto", "progress": False}
_SG_WARM_START = WarmStart(init="init", count="num_chains", prepare=_cut_burnin, names=("num_burnin", "num_steps"))
register(MethodSpec("sgld", "SGLD: Langevin dynamics on minibatch gradients (constant or cyclical steps)", "sgmcmc", sgld,
                    latent_only_support(), budgets=_SG_BUDGETS, constraints=_SG_CONSTRAINTS, rules=_SG_RULES, quick=_SG_QUICK,
                    bo_options=dict(num_steps=4000, thinning=50, step_size="auto"), warm_start=_SG_WARM_START))
register(MethodSpec("sghmc", "SGHMC: Hamiltonian dynamics with friction on minibatch gradients", "sgmcmc", sghmc,
                    latent_only_support(), budgets=_SG_BUDGETS, constraints={**_SG_CONSTRAINTS, "friction": Interval(0.0, 1.0, "right")},
                    rules=_SG_RULES, quick=_SG_QUICK, bo_options=dict(num_steps=4000, thinning=50, step_size="auto"),
                    warm_start=_SG_WARM_START))
