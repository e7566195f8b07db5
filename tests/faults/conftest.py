"""The fault-injection suite: each case injects one fault (a signal, a killed process, a full
disk, a corrupted file, two processes at once, a rank that dies, too little memory) and checks
what must survive it, within a bound on time.

Every case carries ``@pytest.mark.fault(fault=..., survives=..., bound=...)``; the tests may add
measured figures to the ``fault_figures`` fixture (seconds to stop, ...). Run with
``--fault-table PATH`` the suite writes its table (case, fault, what survives, outcome, figures)
as JSON to ``PATH`` and as a Markdown table beside it (``PATH`` with ``.md``): the docs'
reliability page includes that table (docs/reliability.md)."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_ROWS = {}


def pytest_addoption(parser):
    parser.addoption("--fault-table", default=None, help="write the fault suite's table to this JSON file (and a .md beside it)")


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
    rows = sorted(_ROWS.values(), key=lambda r: (r["file"], r["case"]))
    from pyrobnn.utils.io import atomic_write_text

    atomic_write_text(json.dumps(rows, indent=1) + "\n", path)
    atomic_write_text(markdown_table(rows), os.path.splitext(path)[0] + ".md")


def _figures(row) -> str:
    return "; ".join(f"{k} {v}" for k, v in row.get("figures", {}).items())


def markdown_table(rows) -> str:
    lines = [
        "| case | fault injected | what must survive | bound | outcome | measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        outcome = r["outcome"] + (f" ({r['reason']})" if r.get("reason") else "")
        cells = [f"`{r['case']}`", r.get("fault", ""), r.get("survives", ""), r.get("bound", ""), outcome, _figures(r)]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- helpers
def run_child(code: str, *args, env=None, timeout=300, check=True):
    """Run ``code`` in a fresh Python process (one torch thread, this suite's folder on the path);
    returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"child exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def start_child(code: str, *args, env=None, **kwargs):
    full_env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=full_env, **kwargs)


def wait_for(predicate, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the child ended ({proc.returncode}) before {what}: {str(out)[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def user_namespaces() -> bool:
    """Whether this machine lets a process mount a small tmpfs in its own user and mount
    namespaces (``unshare -rm``), for a real full disk."""
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=64k tmpfs /tmp"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
