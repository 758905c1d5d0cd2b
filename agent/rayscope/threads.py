"""The one way rayscope starts a thread of its own: :class:`Worker`, a daemon thread whose
exception is kept for its owner and never printed.

A one-shot command (``status``, or a ``--watch`` left with Ctrl-C) exits while reads it gave
up at their deadline may still run in daemon threads: a GCS call, NVML, the dashboard's GET,
the port probe. Python's default ``threading.excepthook`` writes a traceback to stderr. A
thread that does so while the interpreter shuts down can hold stderr's lock when the main
thread flushes it, and Python aborts (``Fatal Python error: _enter_buffered_busy``, exit
134: seen on 3.13 after Ctrl-C on ``--watch``). Nor is a traceback ever how rayscope says
what went wrong: the owner reads :attr:`Worker.error` and says it its own way.

Standard library only (the GCS child's early start imports it).
"""

import threading
from typing import Callable, Optional


class Worker(threading.Thread):
    """``target()`` in a daemon thread named ``name``; whatever it raises is kept in
    :attr:`error` (``BaseException`` too), for whoever joins or checks it."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._work: Optional[Callable[[], object]] = target
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            if self._work is not None:
                self._work()
        except BaseException as err:  # kept, never printed: see the module's docstring
            self.error = err
        finally:
            self._work = None  # what the target holds is not kept alive by a finished thread


def start(target: Callable[[], object], name: str) -> Worker:
    """A started :class:`Worker`."""
    worker = Worker(target, name)
    worker.start()
    return worker
