"""The fault-injection suite: each case injects one fault (a signal, a killed process, a full
disk, a corrupted file, two processes at once, a rank that dies, too little memory) and checks
what must survive it, within a bound on time.

Every case carries ``@pytest.mark.fault(fault=..., survives=..., bound=...)``; the tests may add
measured figures to the ``fault_figures`` fixture (seconds to stop, ...). Run with
``--fault-table PATH`` the suite writes its table (case, fault, what survives, bound, outcome,
seconds, figures) as JSON to ``PATH``; the docs' reliability page renders
``docs/reliability.json`` (``python -m pytest tests/faults -m "slow or not slow" --fault-table
docs/reliability.json``)."""

import json
import os

import pytest

_ROWS = {}


def pytest_addoption(parser):
    parser.addoption("--fault-table", default=None, help="write the fault suite's table to this JSON file")


def pytest_configure(config):
    config.addinivalue_line("markers", "fault(fault, survives, bound): a case of the fault-injection suite (tests/faults)")


@pytest.fixture
def fault_figures(request):
    """A dict for the case's measured figures (plain numbers and strings), shown in its row."""
    figures = {}
    request.node.fault_figures = figures
    return figures


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("fault")
    if marker is None:
        return
    row = _ROWS.setdefault(item.nodeid, {
        "case": item.nodeid.split("::", 1)[1], "file": os.path.basename(item.fspath), **marker.kwargs,
        "slow": item.get_closest_marker("slow") is not None, "outcome": "not run", "seconds": 0.0,
    })
    if report.when == "call" or report.outcome != "passed":
        row["outcome"] = "skipped" if report.skipped else report.outcome
        if report.skipped and isinstance(report.longrepr, tuple):
            row["reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    row["seconds"] = round(row["seconds"] + report.duration, 2)
    row["figures"] = dict(getattr(item, "fault_figures", {}))


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--fault-table")
    if not path or not _ROWS:
        return
    import datetime
    import platform

    from pyrobnn.utils.io import atomic_write_text

    rows = sorted(_ROWS.values(), key=lambda r: (r["file"], r["case"]))
    table = {
        "command": 'python -m pytest tests/faults -m "slow or not slow" --fault-table docs/reliability.json',
        "date": datetime.date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "cases": rows,
    }
    atomic_write_text(json.dumps(table, indent=1) + "\n", path)
