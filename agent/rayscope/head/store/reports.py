"""The head's table of reports: the latest one per node, which connection owns each node, and
which to forget or evict. Every age here is on the head's monotonic clock. Not thread-safe:
:class:`rayscope.head.store.state.HeadState` holds its lock around every call.

The rules (SECURITY.md, "Report bounds"), each a property of every path into the table:

* **A node belongs to one connection.** The first connection to report a node owns it; a
  report for that node from another connection is refused (``claimed``) while the owner is
  connected and its report is fresh. When the owner disconnects, or its report goes stale,
  the next connection to report the node owns it. A host without a raylet (``host:NAME``)
  is a node like any other.
* **A node is reported from its own address.** Where the scheduler knows the node's IP and
  the peer is not on loopback, a report from another address is refused (``wrong peer``).
* **What is held is bounded:** at most :data:`MAX_NODES_HELD` nodes, of which at most
  :data:`MAX_UNKNOWN_HELD` the scheduler does not know. A new unknown node at either cap
  evicts the unknown node whose report is oldest, found in O(1) (the unknown nodes are kept
  in the order their latest report arrived); nodes the scheduler knows are never evicted,
  and when only they are held, a new unknown node is refused (``full``).
* **Old reports go**, with or without a scheduler view: a report older than the forget
  horizon is dropped for a node the scheduler does not know, or for every node when there
  is no scheduler view to say which are known.
* **A clean stop says goodbye:** the node's report is dropped at once (``no agent``), while
  a crash leaves it to go stale.
"""

import threading
from collections import OrderedDict
from collections.abc import Container, Hashable, Mapping
from typing import Optional

from rayscope.core.validate import ReportError
from rayscope.net.addresses import is_loopback
from rayscope.net.wire import CLAIMED, FULL, WRONG_PEER
from rayscope.schema.status import ReceivedReport

MAX_NODES_HELD = 16_384
MAX_UNKNOWN_HELD = 256
"""Nodes the scheduler does not know (hosts without a raylet, nodes just gone): a few per
login node and a few gone per interval; more is someone sending made-up ids. SECURITY.md
states this number and the head's memory at it, filled with the largest reports
(``tests/tools/measure_unknown_cap.py``); a test holds it at its real value."""


def bare_address(host: str) -> str:
    """A peer address as the scheduler writes node IPs: IPv4-mapped IPv6 unmapped."""
    host = host.strip("[]")
    return host[len("::ffff:") :] if host.lower().startswith("::ffff:") and "." in host else host


class ReportTable:
    """The latest report per node key, its owner, and the order to evict unknown nodes in."""

    def __init__(self) -> None:
        self.reports: dict[str, ReceivedReport] = {}
        self._owner: dict[str, Hashable] = {}  # node key -> the connection that owns it
        self._owned: dict[Hashable, set[str]] = {}  # connected owner -> the keys it owns
        self._unknown: OrderedDict[str, None] = OrderedDict()  # unknown keys, oldest report first
        self._known: Container[str] = ()

    def __len__(self) -> int:
        return len(self.reports)

    def put(
        self,
        key: str,
        received: ReceivedReport,
        conn: Optional[Hashable],
        peer: Optional[str],
        expected_ip: Optional[str],
        fresh_s: float,
    ) -> Optional[str]:
        """Keep ``received`` as ``key``'s latest report, sent on ``conn`` from ``peer``; the
        key evicted to make room, if any. :class:`ReportError` (with its ``reason``) for a
        report the rules refuse; the table is then unchanged."""
        now = received.received_at
        owner = self._owner.get(key)
        if owner is not None and owner != conn and owner in self._owned:
            held = self.reports.get(key)
            if held is not None and now - held.received_at <= fresh_s:
                raise ReportError(
                    f"node {key} is reported by another connection (its report is fresh)", reason=CLAIMED
                )
        if self._wrong_peer(peer, expected_ip):
            raise ReportError(
                f"node {key} is at {expected_ip} by the scheduler; this report came from {peer}",
                reason=WRONG_PEER,
            )
        evicted = None if key in self.reports else self._make_room(key)
        self.reports[key] = received
        if key not in self._known:
            self._unknown[key] = None
            self._unknown.move_to_end(key)
        self._own(key, conn)
        return evicted

    @staticmethod
    def _wrong_peer(peer: Optional[str], expected_ip: Optional[str]) -> bool:
        """A report from another address than the scheduler's IP for its node (on loopback,
        where a test or the head's own agent reports, every address is the same host)."""
        if peer is None or not expected_ip or is_loopback(peer) or is_loopback(expected_ip):
            return False
        return bare_address(peer) != bare_address(expected_ip)

    def _make_room(self, key: str) -> Optional[str]:
        """Evict the oldest unknown node when a new ``key`` hits a cap; ``full`` when it cannot."""
        unknown = key not in self._known
        if len(self.reports) < MAX_NODES_HELD and not (unknown and len(self._unknown) >= MAX_UNKNOWN_HELD):
            return None
        if not self._unknown:
            if unknown:
                raise ReportError(
                    f"the head holds {len(self.reports)} nodes the scheduler knows, the most it holds: full",
                    reason=FULL,
                )
            return None  # a known node is never refused: the scheduler bounds their number
        oldest = next(iter(self._unknown))
        self.drop(oldest)
        return oldest

    def _own(self, key: str, conn: Optional[Hashable]) -> None:
        previous = self._owner.get(key)
        if previous is not None and previous != conn:
            self._owned.get(previous, set()).discard(key)
        if conn is None:
            self._owner.pop(key, None)
            return
        self._owner[key] = conn
        self._owned.setdefault(conn, set()).add(key)

    def drop(self, key: str) -> None:
        self.reports.pop(key, None)
        self._unknown.pop(key, None)
        owner = self._owner.pop(key, None)
        if owner is not None:
            self._owned.get(owner, set()).discard(key)

    def disconnected(self, conn: Hashable) -> None:
        """``conn`` is gone: its nodes keep their reports (a crash goes stale) but no longer
        belong to anyone, so the next connection to report them owns them."""
        for key in self._owned.pop(conn, set()):
            if self._owner.get(key) == conn:
                del self._owner[key]

    def goodbye(self, conn: Hashable) -> list[str]:
        """``conn``'s agent stopped cleanly: drop the reports of the nodes it owns."""
        keys = sorted(self._owned.get(conn, set()))
        for key in keys:
            self.drop(key)
        self._owned.pop(conn, None)
        return keys

    def set_known(self, known: Container[str]) -> None:
        """A new scheduler view: the unknown nodes are re-listed, oldest report first."""
        self._known = known
        unknown = sorted((r.received_at, k) for k, r in self.reports.items() if k not in known)
        self._unknown = OrderedDict((k, None) for _, k in unknown)

    def forget(self, now: float, horizon_s: float, view_ok: bool) -> list[str]:
        """Drop the reports older than ``horizon_s``: of nodes the scheduler does not know,
        or of every node when there is no scheduler view (``view_ok`` false)."""
        keys = list(self.reports) if not view_ok else list(self._unknown)
        gone = [k for k in keys if now - self.reports[k].received_at > horizon_s]
        for key in gone:
            self.drop(key)
        return gone


class SharedGpuWatch:
    """Whether any GPU UUID is listed by two of the reports a merge is given (or twice by
    one): while none is, no GPU is time-sliced and the rollup need not look through every
    node's GPUs to say so (:func:`rayscope.core.gpu.memory.find_shared_gpus`: a quarter of a
    merge at 10,000 nodes of 8 GPUs). Kept per merge from the reports that changed since the
    last (a report is known by its identity and receive time, nothing of it held), never on
    the report path. Safe across the HTTP port's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int, float, tuple[str, ...]]] = {}
        self._counts: dict[str, int] = {}  # GPU UUID -> how many of the seen reports list it
        self.repeated = 0
        """UUIDs listed more than once."""

    def unique(self, reports: Mapping[str, ReceivedReport]) -> bool:
        """No GPU UUID listed twice in ``reports``."""
        with self._lock:
            seen = self._seen
            for key in seen.keys() - reports.keys():
                self._count(seen.pop(key)[2], ())
            for key, received in reports.items():
                held = seen.get(key)
                if held is None or held[0] != id(received) or held[1] != received.received_at:
                    uuids = _uuids(received)
                    self._count(held[2] if held is not None else (), uuids)
                    seen[key] = (id(received), received.received_at, uuids)
            return not self.repeated

    def _count(self, before: tuple[str, ...], after: tuple[str, ...]) -> None:
        if before == after:
            return  # the usual report: the same GPUs as the last
        counts = self._counts
        for uuid in before:
            counts[uuid] -= 1
            self.repeated -= counts[uuid] == 1
            if not counts[uuid]:
                del counts[uuid]
        for uuid in after:
            counts[uuid] = counts.get(uuid, 0) + 1
            self.repeated += counts[uuid] == 2


def _uuids(received: ReceivedReport) -> tuple[str, ...]:
    """The GPU UUIDs a report lists, as the rollup reads them (its devices, not MIG's)."""
    gpus = received.report.gpus
    return tuple([g.uuid for g in gpus if g.uuid]) if gpus else ()
