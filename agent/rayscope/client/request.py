"""One GET to a head agent over a plain socket: the transport of ``status --head``'s fast
path (:mod:`rayscope.cli.fast_status`), and the one-line failures every ``--head`` read shares.

``http.client`` costs ~25 ms to import (``email.parser`` and the rest), more than the rest
of the fast path together, so the answer of the head (``agent/rayscope/head/http.py``: HTTP/1.1, a
``Content-Length``, the connection closed after it) is read here, strictly: anything else
(chunked or compressed bodies, a missing length, a malformed status line or header) is
:class:`Unusual`, and the caller hands the command to the standard client
(:func:`rayscope.client.head.head_status`), which asks again with ``http.client``. What cannot be
asked twice without doubling the wait (the head unreachable, a timeout) is said here, in the
same words as the standard client (:func:`unreachable`).
"""

import socket
from typing import TYPE_CHECKING, NamedTuple, Optional, Union
from urllib.parse import urlsplit

from rayscope.errors import EXIT_NO_DATA, AgentError
from rayscope.net.tls import TlsFiles

if TYPE_CHECKING:
    import ssl

HEAD_ENV = "RAYSCOPE_HEAD"
DEFAULT_HEAD_PORT = 7532
MAX_HEAD_BYTES = 64 * 1024
"""Status line and headers of an answer (the head sends a few hundred bytes); more is
:class:`Unusual`."""
_RECV_BYTES = 256 * 1024


class Unusual(Exception):
    """An answer this reader does not take: hand the command to the standard client."""


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    """Lower-case names; values decoded as latin-1 (as ``http.client`` does)."""
    body: Union[bytes, bytearray]
    """Received in place, not copied (14 MB at 10,000 nodes)."""


def parse_head_url(text: str) -> str:
    """``HOST[:PORT]`` or ``http://HOST[:PORT]`` → the head agent's base URL; ``ValueError``."""
    url = urlsplit(text.strip() if "://" in text else f"http://{text.strip()}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{text!r} is not a head agent URL (http://HOST:PORT)")
    try:
        port = url.port or DEFAULT_HEAD_PORT
    except ValueError:
        raise ValueError(f"{text!r}: port must be a number from 1 to 65535") from None
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port}"


def unreachable(err: BaseException, url: str, timeout_s: float, host: str = "", port: int = 0) -> AgentError:
    """The head could not be asked (connect, TLS, send or receive failed), in one line. A
    port that answered something else than HTTP is probed (:mod:`rayscope.client.peer`) and named,
    never quoted: its bytes (a report port's random challenge) are not the operator's."""
    if isinstance(err, TimeoutError) or "timed out" in str(err):
        return AgentError(f"head agent unreachable at {url} (timeout {timeout_s:g} s)", EXIT_NO_DATA)
    if isinstance(err, ConnectionRefusedError):
        return AgentError(f"head agent unreachable at {url} (connection refused)", EXIT_NO_DATA)
    if host:
        from rayscope.client import peer

        wrong = peer.wrong_http_port(url, host, port)
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


def get(url: str, target: str, token: bytes, timeout_s: float, tls: TlsFiles) -> Answer:
    """``GET target`` from the head at ``url`` (``parse_head_url``'s form), ``timeout_s``
    for each step as ``http.client`` has it; :class:`AgentError` when the head cannot be
    asked, :class:`Unusual` when its answer is not one this reader takes."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_HEAD_PORT
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
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as plain:
            if context is not None:
                with context.wrap_socket(plain, server_hostname=host) as wrapped:
                    return _exchange(wrapped, request)
            return _exchange(plain, request)
    except (TimeoutError, OSError) as err:
        raise unreachable(err, named, timeout_s, host, port) from None


def _exchange(sock: socket.socket, request: bytes) -> Answer:
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(_RECV_BYTES)
        if not chunk or len(data) > MAX_HEAD_BYTES:
            raise Unusual("no complete status line and headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, headers = parse_head(head)
    if "transfer-encoding" in headers or "content-encoding" in headers:
        raise Unusual("a transfer or content encoding")
    try:
        length = int(headers["content-length"])
    except (KeyError, ValueError):
        raise Unusual("no Content-Length") from None
    if len(body) > length:
        raise Unusual("more than Content-Length")
    whole = bytearray(length)  # received in place: a document of 10,000 nodes is ~14 MB
    whole[: len(body)] = body
    view, received = memoryview(whole), len(body)
    while received < length:
        got = sock.recv_into(view[received:], min(_RECV_BYTES, length - received))
        if not got:
            raise Unusual("the body ended early")
        received += got
    return Answer(status, headers, whole)  # not copied: bytes-like is all its readers need


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """``HTTP/1.x NNN reason`` and ``Name: value`` lines → (status, headers); a repeated
    or malformed header is :class:`Unusual` (pure: the tests feed it bytes)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.0", "HTTP/1.1") or not code.isdigit() or rest[3:4] not in ("", " "):
        raise Unusual(f"status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        key = name.lower()
        if not sep or not name or name != name.strip() or key in headers:
            raise Unusual(f"header line {line[:80]!r}")
        headers[key] = value.strip(" \t")
    return int(code), headers
