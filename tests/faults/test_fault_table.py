"""The reliability page's table (docs/reliability.json) is the suite's: every fault case has its
rows there, every row is a case that still exists, and none failed."""

import ast
import json
import os

from fault_tools import HERE

TABLE = os.path.join(HERE, "..", "..", "docs", "reliability.json")


def _fault_cases() -> set:
    names = set()
    for file in sorted(os.listdir(HERE)):
        if not (file.startswith("test_fault_") and file.endswith(".py")):
            continue
        with open(os.path.join(HERE, file)) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any("fault" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def test_the_reliability_table_is_the_suite_s():
    with open(TABLE) as f:
        table = json.load(f)
    rows = {row["case"].split("[")[0] for row in table["cases"]}
    cases = _fault_cases()
    assert cases, "no fault cases found"
    assert rows == cases, f"regenerate docs/reliability.json ({table['command']}): missing {sorted(cases - rows)}, gone {sorted(rows - cases)}"
    failed = [row["case"] for row in table["cases"] if row["outcome"] not in ("passed", "skipped")]
    assert not failed, f"the table records failed cases: {failed}"
    assert all(row.get("reason") for row in table["cases"] if row["outcome"] == "skipped")
