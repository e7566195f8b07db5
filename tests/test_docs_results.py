"""docs/results.json is the machine-readable copy of docs/logs/reproductions.md: a list of objects with
``name``, ``metric``, ``value``, ``published`` and ``command``. These tests keep it well formed
and keep its commands runnable: each names an example that exists, with options its parser
still accepts (a renamed flag would otherwise leave the docs pointing at a dead command)."""

import ast
import json
import math
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.json"


def entries():
    return json.loads(RESULTS.read_text())


def test_entries_have_the_documented_fields():
    records = entries()
    assert isinstance(records, list) and records, "docs/results.json must be a non-empty list"
    seen = set()
    for e in records:
        for key, kind in (("name", str), ("metric", str), ("command", str)):
            assert isinstance(e.get(key), kind) and e[key], f"{key!r} missing or empty in {e}"
        assert isinstance(e.get("value"), (int, float)) and math.isfinite(e["value"]), e
        assert "published" in e, e
        assert e["published"] is None or isinstance(e["published"], (int, float)), e
        key = (e["name"], e["metric"])
        assert key not in seen, f"duplicate entry {key}"
        seen.add(key)


def declared_options(path) -> set:
    """The option strings a script hands to ``add_argument`` as literals, read from its source
    (``ast``: nothing is run; starting each script for its ``--help`` imported torch seven times,
    5-15 s each). An option added any other way is not seen: a command using it fails below, naming it."""
    options = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
            options.update(names)
            if any(k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction") for k in node.keywords):
                options.update("--no-" + n[2:] for n in names if n.startswith("--"))  # argparse adds the negative
    return options


@pytest.mark.parametrize("script", sorted({shlex.split(e["command"])[1] for e in entries()}))
def test_commands_use_options_the_example_accepts(script):
    path = ROOT / script
    assert path.is_file(), f"docs/results.json names {script}, which does not exist"
    accepted = declared_options(path)
    for e in entries():
        words = shlex.split(e["command"])
        if words[1] != script:
            continue
        assert words[0] == "python", e["command"]
        for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
            assert flag in accepted, f"{script} no longer accepts {flag} (from {e['name']!r})"


def test_the_options_read_from_the_source_are_those_argparse_accepts():
    """The static reading above against a script's own ``--help`` (one start, not seven; this one
    has a ``BooleanOptionalAction``, whose ``--no-`` option argparse adds)."""
    path = ROOT / "examples" / "mnist_sparse_vd.py"
    helptext = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    usage = helptext.split("\n\n")[0]  # the usage block: every option once, none cut by a line's wrap
    shown = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage)) - {"--help"}
    assert shown == declared_options(path) - {"-h"}


def test_every_entry_is_on_the_sites_results_page():
    """docs/results.md renders its tables from docs/results.json (a ``results-table`` directive
    selects entries by regular expressions on name and command): an entry no table selects would
    be measured and never shown."""
    page = (ROOT / "docs" / "results.md").read_text()
    tables = []
    for block in re.findall(r"```\{results-table\}\n(.*?)```", page, re.S):
        options = dict(re.findall(r"^:(\w+):\s*(.*)$", block, re.M))
        tables.append((re.compile(options.get("name", "")), re.compile(options.get("command", ""))))
    assert tables, "docs/results.md has no results-table"
    unshown = [e["name"] + " / " + e["metric"] for e in entries() if not any(n.search(e["name"]) and c.search(e["command"]) for n, c in tables)]
    assert not unshown, f"entries of docs/results.json on no table of docs/results.md: {unshown}"
