"""The head agent's HTTP client: every ``--head`` read the fast path
(:mod:`rayscope.cli.fast_status`, over :mod:`rayscope.client.request`) hands on to the CLI
reads the merged rollup or the usage document here, decoded into Structs; and
:func:`read_cluster`, which picks the source (a head, else the GCS and this host's NVML).

No ray, no psutil, no pynvml: the standard library's ``http.client`` and msgspec.
"""

from typing import Optional
from urllib.parse import urlsplit

import msgspec

from rayscope.client.request import HEAD_ENV as HEAD_ENV  # noqa: PLC0414 - re-exported: the options name them here
from rayscope.client.request import parse_head_url as parse_head_url  # noqa: PLC0414
from rayscope.errors import EXIT_NO_DATA, AgentError
from rayscope.net.addresses import DEFAULT_HTTP_PORT
from rayscope.net.tls import NO_TLS, TlsFiles
from rayscope.schema.status import DOCUMENT_SCHEMA, ClusterStatus
from rayscope.schema.usage import UsageDocument


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
    path: it is the fast one (``http.client`` itself, not ``urllib.request``, for the same
    reason). HTTPS when the URL says ``https://`` or any ``tls`` file is given. ``token_file``:
    where ``token`` came from, for the message when the head refuses it."""
    path = "/v1/status?all=1" + ("&gpus=1" if gpus else "")
    body = head_get(url, path, token, timeout_s, tls, token_file)
    try:
        return msgspec.json.decode(body, type=ClusterStatus)
    except msgspec.DecodeError as err:
        raise _unexpected(url, body, err) from None


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
    body = head_get(url, query, token, timeout_s, tls, token_file)
    try:
        return msgspec.json.decode(body, type=UsageDocument)
    except msgspec.DecodeError as err:
        raise _unexpected(url, body, err) from None


def head_get(
    url: str,
    path: str,
    token: bytes,
    timeout_s: float,
    tls: TlsFiles = NO_TLS,
    token_file: Optional[str] = None,
) -> bytes:
    """The body of ``GET path`` from the head at ``url``; :class:`AgentError` (exit 2) for
    anything but a 200: a refused token told from a missing one, and a port that is not a
    head agent's HTTP port named (:func:`_unreachable`)."""
    import http.client

    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or DEFAULT_HTTP_PORT
    connection: http.client.HTTPConnection
    if parts.scheme == "https" or tls.enabled:
        from rayscope.net.tls import client_context

        try:
            context = client_context(tls)
        except ValueError as err:
            raise AgentError(str(err), EXIT_NO_DATA) from None
        connection = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
        url = f"https://{parts.netloc}"
    else:
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"Authorization": "Bearer " + token.decode()} if token else {}
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
    except (TimeoutError, OSError, http.client.HTTPException) as err:
        raise AgentError(_unreachable(url, host, port, timeout_s, err), EXIT_NO_DATA) from None
    finally:
        connection.close()
    if response.status == 401:
        if token:
            raise AgentError(
                f"head agent at {url} refused the token from {token_file or 'the token file'}: it holds"
                " another one (its --token-file or --read-token-file)",
                EXIT_NO_DATA,
            )
        raise AgentError(
            f"head agent at {url} requires a token: pass --token-file (the head's)", EXIT_NO_DATA
        )
    if response.status != 200 and (response.getheader("Server") or "") != "rayscope-head":
        raise AgentError(
            f"{url} is an HTTP server but not a rayscope head agent (HTTP {response.status}): status --head"
            f" wants the head's --http address ({DEFAULT_HTTP_PORT} by default)",
            EXIT_NO_DATA,
        )
    if response.status == 404 and path.startswith("/v1/usage"):
        raise AgentError(f"head agent at {url} keeps no usage history: it is an older release", EXIT_NO_DATA)
    if response.status != 200:
        raise AgentError(f"head agent at {url} answered HTTP {response.status}", EXIT_NO_DATA)
    return body


def _unreachable(url: str, host: str, port: int, timeout_s: float, err: BaseException) -> str:
    """Why the head agent at ``url`` could not be read. A port that answered something else
    than HTTP is probed (:mod:`rayscope.client.peer`) and named, never quoted: its bytes (a report
    port's random challenge) are not the operator's to read."""
    import http.client

    from rayscope.client import peer

    if isinstance(err, TimeoutError) or "timed out" in str(err):
        return f"head agent unreachable at {url} (timeout {timeout_s:g} s)"
    if isinstance(err, ConnectionRefusedError):
        return f"head agent unreachable at {url} (connection refused)"
    wrong = peer.wrong_http_port(url, host, port)
    if wrong:
        return wrong
    if isinstance(err, http.client.HTTPException) and not isinstance(err, http.client.RemoteDisconnected):
        return f"head agent at {url} answered something that is not HTTP"
    reason = (getattr(err, "strerror", None) or str(err) or type(err).__name__).lower()
    return f"head agent unreachable at {url} ({reason})"


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
        from rayscope.net import tokens

        files = TlsFiles.from_env() if tls is None else tls
        return head_status(head, tokens.read_token(token_file), timeout_s, gpus, files, token_file)
    from rayscope.node import collect  # psutil, pynvml: off the --head fast path

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
    from rayscope.net import tokens

    return head_usage(head, tokens.read_token(token_file), timeout_s, window_s, headroom_pct, tls, token_file)
