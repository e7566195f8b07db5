"""SMILE as a posterior method on a BayesianModel: stochastic-gradient microcanonical Langevin
sampling (the kernel and its math: :mod:`pyrobnn.infer.sgmcmc.smile_kernel`) over the minibatch
log joint that SGLD and SGHMC use, a batch per chain, every chain in one batch, run by the one
runner (:mod:`pyrobnn.infer.core.runner`)."""

from __future__ import annotations

from pyrobnn.infer.core.checkpoints import Checkpointing
from pyrobnn.infer.core.kernel import Fixed
from pyrobnn.infer.core.problem import training_data
from pyrobnn.infer.core.runner import RunSettings, sample
from pyrobnn.infer.results.posterior import Posterior
from pyrobnn.infer.sgmcmc.samplers import MinibatchSampler
from pyrobnn.infer.sgmcmc.smile_kernel import SMILE, SMILESettings
from pyrobnn.methods import CHAIN_WARM_START, MethodSpec, checked, latent_only_support, register, samples_cover_thinning
from pyrobnn.utils.constraints import Either, Flag, Interval, Positive

__all__ = ["smile"]


class _SMILESampler(MinibatchSampler):
    def __init__(self, settings: dict, kernel: SMILE):
        super().__init__("SMILE", settings, settings["batch_size"], per_chain=True, guard=False)
        self.kernel = kernel

    def kernel_and_adaptation(self, problem, z0):
        # the warm-up adapts inside the kernel's state (the preconditioner, the tuned step size)
        return self.kernel, Fixed(self.settings["num_warmup"], warmup=True, sampling=False)

    def label(self, run) -> str:
        return ("pSMILE" if self.settings["precondition"] else "SMILE") + (" (tuned step size)" if self.settings["tune"] else "")


@checked("smile")
def smile(
    model, x, y, *, num_samples: int = 10_000, num_warmup: int = 10_000, thinning: int = 10, step_size: float = 1e-3,
    batch_size: int = 128, precondition: bool = True, tune: bool = False, reset_prob: float = 0.99, adaptation_prob: float = 0.05,
    adaptation_strength: float = 0.02, L=None, num_chains: int = 4, init=None, seed: int = 0, progress: bool = True,
    checkpoint=None,
) -> Posterior:
    """Stochastic-gradient microcanonical Langevin draws (SMILE; Sommer et al. 2026, ICML) from
    ``model``'s posterior given ``(x, y)``, as a :class:`~pyrobnn.infer.results.posterior.Posterior`.

    ``num_warmup`` steps in which the gradient-noise preconditioner (``precondition``: pSMILE;
    ``False``: plain SMILE) and, with ``tune``, each chain's step size adapt, then
    ``num_samples`` steps with both fixed, keeping every ``thinning``-th position; each step uses
    one minibatch of ``batch_size`` points per chain and two gradient evaluations. The reset
    guardrail (``reset_prob``) acts throughout.

    :param step_size: the initial step size of every chain (the authors' default, 1e-3).
    :param precondition: scale each coordinate by the spread of its minibatch gradients (pSMILE).
        A coordinate whose gradient barely varies (a weight into a dead ReLU unit) then takes
        steps thousands of times longer than the others. On MILE's UCI protocol this went with
        half the chains diverging (``docs/logs/reproductions.md``), which ``precondition=False`` avoided.
    :param tune: adapt the step size by the energy-error tuner while warming up (SMILET). Off by
        default, as in the paper's UCI and LeNet runs: the tuner is relative and drifts the step
        down over long warm-ups (:mod:`pyrobnn.infer.sgmcmc.smile_kernel` says why).
    :param reset_prob: the quantile of the energy errors beyond which a step is undone (1.0: never).
    :param adaptation_prob: :math:`a`, the tail mass on which the tuner moves the step size.
    :param adaptation_strength: :math:`\\delta`, the factor by which it moves it.
    :param progress: show a progress bar.
    :param L: ``None`` (the paper's sampler: the minibatch noise alone moves the velocity) or a
        velocity decoherence length for an added partial refresh, as MCLMC's.
    :param num_chains: chains started at the network's own initialization under seeds
        ``seed + k`` (as deep-ensemble members are), unless ``init`` gives the starts: a
        :class:`Posterior` (a deep ensemble: one chain per member, SMILE's ensemble
        initialization; or a sampler's result: its last draws) or a ``(chains, dim)`` tensor.
    :param checkpoint: a file to write the chains' state to, or a
        :class:`~pyrobnn.infer.core.checkpoints.Checkpointing` (every ``every`` steps or ``seconds``
        seconds), and at the end; the same call resumes from it to the
        uninterrupted run's draws (:mod:`pyrobnn.infer.core.checkpoints`).

    ``stats``: the final ``step_size`` per chain, the ``energy_change`` of each kept step, and per
    chain the steps undone by the guardrail (``resets``, ``resets_warmup``) and for a non-finite
    value (``nonfinite``, ``nonfinite_warmup``).
    """
    n = training_data(model, x, y)[0].shape[0]
    if L is None and batch_size >= n:
        raise ValueError(
            f"batch_size={batch_size} covers all {n} points, so the gradients carry no noise and SMILE's velocity would never "
            "be randomized: use pyrobnn.mclmc for full-batch sampling, a smaller batch_size, or pass L for a velocity refresh"
        )
    settings = dict(
        num_samples=num_samples, num_warmup=num_warmup, thinning=thinning, step_size=step_size, batch_size=batch_size,
        precondition=precondition, tune=tune, reset_prob=reset_prob, adaptation_prob=adaptation_prob,
        adaptation_strength=adaptation_strength, L=L, num_chains=num_chains, seed=seed, init=init,
    )
    kernel = SMILE(SMILESettings(reset_prob, adaptation_prob, adaptation_strength, 0.01, bool(tune), bool(precondition), L), float(step_size))
    run = RunSettings(num_samples=num_samples, thinning=thinning, num_chains=num_chains, init=init, seed=seed, progress=progress,
                      checkpoint=Checkpointing.of(checkpoint))
    return sample(model, x, y, _SMILESampler(settings, kernel), run)


register(MethodSpec(
    "smile", "SMILE: stochastic-gradient microcanonical Langevin ensembles (pSMILE by default)", "sgmcmc", smile,
    latent_only_support(), budgets={"num_samples": 1, "num_warmup": 0, "thinning": 1, "batch_size": 1, "num_chains": 1},
    constraints={
        "step_size": Interval(0.0, 10.0, "right", "a number"), "precondition": Flag(), "tune": Flag(),
        "reset_prob": Interval(0.0, 1.0, "right", "a fraction"), "adaptation_prob": Interval(0.0, 1.0, "left", "a fraction"),
        "adaptation_strength": Interval(0.0, 1.0, "left", "a fraction"), "L": Either(Positive(), None),
    },
    rules=(samples_cover_thinning("smile"),),
    quick={"num_samples": 4, "num_warmup": 4, "thinning": 2, "batch_size": 16, "num_chains": 2, "progress": False},
    warm_start=CHAIN_WARM_START,
))
