"""Sphinx configuration of pyrobnn's documentation site.

Build it with ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (README.md).
The tutorials in ``tutorials/`` are MyST notebooks that myst-nb executes during the build, in
their quick setting unless ``PYROBNN_DOCS_FULL=1``; a cell that raises fails the build.
``PYROBNN_DOCS_CACHE=1`` reuses the outputs of notebooks whose code did not change.
"""

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

# The MNIST and UCI tutorials read the benchmark data folder: $PYROBNN_DATA, else the shared
# folder beside the checkout (as the tests look for it)
_shared = HERE.parent.parent / "shared" / "data"
if "PYROBNN_DATA" not in os.environ and _shared.is_dir():
    os.environ["PYROBNN_DATA"] = str(_shared)

project = "pyrobnn"
author = "the pyrobnn developers"
copyright = "2026, the pyrobnn developers"

from pyrobnn import __version__ as release  # noqa: E402

version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "sphinx.ext.mathjax",
    "offline_mathjax",  # MathJax served from the site itself: pages read offline, and CI's browser check has no network
    "sphinx_copybutton",
    "myst_nb",
    "results_tables",
    "method_tables",
    "public_names",
    "layers_figure",
    "fault_table",
]

exclude_patterns = ["_build", "_generated", "jupyter_execute", ".jupyter_cache", "**.ipynb_checkpoints"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# Tutorials are executed at every build, so that their outputs are those of the library as it is
# (jupyter-cache keys on a notebook's code alone, and would keep outputs the library no longer
# gives); PYROBNN_DOCS_CACHE=1 reuses them while editing prose.
nb_execution_mode = "cache" if os.environ.get("PYROBNN_DOCS_CACHE") == "1" else "force"
nb_execution_cache_path = str(HERE / "_build" / ".jupyter_cache")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# each object is documented where it is defined (ignore-module-all), with or without a docstring;
# inherited docstrings (Lightning's hooks) are left to their own libraries
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_inherit_docstrings = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"

# Cross-references inside pyrobnn must resolve (nitpicky); names from torch, Pyro and other
# libraries have no inventory offline (no intersphinx without a network), so they are not checked.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(argparse|torch|pyro|numpy|np|arviz|az|lightning|L|laplace|matplotlib|tqdm|typing|collections|pathlib|os|dataclasses|enum|abc|botorch|gpytorch|ax)(\..*)?"),
    (r"py:class", r".*\._[A-Za-z]\w*"),  # private bases in show-inheritance
    (r"py:class", r"ExpandedDistribution"),  # torch's, named in our expand() docstrings
    (r"py:.*", r"(optional|callable|tensor|Tensor|Module|nn\.Module|Path|Figure|Axes|Distribution|InferenceData|dict|list|tuple|float|int|str|bool|None)"),
]

html_theme = "furo"
html_title = f"pyrobnn {release}"

pygments_style = "friendly"
