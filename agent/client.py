"""The head agent's HTTP client: ``status --head`` (and ``fit``, ``usage``) read the merged
rollup from it, decoded into Structs.

No ray, no psutil, no pynvml: only the standard library's HTTP client and msgspec. The
fastest path, ``status --head`` printing what the head rendered, is
:mod:`agent.fast_status`; it hands here what it does not take, and both say a failure in
the words of :mod:`agent.head_request`.
"""

from typing import Optional
from urllib.parse import urlsplit

import msgspec

from agent import head_request
from agent.errors import EXIT_NO_DATA, AgentError
from agent.head_request import DEFAULT_HEAD_PORT
from agent.head_request import HEAD_ENV as HEAD_ENV  # noqa: PLC0414 - re-exported: the options name them here
from agent.head_request import parse_head_url as parse_head_url  # noqa: PLC0414
from agent.schema.status import DOCUMENT_SCHEMA, ClusterStatus
from agent.schema.usage import UsageDocument
from agent.tls import NO_TLS, TlsFiles


def head_status(
    url: str, token: bytes, timeout_s: float, gpus: bool = False, tls: TlsFiles = NO_TLS
) -> ClusterStatus:
    """The rollup a head agent serves (``GET /v1/status?all=1``, ``&gpus=1`` for the per-GPU
    attribution); :class:`AgentError` (exit 2) when it cannot be had. No ray import on this
    path (``http.client`` itself, not ``urllib.request``). HTTPS when the URL says
    ``https://`` or any ``tls`` file is given."""
    body = head_get(url, "/v1/status?all=1" + ("&gpus=1" if gpus else ""), token, timeout_s, tls)
    try:
        return msgspec.json.decode(body, type=ClusterStatus)
    except msgspec.DecodeError as err:
        raise _unexpected(url, body, err) from None


def head_usage(
    url: str, token: bytes, timeout_s: float, window_s: Optional[float], headroom_pct: float, tls: TlsFiles
) -> UsageDocument:
    """What the head remembers of each actor's GPU memory (``GET /v1/usage``)."""
    query = f"/v1/usage?headroom={headroom_pct:g}" + (f"&window={window_s:g}" if window_s else "")
    body = head_get(url, query, token, timeout_s, tls)
    try:
        return msgspec.json.decode(body, type=UsageDocument)
    except msgspec.DecodeError as err:
        raise _unexpected(url, body, err) from None


def head_get(url: str, path: str, token: bytes, timeout_s: float, tls: TlsFiles = NO_TLS) -> bytes:
    """The body of ``GET path`` from the head at ``url``; :class:`AgentError` (exit 2) for
    anything but a 200, said as :mod:`agent.head_request` says it on the fast path."""
    import http.client

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_HEAD_PORT
    connection: http.client.HTTPConnection
    if parts.scheme == "https" or tls.enabled:
        context = head_request.tls_context(tls)
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    url = head_request.shown_url(url, tls)
    headers = {"Authorization": "Bearer " + token.decode()} if token else {}
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
    except (TimeoutError, OSError, http.client.HTTPException) as err:
        raise head_request.unreachable(err, url, timeout_s) from None
    finally:
        connection.close()
    if response.status == 404 and path.startswith("/v1/usage"):
        raise AgentError(f"head agent at {url} keeps no usage history: it is an older release", EXIT_NO_DATA)
    refused = head_request.refusal(response.status, url)
    if refused is not None:
        raise refused
    return body


def _unexpected(url: str, body: bytes, err: msgspec.DecodeError) -> AgentError:
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


def _document_schema(body: bytes) -> Optional[int]:
    """The ``schema`` a document says it is, when it says so; ``None`` otherwise."""
    try:
        return msgspec.json.decode(body, type=_Versioned).schema or None
    except msgspec.DecodeError:
        return None


def read_cluster(
    head: Optional[str],
    token_file: Optional[str],
    gcs: Optional[str],
    timeout_s: float,
    gpus: bool = False,
    tls: Optional[TlsFiles] = None,
) -> ClusterStatus:
    """The cluster as ``status`` (every mode) and ``fit`` read it, the one place that picks
    the source: a head agent (``--head`` / ``$RAYSCOPE_HEAD``), else the embedded default
    (the GCS and this host's NVML). ``tls``: the ``--tls-*`` files (``None``: from
    ``$RAYSCOPE_TLS_*``)."""
    if head:
        from agent import tokens

        files = TlsFiles.from_env() if tls is None else tls
        return head_status(head, tokens.read_token(token_file), timeout_s, gpus=gpus, tls=files)
    from agent import collect  # psutil, pynvml: off the --head fast path

    return collect.embedded_status(gcs, timeout_s, gpus=gpus)


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
            f"usage needs a head agent (--head URL or ${HEAD_ENV}): only the head remembers", EXIT_NO_DATA
        )
    from agent import tokens

    return head_usage(head, tokens.read_token(token_file), timeout_s, window_s, headroom_pct, tls)
