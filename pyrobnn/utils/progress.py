"""The progress bar of every long loop: tqdm's, a widget in Jupyter where ipywidgets is
installed and text elsewhere. ``import pyrobnn`` imports this module before Pyro, whose
``pyro.infer`` imports ``tqdm.auto`` as well, so that the one import of it is the quiet one."""

import warnings

from tqdm import TqdmWarning

with warnings.catch_warnings():
    # In a notebook without ipywidgets, importing tqdm.auto warns "IProgress not found" and falls
    # back to the text bar, which works: the user asked for no widget and needs to change nothing.
    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)
    from tqdm.auto import tqdm

__all__ = ["tqdm"]
