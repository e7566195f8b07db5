"""A Sphinx directive that renders the fault-injection suite's table, ``docs/reliability.json``
(written by ``python -m pytest tests/faults -m "slow or not slow" --fault-table
docs/reliability.json``), so that the reliability page shows what the suite last found, never a
copy by hand.

.. code-block:: rst

    .. fault-table::

Columns: the case (test and parameters), the fault injected, what must survive, the bound, the
outcome, and the figures the case measured. A file with no cases is an error.
"""

from __future__ import annotations

import json
import pathlib

from docutils import nodes
from docutils.parsers.rst import Directive
from table_nodes import table_node


def _figures(case) -> str:
    return "; ".join(f"{k}: {v}" for k, v in case.get("figures", {}).items())


class FaultTable(Directive):
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        path = pathlib.Path(env.srcdir) / "reliability.json"
        env.note_dependency(str(path))
        table = json.loads(path.read_text())
        cases = table.get("cases", [])
        if not cases:
            raise self.error(f"fault-table: {path.name} holds no cases")
        header = ("case", "fault injected", "what must survive", "bound", "outcome", "measured")
        rows = []
        for c in cases:
            outcome = c["outcome"] + (f" ({c['reason']})" if c.get("reason") else "") + f", {c['seconds']:.1f} s" + (" [slow]" if c.get("slow") else "")
            rows.append((c["case"], c.get("fault", ""), c.get("survives", ""), c.get("bound", ""), outcome, _figures(c)))
        counts = {}
        for c in cases:
            counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
        summary = nodes.paragraph(text=(
            f"{len(cases)} cases: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            + f". Run {table.get('date', '?')} on {table.get('machine', '?')} by: "
        ))
        summary += nodes.literal(text=table.get("command", ""))
        return [summary, table_node(header, rows, (22, 22, 24, 8, 10, 14), ["fault-table"])]


def setup(app):
    app.add_directive("fault-table", FaultTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
