"""The head agent: takes node reports, reads the scheduler once per interval, serves the rollup.

Three parts around one :class:`HeadState` (the latest report per node, stamped with the head's
own receive time, and the latest scheduler view):

* report ingest — :mod:`agent.ingest`, an asyncio protocol, one persistent connection per
  node agent, frames from :mod:`agent.wire` decoded by one reused typed msgspec decoder;
* scheduler poll — one GCS read per interval in a thread (never one per report);
* queries — ``GET /v1/status`` (the JSON of ``status --json``), ``GET /metrics``
  (Prometheus text), ``GET /healthz`` (counters), from the standard library's HTTP server
  with a bounded number of worker threads.

A bad frame is logged and its connection dropped; the head keeps serving everyone else.
"""

import asyncio
import errno
import hmac
import logging
import resource
import signal
import socket
import ssl
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

import msgspec

from agent import ingest, pending, validate
from agent.addresses import DEFAULT_TIMEOUT_S
from agent.attribution import attribute_cluster
from agent.render.metrics import metrics_text
from agent.render.status import status_json
from agent.rollup import STALE_INTERVALS, merge, scheduler_nodes
from agent.schema.pending import PendingRead
from agent.schema.report import REPORT_SCHEMA, NodeReport, SourceStatus
from agent.schema.status import ActorBooking, ClusterStatus, NodeStatus, RayNode, ReceivedReport
from agent.sources import gcs
from agent.sources.ray_agents import RayAgents
from agent.tls import NO_TLS, TlsFiles, server_context
from agent.validate import ReportError as ReportError  # noqa: PLC0414 (re-exported: the head raises it)

log = logging.getLogger("rayscope.head")

TEXT = "text/plain; charset=utf-8"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
FORGET_INTERVALS = 20
"""A report for a node the scheduler does not know is dropped once this many intervals old."""
HTTP_WORKERS = 16
"""Requests served at once; more are closed unanswered (a client retries)."""


class HeadState:
    """The latest report per node and the latest scheduler view; safe across threads."""

    def __init__(self, interval_s: float, gcs_address: Optional[str]) -> None:
        self.interval_s = interval_s
        self.gcs_address = gcs_address
        self._lock = threading.Lock()
        self._reports: dict[str, ReceivedReport] = {}
        self._base: dict[str, NodeStatus] = {}  # rollup.scheduler_nodes of the latest view
        self._gcs_status = SourceStatus(name="gcs", ok=False, reason="not read yet", detail=gcs_address or "")
        self._actors: Optional[list[ActorBooking]] = None
        self._actors_status = SourceStatus(name="gcs_actors", ok=False, reason="not read yet")
        self._view_read_at: Optional[float] = None  # head's clock at the last good GCS read
        self.poller = PollerHealth()
        self._pending: Optional[PendingRead] = None
        self._pending_status: Optional[SourceStatus] = None
        self.ray_versions: Optional[SourceStatus] = None  # the GCS reader's, once connected
        self._decoder = msgspec.msgpack.Decoder(NodeReport)
        self.reports_received = 0
        self.frames_rejected = 0
        self.net: Optional[ingest.IngestCounters] = None  # the report port's, once it serves
        self.more_health: list[Callable[[], dict[str, int]]] = []
        """Counters of parts beside ingest (agents placed through Ray) for ``/healthz``."""

    def ingest(self, payload: bytes, received_at: float) -> NodeReport:
        """Decode one report (typed) and keep it as its node's latest."""
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
            evicted = validate.make_room(self._reports, self._base, key)
            self._reports.pop(evicted or key, None)
            self._reports[key] = ReceivedReport(report=report, received_at=received_at)
            self.reports_received += 1
        return report

    def count_rejected(self) -> None:
        with self._lock:
            self.frames_rejected += 1

    def health(self, now: Optional[float] = None) -> dict[str, Any]:
        """Cheap figures for ``/healthz``: is the head taking reports at all, and is its
        scheduler view being refreshed (the GCS poller's state and the view's age)?
        ``now``: the head's clock (default: read it)."""
        now = time.time() if now is None else now
        with self._lock:
            read_at = self._view_read_at
            counts: dict[str, Any] = {
                "nodes_reporting": len(self._reports),
                "reports_received": self.reports_received,
                "frames_rejected": self.frames_rejected,
            }
        if self.net is not None:
            counts.update(self.net.as_dict())
        for more in self.more_health:
            counts.update(more())
        age = None if read_at is None else round(now - read_at, 1)
        counts["scheduler_view_age_s"] = age
        counts["scheduler_view_stale"] = age is not None and age > STALE_INTERVALS * self.interval_s
        counts["gcs_poller"] = self.poller.snapshot(time.monotonic(), self.interval_s)
        return counts

    def take(self, payload: bytes, received_at: float) -> Optional[str]:
        """:meth:`ingest` for the report port: the node id reported for."""
        return self.ingest(payload, received_at).node_id

    def set_view(self, views: list[RayNode], status: SourceStatus, read_at: Optional[float] = None) -> None:
        """A new scheduler view (a failed read keeps the last good one, flagged by status
        and by its age). ``read_at``: the head's clock at the read (default: now)."""
        base = scheduler_nodes(views) if status.ok else None
        with self._lock:
            if base is not None:
                self._base = base
                self._view_read_at = time.time() if read_at is None else read_at
            self._gcs_status = status

    def forget_gone(self, now: float) -> list[str]:
        """Drop reports of nodes the scheduler does not know that have long stopped (a node
        taken away with its agent): kept, they would show as ``no raylet`` for ever."""
        horizon = now - FORGET_INTERVALS * self.interval_s
        with self._lock:
            if not self._gcs_status.ok:
                return []  # without the scheduler's view, "unknown to it" means nothing
            gone = [k for k, r in self._reports.items() if k not in self._base and r.received_at < horizon]
            for key in gone:
                del self._reports[key]
        return gone

    def set_actors(self, actors: Optional[list[ActorBooking]], status: SourceStatus) -> None:
        """The actor table's bookings (``--gpus``); a failed read keeps the last good one."""
        with self._lock:
            if actors is not None:
                self._actors = actors
            self._actors_status = status

    def set_pending(self, read: Optional[PendingRead], status: SourceStatus) -> None:
        """What waits to be placed, read with the scheduler view; a failed read drops it
        (an old demand would name actors long placed), and the status says why."""
        with self._lock:
            self._pending, self._pending_status = read, status

    def status(self, now: float, gpus: bool = False) -> ClusterStatus:
        """The rollup as of ``now``: reports older than 3 intervals are stale. ``gpus``: also
        attribute each fresh report's GPU memory to the actors on it (agent.attribution)."""
        with self._lock:
            base, reports, gcs_status = self._base, dict(self._reports), self._gcs_status
            actors, actors_status = self._actors, self._actors_status
            read_at = self._view_read_at
            waiting, pending_status = self._pending, self._pending_status
            sources = [gcs_status, actors_status] if gpus else [gcs_status]
            sources += [self.ray_versions] if self.ray_versions else []
        status = merge(
            base,
            reports,
            now=now,
            stale_after_s=STALE_INTERVALS * self.interval_s,
            view="head",
            gcs_address=self.gcs_address,
            sources=sources,
            scheduler_read_at=read_at,
        )
        if pending_status is not None:
            status.sources.append(pending_status)
        status = pending.attach(status, waiting)
        if not gpus:
            return status
        fresh = {node_id: r.report for node_id, r in reports.items() if not status.nodes[node_id].stale}
        return attribute_cluster(status, fresh, actors, co_hosted(fresh))


class _StatusHandler(BaseHTTPRequestHandler):
    """``/v1/status``, ``/metrics``, ``/healthz``; a bearer token required when the head has one
    (``/healthz`` excepted: it says only whether reports arrive). ``read_tokens``: the agents'
    write token and the read-only token (``--read-token-file``), either reads."""

    state: HeadState
    read_tokens: tuple[bytes, ...]
    timeout = 10  # seconds a client may take to send its request
    server_version = "rayscope-head"

    def do_GET(self) -> None:  # the standard library's name
        try:
            self._get()
        except Exception:  # a bug in one answer must not cost the caller its connection
            log.exception("http %s: internal error", self.path)
            self._send(500, TEXT, b"internal error in the head agent (its log says where)\n")

    def _get(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            health = self.state.health(time.time())
            ok = bool(health["gcs_poller"]["ok"])
            return self._send(200, "application/json", msgspec.json.encode({"ok": ok, **health}))
        if url.path not in ("/v1/status", "/metrics"):
            return self._send(404, TEXT, b"not found: try /v1/status, /metrics, /healthz\n")
        if self.read_tokens and not self._authorized():
            return self._send(401, TEXT, b"bearer token required\n")
        query = parse_qs(url.query)
        gpus = query.get("gpus", ["0"])[0] in ("1", "true", "yes")
        status = self.state.status(time.time(), gpus=gpus)
        if url.path == "/metrics":
            return self._send(200, PROMETHEUS_TEXT, metrics_text(status).encode())
        include_dead = query.get("all", ["0"])[0] in ("1", "true", "yes")
        document = status_json(status, include_dead, indent=0)
        return self._send(200, "application/json", document.encode())

    def _authorized(self) -> bool:
        """``Bearer TOKEN``, the scheme in any case (RFC 9110); every token compared in
        constant time. The header arrives latin-1 decoded: encoded back, byte for byte."""
        scheme, _, offered = self.headers.get("Authorization", "").strip().partition(" ")
        offered_bytes = offered.strip().encode("latin-1", "replace")
        matches = [hmac.compare_digest(offered_bytes, token) for token in self.read_tokens]
        return scheme.lower() == "bearer" and any(matches)

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s " + format, self.client_address[0], *args)


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


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class PollerHealth:
    """What ``/healthz`` says about the GCS poller: alive, last round, failures, restarts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_round: Optional[float] = None  # monotonic clock
        self.errors = 0
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
                "restarts": self.restarts,
                "last_error": self.last_error,
            }


def poll_once(
    state: HeadState, reader: Optional[gcs.GcsReader], agents: Optional[RayAgents] = None
) -> SourceStatus:
    """One read of the scheduler's view (the actor table, the pending demand), kept in
    ``state``; ``agents``: keep one node agent on every alive node of that view."""
    views: list[RayNode] = []
    if reader is None:
        status = SourceStatus(name="gcs", ok=False, reason="no GCS address")
    else:
        views, status = reader.read()
        state.ray_versions = reader.versions
        if status.ok:
            state.set_actors(*reader.read_actors())
            state.set_pending(*reader.read_pending())
    state.set_view(views, status)
    if agents is not None and status.ok:
        agents.reconcile(v.node_id for v in views if v.alive)
    for node_id in state.forget_gone(time.time()):
        log.info(
            "forgot node %s: unknown to the scheduler, silent for %d intervals", node_id, FORGET_INTERVALS
        )
    if status.ok:
        log.debug("GCS %s: %d nodes", status.detail, len(views))
    return status


def poll_gcs(
    state: HeadState,
    reader: Optional[gcs.GcsReader],
    stop: threading.Event,
    agents: Optional[RayAgents] = None,
) -> None:
    """Read the scheduler's view once per interval; log only when reachability changes.
    ``agents``: keep one node agent on every alive node of that view (``--agents ray``). A
    round that raises is logged and counted (``/healthz``), and the next one runs."""
    was_ok: Optional[bool] = None
    while not stop.is_set():
        try:
            status = poll_once(state, reader, agents)
        except Exception as err:
            state.poller.failed(f"{type(err).__name__}: {err}")
            log.exception("GCS poller: round failed; the scheduler view ages until a round succeeds")
        else:
            if status.ok != was_ok:
                if status.ok:
                    log.info("GCS %s: reading every %g s", status.detail, state.interval_s)
                else:
                    log.warning("GCS: %s", status.reason)
                was_ok = status.ok
        state.poller.round_done()
        stop.wait(state.interval_s)


class PollerGuard:
    """Runs :func:`poll_gcs` in a thread and starts a new one when it has died (a bug, or a
    ``BaseException`` from a library): the view would otherwise be served, ageing, for good."""

    def __init__(
        self,
        state: HeadState,
        reader: Optional[gcs.GcsReader],
        stop: threading.Event,
        agents: Optional[RayAgents] = None,
        target: Callable[..., None] = poll_gcs,
    ) -> None:
        self._state, self._reader, self._stop, self._target = state, reader, stop, target
        self._agents = agents
        self._thread: Optional[threading.Thread] = None

    def _run(self) -> None:
        try:
            self._target(self._state, self._reader, self._stop, self._agents)
        except BaseException as err:
            self._state.poller.failed(f"poller died: {type(err).__name__}: {err}")
            log.error("GCS poller died (%s: %s); it is restarted", type(err).__name__, err)
        finally:
            self._state.poller.set_alive(False)

    def start(self, restarted: bool = False) -> None:
        self._state.poller.set_alive(True, restarted)
        self._thread = threading.Thread(target=self._run, name="rayscope-gcs-poller", daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """Start a new poller if the last one died; ``True`` if one was started."""
        if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
            return False
        self.start(restarted=self._thread is not None)
        return True


class BoundedHTTPServer(ThreadingHTTPServer):
    """The threading HTTP server with at most ``HTTP_WORKERS`` requests at once (more are
    closed unanswered), TLS done in the worker (a slow handshake holds no accept), and an
    ``accept`` that neither spins nor floods the log when file descriptors run out."""

    daemon_threads = True
    ssl_context: Optional[ssl.SSLContext] = None
    throttle: Optional[ingest.LogThrottle] = None

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(HTTP_WORKERS)

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE) and self.throttle is not None:
                self.throttle.note("http:accept", "HTTP port: %s", err.strerror)
                time.sleep(0.1)  # the listening socket stays readable: do not spin
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            if self.throttle is not None:
                self.throttle.note(
                    "http:busy", "HTTP port: %d requests in progress; closing one", HTTP_WORKERS
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            if self.ssl_context is not None:
                request.settimeout(_StatusHandler.timeout)
                try:
                    request = self.ssl_context.wrap_socket(request, server_side=True)
                except (OSError, ssl.SSLError) as err:
                    if self.throttle is not None:
                        self.throttle.note(
                            "http:tls", "HTTP port: TLS handshake with %s failed: %s", client_address[0], err
                        )
                    request.close()
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def raise_fd_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as err:
            log.warning("cannot raise the file limit from %d to %d: %s", soft, target, err)
    return int(soft)


def remove_agents(agents: RayAgents) -> None:
    """The head's shutdown with ``--agents ray``: every placed agent goes with it."""
    try:
        agents.remove_all()
        agents.close()
    except Exception as err:  # the GCS may be gone: say so, and stop anyway
        log.warning("could not remove the agents placed through Ray: %s", err)


class Head:
    """The head agent's servers: :meth:`serve` runs them until :meth:`stop` or a signal."""

    def __init__(
        self,
        listen: tuple[str, int],
        http: tuple[str, int],
        gcs_address: Optional[str],
        interval_s: float,
        token: bytes,
        gcs_timeout_s: float = DEFAULT_TIMEOUT_S,
        read_token: bytes = b"",
        tls: TlsFiles = NO_TLS,
        max_pending_per_address: int = ingest.MAX_UNAUTH_PER_HOST,
        agents: Optional[RayAgents] = None,
    ) -> None:
        for host, _ in (listen, http):
            if not token and not is_loopback(host):
                raise ValueError(
                    f"refusing to listen on {host} without a token: anyone who reaches it could"
                    " send reports or read the cluster; pass --token-file (the same file on every agent)"
                )
        if read_token and (not token or hmac.compare_digest(read_token, token)):
            raise ValueError("the read-only token must differ from the agents' token (--token-file)")
        self.listen, self.http, self.token, self.read_token = listen, http, token, read_token
        if max_pending_per_address < 1:
            raise ValueError(f"--max-pending must be at least 1, not {max_pending_per_address}")
        self.ssl_context = server_context(tls)
        self.max_pending_per_address = max_pending_per_address
        self.state = HeadState(interval_s, gcs_address)
        self._reader = gcs.GcsReader(gcs_address, gcs_timeout_s) if gcs_address else None
        self._stop = threading.Event()
        self._httpd: Optional[BoundedHTTPServer] = None
        self.throttle = ingest.LogThrottle(log)
        self.agents = agents
        if agents is not None:
            self.state.more_health.append(agents.health)

    def _start_http(self) -> None:
        read_tokens = tuple(t for t in (self.token, self.read_token) if t)
        handler = type("Handler", (_StatusHandler,), {"state": self.state, "read_tokens": read_tokens})
        self._httpd = BoundedHTTPServer(self.http, handler)
        self._httpd.ssl_context, self._httpd.throttle = self.ssl_context, self.throttle
        threading.Thread(target=self._httpd.serve_forever, name="rayscope-http", daemon=True).start()

    async def serve(self) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT): ingest, poll, answer queries."""
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(ingest.fd_exception_handler(self.throttle))
        nofile = raise_fd_limit()
        max_total = max(16, min(ingest.MAX_CONNECTIONS, nofile - ingest.FD_RESERVE - HTTP_WORKERS))
        guard = ingest.ConnectionGuard(
            max_total, self.max_pending_per_address, self.throttle, self.state.count_rejected
        )
        self.state.net = guard.counters
        idle = max(60.0, 10 * self.state.interval_s)
        agents: weakref.WeakSet[ingest.ReportProtocol] = weakref.WeakSet()

        def accept() -> ingest.ReportProtocol:
            agent = ingest.ReportProtocol(self.state.take, self.token, idle, guard)
            agents.add(agent)
            return agent

        server = await loop.create_server(
            accept,
            *self.listen,
            ssl=self.ssl_context,
            backlog=ingest.ACCEPT_BACKLOG,
            ssl_handshake_timeout=ingest.FRAME_DEADLINE_S if self.ssl_context else None,
        )
        for listening in server.sockets:
            ingest.widen_listen_queue(listening.fileno())
        self._start_http()
        poller = PollerGuard(self.state, self._reader, self._stop, self.agents)
        poller.start()

        def watch_poller() -> None:
            poller.check()
            if not self._stop.is_set():
                loop.call_later(self.state.interval_s, watch_poller)

        loop.call_later(self.state.interval_s, watch_poller)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        log.info(
            "head agent: reports on %s:%d, HTTP on %s:%d, GCS %s, interval %g s%s%s; up to %d agents",
            *self.listen,
            *self.http,
            self.state.gcs_address or "(none)",
            self.state.interval_s,
            ", token required" if self.token else "",
            ", TLS" if self.ssl_context else "",
            max_total,
        )

        def flush() -> None:
            self.throttle.flush()
            loop.call_later(ingest.THROTTLE_S, flush)

        loop.call_later(ingest.THROTTLE_S, flush)
        async with server:
            await loop.run_in_executor(None, self._stop.wait)
            # From Python 3.12.1 the server's exit waits for every connection to close, and
            # node agents never hang up by themselves: close theirs first.
            server.close()
            for agent in list(agents):
                agent._close()
        if self.agents is not None:
            await loop.run_in_executor(None, remove_agents, self.agents)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        log.info("head agent stopped")

    def stop(self) -> None:
        self._stop.set()
