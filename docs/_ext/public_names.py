"""Resolve cross-references to where a name is *used* (``pyrobnn.fit``, ``pyrobnn.guides.MeanFieldNormal``,
or ``SplitELBO`` inside a module that imports it) to where it is *documented* (its defining
module), as a reader expects: docstrings cite the public path, the API pages are by module.

A reference that names nothing importable stays unresolved, so ``nitpicky`` still reports it.
"""

from __future__ import annotations

import importlib

from sphinx.util.nodes import make_refnode


def _lookup(path: str):
    """The object at a dotted ``path``, walking attributes first (``pyrobnn.predict`` is the
    function the package exports, not a deprecated module of that name), importing a submodule
    only where no attribute has the name; None if nothing is there."""
    parts = path.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            return None
    return obj


def _documented_name(obj, attr_tail=()):
    """Where autodoc documents ``obj`` (plus ``attr_tail``), or None for a plain value."""
    if isinstance(obj, type(importlib)):
        return obj.__name__
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return ".".join((module, qualname, *attr_tail))
    return None


def resolve(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    domain = env.get_domain("py")
    candidates = [target]
    current = node.get("py:module")
    if current:
        candidates.append(f"{current}.{target}")
        owner = node.get("py:class")
        if owner:
            candidates.append(f"{current}.{owner}.{target}")
    candidates.append(f"pyrobnn.{target}")  # a public name cited bare: ``SplitELBO``, ``fit``
    for candidate in candidates:
        obj = _lookup(candidate)
        name = _documented_name(obj) if obj is not None else None
        if name is None and "." in candidate:
            # an attribute or method of a re-exported class: pyrobnn.guides.WeightGuide.pyro_prefix
            head, _, last = candidate.rpartition(".")
            owner_obj = _lookup(head)
            if isinstance(owner_obj, type) and hasattr(owner_obj, last):
                name = _documented_name(owner_obj, (last,))
        if not name or name == target:
            continue
        found = domain.objects.get(name)
        if found is not None:
            return make_refnode(app.builder, node["refdoc"], found.docname, found.node_id, contnode, name)
    return None


def setup(app):
    app.connect("missing-reference", resolve)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
