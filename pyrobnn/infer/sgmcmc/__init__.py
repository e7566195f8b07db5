"""Stochastic-gradient MCMC on a BayesianModel: kernels that take a minibatch estimate of the
log joint's gradient (:mod:`.kernels`) and the samplers as methods (:mod:`.samplers`)."""

from pyrobnn.infer.minibatch import minibatch_log_joint_grad
from pyrobnn.infer.sgmcmc.kernels import SCHEDULES, cyclical_step_size, sghmc_step, sgld_step
from pyrobnn.infer.sgmcmc.samplers import sghmc, sgld

__all__ = ["sgld", "sghmc", "sgld_step", "sghmc_step", "cyclical_step_size", "minibatch_log_joint_grad", "SCHEDULES"]
