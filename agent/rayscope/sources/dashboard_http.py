"""One ``GET <dashboard>/nodes?view=summary`` over a socket of its own, read strictly: the
transport of :mod:`rayscope.sources.dashboard`.

One deadline covers connect, request, status line, headers and body (the time left is given
to each ``recv``, so a dashboard that trickles is cut at it); the answer is read as it comes,
at most :data:`MAX_ANSWER_BYTES`, never sized from its ``Content-Length``. The request is
HTTP/1.0: the answer ends when the connection closes and is never chunked; anything else (an
encoded body, one cut short, two lengths) is refused with the reason. ``http.client`` is not
used: it costs ~25 ms to import on the CLI's path, and its timeout is per step, not one.
"""

import socket
import time
from typing import Callable, Optional
from urllib.parse import urlsplit

from rayscope import __version__
from rayscope.units import MIB, is_count, parse_count

DEFAULT_PORT = 8265
"""Ray's dashboard port when ``ray start`` is given none (``--dashboard HOST`` means it)."""
SUMMARY_TARGET = "/nodes?view=summary"
USER_AGENT = f"rayscope/{__version__}"
"""Sent with the request: Ray 2.33-2.51's dashboard answers 500 to one without a
``User-Agent`` (a browser check that reads the header unguarded)."""

MAX_ANSWER_BYTES = 128 * MIB
"""The most of an answer read: Ray 2.60 sends ~16 KB per node (measured, one node with two
GPUs), so ~8,000 nodes; a larger answer is refused, not truncated."""
MAX_HEAD_BYTES = 64 * 1024
"""Status line and headers (aiohttp sends ~200 bytes)."""
_RECV_BYTES = 256 * 1024


class Unanswered(Exception):
    """The dashboard could not be read; ``str()`` is the operator's one-line reason."""


def _request(url: str, token: Optional[bytes]) -> bytes:
    parts = urlsplit(url)
    # HTTP/1.0: the answer ends when the connection closes, never chunked.
    lines = [
        f"GET {parts.path}{SUMMARY_TARGET} HTTP/1.0",
        f"Host: {parts.netloc}",
        f"User-Agent: {USER_AGENT}",
        "Accept: application/json",
        "Accept-Encoding: identity",
    ]
    if token:
        lines.append(f"Authorization: Bearer {token.decode('ascii')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def get(
    url: str,
    token: Optional[bytes],
    timeout_s: float,
    max_bytes: int = MAX_ANSWER_BYTES,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, bytes]:
    """``GET <url>/nodes?view=summary``: (HTTP status, body). One deadline, ``timeout_s``
    from now, for all of it; the answer read as it comes, at most ``max_bytes``;
    :class:`Unanswered` with the reason otherwise."""
    deadline = clock() + timeout_s

    def left() -> float:
        remaining = deadline - clock()
        if remaining <= 0:
            raise Unanswered(f"the Ray dashboard at {url} did not answer in time (timeout {timeout_s:g} s)")
        return remaining

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_PORT
    data = bytearray()
    try:
        # The TLS socket closed too, not only the plain one it took over (left to the collector
        # before: an unclosed socket per read of an https dashboard, in a daemon).
        with (
            socket.create_connection((host, port), timeout=left()) as plain,
            _over(plain, host, parts.scheme == "https") as sock,
        ):
            sock.settimeout(left())
            sock.sendall(_request(url, token))
            while True:
                sock.settimeout(left())
                chunk = sock.recv(min(_RECV_BYTES, max_bytes + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
                if len(data) > max_bytes:
                    raise Unanswered(f"the Ray dashboard at {url} answered more than {max_bytes // MIB} MiB")
    except socket.timeout:
        left()  # the deadline passed: its reason
        raise Unanswered(
            f"the Ray dashboard at {url} did not answer in time (timeout {timeout_s:g} s)"
        ) from None
    except ConnectionRefusedError:
        raise Unanswered(f"no Ray dashboard at {url} (connection refused)") from None
    except OSError as err:
        raise Unanswered(f"the Ray dashboard at {url} failed: {err.strerror or type(err).__name__}") from None
    return split_answer(bytes(data), url)


def _over(plain: socket.socket, host: str, secure: bool) -> socket.socket:
    """``plain``, or (``secure``) a TLS socket that takes ``plain``'s descriptor over: the one
    to use and to close."""
    if not secure:
        return plain
    import ssl  # here: only an https dashboard pays for it

    return ssl.create_default_context().wrap_socket(plain, server_hostname=host)


def split_answer(data: bytes, url: str) -> tuple[int, bytes]:
    """An HTTP/1.x answer → (status, body), strictly (pure: the tests feed it bytes)."""
    head, sep, body = data[: MAX_HEAD_BYTES + 4].partition(b"\r\n\r\n")
    if not sep:
        raise Unanswered(f"the Ray dashboard at {url} sent no complete HTTP answer")
    body = data[len(head) + 4 :]
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if version not in ("HTTP/1.0", "HTTP/1.1") or len(rest) < 3 or not is_count(rest[:3]):
        raise Unanswered(f"what answers at {url} is not an HTTP server (no HTTP status line)")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    if headers.get("transfer-encoding") or any(v != "identity" for v in headers.get("content-encoding", [])):
        raise Unanswered(f"the Ray dashboard at {url} sent an encoded answer, not asked for")
    lengths = headers.get("content-length", [])
    if lengths:
        try:
            length = parse_count(lengths[0], "Content-Length") if len(set(lengths)) == 1 else -1
        except ValueError as err:
            raise Unanswered(f"the Ray dashboard at {url} sent a bad {err}") from None
        if length < 0 or len(body) < length:
            raise Unanswered(f"the Ray dashboard at {url} sent an answer cut short or of two lengths")
        body = body[:length]
    return int(rest[:3]), body
