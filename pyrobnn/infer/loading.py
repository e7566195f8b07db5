"""Reading any saved result without knowing its kind: the file's format names it (draws of a
:class:`~pyrobnn.infer.results.posterior.Posterior` or a trained guide of a
:class:`~pyrobnn.infer.svi.variational.VariationalPosterior`), and the matching ``load`` reads it
with ``torch.load(weights_only=True)``."""

from __future__ import annotations

from pyrobnn.infer.results.posterior import FORMAT, Posterior
from pyrobnn.infer.results.protocol import Result
from pyrobnn.infer.svi.variational import VariationalPosterior
from pyrobnn.utils.io import FORMAT as GUIDE_FORMAT
from pyrobnn.utils.io import safe_load

__all__ = ["load_posterior"]


def load_posterior(path, model, guide=None, map_location=None) -> Result:
    """Read any saved result for ``model``: a :class:`~pyrobnn.infer.results.posterior.Posterior` (or
    subclass) written by its ``save``, or a trained guide written by ``VariationalPosterior.save``
    (or :func:`pyrobnn.save`), which comes back as a
    :class:`~pyrobnn.infer.svi.variational.VariationalPosterior` with its guide rebuilt from the
    saved class and settings (or loaded into ``guide`` where one is given)."""
    obj = safe_load(path, map_location)
    fmt = obj.get("format") if isinstance(obj, dict) else None
    if fmt == FORMAT:
        return Posterior.load(path, model, map_location)
    if fmt == GUIDE_FORMAT:
        return VariationalPosterior.load(path, model, map_location, guide=guide)
    raise ValueError(f"{path} is not a saved pyrobnn posterior or guide")
