"""The head's state: the latest report per node and the latest scheduler view, safe across
threads; :meth:`HeadState.status` merges them into the rollup as of a given instant.

Every age is on the head's monotonic clock (``time.monotonic``): a wall clock stepped back
would keep a dead agent "reporting" for as long as the step, stepped forward would make every
node stale at once. Wall-clock times appear only in what the document shows (``generated_at``,
``received_at``), derived from the ages at the instant of the answer."""

import logging
import threading
import time
from collections.abc import Hashable
from typing import Any, Callable, Optional

import msgspec

from rayscope.core import validate
from rayscope.core.capacity import pending
from rayscope.core.gpu.attribution import attribute_cluster
from rayscope.core.gpu.precedence import dashboard_reports
from rayscope.core.isolation import recording
from rayscope.core.rollup import STALE_INTERVALS, merge, scheduler_nodes, scheduler_sums
from rayscope.core.validate import ReportError
from rayscope.defaults import DEFAULT_TIMEOUT_S
from rayscope.head.access.admission import IngestCounters
from rayscope.head.store.dashboard_health import DashboardHealth
from rayscope.head.store.failures import NodeFailures
from rayscope.head.store.reports import ReportTable, SharedGpuWatch
from rayscope.head.store.usage_store import DEFAULT_WINDOW_S, UsageStore
from rayscope.schema.dashboard import DashboardRead
from rayscope.schema.pending import PendingRead
from rayscope.schema.report import REPORT_SCHEMA, NodeReport, SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeStatus, RayNode, ReceivedReport
from rayscope.sinks.logs import LogThrottle

log = logging.getLogger("rayscope.head")

FORGET_INTERVALS = 20
"""A report for a node the scheduler does not know is dropped once this many intervals old."""


class PollerHealth:
    """What ``/healthz`` says about the GCS poller: alive, last round, failures, restarts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_round: Optional[float] = None  # monotonic clock
        self.errors = 0
        self.read_errors = 0
        self.restarts = 0
        self.last_error = ""
        self.alive = False

    def round_done(self) -> None:
        with self._lock:
            self.last_round = time.monotonic()

    def failed(self, what: str) -> None:
        with self._lock:
            self.errors += 1
            self.last_error = what

    def read(self, status: SourceStatus) -> None:
        """A round's GCS read: one that failed is counted and its reason kept (a round that
        completes with every read failing is not a healthy poller)."""
        if not status.ok:
            with self._lock:
                self.read_errors += 1
                self.last_error = f"GCS read failed: {status.reason}"

    def set_alive(self, alive: bool, restarted: bool = False) -> None:
        with self._lock:
            self.alive = alive
            self.restarts += int(restarted)

    def snapshot(self, now: float, interval_s: float) -> dict[str, Any]:
        """``ok``: alive, and a round finished within the GCS deadline plus 3 intervals."""
        with self._lock:
            since = None if self.last_round is None else round(now - self.last_round, 1)
            late = since is not None and since > DEFAULT_TIMEOUT_S + STALE_INTERVALS * interval_s
            return {
                "ok": self.alive and not late,
                "alive": self.alive,
                "last_round_s_ago": since,
                "errors": self.errors,
                "read_errors": self.read_errors,
                "restarts": self.restarts,
                "last_error": self.last_error,
            }


class HeadState:
    """The latest report per node and the latest scheduler view; safe across threads."""

    def __init__(
        self, interval_s: float, gcs_address: Optional[str], usage: Optional[UsageStore] = None
    ) -> None:
        self.interval_s = interval_s
        self.usage = usage or UsageStore(DEFAULT_WINDOW_S, interval_s, time.monotonic(), time.time())
        """Each actor's measured GPU memory over a window (``rayscope usage``)."""
        self.gcs_address = gcs_address
        self._lock = threading.Lock()
        self._table = ReportTable()
        self._shared_gpus = SharedGpuWatch()
        self._base: dict[str, NodeStatus] = {}  # rollup.scheduler_nodes of the latest view
        self._sums: dict[str, float] = scheduler_sums(())  # and its bookings summed
        self._gcs_status = SourceStatus(name="gcs", ok=False, reason="not read yet", detail=gcs_address or "")
        self._actors: Optional[list[ActorBooking]] = None
        self._actors_status = SourceStatus(name="gcs_actors", ok=False, reason="not read yet")
        self._view_read_at: Optional[float] = None  # monotonic clock at the last good GCS read
        self.poller = PollerHealth()
        self.dashboard_health = DashboardHealth()
        """The dashboard's reader (``/healthz``'s ``dashboard``): apart from the poller's."""
        self._pending: Optional[PendingRead] = None
        self._pending_status: Optional[SourceStatus] = None
        self.ray_versions: Optional[SourceStatus] = None  # the GCS reader's, once connected
        self._decoder = msgspec.msgpack.Decoder(NodeReport)
        self.reports_received = 0
        self.frames_rejected = 0
        self.net: Optional[IngestCounters] = None  # the report port's, once it serves
        self.more_health: list[Callable[[], dict[str, int]]] = []
        """Counters of parts beside ingest (agents placed through Ray) for ``/healthz``."""
        self.failures = NodeFailures(LogThrottle(log))
        """Merges and renders that failed for a node (rayscope.core.isolation), for ``/healthz``."""
        self.more_sources: list[Callable[[], SourceStatus]] = []
        """Statuses of parts beside the GCS (agents placed through Ray), in every status."""
        self._dashboard: Optional[DashboardRead] = None
        """Ray's dashboard's latest read (``rayscope.head.poll.dashboard``); ``None``: not read."""
        self.version = 0
        """Counts the changes of what :meth:`status` merges (reports, views, actors, demand):
        :mod:`rayscope.head.serve.answers` renders again only when it moved (or time did)."""

    def ingest(
        self,
        payload: bytes,
        received_at: float,
        conn: Optional[Hashable] = None,
        peer: Optional[str] = None,
    ) -> NodeReport:
        """Decode one report (typed) and keep it as its node's latest: sent on ``conn`` from
        ``peer`` (``None``: not through the report port), received at ``received_at`` on the
        head's monotonic clock. :class:`ReportError` with its reason when refused."""
        try:
            report = self._decoder.decode(payload)
        # ValidationError included; nesting; bad UTF-8 in a str raises UnicodeDecodeError (fuzz_wire)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
            raise ReportError(f"malformed report: {err}") from None
        if report.schema > REPORT_SCHEMA:
            raise ReportError(f"report schema {report.schema} is newer than this head's {REPORT_SCHEMA}")
        validate.check_report(report)  # bounds, numbers, strings (SECURITY.md rule 4)
        key = report.node_id or f"host:{report.host.hostname if report.host else '?'}"
        with self._lock:
            known = self._base.get(key)
            self._table.put(
                key,
                ReceivedReport(report=report, received_at=received_at),
                conn,
                peer,
                known.node_ip if known is not None else None,
                STALE_INTERVALS * self.interval_s,
            )
            self.usage.seen(key, report)
            self.reports_received += 1
            self.version += 1
        return report

    def disconnected(self, conn: Hashable) -> None:
        """The report port lost ``conn``: its nodes' reports stay (and go stale) but anyone
        may report them now."""
        with self._lock:
            self._table.disconnected(conn)

    def goodbye(self, conn: Hashable) -> list[str]:
        """``conn``'s agent stopped cleanly: its nodes show ``no agent`` at once."""
        with self._lock:
            self.version += 1
            return self._table.goodbye(conn)

    def count_rejected(self) -> None:
        with self._lock:
            self.frames_rejected += 1

    def health(self, now: Optional[float] = None) -> dict[str, Any]:
        """Cheap figures for ``/healthz``: is the head taking reports at all, and is its
        scheduler view being refreshed (the GCS poller's state and the view's age)?
        ``now``: the head's monotonic clock (default: read it). ``ok``: the poller runs and
        the scheduler view is fresh; ``problems`` says, in words, what is not."""
        now = time.monotonic() if now is None else now
        with self._lock:
            read_at, gcs = self._view_read_at, self._gcs_status
            counts: dict[str, Any] = {
                "nodes_reporting": len(self._table),
                "reports_received": self.reports_received,
                "frames_rejected": self.frames_rejected,
            }
        if self.net is not None:
            counts.update(self.net.as_dict())
        for more in self.more_health:
            counts.update(more())
        age = None if read_at is None else round(now - read_at, 1)
        stale = age is not None and age > STALE_INTERVALS * self.interval_s
        counts["scheduler_view"] = "missing" if age is None else ("old" if stale else "fresh")
        counts["scheduler_view_age_s"] = age
        counts["scheduler_view_stale"] = stale
        counts["scheduler_view_error"] = "" if gcs.ok else gcs.reason
        counts["gcs_poller"] = self.poller.snapshot(time.monotonic(), self.interval_s)
        counts["dashboard"] = self.dashboard_health.snapshot(time.monotonic())  # never a problem
        counts.update(self.failures.snapshot())
        problems = health_problems(counts, self.interval_s)
        ok = all(p == UNREADABLE_PROBLEM for p in problems)  # one node's problem is not the head's
        return {"ok": ok, "problems": problems, **counts}

    def take(self, payload: bytes, received_at: float, conn: Hashable, peer: str) -> Optional[str]:
        """:meth:`ingest` for the report port: the node id reported for."""
        return self.ingest(payload, received_at, conn, peer).node_id

    def set_view(self, views: list[RayNode], status: SourceStatus, read_at: Optional[float] = None) -> None:
        """A new scheduler view (a failed read keeps the last good one, flagged by status
        and by its age). ``read_at``: the head's monotonic clock at the read (default: now)."""
        base = scheduler_nodes(views) if status.ok else None
        sums = scheduler_sums(base.values()) if base is not None else None
        with self._lock:
            if base is not None and sums is not None:
                self._base, self._sums = base, sums
                self._table.set_known(base)
                self._view_read_at = time.monotonic() if read_at is None else read_at
            self._gcs_status = status
            self.version += 1

    def forget_gone(self, now: float) -> list[str]:
        """Drop reports that have long stopped (``now``: the monotonic clock): of nodes the
        scheduler does not know (a node taken away with its agent, which would show as ``no
        raylet`` for ever), and of every node while there is no scheduler view (made-up ids
        would otherwise stay for good)."""
        with self._lock:
            view_ok = self._view_read_at is not None
            gone = self._table.forget(now, FORGET_INTERVALS * self.interval_s, view_ok)
            self.version += len(gone)
            return gone

    def fold_usage(self, now: float) -> None:
        """Once per interval (the poller): attribute the reports since the last fold to the
        actors of the latest actor table and record them in the usage window."""
        with self._lock:
            pending = self.usage.take()
            actors = self._actors
            reports = {key: r.report for key, r in self._table.reports.items()}
        self.usage.fold(pending, actors, co_hosted(reports), now)
        self.usage.maybe_save(now)

    def set_actors(self, actors: Optional[list[ActorBooking]], status: SourceStatus) -> None:
        """The actor table's bookings (``--gpus``); a failed read keeps the last good one."""
        with self._lock:
            if actors is not None:
                self._actors = actors
            self._actors_status = status
            self.version += 1

    def needs_dashboard(self, now: float) -> bool:
        """Whether an alive GPU node of the scheduler's view has no fresh report that measured
        it (none, stale, or NVML did not answer): only then is Ray's dashboard read."""
        fresh_s = STALE_INTERVALS * self.interval_s
        with self._lock:
            reports = self._table.reports
            for node_id, node in self._base.items():
                held = reports.get(node_id)
                measured = (
                    held is not None and now - held.received_at <= fresh_s and held.report.gpus is not None
                )
                if node.alive and node.total_gpu > 0 and not measured:
                    return True
        return False

    def set_dashboard(self, read: Optional[DashboardRead]) -> None:
        """Ray's dashboard's latest read (``None``: not read this round); the nodes whose
        figures it gives go to the usage window too, their pids matched to the actors."""
        with self._lock:
            self._dashboard = read
            self.version += 1
        if read is None or not read.nodes:
            return
        status = self.status(time.monotonic(), wall_now=time.time())
        with self._lock:
            for key, report in dashboard_reports(status, self._actors).items():
                self.usage.seen(key, report)

    def set_pending(self, read: Optional[PendingRead], status: SourceStatus) -> None:
        """What waits to be placed, read with the scheduler view; a failed read drops it
        (an old demand would name actors long placed), and the status says why."""
        with self._lock:
            self._pending, self._pending_status = read, status
            self.version += 1

    def status(self, now: float, gpus: bool = False, wall_now: Optional[float] = None) -> ClusterStatus:
        """The rollup as of ``now`` (the monotonic clock): reports older than
        :data:`STALE_INTERVALS` intervals are stale. ``wall_now``: the wall clock at the same
        instant, for the times the document shows (default ``now``: tests on one clock).
        ``gpus``: also attribute each fresh report's GPU memory to the actors on it."""
        with self._lock:
            base, reports, gcs_status = self._base, dict(self._table.reports), self._gcs_status
            sums = self._sums
            actors, actors_status = self._actors, self._actors_status
            read_at = self._view_read_at
            waiting, pending_status = self._pending, self._pending_status
            dashboard = self._dashboard
            sources = [gcs_status, actors_status] if gpus else [gcs_status]
            sources += [self.ray_versions] if self.ray_versions else []
        sources += [more() for more in self.more_sources]
        gpus_unique = self._shared_gpus.unique(reports)
        with recording(self.failures):  # a node that cannot be merged is counted for /healthz
            status = merge(
                base,
                reports,
                now=now,
                stale_after_s=STALE_INTERVALS * self.interval_s,
                view="head",
                gcs_address=self.gcs_address,
                sources=sources,
                scheduler_read_at=read_at,
                wall_now=wall_now,
                sums=sums,
                dashboard=dashboard,
                gpus_unique=gpus_unique,
            )
            if pending_status is not None:
                status.sources.append(pending_status)
            status = pending.attach(status, waiting)
            if not gpus:
                return status
            fresh = {node_id: r.report for node_id, r in reports.items() if not status.nodes[node_id].stale}
            return attribute_cluster(status, fresh, actors, co_hosted(fresh))


UNREADABLE_PROBLEM = "a node's report could not be merged or rendered (last_render_error says which and why)"


def health_problems(health: dict[str, Any], interval_s: float) -> list[str]:
    """What ``/healthz`` says is wrong, in words: no scheduler view or an old one (and why),
    a poller that is not running, a node's report that failed a merge or a render lately
    (the last shows only as a problem: the head serves every other node)."""
    problems = []
    why = health["scheduler_view_error"] or health["gcs_poller"]["last_error"] or "no GCS read yet"
    if health["scheduler_view"] == "missing":
        problems.append(f"no scheduler view: no GCS read has succeeded ({why})")
    elif health["scheduler_view"] == "old":
        problems.append(f"scheduler view {health['scheduler_view_age_s']:.0f} s old ({why})")
    if not health["gcs_poller"]["ok"]:
        problems.append(
            f"GCS poller not running or late ({health['gcs_poller']['last_error'] or 'no round yet'})"
        )
    last_at = health["last_render_error_at"]
    if last_at is not None and time.time() - last_at < STALE_INTERVALS * interval_s:
        problems.append(UNREADABLE_PROBLEM)
    return problems


def co_hosted(reports: dict[str, NodeReport]) -> dict[str, set[str]]:
    """Node ids grouped by the host that reported them: raylets on one machine share its GPUs,
    so an actor of any of them may hold memory on them."""
    by_host: dict[str, set[str]] = {}
    for node_id, report in reports.items():
        if report.host is not None:
            by_host.setdefault(report.host.hostname, set()).add(node_id)
    return {
        node_id: by_host.get(r.host.hostname, set()) if r.host else set() for node_id, r in reports.items()
    }
