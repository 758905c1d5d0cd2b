"""One GET to a head agent: the transport of every ``--head`` read (``status`` on the fast
path, :mod:`rayscope.cli.fast_status`; ``status``, ``usage`` and ``fit`` through
:mod:`rayscope.client.head`), and the one-line failures they share.

The exchange itself is :class:`rayscope.net.http.Exchange` (one deadline, one bounded reader,
the one number parser: the same as for Ray's dashboard); here are what is the head's own: its
URL, its cap (:data:`MAX_BODY_BYTES`), its TLS files and token, and the words when it cannot
be asked (:func:`unreachable`; a port that answers something else than HTTP is named by
:func:`rayscope.net.peer.wrong_http_port`, within what is left of the same deadline).
"""

import socket
from typing import TYPE_CHECKING, Optional
from urllib.parse import urlsplit

from rayscope.errors import EXIT_NO_DATA, AgentError
from rayscope.net.deadline import Deadline, carried
from rayscope.net.http import Answer, BadAnswer, Exchange, NotHttp, Sink
from rayscope.net.tls import TlsFiles
from rayscope.units import MIB, seconds

if TYPE_CHECKING:
    import ssl

DEFAULT_HTTP_PORT = 7532
MAX_BODY_BYTES = 256 * MIB
"""The largest body a read takes: 3.5 times the largest document a head serves (the sizes
measured are in SECURITY.md, *Wire and network*); an endless body stops there."""


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
    port that answered something else than HTTP is probed (:mod:`rayscope.net.peer`, within what is
    left of ``deadline``) and named, never quoted: its bytes (a report port's random
    challenge) are not the operator's."""
    if _timed_out(err):
        return AgentError(f"head agent unreachable at {url} (timeout {seconds(timeout_s)} s)", EXIT_NO_DATA)
    if isinstance(err, ConnectionRefusedError):
        return AgentError(f"head agent unreachable at {url} (connection refused)", EXIT_NO_DATA)
    if host:
        from rayscope.net import peer

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
    exchange = Exchange(host, port, deadline, MAX_BODY_BYTES, context, sink)
    try:
        return exchange.run(request)
    except NotHttp:
        from rayscope.net import peer

        wrong = peer.wrong_http_port(named, host, port, deadline)
        said = wrong or f"head agent at {named} answered something that is not HTTP"
        raise AgentError(said, EXIT_NO_DATA) from None
    except BadAnswer as err:
        raise AgentError(f"head agent at {named} answered {err}", EXIT_NO_DATA) from None
    except OSError as err:  # a timeout, a refusal, a reset, TLS (ssl.SSLError is an OSError)
        if exchange.answered and _timed_out(err):
            raise AgentError(
                f"head agent at {named} did not send its whole answer within --timeout {seconds(timeout_s)} s"
                f" ({exchange.answered:,} bytes came)",
                EXIT_NO_DATA,
            ) from None
        raise unreachable(err, named, timeout_s, host, port, deadline) from None
