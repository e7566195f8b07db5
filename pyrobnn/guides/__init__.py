"""Variational families placed at the weight sites of a :class:`~pyrobnn.models.BayesianModel`,
and the record of a guide's class and settings that rebuilds it from a saved file."""

from pyrobnn.guides.base import WeightGuide
from pyrobnn.guides.dropout import ConcreteDropout, MCDropout
from pyrobnn.guides.mean_field import MeanFieldNormal
from pyrobnn.guides.variational_dropout import GaussianDropout, SparseVariationalDropout, VariationalDropout

__all__ = [
    "WeightGuide",
    "MeanFieldNormal",
    "VariationalDropout",
    "SparseVariationalDropout",
    "GaussianDropout",
    "MCDropout",
    "ConcreteDropout",
    "GUIDES",
    "guide_config",
    "build_guide",
]

#: the guides a saved file may name, by class name: loading builds only these (a file never
#: names code to import)
GUIDES = {cls.__name__: cls for cls in (MeanFieldNormal, VariationalDropout, SparseVariationalDropout, GaussianDropout, MCDropout, ConcreteDropout)}


def guide_config(guide) -> dict:
    """``{"class": name, "settings": {...}}`` for a guide of :data:`GUIDES` (its
    :meth:`~pyrobnn.guides.WeightGuide.config`), ``{"class": name, "settings": None}`` for any other."""
    name = type(guide).__name__
    if GUIDES.get(name) is type(guide):
        return {"class": name, "settings": guide.config()}
    return {"class": name, "settings": None}


def build_guide(config, model, path="the file"):
    """The guide ``config`` (from :func:`guide_config`) describes, built for ``model``; a guide
    outside :data:`GUIDES` is refused, asking for the guide to load into."""
    name = config.get("class") if isinstance(config, dict) else config if isinstance(config, str) else None
    settings = config.get("settings") if isinstance(config, dict) else None
    cls = GUIDES.get(name)
    if cls is None or (settings is None and isinstance(config, dict)):
        raise ValueError(
            f"{path} holds a trained {name or 'guide'} that pyrobnn cannot rebuild by itself (it rebuilds "
            f"{', '.join(GUIDES)}): build that guide for the model and pass it, load(path, model, guide=guide)"
        )
    return cls(model, **(settings or {}))
