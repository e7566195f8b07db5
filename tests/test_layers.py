"""The package's layout as a checked claim: the import graph, read from the source (imports
inside functions included), has no cycle between modules or between packages, and every import
runs from a layer down to a lower one (or within one layer), in the order docs/layout.md draws.

Run ``python tests/test_layers.py`` to print the graph's figures: modules, packages, import
edges, cycles and imports that run upward."""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1] / "pyrobnn"

#: the layers from the bottom up; a module belongs to the longest prefix that names it. Each
#: layer may import itself and the layers below it, never one above.
LAYERS = [
    ("utils", ["pyrobnn.utils"]),
    ("evaluation", ["pyrobnn.evaluation"]),
    ("data", ["pyrobnn.data"]),
    ("model", ["pyrobnn.models"]),
    ("registry", ["pyrobnn.methods"]),
    ("guides", ["pyrobnn.guides"]),
    ("results", ["pyrobnn.infer.results"]),
    ("core", ["pyrobnn.infer.core"]),
    ("families", ["pyrobnn.infer.svi", "pyrobnn.infer.mcmc", "pyrobnn.infer.sgmcmc", "pyrobnn.infer.modes"]),
    ("inference", ["pyrobnn.infer"]),
    ("integrations", ["pyrobnn.integrations"]),
    ("public", ["pyrobnn.__init__", "pyrobnn.testing"]),
    ("applications", ["pyrobnn.apps"]),
]
#: the method families: none may import another
FAMILIES = ["pyrobnn.infer.svi", "pyrobnn.infer.mcmc", "pyrobnn.infer.sgmcmc", "pyrobnn.infer.modes"]


def modules() -> dict:
    """``{dotted name: path}`` of every module; a package's ``__init__`` is ``pkg.__init__``."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict):
    """The module an imported dotted name loads: itself, or its package's ``__init__``."""
    if name in known:
        return name
    if f"{name}.__init__" in known:
        return f"{name}.__init__"
    return None


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:-1]) if parts[-1] == "__init__" or len(parts) > 2 else module


def edges(known: dict) -> dict:
    """``{module: {imported module, ...}}`` within pyrobnn, from every import statement."""
    graph = {}
    for name, path in known.items():
        package = _package(name) if not name.endswith("__init__") else name[: -len(".__init__")]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.add(_resolve(alias.name, known))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    sub = _resolve(f"{base}.{alias.name}", known)
                    targets.add(sub or _resolve(base, known))
        targets.discard(None)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10_000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def unit(module: str) -> str:
    """The package a module is part of; a module directly under ``pyrobnn/`` is a unit of its own."""
    parts = module.split(".")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]) if len(parts) > 2 else module
    return ".".join(parts[:-1]) if len(parts) > 2 else module


def package_graph(graph: dict) -> dict:
    out = {}
    for a, targets in graph.items():
        out.setdefault(unit(a), set()).update(unit(b) for b in targets if unit(b) != unit(a))
    return out


def layer(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it to the layer it belongs to")
    return rank


def upward(graph: dict) -> list:
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def family(module: str):
    return next((f for f in FAMILIES if module == f or module.startswith(f + ".")), None)


def test_no_module_imports_a_module_that_imports_it_back():
    assert cycles(edges(modules())) == []


def test_no_package_imports_a_package_that_imports_it_back():
    assert cycles(package_graph(edges(modules()))) == []


def test_every_import_runs_down_the_layers():
    assert upward(edges(modules())) == []


def test_no_method_family_imports_another():
    crossing = sorted((a, b) for a, targets in edges(modules()).items() for b in targets
                      if family(a) and family(b) and family(a) != family(b))
    assert crossing == []


def test_the_top_level_shows_a_dozen_parts():
    entries = sorted(p.name for p in ROOT.iterdir() if p.name != "__pycache__" and (p.suffix == ".py" or (p / "__init__.py").exists()))
    assert len([e for e in entries if e != "__init__.py"]) <= 12, entries


def test_the_graph_reader_sees_a_cycle_and_an_upward_import():
    # the checks above pass on any graph the reader fails to build: show that it builds one
    graph = {"pyrobnn.utils.a": {"pyrobnn.infer.core.b"}, "pyrobnn.infer.core.b": {"pyrobnn.utils.a"}}
    assert cycles(graph) == [["pyrobnn.infer.core.b", "pyrobnn.utils.a"]]
    assert upward(graph) == [("pyrobnn.utils.a", "pyrobnn.infer.core.b")]
    real = edges(modules())
    assert "pyrobnn.infer.results.protocol" in real["pyrobnn.infer.results.posterior"]
    assert "pyrobnn.infer.core.potential" in real["pyrobnn.infer.core.runner"]


def main() -> None:
    known = modules()
    graph = edges(known)
    packages = package_graph(graph)
    print(f"{len(known)} modules in {len(packages)} packages; {sum(map(len, graph.values()))} imports between modules, "
          f"{sum(map(len, packages.values()))} between packages")
    print(f"cycles between modules: {len(cycles(graph))}; between packages: {len(cycles(packages))}; "
          f"imports that run up the layers: {len(upward(graph))}")
    for name, prefixes in reversed(LAYERS):
        members = sorted({unit(m) for m in known if layer(m) == [n for n, _ in LAYERS].index(name)})
        print(f"  {name:13s} {', '.join(members)}")


if __name__ == "__main__":
    main()
