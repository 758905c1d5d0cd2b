"""The head's rendered answers, each representation rendered once per change, not per request.

At 10,000 nodes one merge and JSON render of ``/v1/status`` costs ~0.1 s and the
Prometheus text ~0.4 s of the head's CPU; a dashboard, a cron job and a few operators asking
every few seconds would keep it busy for nothing. So each representation (the JSON document,
the status lines, the metrics; each with its options) is kept as bytes with the
:attr:`HeadState.version <rayscope.head.state.HeadState.version>` it was rendered at, and is
served again:

* while it is younger than :func:`refresh_s` (at most :data:`REFRESH_S`), whatever changed:
  under a steady stream of reports the state changes thousands of times a second;
* up to :func:`max_age_s` (at most :data:`MAX_AGE_S`) when nothing changed: ages and
  staleness move with the clock alone, so a render does not stay for ever.

Both are fractions of the head's interval, so an answer is never more than a quarter of an
interval behind the reports, or half of one behind the clock. One request renders while the
others asking for the same representation wait for it (no stampede). A gzip copy is made
once, for the first client that accepts it.
"""

import gzip
import json
import threading
import time
from collections.abc import Hashable
from typing import Callable, NamedTuple, Optional

from rayscope.core.completeness import assess
from rayscope.core.isolation import recording
from rayscope.head.state import HeadState
from rayscope.render.status import source_details
from rayscope.schema.status import DOCUMENT_SCHEMA, ClusterStatus

REFRESH_S = 0.5
MAX_AGE_S = 2.0
GZIP_LEVEL = 1
"""Fast: the JSON of 10,000 nodes shrinks ~12× at level 1 in ~20 ms (level 6: ~15×, ~60 ms)."""


def refresh_s(interval_s: float) -> float:
    return min(REFRESH_S, interval_s / 4)


def max_age_s(interval_s: float) -> float:
    return min(MAX_AGE_S, interval_s / 2)


def _monotonic() -> float:
    return time.monotonic()  # looked up per call: tests move the clock


class Rendered(NamedTuple):
    """One representation as served: its body and the headers that describe the status."""

    body: bytes
    headers: tuple[tuple[str, str], ...]


def status_headers(status: ClusterStatus) -> tuple[tuple[str, str], ...]:
    """What a client needs besides the body to behave as ``status`` does: the exit code and
    the completeness note (stderr), the ``--verbose`` source lines, the document schema.
    Values JSON-encoded as ASCII, so no byte of a peer's text can break a header."""
    code, note = assess(status)
    return (
        ("X-Rayscope-Exit", str(code)),
        ("X-Rayscope-Note", json.dumps(note or "")),
        ("X-Rayscope-Notes", json.dumps(source_details(status.sources))),
        ("X-Rayscope-Schema", str(DOCUMENT_SCHEMA)),
    )


class _Entry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = -1
        self.rendered_at = float("-inf")
        self.value: Optional[Rendered] = None
        self.gzipped: Optional[bytes] = None


class Answers:
    """The cached answers of one head; ``get`` is safe across the HTTP port's threads."""

    def __init__(self, state: HeadState) -> None:
        self.state = state
        self._entries: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()
        self.renders = 0
        """How many renders were made (``/healthz`` does not show it; tests do)."""

    def get(
        self, key: Hashable, render: Callable[[ClusterStatus], Rendered], gpus: bool, gzipped: bool = False
    ) -> Rendered:
        """The representation ``key`` (rendered by ``render`` from the status with or without
        the per-GPU attribution), as bytes; gzip-compressed when ``gzipped``."""
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
        with entry.lock:
            now = _monotonic()
            version = self.state.version
            age = now - entry.rendered_at
            interval = self.state.interval_s
            current = age < refresh_s(interval) or (entry.version == version and age < max_age_s(interval))
            if entry.value is None or not current:
                status = self.state.status(now, gpus=gpus, wall_now=time.time())
                with recording(self.state.failures):  # a node a renderer fails on: counted
                    entry.value, entry.gzipped = render(status), None
                entry.version, entry.rendered_at = version, now
                self.renders += 1
            value = entry.value
            if not gzipped:
                return value
            if entry.gzipped is None:
                entry.gzipped = gzip.compress(value.body, GZIP_LEVEL, mtime=0)
            return Rendered(entry.gzipped, (*value.headers, ("Content-Encoding", "gzip")))
