"""The head agent's client: ``status``, ``usage`` and ``fit`` with ``--head`` read the
merged rollup (or the usage history) from it, and what a refusal means is said here.

No ray, no psutil, no pynvml: the one transport of every ``--head`` read
(:mod:`rayscope.client.request`, a plain socket) and msgspec, so a status query costs little more
than the interpreter's start.
"""

from typing import Optional, TypeVar, Union
from urllib.parse import urlsplit

import msgspec

from rayscope.client.request import parse_head_url as parse_head_url  # noqa: PLC0414 - re-exported: the options name it here
from rayscope.defaults import DEFAULT_HTTP_PORT, HEAD_ENV, SERVER_NAME
from rayscope.errors import EXIT_NO_DATA, EXIT_USAGE, AgentError
from rayscope.net import peer_json
from rayscope.net.tls import NO_TLS, TlsFiles
from rayscope.schema.status import DOCUMENT_SCHEMA, ClusterStatus
from rayscope.schema.usage import UsageDocument
from rayscope.units import is_count


def head_status(
    url: str,
    token: bytes,
    timeout_s: float,
    gpus: bool = False,
    tls: TlsFiles = NO_TLS,
    token_file: Optional[str] = None,
) -> ClusterStatus:
    """The rollup a head agent serves (``GET /v1/status?all=1``, ``&gpus=1`` for the per-GPU
    attribution); :class:`AgentError` (exit 2) when it cannot be had. No ray import on this
    path (the fast path, :mod:`rayscope.cli.fast_status`, hands its reads on to it). HTTPS
    when the URL says ``https://`` or any ``tls`` file is given. ``token_file``: where
    ``token`` came from, for the message when the head refuses it."""
    path = "/v1/status?all=1" + ("&gpus=1" if gpus else "")
    return _decoded(url, head_get(url, path, token, timeout_s, tls, token_file), _STATUS)


def head_usage(
    url: str,
    token: bytes,
    timeout_s: float,
    window_s: Optional[float],
    headroom_pct: float,
    tls: TlsFiles,
    token_file: Optional[str] = None,
) -> UsageDocument:
    """What the head remembers of each actor's GPU memory (``GET /v1/usage``)."""
    query = f"/v1/usage?headroom={headroom_pct:g}" + (f"&window={window_s:g}" if window_s else "")
    return _decoded(url, head_get(url, query, token, timeout_s, tls, token_file), _USAGE)


_Document = TypeVar("_Document", ClusterStatus, UsageDocument)
_STATUS = peer_json.Decoder(ClusterStatus)
_USAGE = peer_json.Decoder(UsageDocument)


def _decoded(url: str, body: Union[bytes, bytearray], decoder: peer_json.Decoder[_Document]) -> _Document:
    """The head's document by ``decoder`` (:mod:`rayscope.net.peer_json`: its nesting
    bounded); what does not decode says so in one line (exit 2)."""
    try:
        return decoder.decode(body)
    except peer_json.PeerJsonError as err:
        raise _unexpected(url, body, err) from None


def head_get(
    url: str,
    path: str,
    token: bytes,
    timeout_s: float,
    tls: TlsFiles = NO_TLS,
    token_file: Optional[str] = None,
) -> Union[bytes, bytearray]:
    """The body of ``GET path`` from the head at ``url``, read by the one transport
    (:func:`rayscope.client.request.get`: the whole exchange within ``timeout_s``, the body
    capped, every number parsed as ASCII); :class:`AgentError` (exit 2) for anything but a
    200: a refused token told from a missing one, and a server that is not a head agent named."""
    from rayscope.client import request as head_request

    answer = head_request.get(url, path, token, timeout_s, tls)
    url = head_request.shown_url(url, tls)
    if answer.status == 401:
        if token:
            raise AgentError(
                f"head agent at {url} refused the token from {token_file or 'the token file'}: it holds"
                " another one (its --token-file or --read-token-file)",
                EXIT_NO_DATA,
            )
        raise AgentError(
            f"head agent at {url} requires a token: pass --token-file (the head's)", EXIT_NO_DATA
        )
    if answer.status != 200 and answer.headers.get("server", "") != SERVER_NAME:
        raise AgentError(
            f"{url} is an HTTP server but not a rayscope head agent (HTTP {answer.status}): status --head"
            f" wants the head's --http address ({DEFAULT_HTTP_PORT} by default)",
            EXIT_NO_DATA,
        )
    if answer.status == 421:
        host = urlsplit(url).hostname or url
        raise AgentError(
            f"head agent at {url} does not answer to the name {host}: start it with --http-host {host}"
            " (or use its IP address)",
            EXIT_NO_DATA,
        )
    if answer.status == 429:
        retry = answer.headers.get("retry-after", "")  # the peer's text: a number or nothing
        raise AgentError(
            f"head agent at {url} refuses tokens from this address for now (too many wrong ones):"
            f" try again in {retry if is_count(retry) else 'a few'} s",
            EXIT_NO_DATA,
        )
    if answer.status == 404 and path.startswith("/v1/usage"):
        raise AgentError(f"head agent at {url} keeps no usage history: it is an older release", EXIT_NO_DATA)
    if answer.status != 200:
        raise AgentError(f"head agent at {url} answered HTTP {answer.status}", EXIT_NO_DATA)
    return answer.body


def _unexpected(url: str, body: Union[bytes, bytearray], err: peer_json.PeerJsonError) -> AgentError:
    """A head's document this release cannot read: another schema (by name), or garbage."""
    served = _document_schema(body)
    if served is not None and served != DOCUMENT_SCHEMA:
        return AgentError(
            f"head agent at {url} serves document schema {served}, this rayscope reads schema"
            f" {DOCUMENT_SCHEMA}: run one rayscope release on the head and its clients",
            EXIT_NO_DATA,
        )
    return AgentError(f"unexpected answer from head agent at {url}: {err}", EXIT_NO_DATA)


class _Versioned(msgspec.Struct):
    schema: int = 0


_VERSIONED = peer_json.Decoder(_Versioned)


def _document_schema(body: Union[bytes, bytearray]) -> Optional[int]:
    """The ``schema`` a document says it is, when it says so; ``None`` otherwise."""
    try:
        return _VERSIONED.decode(body).schema or None
    except peer_json.PeerJsonError:
        return None


def read_cluster(
    head: Optional[str],
    token_file: Optional[str],
    gcs: Optional[str],
    timeout_s: float,
    gpus: bool = False,
    tls: Optional[TlsFiles] = None,
    dashboard: Optional[str] = None,
) -> ClusterStatus:
    """The cluster as ``status`` (every mode) and ``fit`` read it, the one place that picks
    the source: a head agent (``--head`` / ``$RAYSCOPE_HEAD``), else the embedded default
    (the GCS, this host's NVML and Ray's dashboard: ``dashboard``, ``--dashboard``'s value;
    a head reads its own). ``tls``: the ``--tls-*`` files (``None``: from
    ``$RAYSCOPE_TLS_*``)."""
    if head and dashboard is not None:
        raise AgentError(
            "--dashboard with --head: the head agent reads Ray's dashboard itself (its own --dashboard)",
            EXIT_USAGE,
        )
    if head:
        from rayscope.net import tokens

        files = TlsFiles.from_env() if tls is None else tls
        return head_status(head, tokens.read_token(token_file), timeout_s, gpus, files, token_file)
    from rayscope.node import collect  # psutil, pynvml: off the --head fast path

    return collect.embedded_status(gcs, timeout_s, gpus=gpus, dashboard=dashboard)


def read_usage(
    head: Optional[str],
    token_file: Optional[str],
    timeout_s: float,
    window_s: Optional[float],
    headroom_pct: float,
    tls: TlsFiles,
) -> UsageDocument:
    """``rayscope usage``: only a head agent remembers, so ``--head`` is required."""
    if not head:
        raise AgentError(
            f"usage needs a head agent (--head URL or ${HEAD_ENV}): only the head remembers", EXIT_USAGE
        )
    from rayscope.net import tokens

    return head_usage(head, tokens.read_token(token_file), timeout_s, window_s, headroom_pct, tls, token_file)
