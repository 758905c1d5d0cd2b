"""The head's count of node failures: merges and renders that failed for one node
(:mod:`rayscope.core.isolation`), what ``/healthz`` says of them, and their log line."""

import threading
import time
from typing import Any, Optional

from rayscope.labels import printable
from rayscope.sinks.logs import LogThrottle


class NodeFailures:
    """What ``/healthz`` says about merges and renders that failed for a node: how many, since
    when, the last one and when (wall clock). Safe across threads."""

    def __init__(self, throttle: Optional[LogThrottle] = None) -> None:
        self._lock = threading.Lock()
        self._throttle = throttle
        self.count = 0
        self.first_at: Optional[float] = None
        self.last = ""
        self.last_at: Optional[float] = None

    def note(self, stage: str, node_id: str, reason: str) -> None:
        what = f"{stage} of node {printable(node_id)[:60]}: {reason}"
        with self._lock:
            now = time.time()
            self.count += 1
            self.first_at = self.first_at or now
            self.last, self.last_at = what, now
            if self._throttle is not None:
                self._throttle.note(f"unreadable:{stage}", "report unreadable: %s", what)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "render_errors": self.count,
                "render_errors_since": self.first_at,
                "last_render_error": self.last,
                "last_render_error_at": self.last_at,
            }
