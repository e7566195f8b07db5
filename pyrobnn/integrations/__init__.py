"""Adapters that run pyrobnn's methods inside other frameworks: :mod:`.lightning` (SVI and deep
ensembles as Lightning modules, for multi-device training), :mod:`.botorch` (every posterior as a
BoTorch model, a surrogate for Bayesian optimization) and :mod:`.ax` (those surrogates in Ax's
modular BoTorch generator). Each imports its framework on use."""
