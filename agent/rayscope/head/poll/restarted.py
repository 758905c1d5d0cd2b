"""A loop in a daemon thread of its own, started again by :meth:`RestartedThread.check` when
it has died (a bug, or a ``BaseException`` from a library): the GCS poller and the dashboard
worker are each one."""

import threading
from typing import Callable, Optional


class RestartedThread:
    """Runs :meth:`_run` in a thread named ``name``; ``set_alive(alive, restarted)`` tells the
    health the loop reports to (``/healthz``). Subclasses write :meth:`_run`."""

    def __init__(self, name: str, stop: threading.Event, set_alive: Callable[..., None]) -> None:
        self._name, self._stop, self._set_alive = name, stop, set_alive
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self, restarted: bool = False) -> None:
        self._set_alive(True, restarted)
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """Start a new thread if the last one died; ``True`` if one was started."""
        if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
            return False
        self.start(restarted=self._thread is not None)
        return True
