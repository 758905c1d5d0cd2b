"""What answers at a port that did not speak the protocol a client expected: a rayscope
head's report port, its HTTP port, a gRPC server (Ray's GCS), another HTTP or TLS server.

A client that got the wrong answer (``status --head`` at the report port, ``push --head`` at
the HTTP port, ``--gcs`` at either) asks :func:`probe` and names the port it likely meant,
instead of "unreachable" or the peer's bytes. Only the kind of peer is said, never a byte it
sent: what a stranger's port answers does not reach the terminal (the one printable rule
still applies to the rest of the line). Standard library only, and only on a failure path.

How each kind is known, by what it says first or to ``GET /healthz``:

* a rayscope head's report port greets at once: ``RSC\\x02`` and a challenge (:mod:`rayscope.net.wire`);
* a gRPC server (Ray's GCS, a raylet) sends an HTTP/2 SETTINGS frame at once, before any
  request (measured on Ray 2.60's GCS: ``00 00 18 04 00 00 00 00 00``);
* an HTTP server answers ``HTTP/1.x``; rayscope's names itself ``Server: rayscope-head``;
* a TLS server answers a plain request with a TLS record (alert or handshake), or drops it
  and completes a TLS handshake (asyncio's);
* anything else, or silence: unknown.
"""

import socket
import time
from typing import Callable, Optional

from rayscope import errors
from rayscope.defaults import DEFAULT_GCS_PORT, DEFAULT_HTTP_PORT, DEFAULT_REPORT_PORT
from rayscope.net import wire
from rayscope.net.deadline import Deadline

REPORT = "report"
HEAD_HTTP = "head_http"
GRPC = "grpc"
HTTP = "http"
TLS = "tls"

PROBE_S = 1.0
"""How long a probe waits for the answer to its request."""
SPEAKS_FIRST_S = 0.5
"""How long it waits for a peer that speaks first (a head's greeting, HTTP/2's SETTINGS:
both are sent on accept)."""

WHAT = {
    REPORT: f"a rayscope head's report port (node agents push to it; {DEFAULT_REPORT_PORT} by default)",
    HEAD_HTTP: f"a rayscope head's HTTP port (status, metrics; {DEFAULT_HTTP_PORT} by default)",
    GRPC: f"a gRPC port (Ray's GCS listens on {DEFAULT_GCS_PORT} by default)",
    HTTP: "an HTTP server, not rayscope's (Ray's dashboard listens on 8265 by default)",
    TLS: "a TLS server",
}


def kind_of(first: bytes, answer: bytes = b"") -> Optional[str]:
    """The kind of peer from what it sent unasked (``first``) and what it answered to
    ``GET /healthz`` (``answer``); ``None`` when neither says. Pure."""
    if first.startswith(wire.GREETING_MAGIC[:3]):
        return REPORT
    if len(first) >= 9 and first[3] == 0x04 and first[5:9] == b"\0\0\0\0":
        return GRPC  # an HTTP/2 SETTINGS frame on stream 0
    if answer.startswith(b"HTTP/"):
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        return HEAD_HTTP if b"\r\nserver: rayscope-head" in head else HTTP
    if len(answer) >= 3 and answer[0] in (0x15, 0x16) and answer[1] == 0x03:
        return TLS
    return None


def _enough_first(data: bytes) -> bool:
    return len(data) >= 9  # a greeting's magic, an HTTP/2 frame header


def _enough_answer(data: bytes) -> bool:
    return b"\r\n\r\n" in data or (len(data) >= 3 and data[0] in (0x15, 0x16))


def _read_some(sock: socket.socket, until: float, enough: Callable[[bytes], bool]) -> tuple[bytes, bool]:
    """What the peer sends before ``until`` (monotonic), up to 512 bytes or ``enough``, and
    whether it closed the connection."""
    data = b""
    while len(data) < 512 and not enough(data):
        left = until - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(512 - len(data))
        except OSError:  # a timeout too
            break
        if not chunk:
            return data, True
        data += chunk
    return data, False


def probe(
    host: str,
    port: int,
    timeout_s: float = PROBE_S,
    first_s: float = SPEAKS_FIRST_S,
    deadline: Optional[Deadline] = None,
) -> Optional[str]:
    """Connect to ``host:port`` and tell what answers there (:func:`kind_of`); ``None`` when
    it cannot be told (or nothing listens). Waits ``first_s`` for the peer to speak first (0
    when it is known not to), then ``timeout_s`` for its answer to ``GET /healthz``; every
    wait within ``deadline`` when one is given (the caller's ``--timeout`` includes the probe)."""
    connect_s = _wait(timeout_s, deadline)
    if connect_s <= 0:
        return None
    try:
        sock = socket.create_connection((host, port), timeout=connect_s)
    except OSError:
        return None
    with sock:
        return probe_connected(sock, host, port, timeout_s, first_s, deadline)


def _wait(wait_s: float, deadline: Optional[Deadline]) -> float:
    return wait_s if deadline is None else deadline.within(wait_s)


def probe_connected(
    sock: socket.socket,
    host: str,
    port: int,
    timeout_s: float = PROBE_S,
    first_s: float = SPEAKS_FIRST_S,
    deadline: Optional[Deadline] = None,
) -> Optional[str]:
    """:func:`probe` on a connection already made to ``host:port`` (a port check's)."""
    first_s = _wait(first_s, deadline)
    first = _read_some(sock, time.monotonic() + first_s, _enough_first)[0] if first_s > 0 else b""
    if first:
        return kind_of(first)
    send_s = _wait(timeout_s, deadline)
    if send_s <= 0:
        return None
    try:
        sock.settimeout(send_s)
        sock.sendall(f"GET /healthz HTTP/1.0\r\nHost: {host}\r\n\r\n".encode("ascii", "replace"))
    except OSError:
        return None
    answer, closed = _read_some(sock, time.monotonic() + _wait(timeout_s, deadline), _enough_answer)
    if kind_of(b"", answer) is None and answer == b"" and closed:
        tls_s = _wait(timeout_s, deadline)
        if tls_s > 0 and _speaks_tls(host, port, Deadline(tls_s)):
            return TLS  # dropped the plain request, took a handshake
    return kind_of(b"", answer)


def _speaks_tls(host: str, port: int, deadline: Deadline) -> bool:
    """Whether a TLS handshake gets a TLS answer at ``host:port`` (a server that drops a
    plain request without a word, as asyncio's does), connect and handshake within
    ``deadline``. Nothing is verified and nothing sent after it: the peer's certificate,
    if any, is not looked at."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=deadline.need()) as raw:
            deadline.bound(raw)
            with context.wrap_socket(raw, server_hostname=host):
                return True
    except ssl.SSLError as err:
        return "ALERT" in str(getattr(err, "reason", "") or "").upper()  # the server's TLS alert
    except OSError:
        return False


class Naming:
    """What answers at a port, told in the background (:func:`probe_connected`, on a
    connection a port check made) while the caller's read goes on, within the read's
    deadline: asked only when the read fails, and never waited on past that deadline."""

    def __init__(self, sock: socket.socket, host: str, port: int, deadline: Deadline) -> None:
        self.deadline = deadline
        self._kind: Optional[str] = None
        self._thread = errors.Worker(lambda: self._run(sock, host, port), "rayscope-probe")
        try:
            self._thread.start()
        except BaseException:  # no thread to close it (at the thread limit): closed here
            sock.close()
            raise

    def _run(self, sock: socket.socket, host: str, port: int) -> None:
        with sock:
            self._kind = probe_connected(sock, host, port, deadline=self.deadline)

    def kind(self) -> Optional[str]:
        """The kind of peer, when the probe told it before the deadline; ``None`` otherwise."""
        self._thread.join(self.deadline.left())
        return None if self._thread.is_alive() else self._kind


def described(
    host: str,
    port: int,
    timeout_s: float = PROBE_S,
    first_s: float = SPEAKS_FIRST_S,
    deadline: Optional[Deadline] = None,
) -> tuple[Optional[str], str]:
    """(:func:`probe`'s kind, its words: ``a rayscope head's HTTP port (...)``, or ``""``)."""
    kind = probe(host, port, timeout_s, first_s, deadline)
    return kind, WHAT.get(kind or "", "")


class WrongPort(Exception):
    """What answers at an address is not what the client asked for; ``str()`` says what it
    is and the port meant."""


PUSH_PROBE_S = 0.5
"""``push`` probes after its own wait for the greeting: a shorter answer wait, so that a head
that accepts and never speaks is still reported within three intervals of one second."""


def wrong_report_port(head: tuple[str, int], tls: bool, silent: bool = False) -> str:
    """``push --head``: why ``head`` is the wrong port (or the wrong TLS), from what answers
    there; ``""`` when it is a report port as asked for, or nothing can be told. ``silent``:
    the peer already said nothing for the whole greeting wait (no need to wait again)."""
    kind, what = described(*head, timeout_s=PUSH_PROBE_S, first_s=0.0 if silent else PUSH_PROBE_S)
    if kind is None or (kind == REPORT and not tls) or (kind == TLS and tls):
        return ""
    if kind == REPORT:
        return (
            "speaks rayscope's report protocol without TLS: drop --tls-*, or start the head"
            " with --tls-cert/--tls-key"
        )
    if kind == TLS:
        return "speaks TLS: pass --tls-ca (the CA that signed the head's certificate)"
    return (
        f"is {what}, not a head's report port: push --head wants the head's --listen address"
        f" ({DEFAULT_REPORT_PORT} by default)"
    )


def wrong_http_port(url: str, host: str, port: int, deadline: Optional[Deadline] = None) -> str:
    """``status --head``: why ``url`` is not a head agent's HTTP port (or is one, without the
    TLS ``url`` asks for), from what answers there (probed within what is left of
    ``deadline``: the read's ``--timeout`` includes it); ``""`` when it is one, or nothing
    can be told."""
    kind, what = described(host, port, deadline=deadline)
    secure = url.startswith("https://")
    if kind == HEAD_HTTP and secure:
        plain = "http://" + url[len("https://") :]
        return (
            f"{url}: the head there serves plain HTTP, not TLS: use {plain} without --tls-*"
            " (or start the head with --tls-cert and --tls-key)"
        )
    if kind is None or kind == HEAD_HTTP or (kind == TLS and secure):
        return ""
    if kind == TLS:
        return f"{url} speaks TLS: use https://{host}:{port} (with --tls-ca if its certificate needs one)"
    whose = "not its HTTP port" if kind == REPORT else "not a head agent"
    return (
        f"{url} is {what}, {whose}: status --head wants the head's --http address"
        f" ({DEFAULT_HTTP_PORT} by default)"
    )
