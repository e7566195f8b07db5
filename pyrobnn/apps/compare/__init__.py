"""A sampling reference beside variational methods and deep ensembles on small regression
problems: ``pyrobnn compare``.

Every method fits the same network (one hidden layer; 50 units, 100 for protein) with the same
Gaussian likelihood, whose noise scale has a log-normal prior, so the reference and the guides
target the same kind of model; each method has the prior its family is defined with (Normal(0, 1)
weights for the reference, the ensemble, the mean-field and the dropout methods; Blundell's scale
mixture; the log-uniform prior of variational dropout).

The reference is ensemble-initialized sampling by default (Sommer et al. 2024, 2025): a deep
ensemble (MAP under the model's prior) and one MCLMC chain started at each member
(``reference="ensemble-mclmc"``), or one NUTS chain per member (``"ensemble-nuts"``); random-start
NUTS (``"nuts"``) is still there, but on the UCI sets its chains do not agree within a run's budget
(docs/logs/compare.md). Ensemble-initialized chains are judged each on its own (within-chain R-hat on
the test predictions and log density, :func:`pyrobnn.infer.results.diagnostics.within_chain_summary`).

Beside the variational methods and the deep ensemble, the methods built on that ensemble: the
Laplace approximation around its first member (KFAC GGN over all weights, prior precision tuned
by the marginal likelihood, the linearized predictive), SWAG from the same member, and SGLD and
SGHMC with one chain started at each member; their step sizes are set from the largest
curvature at the start (``"auto"``).

On every split each method is scored on the test set in the original units of the target:

- RMSE of the predictive mean; test log-likelihood, the log of the mean predictive density
  over posterior samples (Hernández-Lobato & Adams 2015); coverage of the central 90%
  predictive interval; CRPS;
- ``w2_to_reference``: the 2-Wasserstein distance between the method's predictive marginal and
  the reference's at each test point (from 20 quantiles of each Gaussian-mixture predictive),
  averaged over the points: how far the method is from the reference posterior;
- wall time of the fit (the reference: ensemble training and sampling, warm-up included; Laplace,
  SWAG, SGLD and SGHMC: their own time plus the split's deep ensemble, whose first member is
  their MAP or whose members start their chains).

Results are mean and standard error over splits, beside the published figures of
``REFERENCES.md`` for the UCI sets.

The methods are a registry (:mod:`pyrobnn.apps.compare.methods`: one :class:`Method` each), run by
:mod:`pyrobnn.apps.compare.runner` and written out by :mod:`pyrobnn.apps.compare.report`.
"""

from pyrobnn.apps.compare.methods import METHODS, REFERENCES, Method, Settings, register, settings
from pyrobnn.apps.compare.report import METRICS, PUBLISHED, degenerate_warning, diagnostics_threshold, format_markdown
from pyrobnn.apps.compare.runner import fit_method, predictive_w2, run_compare

__all__ = [
    "run_compare", "fit_method", "predictive_w2", "format_markdown", "degenerate_warning", "diagnostics_threshold",
    "METHODS", "REFERENCES", "Method", "register", "Settings", "settings", "METRICS", "PUBLISHED",
]
