"""The head's HTTP port against slow and rude clients, with a real ``rayscope
head`` on loopback and no token needed by the attacker.

Before: the handler's deadline was per ``recv`` and 16 worker threads read requests, so 16
connections sending one header line every 4 s kept every worker and ``/healthz``,
``/v1/status`` and ``/metrics`` stopped answering; TLS handshakes ran in the same workers;
a client that hung up early cost a traceback in the log (1,000 connections, 57,000 lines).
"""

import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from rayscope.head.serve.http import HTTP_WORKERS, REQUEST_DEADLINE_S
from tests.reliability_plugin import FaultRecord
from tests.support.head import Head
from tests.support.pki import make_pki
from tests.waiting import eventually

pytestmark = pytest.mark.live

SLOW = 3 * HTTP_WORKERS


class Drip:
    """``count`` connections that each send a request one header line per second, for ever."""

    def __init__(self, port: int, count: int, context: "ssl.SSLContext | None" = None) -> None:
        self.sockets: list[socket.socket] = []
        try:
            for _ in range(count):
                self.sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except BaseException:  # those made so far closed, not left to the collector
            for s in self.sockets:
                s.close()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lines = [b"GET /healthz HTTP/1.1\r\n"] + [b"X-Slow: %d\r\n" % i for i in range(1000)]
        for line in lines:
            for s in self.sockets:
                with contextlib.suppress(OSError):  # one the head closed
                    s.send(line)
            if self._stop.wait(1.0):
                return

    def closed_by_head(self) -> int:
        closed = 0
        for s in self.sockets:
            s.settimeout(0.01)
            try:
                closed += s.recv(1) == b""
            except (socket.timeout, BlockingIOError):
                pass
            except OSError:
                closed += 1
        return closed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.sockets:
            s.close()


def probe_answers(head: Head, seconds: float) -> list[float]:
    """Probe ``/healthz`` for ``seconds``; how long each answer took (it must come)."""
    took = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.monotonic()
        status, _ = head.get("/healthz", timeout_s=3)
        assert status == 200
        took.append(time.monotonic() - started)
        time.sleep(0.2)
    return took


def test_slow_clients_hold_no_worker_and_are_closed_at_the_deadline(tmp_path: Path, token: Path) -> None:
    """Three times as many slow clients as workers: the probe is answered throughout, and
    every slow client is closed once the request deadline passes. Positive control: read
    requests in the workers again (the old threading server) and the probe times out."""
    head = Head(tmp_path / "head.log", token)
    drip = Drip(head.http_port, SLOW)
    try:
        took = probe_answers(head, REQUEST_DEADLINE_S - 1)
        assert max(took) < 2.0, took
        eventually(lambda: drip.closed_by_head() == SLOW, 2.0, f"the head closed all {SLOW} slow clients")
        assert head.health()["http_timed_out"] >= SLOW
    finally:
        drip.stop()
        head.stop()


def test_slow_tls_handshakes_hold_no_worker(tmp_path: Path, token: Path) -> None:
    """Connections that never start their TLS handshake: the TLS probe is answered, and the
    handshakes are cut at the deadline."""
    pki = make_pki(tmp_path)
    context = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    tls = ("--tls-cert", str(pki["head.pem"]), "--tls-key", str(pki["head.key"]))
    head = Head(tmp_path / "head.log", token, extra=tls, ssl_context=context)
    silent: list[socket.socket] = []
    try:
        for _ in range(SLOW):  # each kept as it is made: closed below if a later one fails
            silent.append(socket.create_connection(("127.0.0.1", head.http_port), timeout=5))
        took = probe_answers(head, 2.0)
        assert max(took) < 2.0, took
        cut_by = time.monotonic() + REQUEST_DEADLINE_S + 2  # the old fixed sleep's bound, not its wait
        for s in silent:
            s.settimeout(max(0.1, cut_by - time.monotonic()))
            assert s.recv(1) == b""  # closed by the head
    finally:
        for s in silent:
            s.close()
        head.stop()


def test_clients_that_hang_up_early_cannot_fill_the_log(tmp_path: Path, token: Path) -> None:
    """1,000 clients that send half a request, or a whole one and leave before the answer:
    the head's log grows by a few throttled lines, never a traceback."""
    head = Head(tmp_path / "head.log", token)
    try:
        before = len(head.log_text().splitlines())
        for i in range(1000):
            with socket.create_connection(("127.0.0.1", head.http_port), timeout=5) as s:
                s.send(b"GET /v1/status HTTP/1.1\r\n" if i % 2 else b"GET /v1/status HTTP/1.1\r\n\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        assert head.get("/healthz")[0] == 200
        text = head.log_text()
        assert "Traceback" not in text
        assert len(text.splitlines()) - before < 20, text
    finally:
        head.stop()


MALFORMED = {
    "Content-Length: ²": b"POST /login HTTP/1.1\r\nHost: h\r\nContent-Length: \xb2\r\n\r\n",
    "Content-Length: ¹²³": b"POST /login HTTP/1.1\r\nHost: h\r\nContent-Length: \xb9\xb2\xb3\r\n\r\n",
    "Content-Length: 5,000 digits": b"POST /login HTTP/1.1\r\nHost: h\r\nContent-Length: "
    + b"9" * 5000
    + b"\r\n\r\n",
    "Content-Length: -1": b"POST /login HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
    "bad request line": b"GET\x00/ \xff HTTP/1.1 x\r\nHost: h\r\n\r\n",
    "bad version": b"GET / HTTP/\xb9.\xb2\r\nHost: h\r\n\r\n",
    "header without a colon": b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n",
}


def _answer_of(port: int, request: bytes) -> bytes:
    """The head's whole answer to ``request`` (``b""``: the connection closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        answer = b""
        with contextlib.suppress(OSError):
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        return answer


@pytest.mark.fault
def test_a_malformed_request_is_a_400_and_writes_at_most_a_throttled_line(
    tmp_path: Path, token: Path, fault: FaultRecord
) -> None:
    """A stranger cannot write to the head's log. Each malformed request
    line or header, sent 30 times in a row: a 400 every time, and the log grows by a few
    throttled lines, never a traceback. Before: ``Content-Length: ²`` (``'²'.isdigit()`` is
    true, ``int('²')`` raises), ``¹²³`` and 5,000 digits raised inside ``data_received``:
    no answer, and asyncio's 10-line traceback in the log for each. Positive control: put
    ``length.isdigit()`` and ``int(length)`` back in ``HttpConnection.data_received``."""
    fault.expect(
        "malformed HTTP requests from a stranger (non-ASCII digits or 5,000 digits in"
        " Content-Length, a bad request line or version, a header without a colon), 30 of each",
        "a 400 for every one; the head's log grows by at most one throttled line per kind, no traceback"
        " (before, 5cffc7d: the three lengths no answer and 300 log lines each, 90 tracebacks; a bad"
        " version an error page without a status line; a header without a colon 200)",
    )
    head = Head(tmp_path / "head.log", token)
    try:
        before = len(head.log_text().splitlines())
        answers: dict[str, set[bytes]] = {}
        for name, request in MALFORMED.items():
            for _ in range(30):
                status_line = _answer_of(head.http_port, request).split(b"\r\n", 1)[0]
                answers.setdefault(name, set()).add(status_line)
        assert head.get("/healthz")[0] == 200
        text = head.log_text()
        added = len(text.splitlines()) - before
        lines = sorted({a.decode("latin-1") for s in answers.values() for a in s})
        fault.observe(f"{len(MALFORMED) * 30} requests: answers {lines}; {added} log lines added")
        for name, seen in answers.items():
            assert len(seen) == 1 and next(iter(seen)).startswith(b"HTTP/1.1 400 "), (name, seen)
        assert "Traceback" not in text
        assert added <= len(MALFORMED), text
        assert head.health()["http_bad_requests"] >= len(MALFORMED) * 30
    finally:
        head.stop()
