"""Full-batch MCMC on a BayesianModel: the NUTS and MCLMC kernels with their adaptations
(:mod:`.nuts_kernel`, :mod:`.mclmc_kernel`), the rule that picks the code path that runs them
(:mod:`.backend`: native kernels in :mod:`.native`, ``torch.compile`` or eager torch), the
effective sample size MCLMC tunes on (:mod:`.autocorrelation`) and the samplers as methods
(:mod:`.samplers`), which the one runner of :mod:`pyrobnn.infer.core.runner` runs."""

from pyrobnn.infer.mcmc.samplers import mclmc, nuts, pyro_nuts

__all__ = ["nuts", "mclmc", "pyro_nuts"]
