"""Sphinx directives for the method registry's tables, so that what the site says each method
takes comes from the declarations its refusals read (:mod:`pyrobnn.methods`) and the
conformance matrix from a run of the suite (``docs/conformance.json``, written by
``python -m pyrobnn.testing --out docs/conformance.json``), never from a copy by hand.

.. code-block:: rst

    .. support-table::        (methods x likelihoods and priors, from the declarations)
    .. conformance-table::    (methods x cases: passes, refused by design, fails)
"""

from __future__ import annotations

import json
import pathlib

from docutils import nodes
from docutils.parsers.rst import Directive
from table_nodes import table_node


class SupportTable(Directive):
    """Each registered method against the likelihood and prior kinds: ✓ where its declaration
    takes the kind, ✗ where the method refuses it at the call."""

    has_content = False

    def run(self):
        from pyrobnn import methods

        kinds = [("likelihood", k) for k in methods.LIKELIHOODS] + [("prior", k) for k in methods.PRIORS]
        header = ["method", "family"] + [f"{k}" for _, k in kinds] + ["smallest budgets"]
        rows = []
        for row in methods.support_table():
            budgets = ", ".join(f"{k} {v}" for k, v in row["budgets"].items())
            rows.append([row["method"], row["family"]] + ["✓" if row[f"{a}:{k}"] else "✗" for a, k in kinds] + [budgets])
        widths = [16, 10] + [6] * len(kinds) + [30]
        legend = nodes.definition_list()
        for what, table in (("likelihood", methods.LIKELIHOODS), ("prior", methods.PRIORS)):
            for key, text in table.items():
                item = nodes.definition_list_item()
                item += nodes.term(text=key)
                definition = nodes.definition()
                definition += nodes.paragraph(text=f"{what}: {text}")
                item += definition
                legend += item
        return [table_node(header, rows, widths, ["support-table"]), legend]


class ConformanceTable(Directive):
    """The conformance matrix of ``docs/conformance.json``: each method on each case of the
    suite. A matrix that names a method or a case the registry or the suite no longer has is an
    error (a stale table)."""

    has_content = False

    def run(self):
        from pyrobnn import methods, testing

        env = self.state.document.settings.env
        path = pathlib.Path(env.srcdir) / "conformance.json"
        env.note_dependency(str(path))
        data = json.loads(path.read_text())
        matrix, cases = data["matrix"], list(data["cases"])
        if list(matrix) != list(methods.METHODS) or cases != list(testing.CASES):
            raise self.error(f"{path.name} is stale: rerun python -m pyrobnn.testing --out docs/conformance.json")
        short = {"passes": "passes", "refused by design": "refused"}
        rows = [[key] + [short.get(matrix[key][c], "FAILS") for c in cases] for key in matrix]
        legend = nodes.definition_list()
        for key, text in data["cases"].items():
            item = nodes.definition_list_item()
            item += nodes.term(text=key)
            definition = nodes.definition()
            definition += nodes.paragraph(text=text)
            item += definition
            legend += item
        return [table_node(["method"] + cases, rows, [16] + [8] * len(cases), ["conformance-table"]), legend]


def setup(app):
    app.add_directive("support-table", SupportTable)
    app.add_directive("conformance-table", ConformanceTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
