"""Serve MathJax 3 from the site itself instead of a CDN, so that math renders offline and in
CI's browser check (which has no network).

The MathJax files come from the ``sphinx-mathjax-offline`` distribution (MathJax 3.2.2,
Apache-2.0). Its import name has a hyphen, so Sphinx cannot load it as an extension; this one
finds its files through the distribution's metadata and adds them to the static path.
"""

from __future__ import annotations

import importlib.metadata
import pathlib

from sphinx.errors import ConfigError


def mathjax_static_dir() -> pathlib.Path:
    try:
        files = importlib.metadata.files("sphinx-mathjax-offline") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "tex-chtml.js" and f.parent.name == "mathjax":
            return pathlib.Path(f.locate()).parent.parent
    raise ConfigError("the docs need MathJax's files from sphinx-mathjax-offline: pip install -e '.[docs]'")


def _add_static(app, config):
    config.html_static_path.append(str(mathjax_static_dir()))


def setup(app):
    app.config.mathjax_path = "mathjax/tex-chtml.js"
    app.connect("config-inited", _add_static)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
