"""A Sphinx directive that draws the package's layers from its own imports, at build time, so
that the layout page can never show a layout the code no longer has.

.. code-block:: rst

    .. layers-figure::

It reads the import graph and the layer declaration of ``tests/test_layers.py`` (the test that
holds the layout as a checked claim), draws one band per layer from the bottom up with a box per
package (its modules and lines) and an arrow per package-to-package import, and writes a table
of the same figures beneath. An import that ran up the layers would be drawn in red; the test
fails on it first.
"""

from __future__ import annotations

import importlib.util
import pathlib

from docutils import nodes
from docutils.parsers.rst import Directive
from table_nodes import table_node

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _reader():
    spec = importlib.util.spec_from_file_location("layers_reader", ROOT / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _packages(reader):
    """``{package: (layer index, modules, lines)}`` and the package graph."""
    known = reader.modules()
    graph = reader.edges(known)
    out = {}
    for name, path in known.items():
        unit = reader.unit(name)
        layer, count, lines = out.get(unit, (reader.layer(name), 0, 0))
        out[unit] = (layer, count + 1, lines + len(path.read_text().splitlines()))
    return out, reader.package_graph(graph), graph


def _short(unit: str) -> str:
    name = unit[len("pyrobnn."):] if unit.startswith("pyrobnn.") else unit
    return {"__init__": "pyrobnn (the public names)"}.get(name, name)


def draw(path: pathlib.Path, reader) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    packages, package_graph, _ = _packages(reader)
    layers = reader.LAYERS
    fig, ax = plt.subplots(figsize=(11, 0.62 * len(layers) + 0.6), dpi=150)
    ax.set_xlim(0, 11)
    ax.set_ylim(-0.2, len(layers) + 0.1)
    ax.axis("off")
    where = {}
    for i, (name, _) in enumerate(layers):
        ax.axhspan(i + 0.04, i + 0.96, color="#f2f4f7" if i % 2 else "#e8edf3", zorder=0)
        ax.text(0.1, i + 0.5, name, va="center", ha="left", fontsize=9, fontweight="bold", color="#2b3a4a")
        members = sorted(u for u, (layer, _, _) in packages.items() if layer == i)
        width = min(8.6 / max(len(members), 1), 2.4)
        left = 2.2 + (8.6 - width * len(members)) / 2
        for k, unit in enumerate(members):
            _, count, lines = packages[unit]
            x0 = left + k * width
            box = FancyBboxPatch((x0 + 0.05, i + 0.14), width - 0.1, 0.72, boxstyle="round,pad=0.01,rounding_size=0.06",
                                 fc="white", ec="#5b7083", lw=0.8, zorder=2)
            ax.add_patch(box)
            ax.text(x0 + width / 2, i + 0.58, _short(unit), ha="center", va="center", fontsize=7, zorder=3)
            ax.text(x0 + width / 2, i + 0.32, f"{count} modules, {lines:,} lines", ha="center", va="center", fontsize=5.6,
                    color="#5b7083", zorder=3)
            where[unit] = (x0 + width / 2, i)
    for a, targets in package_graph.items():
        for b in targets:
            (xa, la), (xb, lb) = where[a], where[b]
            up = lb > la
            if la == lb:
                continue
            arrow = FancyArrowPatch((xa, la + 0.14), (xb, lb + 0.86), arrowstyle="-|>", mutation_scale=6, lw=0.5,
                                    color="#c0392b" if up else "#9aa9b8", alpha=0.9 if up else 0.45, zorder=1,
                                    connectionstyle="arc3,rad=0.08")
            ax.add_patch(arrow)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


class LayersFigure(Directive):
    has_content = False

    def run(self):
        env = self.state.document.settings.env
        reader = _reader()
        out = pathlib.Path(env.srcdir) / "_generated" / "layers.png"
        draw(out, reader)
        env.note_dependency(str(ROOT / "tests" / "test_layers.py"))
        packages, package_graph, graph = _packages(reader)
        cycles = len(reader.cycles(graph)) + len(reader.cycles(package_graph))
        upward = len(reader.upward(graph))
        image = nodes.image(uri="/_generated/layers.png", alt="pyrobnn's layers, from the utilities up to the applications")
        caption = nodes.paragraph(text=(
            f"Drawn from the code at build time: {len(graph)} modules in {len(packages)} packages, "
            f"{sum(map(len, graph.values()))} imports between modules; {cycles} cycles and {upward} imports up the layers "
            "(an upward one would be red). Each grey arrow is a package importing one below it."))
        rows = []
        for i, (name, _) in reversed(list(enumerate(reader.LAYERS))):
            members = sorted(u for u, (layer, _, _) in packages.items() if layer == i)
            down = sum(1 for a in graph for b in graph[a] if reader.layer(a) == i and reader.layer(b) < i)
            rows.append([name, ", ".join(_short(u) for u in members), str(sum(packages[u][1] for u in members)),
                         f"{sum(packages[u][2] for u in members):,}", str(down)])
        table = table_node(["layer", "packages", "modules", "lines", "imports into lower layers"], rows, [2, 6, 1, 1, 2], ["layers-table"])
        return [image, caption, table]


def setup(app):
    app.add_directive("layers-figure", LayersFigure)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
