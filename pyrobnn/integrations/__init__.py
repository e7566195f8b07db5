"""Adapters that run pyrobnn's methods inside other frameworks: :mod:`.lightning` (SVI and deep
ensembles as Lightning modules, for multi-device training). Each imports its framework on use."""
