"""One ``GET <dashboard>/nodes?view=summary``: the request of Ray's dashboard as a source, and
its failures in the operator's words.

The exchange is :class:`rayscope.net.http.Exchange`, the one every read of a peer over HTTP
uses (a head agent's too): one deadline covers connect, TLS, request, status line, headers and
body; the answer is read as it comes, at most :data:`MAX_ANSWER_BYTES`, never sized from its
``Content-Length``; every number on the wire goes through the one ASCII parser. What is the
dashboard's own is here: the request (with the ``User-Agent`` older releases need and Ray's
token), the cap, and the one-line reasons (:class:`Unanswered`).
"""

import socket
from typing import TYPE_CHECKING, Optional
from urllib.parse import urlsplit

from rayscope import __version__
from rayscope.net.deadline import Deadline
from rayscope.net.http import BadAnswer, Exchange, NotHttp
from rayscope.units import MIB, seconds

if TYPE_CHECKING:
    import ssl

DEFAULT_PORT = 8265
"""Ray's dashboard port when ``ray start`` is given none (``--dashboard HOST`` means it)."""
SUMMARY_TARGET = "/nodes?view=summary"
USER_AGENT = f"rayscope/{__version__}"
"""Sent with the request: Ray 2.33-2.51's dashboard answers 500 to one without a
``User-Agent`` (a browser check that reads the header unguarded)."""

MAX_ANSWER_BYTES = 128 * MIB
"""The most of an answer read: Ray 2.60 sends ~16 KB per node (measured, one node with two
GPUs), so ~8,000 nodes; a larger answer is refused, not truncated."""


class Unanswered(Exception):
    """The dashboard could not be read; ``str()`` is the operator's one-line reason."""


def _request(url: str, token: Optional[bytes]) -> bytes:
    parts = urlsplit(url)
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
) -> tuple[int, bytes]:
    """``GET <url>/nodes?view=summary``: (HTTP status, body). One deadline, ``timeout_s``
    from now, for all of it; at most ``max_bytes`` of body; :class:`Unanswered` with the
    reason otherwise."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_PORT
    context = _tls_context() if parts.scheme == "https" else None
    exchange = Exchange(host, port, Deadline(timeout_s), max_bytes, context)
    try:
        answer = exchange.run(_request(url, token))
    except NotHttp:
        raise Unanswered(f"what answers at {url} is not an HTTP server (no HTTP status line)") from None
    except BadAnswer as err:
        raise Unanswered(f"the Ray dashboard at {url} answered {err}") from None
    except ConnectionRefusedError:
        raise Unanswered(f"no Ray dashboard at {url} (connection refused)") from None
    except (TimeoutError, socket.timeout):
        raise Unanswered(
            f"the Ray dashboard at {url} did not answer in time (timeout {seconds(timeout_s)} s)"
        ) from None
    except OSError as err:  # a reset, a hang-up before any byte, TLS (ssl.SSLError is an OSError)
        raise Unanswered(f"the Ray dashboard at {url} failed: {err.strerror or err}") from None
    return answer.status, bytes(answer.body)


def _tls_context() -> "ssl.SSLContext":
    import ssl  # here: only an https dashboard pays for it

    return ssl.create_default_context()
