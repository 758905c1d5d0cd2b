"""The head's HTTP port: ``/v1/status``, ``/metrics``, ``/healthz``, bounded workers."""

import errno
import hmac
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

import msgspec

from agent.head.state import HeadState
from agent.logs import LogThrottle
from agent.render.metrics import metrics_text
from agent.render.status import status_json

log = logging.getLogger("rayscope.head")

TEXT = "text/plain; charset=utf-8"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
HTTP_WORKERS = 16
"""Requests served at once; more are closed unanswered (a client retries)."""


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


class BoundedHTTPServer(ThreadingHTTPServer):
    """The threading HTTP server with at most ``HTTP_WORKERS`` requests at once (more are
    closed unanswered), TLS done in the worker (a slow handshake holds no accept), and an
    ``accept`` that neither spins nor floods the log when file descriptors run out."""

    daemon_threads = True
    ssl_context: Optional[ssl.SSLContext] = None
    throttle: Optional[LogThrottle] = None

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
