"""A loop in a daemon thread of its own, started again by :meth:`RestartedThread.check` when
it has died (a bug, or a ``BaseException`` from a library): the GCS poller and the dashboard
worker are each one."""

import threading
from typing import Callable, Optional

from rayscope import errors


class RestartedThread:
    """Runs :meth:`_run` in a thread named ``name``; ``set_alive(alive, restarted)`` tells the
    health the loop reports to (``/healthz``). Subclasses write :meth:`_run`, which says why
    its loop died (each has its own health entry and log line) before the thread ends."""

    def __init__(self, name: str, stop: threading.Event, set_alive: Callable[..., None]) -> None:
        self._name, self._stop, self._set_alive = name, stop, set_alive
        self._thread: Optional[errors.Worker] = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self, restarted: bool = False) -> None:
        self._set_alive(True, restarted)
        self._thread = errors.start_worker(self._run, self._name)

    def check(self) -> bool:
        """Start a new thread if the last one died; ``True`` if one was started."""
        if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
            return False
        self.start(restarted=self._thread is not None)
        return True
