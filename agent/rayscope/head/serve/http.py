"""The head's HTTP port: requests read in the event loop under a deadline, answered by a
bounded pool of workers (:mod:`rayscope.head.serve.routes` says what each path answers).

A slow client can hold only what it costs to read its request, never a worker:

* a whole request, request line and headers (and a small body) included, must arrive within
  :data:`REQUEST_DEADLINE_S` of the connection being made, and a TLS handshake within the
  same deadline (asyncio's ``ssl_handshake_timeout``); later, the connection is closed;
* only a complete request goes to a worker: :data:`HTTP_WORKERS` answer at once, at most
  :data:`MAX_WAITING` complete requests wait for one, and past that a request is answered
  ``503`` at once — never queued behind slow ones;
* ``/healthz`` has a worker of its own (:data:`HEALTH_WORKERS`): it never waits behind
  renders in the pool's queue;
* connections still being read are capped per address and in all
  (:data:`MAX_READING_PER_HOST`, :data:`MAX_READING`); a new connection past a cap evicts the
  oldest one still being read (of its own address first), so a flood of slow clients cannot
  lock out a probe that connects later;
* nothing a client does writes more than one log line per kind per interval (the throttle);
  a client that hangs up early is a count, not a traceback; a request that does not parse
  is a ``400`` (or the library's own code: 414, 431, 505) and a count, never a log line, and
  a request that makes the reading itself fail (a bug of ours) a ``400`` and one throttled line.

The request line and headers are parsed by the standard library's own HTTP parser
(``BaseHTTPRequestHandler.parse_request``), never by hand; the one number a request carries
that the head reads, ``Content-Length``, by the one ASCII parser
(:func:`rayscope.units.parse_count`).
"""

import asyncio
import io
import logging
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Optional, Union
from urllib.parse import urlsplit

from rayscope.defaults import SERVER_NAME
from rayscope.head.serve.callbacks import Guarded, ProtocolErrors, guarded
from rayscope.head.serve.routes import Request, Response, Routes, text
from rayscope.sinks.logs import LogThrottle
from rayscope.units import parse_count

log = logging.getLogger("rayscope.head")

HTTP_WORKERS = 16
"""Requests answered at once (each answer may render a whole cluster)."""
MAX_WAITING = 64
"""Complete requests that may wait for a worker; more are answered 503 at once."""
HEALTH_WORKERS = 1
HEALTH_WAITING = 16
"""``/healthz`` requests that may wait for its worker (each takes milliseconds); more: 503."""
REQUEST_DEADLINE_S = 5.0
"""From the connection (after TLS) to the last byte of the request."""
MAX_READING = 1024
MAX_READING_PER_HOST = 128
MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers; more is 431."""
MAX_BODY_BYTES = 4 * 1024
"""A request body (a login form at most); more is 413."""
END_OF_HEAD = b"\r\n\r\n"
TLS_HANDSHAKE = b"\x16"
"""The first byte of a TLS record that carries a handshake (a ClientHello): no HTTP method
starts with it."""
SEND_PIECE = 1024 * 1024
"""An answer's body is handed to the transport this much at a time, when it asks for more."""


class HttpCounters:
    """For ``/healthz``: what the HTTP port refused and why."""

    def __init__(self) -> None:
        self.timed_out = 0
        self.evicted = 0
        self.busy = 0
        self.bad_requests = 0
        self.hung_up = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "http_timed_out": self.timed_out,
            "http_evicted": self.evicted,
            "http_busy": self.busy,
            "http_bad_requests": self.bad_requests,
            "http_hung_up": self.hung_up,
        }


class _Parser(BaseHTTPRequestHandler):
    """The standard library's request parser run on bytes already read (no socket): the
    request line and the headers, and its limits. A refusal is kept as its status code
    (:attr:`refused`) and answered by :func:`response_bytes` in the head's own words: the
    library's error page quotes the client's bytes, and has no status line at all when the
    request line's version does not parse (HTTP/0.9)."""

    def __init__(self, head: bytes) -> None:  # the base class would start serving a socket
        self.rfile = io.BytesIO(head)
        self.wfile = io.BytesIO()
        self.client_address = ("", 0)
        self.close_connection = True
        self.refused = 0
        self.raw_requestline = self.rfile.readline(65537)
        self.ok = bool(self.raw_requestline) and self.parse_request()

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        self.refused = code

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the port counts bad requests; a client cannot write to the head's log


def _refusal(status: int, why: str) -> Response:
    return text(status, f"{HTTPStatus(status).phrase.lower()}: {why}")


def body_length(parsed: _Parser) -> Union[int, Response]:
    """The request body's length (``Content-Length``, read by the one ASCII parser), or
    the refusal: a header the parser flagged, a transfer coding (no request here needs one),
    two lengths, a length that is not ``[0-9]+``, or one over :data:`MAX_BODY_BYTES`."""
    if parsed.headers.defects:  # e.g. a line without a colon: the headers after it were lost
        return _refusal(400, "a header line does not parse")
    if parsed.headers.get("Transfer-Encoding") is not None:
        return _refusal(501, "a request body with a transfer coding is not taken")
    lengths = parsed.headers.get_all("Content-Length") or ["0"]
    if len(set(lengths)) > 1:
        return _refusal(400, "two Content-Length headers that disagree")
    try:
        length = parse_count(lengths[0].strip(" \t"), "Content-Length")
    except ValueError:
        return _refusal(400, "Content-Length is not a number (digits 0-9 only)")
    if length > MAX_BODY_BYTES:
        return _refusal(413, f"a request body over {MAX_BODY_BYTES:,} bytes")
    return length


def response_bytes(response: Response, head_only: bool = False) -> bytes:
    """A whole HTTP/1.1 response, closing the connection after it (``head_only``: its status
    line and headers)."""
    reason = HTTPStatus(response.status).phrase
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        f"Server: {SERVER_NAME}",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


class HttpPort:
    """Admission, the workers and the counters of one head's HTTP port."""

    def __init__(
        self, routes: Routes, throttle: LogThrottle, errors: Optional[ProtocolErrors] = None
    ) -> None:
        self.routes, self.throttle = routes, throttle
        self.errors = errors if errors is not None else ProtocolErrors()  # callbacks that raised
        self.counters = HttpCounters()
        self.pool = ThreadPoolExecutor(max_workers=HTTP_WORKERS, thread_name_prefix="rayscope-http")
        self.health_pool = ThreadPoolExecutor(
            max_workers=HEALTH_WORKERS, thread_name_prefix="rayscope-healthz"
        )
        self._health_in_flight = 0
        self._reading: OrderedDict[HttpConnection, None] = OrderedDict()  # oldest first
        self._reading_by_host: dict[str, int] = {}
        self._in_flight = 0

    def connection(self) -> "HttpConnection":
        return HttpConnection(self)

    def admit(self, conn: "HttpConnection") -> None:
        """Take a new connection for reading, evicting the oldest one still being read at a cap."""
        if self._reading_by_host.get(conn.host, 0) >= MAX_READING_PER_HOST:
            self._evict(next(c for c in self._reading if c.host == conn.host))
        if len(self._reading) >= MAX_READING:
            self._evict(next(iter(self._reading)))
        self._reading[conn] = None
        self._reading_by_host[conn.host] = self._reading_by_host.get(conn.host, 0) + 1

    def read_done(self, conn: "HttpConnection") -> None:
        """``conn`` is no longer being read (complete, refused, late, evicted or gone)."""
        if conn not in self._reading:
            return
        del self._reading[conn]
        left = self._reading_by_host.get(conn.host, 1) - 1
        if left > 0:
            self._reading_by_host[conn.host] = left
        else:
            self._reading_by_host.pop(conn.host, None)

    def _evict(self, conn: "HttpConnection") -> None:
        self.counters.evicted += 1
        self.throttle.note("http:evicted", "HTTP port: closing a slow request from %s", conn.host)
        self.read_done(conn)
        conn.abort()

    def serve(self, conn: "HttpConnection", request: Request) -> None:
        """Answer ``request`` in a worker, or ``503`` at once when too many wait."""
        if urlsplit(request.target).path == "/healthz":
            self._serve_health(conn, request)
            return
        if self._in_flight >= HTTP_WORKERS + MAX_WAITING:
            self.counters.busy += 1
            self.throttle.note("http:busy", "HTTP port: %d requests in progress; 503", self._in_flight)
            conn.send(text(503, "the head is busy: try again"), request.method == "HEAD")
            return
        self._in_flight += 1
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.pool, self.routes.answer, request)

        def done(finished: "asyncio.Future[Response]") -> None:
            self._in_flight -= 1
            if not finished.cancelled():  # routes.answer never raises; send is guarded
                conn.send(finished.result(), request.method == "HEAD")

        future.add_done_callback(done)

    def _serve_health(self, conn: "HttpConnection", request: Request) -> None:
        """``/healthz`` in its own worker: never behind a render in the shared pool."""
        if self._health_in_flight >= HEALTH_WORKERS + HEALTH_WAITING:
            self.counters.busy += 1
            conn.send(text(503, "the head is busy: try again"), request.method == "HEAD")
            return
        self._health_in_flight += 1
        future = asyncio.get_running_loop().run_in_executor(self.health_pool, self.routes.answer, request)

        def done(finished: "asyncio.Future[Response]") -> None:
            self._health_in_flight -= 1
            if not finished.cancelled():  # routes.answer never raises; send is guarded
                conn.send(finished.result(), request.method == "HEAD")

        future.add_done_callback(done)

    def close(self) -> None:
        for conn in list(self._reading):
            conn.abort()
        self.pool.shutdown(wait=False)
        self.health_pool.shutdown(wait=False)


class HttpConnection(asyncio.Protocol, Guarded):
    """One client: its request read under the deadline, then handed to the port."""

    port_name = "HTTP"

    def __init__(self, port: HttpPort) -> None:
        self.port, self.log_throttle, self.protocol_errors = port, port.throttle, port.errors
        self.host = "?"
        self._buffer = bytearray()
        self._transport: Optional[asyncio.Transport] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._head: Optional[_Parser] = None
        self._body_bytes = 0
        self._reading = True
        self._unsent = memoryview(b"")
        """The answer's body not yet handed to the transport."""
        self._paused = False

    @guarded
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if peer else "?"
        self.port.admit(self)
        self._timer = asyncio.get_running_loop().call_later(REQUEST_DEADLINE_S, self._late)

    @guarded
    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return
        try:
            self._take(data)
        except MemoryError:  # the head's, not the request's: the callback's guard closes
            raise
        except Exception as err:  # a bug of ours on a stranger's bytes: a 400, never a traceback
            self.port.throttle.note(
                f"http:unreadable:{type(err).__name__}",
                "HTTP port: a request from %s could not be read (%s); answered 400",
                self.host,
                type(err).__name__,
                level=logging.ERROR,
            )
            self._refuse(_refusal(400, "the request could not be read"))

    def _take(self, data: bytes) -> None:
        self._buffer += data
        if self._head is None and self._buffer[:1] == TLS_HANDSHAKE:
            # A TLS client at a plain-HTTP port: answered at once (its handshake fails now, and
            # the client names the plain HTTP port) rather than left to the request deadline.
            self._refuse(text(400, "this port serves plain HTTP, not TLS"))
            return
        if self._head is None:
            end = self._buffer.find(END_OF_HEAD)
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self._refuse(text(431, "request header fields too large"))
                return
            if end > MAX_HEAD_BYTES:
                self._refuse(text(431, "request header fields too large"))
                return
            parsed = _Parser(bytes(self._buffer[: end + len(END_OF_HEAD)]))
            if not parsed.ok:
                self._refuse(_refusal(parsed.refused or 400, "the request line or a header does not parse"))
                return
            length = body_length(parsed)
            if isinstance(length, Response):
                self._refuse(length)
                return
            self._head, self._body_bytes = parsed, length
            del self._buffer[: end + len(END_OF_HEAD)]
        if len(self._buffer) < self._body_bytes:
            return
        head = self._head
        self._finish_reading()
        body = bytes(self._buffer[: self._body_bytes])
        request = Request(head.command, head.path, head.headers, body, peer=self.host)
        self.port.serve(self, request)

    def _finish_reading(self) -> None:
        self._reading = False
        if self._timer is not None:
            self._timer.cancel()
        self.port.read_done(self)
        if self._transport is not None:
            self._transport.pause_reading()

    def _refuse(self, response: Response) -> None:
        self.port.counters.bad_requests += 1
        self._finish_reading()
        self._write(response_bytes(response))

    @guarded
    def _late(self) -> None:
        if self._reading:
            self.port.counters.timed_out += 1
            self.port.throttle.note(
                "http:late",
                "HTTP port: request from %s not complete in %.0f s",
                self.host,
                REQUEST_DEADLINE_S,
            )
            self.port.read_done(self)
            self.abort()

    @guarded
    def send(self, response: Response, head_only: bool) -> None:
        self._write(response_bytes(response, head_only=True), b"" if head_only else response.body)

    def _write(self, head: bytes, body: Union[bytes, bytearray] = b"") -> None:
        """``head``, then ``body`` :data:`SEND_PIECE` at a time as the client takes it
        (:meth:`pause_writing`), then the close. The body is the cached answer itself, never
        copied whole: at 10,000 nodes joining it to the head and handing it to the transport
        at once copied 52 MB twice per request (the transport keeps what the socket did not
        take), into fresh pages."""
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(head)
            self._unsent = memoryview(body)
            # A client that does not read its answer holds it at most one more deadline.
            asyncio.get_running_loop().call_later(REQUEST_DEADLINE_S, transport.abort)
            self._feed()

    def _feed(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():  # aborted: a client too slow, or gone
            return
        while self._unsent and not self._paused:
            piece, self._unsent = self._unsent[:SEND_PIECE], self._unsent[SEND_PIECE:]
            transport.write(piece)  # may pause us, at once
        if not self._unsent:
            transport.close()  # after what the transport still holds is sent

    def pause_writing(self) -> None:  # no allocation, nothing to guard
        self._paused = True

    @guarded
    def resume_writing(self) -> None:
        self._paused = False
        self._feed()

    def abort(self) -> None:
        self._reading = False
        if self._timer is not None:
            self._timer.cancel()
        if self._transport is not None:
            self._transport.abort()

    @guarded
    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._unsent = memoryview(b"")
        if self._reading:
            self.port.counters.hung_up += 1
            self._reading = False
            self.port.read_done(self)
        if self._timer is not None:
            self._timer.cancel()
