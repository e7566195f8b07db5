"""Stochastic-gradient MCMC on a BayesianModel: kernels that take a minibatch estimate of the
log joint's gradient (:mod:`.kernels`: SGLD and SGHMC; :mod:`.smile_kernel`: stochastic-gradient
microcanonical Langevin dynamics) and the samplers as methods (:mod:`.samplers`, :mod:`.smile`)."""

from pyrobnn.infer.core.minibatch import minibatch_log_joint_grad
from pyrobnn.infer.sgmcmc.kernels import SCHEDULES, cyclical_step_size, sghmc_step, sgld_step
from pyrobnn.infer.sgmcmc.samplers import sghmc, sgld
from pyrobnn.infer.sgmcmc.smile import smile

__all__ = ["sgld", "sghmc", "smile", "sgld_step", "sghmc_step", "cyclical_step_size", "minibatch_log_joint_grad", "SCHEDULES"]
