"""Full-batch MCMC on a BayesianModel: the NUTS and MCLMC kernels (:mod:`.nuts_kernel`,
:mod:`.mclmc_kernel`), the code paths that run them (:mod:`.backend`: native kernels in
:mod:`.native`, ``torch.compile`` or eager torch), the one model-level runner (:mod:`.runner`)
and the samplers as methods (:mod:`.samplers`)."""

from pyrobnn.infer.mcmc.samplers import mclmc, nuts, pyro_nuts

__all__ = ["nuts", "mclmc", "pyro_nuts"]
