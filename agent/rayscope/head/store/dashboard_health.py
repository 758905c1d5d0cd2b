"""What ``/healthz`` says about the head's read of Ray's dashboard, kept apart from the GCS
poller's: a dashboard that fails costs its own figures, never the head's ``ok``."""

import threading
from typing import Any, Optional


class DashboardHealth:
    """What ``/healthz`` says about the head's read of Ray's dashboard (its own thread,
    :mod:`rayscope.head.poll.dashboard`): ``state`` is ``off`` (the operator turned it off),
    ``not needed`` (every GPU node is measured by its agent), ``ok``, ``failing`` (with the
    reason) or ``not read yet``; a failing dashboard costs its figures, never the head's ``ok``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = "not read yet"
        self.reason = ""
        self.alive = False
        self.restarts = 0
        self.errors = 0
        self.failures = 0
        self.last_ok: Optional[float] = None  # monotonic clock
        self.last_read: Optional[float] = None
        self.reading_since: Optional[float] = None

    def off(self, why: str) -> None:
        with self._lock:
            self.state, self.reason = "off", why

    def reading(self, now: float) -> None:
        with self._lock:
            self.reading_since = now

    def _done(self, state: str, reason: str, now: float) -> None:
        self.state, self.reason, self.last_read, self.reading_since = state, reason, now, None

    def not_needed(self, now: float) -> None:
        with self._lock:
            self._done("not needed", "", now)

    def answered(self, now: float) -> None:
        with self._lock:
            self._done("ok", "", now)
            self.last_ok = now

    def failing(self, reason: str, now: float, error: bool = False) -> None:
        """A read that failed (``error``: raised, a bug)."""
        with self._lock:
            self._done("failing", reason, now)
            self.failures += 1
            self.errors += int(error)

    def set_alive(self, alive: bool, restarted: bool = False) -> None:
        with self._lock:
            self.alive = alive
            self.restarts += int(restarted)

    def snapshot(self, now: float) -> dict[str, Any]:
        def ago(at: Optional[float]) -> Optional[float]:
            return None if at is None else round(now - at, 1)

        with self._lock:
            return {
                "state": self.state,
                "reason": self.reason,
                "alive": self.alive,
                "last_ok_s_ago": ago(self.last_ok),
                "last_read_s_ago": ago(self.last_read),
                "reading_for_s": ago(self.reading_since),
                "failures": self.failures,
                "errors": self.errors,
                "restarts": self.restarts,
            }
