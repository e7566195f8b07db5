"""Our training objectives as Lightning modules, for data-parallel training (:mod:`.modules`)."""

from pyrobnn.infer.lightning.modules import EndProcessGroup, EnsembleModule, SVIModule

__all__ = ["SVIModule", "EnsembleModule", "EndProcessGroup"]
