"""Shutdown requests from signal handlers, without locks.

CPython runs a signal handler in the main thread between two bytecodes, and that may be in the middle of
``threading.Event.set()`` or ``.wait()`` with the Event's (non-reentrant) lock held.  A handler that calls
``Event.set()`` then blocks on a lock its own thread holds, forever.  It happened: a sidecar whose engine was
SIGKILLed received the kernel's parent-death signal and a second signal while its main thread was inside
``Event.wait``, and hung instead of exiting (CI, 2026-12-01).  The handler here only appends to a list; the
threads that act on a request poll :meth:`ShutdownLatch.requested` (a plain read) in short sleeps.
"""
from __future__ import annotations

import signal
import time
from collections.abc import Iterable

__all__ = ["POLL_S", "ShutdownLatch"]

#: How often :meth:`ShutdownLatch.wait` looks at the latch, in seconds: the latency of an orderly shutdown.
POLL_S = 0.1


class ShutdownLatch:
    """Records the signals that ask a process to stop; safe to set from a signal handler.

    ``install(signals)`` makes :meth:`handler` the handler of each signal; the handler appends the signal's
    number to :attr:`signals` and does nothing else (no lock, no I/O), so it cannot deadlock whatever the
    main thread was doing when the signal arrived.
    """

    def __init__(self) -> None:
        self.signals: list[int] = []  # list.append is one C call: a handler cannot interrupt another's

    def install(self, signums: Iterable[int]) -> None:
        """Make :meth:`handler` the handler of each signal in ``signums``.

        Raises:
            ValueError: when called from a thread other than the main thread (``signal.signal``'s rule).
        """
        for signum in signums:
            signal.signal(signum, self.handler)

    def handler(self, signum: int, _frame: object = None) -> None:
        """The signal handler: record ``signum``. Also callable directly (a thread asking for a shutdown)."""
        self.signals.append(signum)

    def requested(self) -> bool:
        """Whether any stop has been asked for."""
        return bool(self.signals)

    def received(self, signum: int) -> bool:
        """Whether the signal ``signum`` has been received."""
        return signum in self.signals

    def wait(self, poll_s: float = POLL_S) -> None:
        """Block until a stop is requested, looking every ``poll_s`` seconds."""
        while not self.signals:
            time.sleep(poll_s)
