"""Scoring predictions, whatever made them: the predictive summaries a likelihood returns
(:mod:`.predictions`), proper scoring rules and calibration errors (:mod:`.metrics`), temperature
scaling (:mod:`.calibration`) and the figures (:mod:`.plotting`). It imports only
:mod:`pyrobnn.utils`, so the model layer can return its summaries."""
