"""One HTTP/1.x exchange with a peer over a socket of its own, read strictly and bounded: the
one transport under every read of a peer over HTTP (a head agent, :mod:`rayscope.client.request`;
Ray's dashboard, :mod:`rayscope.sources.dashboard.get`).

A peer is hostile until shown otherwise (SECURITY.md, rule 3): whatever it sends, the exchange
ends within its :class:`~rayscope.net.deadline.Deadline` and holds at most the caller's cap.

* One deadline for the whole exchange: connect, TLS handshake, request, status line, headers,
  body; each ``recv`` waits only what is left of it, never a timeout of its own (a peer
  dripping a byte every 2 s held a client with ``--timeout 3`` past 40 s).
* One bounded reader (:class:`Reader`) for every way a body ends: ``Content-Length``,
  ``chunked``, or the connection's close. Memory grows with the bytes that came, never with
  a length the peer claims (``Content-Length: 1000000000`` allocated 989 MB before any byte
  came); past the cap the read stops, chunked or not (an endless chunked body reached 3.7 GB).
* Every number on the wire (the status code, ``Content-Length``, a chunk size) is read by
  the one ASCII parser (:func:`rayscope.units.parse_count`, :func:`~rayscope.units.parse_hex_count`).
* What does not parse is :class:`BadAnswer`, in our words, quoting no byte of the peer's;
  an answer that is not HTTP at all is :class:`NotHttp`, so the caller can name what
  answers at the port.

Standard library only, and no ``http.client`` (~25 ms to import, a timeout per step rather
than one, and ``int()``'s idea of a number): ``status --head``'s fast path imports this.
"""

import socket
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Union

from rayscope.net.deadline import Deadline
from rayscope.units import MIB, parse_count, parse_hex_count

if TYPE_CHECKING:
    import ssl

MAX_HEAD_BYTES = 64 * 1024
"""Status line and headers of an answer (a head sends a few hundred bytes, aiohttp ~200);
more is refused."""
MAX_LINE_BYTES = 4096
"""A chunk-size line (its extensions included) or a trailer line."""
_RECV_BYTES = 256 * 1024
"""A ``recv``, and a :data:`Writer`'s part: one buffer, reused, in the CPU's cache (a 79 MB
body received whole costs 19,000 fresh pages, more than copying it)."""
_STATUS_PREFIX = b"HTTP/"


class BadAnswer(Exception):
    """The peer's answer does not parse, or is over a cap: ``str()`` says what, in our
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
raises, :meth:`Exchange.run` raises."""


class Exchange:
    """One request to ``host:port`` and its answer, on a connection of its own, all within
    ``deadline``; TLS when ``context`` is given. :attr:`answered` says how far the answer
    came when :meth:`run` raises (a timeout after the first byte is not an unreachable peer)."""

    def __init__(
        self,
        host: str,
        port: int,
        deadline: Deadline,
        max_body: int,
        context: "Optional[ssl.SSLContext]" = None,
        sink: Optional[Sink] = None,
    ) -> None:
        self.host, self.port, self.deadline, self.max_body = host, port, deadline, max_body
        self.context, self.sink = context, sink
        self._reader: Optional[Reader] = None

    @property
    def answered(self) -> int:
        """Bytes of the answer received so far."""
        return self._reader.answered if self._reader is not None else 0

    def run(self, request: bytes) -> Answer:
        """Send ``request``, read the answer: :class:`BadAnswer`, :class:`NotHttp`, or an
        ``OSError`` (a timeout, a refusal, a reset, TLS) when it cannot be had."""
        host = self.host
        # An ASCII name as bytes: a str is IDNA-encoded first (that codec's import: ~3 ms).
        address = (host.encode("ascii") if host.isascii() else host, self.port)
        with socket.create_connection(address, timeout=self.deadline.need()) as plain:  # type: ignore[arg-type]
            if self.context is not None:
                self.deadline.bound(plain)
                with self.context.wrap_socket(plain, server_hostname=host) as wrapped:
                    return self._exchange(wrapped, request)
            return self._exchange(plain, request)

    def _exchange(self, sock: socket.socket, request: bytes) -> Answer:
        self._reader = Reader(sock, self.deadline, self.max_body, self.sink)
        return self._reader.exchange(request)


class Reader:
    """One answer read from ``sock``: every wait within ``deadline``, every byte counted
    against a cap, nothing allocated that did not arrive."""

    def __init__(
        self, sock: socket.socket, deadline: Deadline, max_body: int, sink: Optional[Sink] = None
    ) -> None:
        self.sock, self.deadline, self.max_body, self.sink = sock, deadline, max_body, sink
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
        if size > self.max_body:
            raise BadAnswer(f"a Content-Length of {size:,} bytes, over the cap of {self._cap()}")
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
            if len(body) + size > self.max_body:
                raise BadAnswer(f"a chunked body over the cap of {self._cap()}")
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
            if len(body) > self.max_body:
                raise BadAnswer(f"a body over the cap of {self._cap()}")
            if not self._recv():
                return body
            body += self.pending
            self.pending.clear()

    def _cap(self) -> str:
        return f"{self.max_body // MIB} MiB" if self.max_body % MIB == 0 else f"{self.max_body:,} bytes"


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
