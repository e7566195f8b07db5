"""What the fault suite's tests share: running code in a fresh process, waiting for a file, and
whether this machine can mount a small tmpfs for a real full disk."""

import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child_env(env=None) -> dict:
    """This process's environment with the suite's folder on ``PYTHONPATH`` (the children import
    ``fault_cases``), and ``env`` on top."""
    return dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))


def foreground_signals():
    """In a child before it runs: SIGINT back to its default, as in a process started from a
    terminal (a test run started in the background from a script ignores SIGINT, and its children
    would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_child(code: str, *args, env=None, timeout=300, check=True):
    """Run ``code`` in a fresh Python process (one torch thread, this suite's folder on the path);
    returns the CompletedProcess."""
    full_env = child_env(env)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=full_env, timeout=timeout,
                          preexec_fn=foreground_signals)
    if check and proc.returncode != 0:
        raise AssertionError(f"child exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def start_child(code: str, *args, env=None, **kwargs):
    full_env = child_env(env)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=full_env, preexec_fn=foreground_signals, **kwargs)


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
