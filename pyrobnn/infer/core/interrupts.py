"""Stopping a checkpointed run on SIGTERM or SIGINT (Ctrl-C) without losing its work.

A long run that writes checkpoints watches for the two signals a user or a scheduler sends to
stop a process (:func:`stop_signals`). The first one does not kill the process in the middle of
an iteration: it is recorded, the run finishes the iteration it is in, writes its state to its
checkpoint and raises :class:`RunInterrupted`, whose message names the file and the call that
resumes from it. A loop whose state can only be written at the end of an epoch goes on to that
end for at most :data:`GRACE_SECONDS` after the signal, else stops where it is and says which
state the resumed run starts from (the one written last). A second signal stops at once (the
previous handler runs: a ``KeyboardInterrupt`` for SIGINT, the process's default for SIGTERM).

Handlers are installed only in the main thread (Python delivers signals there), only for the
run's duration, and not for a signal the process ignores (a job started with ``nohup`` or ``&``
from a script ignores SIGINT: it stays ignored); a signal that arrives after the loop's last
iteration is passed on to the previous handler when the run returns, so that nothing the user
asked for is swallowed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

__all__ = ["RunInterrupted", "StopRequest", "stop_signals", "GRACE_SECONDS"]

#: how long after a stop signal a loop may run on to the end of its epoch (where its state can
#: be written) before it stops where it is
GRACE_SECONDS = 5.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGTERM or SIGINT. A ``KeyboardInterrupt``, so that ``except Exception``
    does not swallow it. ``signal`` is the signal's name, ``path`` the checkpoint that holds the
    state the same call resumes from (``None`` when nothing was written), ``done`` the iterations
    that state holds."""

    def __init__(self, message: str, *, signal_name: str, path=None, done=None):
        super().__init__(message)
        self.signal, self.path, self.done = signal_name, path, done

    def __str__(self):
        return self.args[0]


class StopRequest:
    """Whether a stop signal came during a run: ``signum`` (``None`` until one did) and ``time``
    (``time.monotonic()`` then)."""

    def __init__(self):
        self.signum = None
        self.time = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def overdue(self) -> bool:
        """A signal came more than :data:`GRACE_SECONDS` ago: stop without reaching the next
        point where the state can be written."""
        return self.time is not None and time.monotonic() - self.time > GRACE_SECONDS


@contextlib.contextmanager
def stop_signals(enabled: bool = True):
    """Within the block, SIGTERM and SIGINT are recorded in the yielded :class:`StopRequest`
    instead of stopping the process (the module docstring says what a second signal does and
    what happens to one the block did not act on). Not ``enabled``, or outside the main thread,
    the handlers stay as they are and the request stays empty."""
    request = StopRequest()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    previous = {s: h for s, h in previous.items() if h is not signal.SIG_IGN}

    def restore():
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def handler(signum, frame):
        if request.signum is not None:  # a second signal: the previous handler, at once
            restore()
            signal.raise_signal(signum)
            return
        request.signum, request.time = signum, time.monotonic()

    for s in previous:
        signal.signal(s, handler)
    try:
        yield request
    finally:
        restore()
    # a signal the run did not stop for (it came after the last iteration): passed on
    if request.signum is not None:
        signal.raise_signal(request.signum)
