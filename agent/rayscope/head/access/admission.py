"""Admission for the report port: caps on connections, eviction of unauthenticated ones,
and the counters ``/healthz`` shows."""

import logging
from collections import OrderedDict
from typing import Any, Callable, Protocol

from rayscope.sinks.logs import LogThrottle

log = logging.getLogger("rayscope.head")

MAX_CONNECTIONS = 4096
MAX_UNAUTH_PER_HOST = 256


class Connection(Protocol):
    """What admission needs of a connection (:class:`rayscope.head.serve.ingest.Connection`)."""

    peer: str
    """``HOST:PORT`` of the peer, for the log."""
    host: str
    """The peer's address: caps are per source address."""

    def abort(self) -> None: ...


class IngestCounters:
    """Counters for ``/healthz``; touched only from the event loop (reads are racy but
    each value is a plain int)."""

    def __init__(self) -> None:
        self.open = 0
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        self.v1_frames = 0
        self.rejected: dict[str, int] = {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections_open": self.open,
            "connections_evicted": self.evicted,
            "connections_refused": self.refused,
            "connections_timed_out": self.timed_out,
            "v1_frames": self.v1_frames,
            **{f"rejected_{reason.replace(' ', '_')}": n for reason, n in self.rejected.items()},
        }


class ConnectionGuard:
    """Admission for the report port: caps, eviction of unauthenticated connections, and the
    throttled log. One per head."""

    def __init__(
        self,
        max_total: int,
        max_unauth_per_host: int,
        throttle: LogThrottle,
        count_rejected: Callable[[], None] = lambda: None,
    ) -> None:
        self.max_total, self.max_unauth_per_host = max_total, max_unauth_per_host
        self.throttle, self._count_rejected = throttle, count_rejected
        self.counters = IngestCounters()
        self._all: set[Connection] = set()
        self._unauth: OrderedDict[Connection, None] = OrderedDict()  # oldest first
        self._unauth_by_host: dict[str, int] = {}
        self._v1_warned = False

    def admit(self, conn: Connection) -> bool:
        """Take a new connection, evicting an older unauthenticated one if a cap is hit;
        ``False`` when every slot is held by an authenticated agent."""
        if self._unauth_by_host.get(conn.host, 0) >= self.max_unauth_per_host:
            self._evict(next(c for c in self._unauth if c.host == conn.host), "per-address cap")
        if len(self._all) >= self.max_total and self._unauth:
            self._evict(next(iter(self._unauth)), "connection cap")
        if len(self._all) >= self.max_total:
            self.counters.refused += 1
            self.throttle.note(
                "refused", "refusing connection from %s: %d agents connected", conn.peer, len(self._all)
            )
            return False
        self._all.add(conn)
        self._unauth[conn] = None
        self._unauth_by_host[conn.host] = self._unauth_by_host.get(conn.host, 0) + 1
        self.counters.open = len(self._all)
        return True

    def authenticated(self, conn: Connection) -> None:
        if conn in self._unauth:
            del self._unauth[conn]
            self._drop_host(conn.host)

    def gone(self, conn: Connection) -> None:
        self._all.discard(conn)
        self.authenticated(conn)
        self.counters.open = len(self._all)

    def rejected(self, reason: str) -> None:
        self._count_rejected()
        self.counters.rejected[reason] = self.counters.rejected.get(reason, 0) + 1

    def v1_frame(self, peer: str) -> None:
        self.counters.v1_frames += 1
        if not self._v1_warned:
            self._v1_warned = True
            log.warning(
                "agent %s sends version-1 frames: still taken in this release, but they are not"
                " replay-safe (a recorded frame can be resent); upgrade its rayscope",
                peer,
            )

    def _drop_host(self, host: str) -> None:
        left = self._unauth_by_host.get(host, 0) - 1
        if left > 0:
            self._unauth_by_host[host] = left
        else:
            self._unauth_by_host.pop(host, None)

    def _evict(self, conn: Connection, why: str) -> None:
        self.counters.evicted += 1
        self.throttle.note("evicted", "evicting unauthenticated connection from %s: %s", conn.peer, why)
        self.gone(conn)
        conn.abort()
