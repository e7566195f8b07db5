"""The docutils table the site's generated tables share (results, method support, conformance)."""

from __future__ import annotations

from docutils import nodes


def table_node(header, rows, widths, classes, caption=None, literal_last=False):
    """A table of text cells: ``header`` and each of ``rows`` a sequence of strings, ``widths``
    the relative column widths; with ``literal_last`` the body's last column is set as code."""
    table = nodes.table(classes=list(classes))
    if caption:
        table += nodes.title(text=caption)
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)

    def make_row(cells, literal=False):
        row = nodes.row()
        for i, text in enumerate(cells):
            entry = nodes.entry()
            para = nodes.paragraph()
            para += nodes.literal(text=text) if (literal and i == len(cells) - 1) else nodes.Text(text)
            entry += para
            row += entry
        return row

    thead = nodes.thead()
    thead += make_row(header)
    group += thead
    body = nodes.tbody()
    for cells in rows:
        body += make_row(cells, literal_last)
    group += body
    return table
