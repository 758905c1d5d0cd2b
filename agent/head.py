"""The head agent: takes node reports, reads the scheduler once per interval, serves the rollup.

Three parts around one :class:`HeadState` (the latest report per node, stamped with the head's
own receive time, and the latest scheduler view):

* report ingest — an asyncio protocol, one persistent connection per node agent, frames from
  :mod:`agent.wire` decoded by one reused typed msgspec decoder;
* scheduler poll — one GCS read per interval in a thread (never one per report);
* queries — ``GET /v1/status`` (the JSON of ``status --json``), ``GET /metrics``
  (Prometheus text), ``GET /healthz`` (counters), from the standard library's threading
  HTTP server.

A bad frame is logged and its connection dropped; the head keeps serving everyone else.
"""

import asyncio
import hmac
import logging
import signal
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

import msgspec

from agent import wire
from agent.addresses import DEFAULT_TIMEOUT_S
from agent.attribution import attribute_cluster
from agent.model import (
    SCHEMA_VERSION,
    ActorBooking,
    ClusterStatus,
    NodeReport,
    NodeStatus,
    RayNode,
    ReceivedReport,
    SourceStatus,
)
from agent.render.metrics import metrics_text
from agent.render.status import status_json
from agent.rollup import STALE_INTERVALS, merge, scheduler_nodes
from agent.sources import gcs

log = logging.getLogger("rayscope.head")

TEXT = "text/plain; charset=utf-8"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
FORGET_INTERVALS = 20
"""A report for a node the scheduler does not know is dropped once this many intervals old."""
FRAME_BODY_TIMEOUT_S = 30.0
"""A peer that started a frame must finish it in this time (slowloris guard)."""


class ReportError(Exception):
    """A frame that authenticated but does not hold a report this head accepts."""


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
        self.ray_versions: Optional[SourceStatus] = None  # the GCS reader's, once connected
        self._decoder = msgspec.msgpack.Decoder(NodeReport)
        self.reports_received = 0
        self.frames_rejected = 0

    def ingest(self, payload: bytes, received_at: float) -> NodeReport:
        """Decode one report (typed) and keep it as its node's latest."""
        try:
            report = self._decoder.decode(payload)
        except msgspec.DecodeError as err:  # ValidationError included
            raise ReportError(f"malformed report: {err}") from None
        if report.schema > SCHEMA_VERSION:
            raise ReportError(f"report schema {report.schema} is newer than this head's {SCHEMA_VERSION}")
        key = report.node_id or f"host:{report.host.hostname if report.host else '?'}"
        with self._lock:
            self._reports[key] = ReceivedReport(report=report, received_at=received_at)
            self.reports_received += 1
        return report

    def count_rejected(self) -> None:
        with self._lock:
            self.frames_rejected += 1

    def health(self) -> dict[str, int]:
        """Cheap counters for ``/healthz``: is the head taking reports at all?"""
        with self._lock:
            return {
                "nodes_reporting": len(self._reports),
                "reports_received": self.reports_received,
                "frames_rejected": self.frames_rejected,
            }

    def set_view(self, views: list[RayNode], status: SourceStatus) -> None:
        """A new scheduler view (a failed read keeps the last good one, flagged by status)."""
        base = scheduler_nodes(views) if status.ok else None
        with self._lock:
            if base is not None:
                self._base = base
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

    def status(self, now: float, gpus: bool = False) -> ClusterStatus:
        """The rollup as of ``now``: reports older than 3 intervals are stale. ``gpus``: also
        attribute each fresh report's GPU memory to the actors on it (agent.attribution)."""
        with self._lock:
            base, reports, gcs_status = self._base, dict(self._reports), self._gcs_status
            actors, actors_status = self._actors, self._actors_status
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
        )
        if not gpus:
            return status
        fresh = {node_id: r.report for node_id, r in reports.items() if not status.nodes[node_id].stale}
        return attribute_cluster(status, fresh, actors, co_hosted(fresh))


class ReportProtocol(asyncio.Protocol):
    """One agent's connection. Frames are cut from a byte buffer as data arrives — no
    coroutine and no timer per frame, so one core takes tens of thousands of reports a
    second. The connection is closed on a bad frame, at EOF, or after a silence."""

    def __init__(self, state: HeadState, token: bytes, idle_timeout_s: float) -> None:
        self._state, self._token, self._idle_timeout_s = state, token, idle_timeout_s
        self._buffer = bytearray()
        self._body_length: Optional[int] = None  # of the frame whose body is awaited
        self._node: Optional[str] = None
        self._peer = "?"
        self._last_data = time.monotonic()
        self._transport: Optional[asyncio.BaseTransport] = None
        self._timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._timer = asyncio.get_running_loop().call_later(self._idle_timeout_s, self._check_silence)

    def data_received(self, data: bytes) -> None:
        self._last_data = time.monotonic()
        buffer = self._buffer
        buffer += data
        received_at = time.time()
        used = 0
        try:
            while True:
                if self._body_length is None:
                    if len(buffer) - used < wire.LENGTH.size:
                        break
                    self._body_length = wire.body_length(bytes(buffer[used : used + wire.LENGTH.size]))
                    used += wire.LENGTH.size
                if len(buffer) - used < self._body_length:
                    break
                body = bytes(buffer[used : used + self._body_length])
                used += self._body_length
                self._body_length = None
                report = self._state.ingest(wire.open_body(body, self._token), received_at)
                if report.node_id != self._node:
                    self._node = report.node_id
                    log.info("agent %s reports node %s", self._peer, self._node or "(no raylet)")
        except (wire.FrameError, ReportError) as err:
            self._state.count_rejected()
            log.warning("agent %s: rejected frame: %s; connection dropped", self._peer, err)
            self._close()
        finally:
            del buffer[:used]

    def eof_received(self) -> bool:
        if self._buffer or self._body_length is not None:
            self._state.count_rejected()
            log.warning("agent %s: truncated frame at end of stream; connection dropped", self._peer)
        return False  # close our side too

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        log.info("agent %s disconnected%s", self._peer, f": {exc}" if exc else "")

    def _check_silence(self) -> None:
        """Drop a peer silent for the idle timeout, or stuck inside a frame (slowloris)."""
        silent = time.monotonic() - self._last_data
        inside_frame = bool(self._buffer) or self._body_length is not None
        limit = FRAME_BODY_TIMEOUT_S if inside_frame else self._idle_timeout_s
        if silent >= limit:
            where = " inside a frame" if inside_frame else ""
            log.warning("agent %s: silent for %.0f s%s; connection dropped", self._peer, silent, where)
            self._close()
            return
        self._timer = asyncio.get_running_loop().call_later(limit - silent, self._check_silence)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _StatusHandler(BaseHTTPRequestHandler):
    """``/v1/status``, ``/metrics``, ``/healthz``; bearer token required when the head has one
    (``/healthz`` excepted: it says only whether reports arrive)."""

    state: HeadState
    token: bytes
    timeout = 10  # seconds a client may take to send its request
    server_version = "rayscope-head"

    def do_GET(self) -> None:  # the standard library's name
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self._send(
                200, "application/json", msgspec.json.encode({"ok": True, **self.state.health()})
            )
        if url.path not in ("/v1/status", "/metrics"):
            return self._send(404, TEXT, b"not found: try /v1/status, /metrics, /healthz\n")
        if self.token and not self._authorized():
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
        offered = self.headers.get("Authorization", "")
        return hmac.compare_digest(offered.encode(), b"Bearer " + self.token)

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


def poll_gcs(state: HeadState, reader: Optional[gcs.GcsReader], stop: threading.Event) -> None:
    """Read the scheduler's view once per interval; log only when reachability changes."""
    was_ok: Optional[bool] = None
    while not stop.is_set():
        views: list[RayNode] = []
        if reader is None:
            status = SourceStatus(name="gcs", ok=False, reason="no GCS address")
        else:
            views, status = reader.read()
            state.ray_versions = reader.versions
            if status.ok:
                state.set_actors(*reader.read_actors())
        state.set_view(views, status)
        for node_id in state.forget_gone(time.time()):
            log.info(
                "forgot node %s: unknown to the scheduler, silent for %d intervals", node_id, FORGET_INTERVALS
            )
        if status.ok != was_ok:
            if status.ok:
                log.info("GCS %s: reading %d nodes every %g s", status.detail, len(views), state.interval_s)
            else:
                log.warning("GCS: %s", status.reason)
            was_ok = status.ok
        stop.wait(state.interval_s)


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
    ) -> None:
        for host, _ in (listen, http):
            if not token and not is_loopback(host):
                raise ValueError(
                    f"refusing to listen on {host} without a token: anyone who reaches it could"
                    " send reports or read the cluster; pass --token-file (the same file on every agent)"
                )
        self.listen, self.http, self.token = listen, http, token
        self.state = HeadState(interval_s, gcs_address)
        self._reader = gcs.GcsReader(gcs_address, gcs_timeout_s) if gcs_address else None
        self._stop = threading.Event()
        self._httpd: Optional[ThreadingHTTPServer] = None

    def _start_http(self) -> None:
        handler = type("Handler", (_StatusHandler,), {"state": self.state, "token": self.token})
        self._httpd = ThreadingHTTPServer(self.http, handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="rayscope-http", daemon=True).start()

    async def serve(self) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT): ingest, poll, answer queries."""
        loop = asyncio.get_running_loop()
        idle = max(60.0, 10 * self.state.interval_s)
        agents: weakref.WeakSet[ReportProtocol] = weakref.WeakSet()

        def accept() -> ReportProtocol:
            agent = ReportProtocol(self.state, self.token, idle)
            agents.add(agent)
            return agent

        server = await loop.create_server(accept, *self.listen)
        self._start_http()
        poller = threading.Thread(
            target=poll_gcs, args=(self.state, self._reader, self._stop), name="rayscope-gcs", daemon=True
        )
        poller.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        log.info(
            "head agent: reports on %s:%d, HTTP on %s:%d, GCS %s, interval %g s%s",
            *self.listen,
            *self.http,
            self.state.gcs_address or "(none)",
            self.state.interval_s,
            ", token required" if self.token else "",
        )
        async with server:
            await loop.run_in_executor(None, self._stop.wait)
            # From Python 3.12.1 the server's exit waits for every connection to close, and
            # node agents never hang up by themselves: close theirs first.
            server.close()
            for agent in list(agents):
                agent._close()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        log.info("head agent stopped")

    def stop(self) -> None:
        self._stop.set()
