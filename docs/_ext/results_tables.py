"""A Sphinx directive that renders rows of ``docs/results.json`` as a table, so that the site's
figures come from the file the benchmarks and examples write, never from a copy by hand.

.. code-block:: rst

    .. results-table::
       :name: ^sparse VD        (a regular expression on the entry's name)
       :command: mnist_bbb      (a regular expression on its command; both optional)

Columns: experiment, metric, our value (± its standard error or spread over seeds when the entry
records one), the published figure, and the command that measured it. A pattern that selects no
entry is an error: a table that silently went empty would hide a renamed experiment.
"""

from __future__ import annotations

import json
import math
import pathlib
import re

from docutils.parsers.rst import Directive, directives
from sphinx.util import logging
from table_nodes import table_node

logger = logging.getLogger(__name__)


def _number(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"


def _spread(entry) -> str:
    for key, word in (("se", "±"), ("standard_error", "±"), ("std_over_seeds", "± sd")):
        if isinstance(entry.get(key), (int, float)):
            return f" {word} {_number(entry[key])}"
    return ""


def load_entries(path: pathlib.Path) -> list:
    entries = json.loads(path.read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{path} must hold a JSON list of result entries")
    return entries


class ResultsTable(Directive):
    has_content = False
    option_spec = {"name": directives.unchanged, "command": directives.unchanged, "caption": directives.unchanged}

    def run(self):
        env = self.state.document.settings.env
        path = pathlib.Path(env.srcdir) / "results.json"
        env.note_dependency(str(path))
        entries = load_entries(path)
        try:
            name_re = re.compile(self.options.get("name", ""))
            command_re = re.compile(self.options.get("command", ""))
        except re.error as e:
            raise self.error(f"results-table: :name: or :command: is not a regular expression ({e})")
        rows = [e for e in entries if name_re.search(e["name"]) and command_re.search(e["command"])]
        if not rows:
            raise self.error(f"results-table: no entry of {path.name} matches name={name_re.pattern!r} command={command_re.pattern!r}")

        header = ("experiment", "metric", "pyrobnn", "published", "command")
        cells = [(e["name"], e["metric"], _number(e["value"]) + _spread(e), _number(e.get("published")), e["command"]) for e in rows]
        table = table_node(header, cells, (30, 22, 14, 10, 40), ["results-table"], self.options.get("caption"), literal_last=True)
        return [table]


def setup(app):
    app.add_directive("results-table", ResultsTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
