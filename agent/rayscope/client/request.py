"""One GET to a head agent over a plain socket: the one transport of every ``--head`` read
(``status`` on the fast path, :mod:`rayscope.cli.fast_status`; ``status``, ``usage`` and ``fit``
through :mod:`rayscope.client.head`), and the one-line failures they share.

A head is a peer like any other (issue 30, rule 3): whatever it sends, a read ends within
``--timeout`` and holds at most :data:`MAX_BODY_BYTES`.

* One :class:`~rayscope.net.deadline.Deadline` for the whole exchange: connect, TLS handshake,
  request, status line, headers, body, and the probe that names a wrong port
  (:mod:`rayscope.client.peer`); each ``recv`` waits only what is left of it, never a ``--timeout`` of
  its own (a head dripping a byte every 2 s held a client with ``--timeout 3`` past 40 s).
* One bounded reader (:class:`_Reader`) for every way a body ends: ``Content-Length``,
  ``chunked``, or the connection's close. Memory grows with the bytes that came, never with
  a length the peer claims (``Content-Length: 1000000000`` allocated 989 MB before any byte
  came); past :data:`MAX_BODY_BYTES` the read stops, chunked or not (an endless chunked body
  reached 3.7 GB).
* Every number on the wire (the status code, ``Content-Length``, a chunk size) is read by
  the one ASCII parser (:func:`rayscope.units.parse_count`, :func:`~rayscope.units.parse_hex_count`):
  ``'²00'`` is no status code, ``¹²`` no length.
* A status line, header, length or chunk that does not parse is one line, exit 2, and no
  byte of it is quoted (:class:`BadAnswer`); an answer that is not HTTP at all names what
  answers at the port (:class:`NotHttp`, :func:`rayscope.client.peer.wrong_http_port`).

Standard library only, and no ``http.client`` (~25 ms to import, and it takes ``int()``'s
idea of a number): the fast path's answer costs little more than the interpreter's start.
"""

import socket
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Union
from urllib.parse import urlsplit

from rayscope.errors import EXIT_NO_DATA, AgentError
from rayscope.net.deadline import Deadline, carried
from rayscope.net.tls import TlsFiles
from rayscope.units import MIB, parse_count, parse_hex_count

if TYPE_CHECKING:
    import ssl

DEFAULT_HTTP_PORT = 7532
MAX_HEAD_BYTES = 64 * 1024
"""Status line and headers of an answer (the head sends a few hundred bytes); more is
refused."""
MAX_BODY_BYTES = 256 * MIB
"""The largest body a read takes. The largest document a head serves is ``/v1/status?all=1&gpus=1``
(``status --head --gpus --all``): at 10,000 nodes × 8 GPUs (tests/tools/bench.py's synthetic
cluster) 70.2 MB, and 76.7 MB with two actors placed on every GPU (7.67 MB measured at
1,000 nodes, linear in nodes); the status lines with ``--gpus --all`` 17.2 MB,
``/v1/usage`` at most 16,384 actors (``schema.usage.MAX_ACTORS``), a few MB. 256 MiB is
3.5 times the largest: room for larger clusters and fields to come, while an endless body
stops at a size any client host holds."""
MAX_LINE_BYTES = 4096
"""A chunk-size line (its extensions included) or a trailer line."""
_RECV_BYTES = 256 * 1024
"""A ``recv``, and a :data:`Writer`'s part: one buffer, reused, in the CPU's cache (a 79 MB
body received whole costs 19,000 fresh pages, more than copying it)."""
_STATUS_PREFIX = b"HTTP/"


class BadAnswer(Exception):
    """The head's answer does not parse, or is over a cap: ``str()`` says what, in our
    words (never the peer's bytes)."""


class NotHttp(BadAnswer):
    """The peer's first bytes are not an HTTP status line: another protocol answers there."""


class NoAnswer(ConnectionError):
    """The peer closed the connection without a byte of an answer."""

    def __init__(self) -> None:
        super().__init__("remote end closed connection without response")


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    """Lower-case names; values decoded as latin-1 (as ``http.client`` does); a repeated
    header's values joined with ``", "`` (RFC 9110, 5.3)."""
    body: Union[bytes, bytearray]
    """Received in place, not copied (70 MB at 10,000 nodes with ``--gpus``); empty when
    a :data:`Sink`'s writer took it."""


Writer = Callable[[Union[bytes, bytearray]], None]
"""Takes the body part by part, in order (its buffer is reused after the call)."""
Sink = Callable[[int, dict[str, str]], Optional[Writer]]
"""Given the status and headers of a ``Content-Length`` answer before its body is read: the
writer that takes the body as it comes, or ``None`` (into :attr:`Answer.body`). What either
raises, :func:`get` raises."""


def parse_head_url(text: str) -> str:
    """``HOST[:PORT]`` or ``http://HOST[:PORT]`` → the head agent's base URL; ``ValueError``."""
    url = urlsplit(text.strip() if "://" in text else f"http://{text.strip()}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{text!r} is not a head agent URL (http://HOST:PORT)")
    try:
        port = url.port or DEFAULT_HTTP_PORT
    except ValueError:
        raise ValueError(f"{text!r}: port must be a number from 1 to 65535") from None
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port}"


def _timed_out(err: BaseException) -> bool:
    return isinstance(err, (TimeoutError, socket.timeout)) or "timed out" in str(err)


def unreachable(
    err: BaseException,
    url: str,
    timeout_s: float,
    host: str = "",
    port: int = 0,
    deadline: Optional[Deadline] = None,
) -> AgentError:
    """The head could not be asked (connect, TLS, send or receive failed), in one line. A
    port that answered something else than HTTP is probed (:mod:`rayscope.client.peer`, within what is
    left of ``deadline``) and named, never quoted: its bytes (a report port's random
    challenge) are not the operator's."""
    if _timed_out(err):
        return AgentError(f"head agent unreachable at {url} (timeout {timeout_s:g} s)", EXIT_NO_DATA)
    if isinstance(err, ConnectionRefusedError):
        return AgentError(f"head agent unreachable at {url} (connection refused)", EXIT_NO_DATA)
    if host:
        from rayscope.client import peer

        wrong = peer.wrong_http_port(url, host, port, deadline)
        if wrong:
            return AgentError(wrong, EXIT_NO_DATA)
    reason = (getattr(err, "strerror", None) or str(err) or type(err).__name__).lower()
    return AgentError(f"head agent unreachable at {url} ({reason})", EXIT_NO_DATA)


def tls_context(tls: TlsFiles) -> "Optional[ssl.SSLContext]":
    """The client's context for the ``--tls-*`` files (``None`` without any); a bad file is
    a one-line :class:`AgentError` (exit 2)."""
    from rayscope.net.tls import client_context

    try:
        return client_context(tls)
    except ValueError as err:
        raise AgentError(str(err), EXIT_NO_DATA) from None


def shown_url(url: str, tls: TlsFiles) -> str:
    """The head's URL as messages name it: ``https://`` whenever TLS is used."""
    parts = urlsplit(url)
    return f"https://{parts.netloc}" if parts.scheme == "https" or tls.enabled else url


def get(
    url: str,
    target: str,
    token: bytes,
    timeout_s: float,
    tls: TlsFiles,
    deadline: Optional[Deadline] = None,
    sink: Optional[Sink] = None,
) -> Answer:
    """``GET target`` from the head at ``url`` (``parse_head_url``'s form), the whole
    exchange within ``deadline`` (default: ``timeout_s`` from now, or what the fast path
    left of it, :func:`rayscope.net.deadline.carry`); :class:`AgentError` (exit 2) when the
    head cannot be asked or its answer cannot be read. Any status is an answer: the caller
    says what a refusal means.
    ``sink``: where a ``Content-Length`` body may go as it comes (:data:`Sink`)."""
    deadline = deadline or carried(url, timeout_s)
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_HTTP_PORT
    secure = parts.scheme == "https" or tls.enabled
    context = tls_context(tls) if secure else None
    if secure and context is None:
        import ssl

        context = ssl.create_default_context()
    named = shown_url(url, tls)
    netloc = f"[{host}]" if ":" in host else host
    if port != (443 if secure else 80):  # the Host header as http.client writes it
        netloc += f":{port}"
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\nAccept-Encoding: identity\r\n"
        + (f"Authorization: Bearer {token.decode()}\r\n" if token else "")
        + "Connection: close\r\n\r\n"
    ).encode("latin-1")
    reader: Optional[_Reader] = None
    try:
        # An ASCII name as bytes: a str is IDNA-encoded first (that codec's import: ~3 ms).
        address = (host.encode("ascii") if host.isascii() else host, port)
        with socket.create_connection(address, timeout=deadline.need()) as plain:  # type: ignore[arg-type]
            if context is not None:
                deadline.bound(plain)
                with context.wrap_socket(plain, server_hostname=host) as wrapped:
                    reader = _Reader(wrapped, deadline, sink)
                    return reader.exchange(request)
            reader = _Reader(plain, deadline, sink)
            return reader.exchange(request)
    except NotHttp:
        from rayscope.client import peer

        wrong = peer.wrong_http_port(named, host, port, deadline)
        said = wrong or f"head agent at {named} answered something that is not HTTP"
        raise AgentError(said, EXIT_NO_DATA) from None
    except BadAnswer as err:
        raise AgentError(f"head agent at {named} answered {err}", EXIT_NO_DATA) from None
    except OSError as err:  # a timeout, a refusal, a reset, TLS (ssl.SSLError is an OSError)
        if reader is not None and reader.answered and _timed_out(err):
            raise AgentError(
                f"head agent at {named} did not send its whole answer within --timeout {timeout_s:g} s"
                f" ({reader.answered:,} bytes came)",
                EXIT_NO_DATA,
            ) from None
        raise unreachable(err, named, timeout_s, host, port, deadline) from None


class _Reader:
    """One answer read from ``sock``: every wait within ``deadline``, every byte counted
    against a cap, nothing allocated that did not arrive."""

    def __init__(self, sock: socket.socket, deadline: Deadline, sink: Optional[Sink] = None) -> None:
        self.sock, self.deadline, self.sink = sock, deadline, sink
        self.pending = bytearray()
        """Received, not yet taken (bytearray: deleting from its front is cheap)."""
        self.answered = 0
        """Bytes of the answer received so far."""
        self._scratch = bytearray(_RECV_BYTES)

    def exchange(self, request: bytes) -> Answer:
        self.deadline.bound(self.sock)
        self.sock.sendall(request)
        status, headers = parse_head(self._head())
        # asked for identity: a coding would have to be undone unasked
        if headers.get("content-encoding", "").strip(" \t").lower() not in ("", "identity"):
            raise BadAnswer("a Content-Encoding that was not asked for (identity was)")
        if status < 200 or status in (204, 304):
            return Answer(status, headers, b"")
        coding = headers.get("transfer-encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                raise BadAnswer("a Transfer-Encoding other than chunked")
            return Answer(status, headers, self._chunked())
        length = headers.get("content-length")
        if length is None:
            return Answer(status, headers, self._until_closed())
        try:
            size = parse_count(length.strip(" \t"), "Content-Length")
        except ValueError:
            raise BadAnswer("a Content-Length that is not a number (digits 0-9 only)") from None
        if size > MAX_BODY_BYTES:
            raise BadAnswer(f"a Content-Length of {size:,} bytes, over the cap of {_cap()}")
        write = self.sink(status, headers) if self.sink is not None else None
        if write is not None:
            self._stream(write, size)
            return Answer(status, headers, b"")
        body = bytearray()
        self._stream(body.extend, size)
        return Answer(status, headers, body)

    def _recv(self) -> int:
        """Up to :data:`_RECV_BYTES` more into ``pending``; how many (0: the peer closed)."""
        self.deadline.bound(self.sock)
        got = self.sock.recv_into(self._scratch)
        if got:
            self.pending += memoryview(self._scratch)[:got]
            self.answered += got
        return got

    def _head(self) -> bytes:
        """The status line and headers (without the empty line that ends them)."""
        while True:
            start = bytes(self.pending[: len(_STATUS_PREFIX)])
            if not _STATUS_PREFIX.startswith(start):
                raise NotHttp("not an HTTP status line")
            end = self.pending.find(b"\r\n\r\n")
            if end >= 0:
                if end > MAX_HEAD_BYTES:
                    break
                head = bytes(self.pending[:end])
                del self.pending[: end + 4]
                return head
            if len(self.pending) > MAX_HEAD_BYTES:
                break
            if not self._recv():
                if not self.pending:
                    raise NoAnswer
                raise BadAnswer("an answer that ended inside its status line or headers")
        raise BadAnswer(f"a status line and headers over {MAX_HEAD_BYTES // 1024} KiB")

    def _line(self) -> bytes:
        """One CRLF-terminated line of the chunked framing, at most :data:`MAX_LINE_BYTES`."""
        while True:
            end = self.pending.find(b"\r\n", 0, MAX_LINE_BYTES + 2)
            if end >= 0:
                line = bytes(self.pending[:end])
                del self.pending[: end + 2]
                return line
            if len(self.pending) > MAX_LINE_BYTES:
                raise BadAnswer(f"a chunk-size or trailer line over {MAX_LINE_BYTES:,} bytes")
            if not self._recv():
                raise BadAnswer("a chunked body that ended before its last chunk")

    def _stream(self, write: Writer, size: int) -> None:
        """``size`` bytes of body to ``write``, :data:`_RECV_BYTES` at a time, through one
        buffer (what came with the headers first)."""
        buffer = bytearray(min(size, _RECV_BYTES))
        view = memoryview(buffer)
        while size > 0:
            part = min(size, len(buffer))
            filled = min(part, len(self.pending))
            buffer[:filled] = self.pending[:filled]
            del self.pending[:filled]
            while filled < part:
                self.deadline.bound(self.sock)
                got = self.sock.recv_into(view[filled:part])
                if not got:
                    raise BadAnswer("a body that ended before its length")
                filled += got
                self.answered += got
            write(buffer if part == len(buffer) else bytes(view[:part]))
            size -= part

    def _chunked(self) -> bytearray:
        body = bytearray()
        while True:
            size_text = self._line().split(b";", 1)[0].strip(b" \t").decode("latin-1")
            try:
                size = parse_hex_count(size_text, "chunk size")
            except ValueError:
                raise BadAnswer("a chunk size that is not a number (hex digits only)") from None
            if size == 0:
                break
            if len(body) + size > MAX_BODY_BYTES:
                raise BadAnswer(f"a chunked body over the cap of {_cap()}")
            self._stream(body.extend, size)
            if self._line():
                raise BadAnswer("a chunk longer than its size")
        trailers = 0
        while self._line():  # trailer fields, then the empty line
            trailers += 1
            if trailers * MAX_LINE_BYTES > MAX_HEAD_BYTES:
                raise BadAnswer(f"trailers over {MAX_HEAD_BYTES // 1024} KiB")
        return body

    def _until_closed(self) -> bytearray:
        """A body without a length: up to the connection's close, capped."""
        body = bytearray(self.pending)
        self.pending.clear()
        while True:
            if len(body) > MAX_BODY_BYTES:
                raise BadAnswer(f"a body over the cap of {_cap()}")
            if not self._recv():
                return body
            body += self.pending
            self.pending.clear()


def _cap() -> str:
    return f"{MAX_BODY_BYTES // MIB} MiB"


_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
"""The characters of a header name (RFC 9110, 5.1: a token)."""


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """``HTTP/1.x NNN reason`` and ``Name: value`` lines → (status, headers); a line that
    does not parse is :class:`BadAnswer` (pure: the tests feed it bytes)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if version not in ("HTTP/1.0", "HTTP/1.1") or rest[3:4] not in ("", " "):
        raise BadAnswer("a status line that does not parse")
    try:
        status = parse_count(rest[:3], "status code")
    except ValueError:
        raise BadAnswer("a status code that is not a number (digits 0-9 only)") from None
    if len(rest[:3]) != 3 or status < 100:
        raise BadAnswer("a status code that is not three digits")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not _TOKEN.issuperset(name):
            raise BadAnswer("a header line that does not parse")
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key in ("content-length", "transfer-encoding"):  # framing: said twice, said once
                if headers[key] != value:
                    raise BadAnswer(f"two {name} headers that disagree")
                continue
            value = f"{headers[key]}, {value}"
        headers[key] = value
    return status, headers
