"""Ray's own dashboard as a source: every node's GPU memory, as the dashboard agent Ray runs
on each node (``ray[default]``) measured it, from one ``GET <dashboard>/nodes?view=summary``.

Where the dashboard is (:func:`choose_address`): ``--dashboard URL``, else
``$RAYSCOPE_DASHBOARD``, else the address the cluster published in the GCS (read by the GCS
child in the same connection: ``raycompat.dashboard_url``); ``none`` turns the source off.

The dashboard is a peer like any other (SECURITY.md): one request under one deadline that
covers connect, request, headers and body, the answer read up to a size cap and never sized
from its ``Content-Length`` (:mod:`rayscope.sources.dashboard_http`); every number through
msgspec's bounds or :func:`rayscope.units.parse_count`, every string through
:func:`rayscope.labels.printable`; a node whose entry breaks a rule is left out and counted, the
others stand. Ray token auth (:func:`ray_token`) is honoured the way Ray's own clients find
the token, and the token goes only to a listener that is the dashboard
(:func:`token_withheld`). What each Ray release answers: ``docs/dashboard.md`` (recorded answers in
``tests/data/dashboard/``). Never raises past :func:`read_nodes`: failure is a
``SourceStatus``.
"""

import os
from collections.abc import Mapping
from typing import Annotated, NamedTuple, Optional, Union
from urllib.parse import urlsplit

import msgspec

from rayscope.defaults import DASHBOARD_ENV as DASHBOARD_ENV  # noqa: PLC0414 - re-exported: its tests name it here
from rayscope.labels import printable
from rayscope.net import peer_json
from rayscope.net.tokens import check_token, read_token_file
from rayscope.schema.dashboard import (
    DASHBOARD_OFF,
    DASHBOARD_STATUS,
    DashboardGpu,
    DashboardNode,
    DashboardProcess,
)
from rayscope.schema.report import MAX_DEVICES, MAX_PROCESSES_PER_GPU, Amount, SourceStatus
from rayscope.sources import listeners
from rayscope.sources.dashboard_http import DEFAULT_PORT, Unanswered, get
from rayscope.sources.gcs import read as gcs_read
from rayscope.units import MIB, parse_count

SOURCE = DASHBOARD_STATUS
RAY_TOKEN_MIN_BYTES = 1
"""Ray's token is Ray's to size: rayscope forwards it and imposes no length of its own."""
OFF = "none"
"""``--dashboard none`` / ``RAYSCOPE_DASHBOARD=none``: the source is not read."""
MAX_NODES = 16_384
"""Nodes in one summary: as many as a head agent holds (``head.reports.MAX_NODES_HELD``)."""
MAX_MEMORY_MIB = 2**34
"""16 TiB, over any GPU's memory: a larger MiB figure is not a measurement."""
MAX_PID = 2**31 - 1
"""``pid_t`` is a signed 32-bit integer."""
MAX_TEXT = 256
"""A GPU's name or UUID, a node's address: longer is not Ray's."""
PROCESSES_WRONG = ((2, 50), (2, 57))
"""The releases, from the first to before the second, whose per-process memory is not the
process's: on a driver that offers ``nvmlDeviceGetProcessesUtilizationInfo`` (550 and later)
they write the memory-bus utilisation × the GPU's total (ray-project/ray#61456, fixed by
#61412 in 2.57.0), and the summary does not say which driver answered. 2.33-2.49 and 2.57 on
read NVML's process lists (read from each release's wheel: docs/dashboard.md)."""

NO_DASHBOARD_FIX = "install ray[default] on the head (its dashboard), or run a rayscope node agent"

# The dashboard's JSON: only the fields read; numbers as JSON numbers or as text. MiB may
# be a float: Ray 2.50's per-process figure is (``12288.0``, measured).
_Mib = Union[
    Annotated[int, msgspec.Meta(ge=0, le=MAX_MEMORY_MIB)],
    Annotated[float, msgspec.Meta(ge=0, le=MAX_MEMORY_MIB)],
    Annotated[str, msgspec.Meta(max_length=20)],
]
_Int = Union[Annotated[int, msgspec.Meta(ge=0, le=MAX_PID)], Annotated[str, msgspec.Meta(max_length=20)]]
_Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]


class _Process(msgspec.Struct, rename="camel"):
    pid: _Int
    gpu_memory_usage: Optional[_Mib] = None


class _Gpu(msgspec.Struct, rename="camel"):
    index: _Int
    memory_used: _Mib
    memory_total: _Mib
    uuid: Optional[_Text] = None
    name: Optional[_Text] = None
    # Ray 2.33-2.44 list a pid once per NVML list (compute, graphics; 2.49 on once): twice the bound.
    processes_pids: Optional[
        Annotated[list[_Process], msgspec.Meta(max_length=2 * MAX_PROCESSES_PER_GPU)]
    ] = None


class _Raylet(msgspec.Struct, rename="camel"):
    node_id: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{1,128}$")]
    node_manager_address: Optional[_Text] = None


class _Node(msgspec.Struct):
    raylet: _Raylet
    now: Optional[Amount] = None
    gpus: Optional[Annotated[list[_Gpu], msgspec.Meta(max_length=MAX_DEVICES)]] = None


class _Data(msgspec.Struct):
    summary: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_NODES)]


class _Answer(msgspec.Struct):
    result: bool = False
    msg: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    data: Optional[_Data] = None


class _Message(msgspec.Struct):
    msg: Annotated[str, msgspec.Meta(max_length=4096)] = ""


_ANSWER = peer_json.Decoder(_Answer)
_MESSAGE = peer_json.Decoder(_Message)
_NODE = peer_json.Decoder(_Node)


class Address(NamedTuple):
    url: str
    """``http[s]://HOST:PORT[/prefix]``, no trailing slash."""
    origin: str
    """``--dashboard``, ``$RAYSCOPE_DASHBOARD`` or ``GCS``: where it was found."""


def parse_url(text: str) -> str:
    """``HOST[:PORT]`` or ``http[s]://HOST[:PORT][/prefix]`` → the dashboard's base URL;
    ``ValueError`` saying what is wrong (the text quoted, so controls show escaped)."""
    stripped = text.strip()
    if (
        not stripped
        or len(stripped) > 2048
        or not (stripped.isascii() and stripped.isprintable())
        or " " in stripped
    ):
        raise ValueError(f"{text[:80]!r} is not a dashboard URL (http://HOST:PORT)")
    url = urlsplit(stripped if "://" in stripped else f"http://{stripped}")
    if url.scheme not in ("http", "https") or not url.hostname or url.username or url.query or url.fragment:
        raise ValueError(f"{text[:80]!r} is not a dashboard URL (http://HOST:PORT)")
    after_host = url.netloc.rpartition("]")[2]  # past an IPv6 literal's brackets
    port = DEFAULT_PORT
    if ":" in after_host:
        port = parse_count(after_host.rpartition(":")[2], f"dashboard URL {text[:80]!r}: port", 65535)
    if port == 0:
        raise ValueError(f"dashboard URL {text[:80]!r}: port must be a number from 1 to 65535")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{url.scheme}://{host}:{port}{url.path.rstrip('/')}"


def choose_address(
    option: Optional[str], environ: Mapping[str, str], published: Optional[str], published_error: str
) -> tuple[Optional[Address], str]:
    """The dashboard to read and where it was found, or ``(None, why none)``.

    ``option`` (``--dashboard``) wins, then ``$RAYSCOPE_DASHBOARD``, then ``published`` (the
    GCS's text, checked here like any peer's); ``none`` in either of the first two turns the
    source off. An operator's bad URL is a ``ValueError`` naming where it came from; a bad
    published one is a reason."""
    for given, origin in ((option, "--dashboard"), (environ.get(DASHBOARD_ENV), f"${DASHBOARD_ENV}")):
        if given is None or not given.strip():
            continue
        if given.strip().lower() == OFF:
            return None, f"{DASHBOARD_OFF} ({origin} {OFF})"
        try:
            return Address(parse_url(given), origin), ""
        except ValueError as err:
            raise ValueError(f"{origin}: {err}") from None
    if published is None:
        why = published_error or "the cluster published no dashboard address"
        return None, f"no Ray dashboard: {why}; {NO_DASHBOARD_FIX}"
    try:
        return Address(parse_url(published), "GCS"), ""
    except ValueError:
        shown = printable(published)[:80]
        return None, f"the cluster published a dashboard address that is not one ({shown!r})"


def ray_token(environ: Mapping[str, str]) -> tuple[Optional[bytes], str]:
    """Ray's auth token as Ray's own clients find it (``RAY_AUTH_TOKEN``, then the file at
    ``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``; none with ``RAY_AUTH_MODE`` other
    than ``token``) and where it came from; ``ValueError`` (one line) for a bad one."""
    env = dict(environ)
    found = gcs_read.prepare_auth_env(env)  # the one rule of where Ray's token comes from
    if found is None or env.get(gcs_read.AUTH_MODE) != "token":
        return None, ""
    if found == "RAY_AUTH_TOKEN":
        return check_token(
            env["RAY_AUTH_TOKEN"].encode("utf-8", "replace"), "$RAY_AUTH_TOKEN", RAY_TOKEN_MIN_BYTES
        ), found
    path = env["RAY_AUTH_TOKEN_PATH"] if found == "RAY_AUTH_TOKEN_PATH" else os.path.expanduser(found)
    return read_token_file(path, shared_read=True, min_bytes=RAY_TOKEN_MIN_BYTES), found


def token_withheld(address: Address, me: Optional[int] = None, proc_net: str = listeners.PROC_NET) -> str:
    """Why Ray's token must not go to ``address`` (``""``: it may): the one rule of every
    read that sends it (``status``, ``fit``, ``rayscope.cluster_state()``, the head's polls).
    To an address the operator named, always; to one the GCS published (which it keeps after
    the dashboard is gone), only when root or ``me`` (default: this process's effective uid)
    listens there on this host (:func:`rayscope.sources.listeners.untrusted`)."""
    if address.origin != "GCS":
        return ""
    url = urlsplit(address.url)
    return listeners.untrusted(url.hostname or "", url.port or DEFAULT_PORT, me, proc_net)


def _number(value: Union[int, str], what: str, maximum: int) -> int:
    return parse_count(value, what, maximum) if isinstance(value, str) else value


def _bytes(mib: Union[int, float, str], what: str) -> int:
    """A MiB figure (bounded by its type) in bytes; a fraction of a MiB rounds down."""
    if isinstance(mib, float):
        return int(mib * MIB)
    return _number(mib, what, MAX_MEMORY_MIB) * MIB


def _gpu(raw: _Gpu, believed: bool) -> DashboardGpu:
    used: dict[int, Optional[int]] = {}
    for entry in raw.processes_pids or []:
        pid = _number(entry.pid, "pid", MAX_PID)
        held = None if entry.gpu_memory_usage is None else _bytes(entry.gpu_memory_usage, "gpuMemoryUsage")
        # A pid in NVML's compute and graphics lists (Ray 2.33-2.44 list it twice): its larger figure.
        used[pid] = max(used.get(pid) or 0, held) if held is not None else used.get(pid)
    if len(used) > MAX_PROCESSES_PER_GPU:
        raise ValueError(f"more than {MAX_PROCESSES_PER_GPU} processes on one GPU")
    return DashboardGpu(
        index=_number(raw.index, "index", MAX_PID),
        uuid=printable(raw.uuid) if raw.uuid is not None else None,
        name=printable(raw.name) if raw.name is not None else None,
        memory_total_bytes=_bytes(raw.memory_total, "memoryTotal"),
        memory_used_bytes=_bytes(raw.memory_used, "memoryUsed"),
        processes=[DashboardProcess(pid=pid, used_memory_bytes=held) for pid, held in sorted(used.items())],
        processes_believed=believed,
    )


def _node(raw: msgspec.Raw, believed: bool) -> DashboardNode:
    entry = _NODE.decode(raw, checked=True)  # a part of the answer, whose depth was measured
    address = entry.raylet.node_manager_address
    return DashboardNode(
        node_id=entry.raylet.node_id,
        node_ip=printable(address) if address is not None else None,
        measured_at=entry.now,
        gpus=None if entry.gpus is None else [_gpu(g, believed) for g in entry.gpus],
    )


def believes_processes(cluster_ray_version: Optional[str]) -> bool:
    """Whether the per-process memory of a cluster of this Ray release is the processes'
    (:data:`PROCESSES_WRONG`); an unknown or unreadable release is not believed."""
    parts = (cluster_ray_version or "").split(".")
    try:
        release = (parse_count(parts[0], "major", 99), parse_count(parts[1], "minor", 999))
    except (ValueError, IndexError):
        return False
    first_wrong, first_right = PROCESSES_WRONG
    return not first_wrong <= release < first_right


def _decoded_answer(body: bytes) -> _Answer:
    """The answer; where strict JSON refuses it and it holds what Python's ``json.dumps``
    writes for a float that is no number (the dashboard writes its summary so: one ``NaN`` in
    a field nobody reads made every node unreadable), again with each such value ``null``:
    a node whose read field held one is then refused alone (or, for ``now``, has no time)."""
    try:
        return _ANSWER.decode(body)
    except peer_json.PeerJsonError:
        if b"NaN" not in body and b"Infinity" not in body:
            raise
        try:
            return _ANSWER.decode(peer_json.nan_as_null(body))
        except peer_json.PeerJsonError:
            pass
        raise


def parse_summary(
    status: int, body: bytes, url: str, cluster_ray_version: Optional[str]
) -> tuple[dict[str, DashboardNode], SourceStatus]:
    """The dashboard's answer → its nodes by node id, and the source's status (pure: the
    tests feed it recorded answers). A node whose entry breaks a rule is left out; the
    status's detail counts it and names the first reason."""
    if status != 200:
        return {}, _failed(f"the Ray dashboard at {url} answered HTTP {status}: {_said(body)}")
    try:
        answer = _decoded_answer(body)
    except peer_json.PeerJsonError as err:
        return {}, _failed(f"the Ray dashboard at {url} answered no node summary ({str(err)[:120]})")
    if not answer.result or answer.data is None:
        return {}, _failed(
            f"the Ray dashboard at {url} answered: {printable(answer.msg)[:120] or 'no summary'}"
        )
    believed = believes_processes(cluster_ray_version)
    nodes: dict[str, DashboardNode] = {}
    refused: list[str] = []
    for raw in answer.data.summary:
        try:
            node = _node(raw, believed)
        except ValueError as err:  # PeerJsonError included
            refused.append(printable(str(err))[:120])
            continue
        if node.node_id in nodes:
            refused.append(f"node {node.node_id[:12]} listed twice")
            continue
        nodes[node.node_id] = node
    gpus = sum(len(n.gpus or []) for n in nodes.values())
    detail = f"{url}: {len(nodes)} node(s), {gpus} GPU(s)"
    if not believed:
        detail += f"; per-process memory not believed (cluster Ray {cluster_ray_version or 'unknown'})"
    if refused:
        detail += f"; {len(refused)} node(s) refused, first: {refused[0]}"
    return nodes, SourceStatus(name=SOURCE, ok=True, detail=detail)


def _said(body: bytes) -> str:
    """What an error answer says, shown: the dashboard's ``msg``, else its first line."""
    try:
        message = _MESSAGE.decode(body).msg
    except peer_json.PeerJsonError:
        message = body[:512].decode("utf-8", "replace").strip().split("\n")[0]
    return printable(message)[:120] or "no message"


def _failed(reason: str) -> SourceStatus:
    return SourceStatus(name=SOURCE, ok=False, reason=reason)


def refused_token(status: int, url: str, token_source: str, withheld: str) -> Optional[str]:
    """The reason of a 401 or 403, naming the fix (``withheld``: why the token was not sent,
    :func:`token_withheld`); ``None`` for any other status."""
    if status in (401, 403) and withheld:
        return (
            f"the Ray dashboard at {url} requires a token: the one from {token_source} was withheld"
            f" ({withheld}); to send it, name this dashboard: --dashboard {url} (or ${DASHBOARD_ENV})"
        )
    if status == 401:
        return f"the Ray dashboard at {url} requires a token: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    if status == 403:
        return f"the Ray dashboard at {url} rejected the token from {token_source or 'nowhere'}"
    return None


class Fetched(NamedTuple):
    """The dashboard's raw answer (:func:`fetch`): its HTTP status and body; or ``failed``,
    why there is none."""

    status: int = 0
    body: bytes = b""
    failed: Optional[SourceStatus] = None
    withheld: str = ""
    """Why Ray's token was not sent (:func:`token_withheld`); ``""``: sent, or none to send."""


def fetch(address: Address, timeout_s: float, environ: Mapping[str, str] = os.environ) -> Fetched:
    """The one GET under ``timeout_s``, with Ray's token where it may go
    (:func:`token_withheld`: else without it); a refused token is a failure naming its fix;
    never raises."""
    try:
        token, token_source = ray_token(environ)
    except ValueError as err:
        return Fetched(failed=_failed(str(err)))
    withheld = token_withheld(address) if token is not None else ""
    try:
        status, body = get(address.url, None if withheld else token, timeout_s)
    except Unanswered as err:
        return Fetched(failed=_failed(str(err)), withheld=withheld)
    refused = refused_token(status, address.url, token_source, withheld)
    if refused:
        return Fetched(failed=_failed(refused), withheld=withheld)
    return Fetched(status, body, withheld=withheld)


def read_nodes(
    address: Address,
    timeout_s: float,
    cluster_ray_version: Optional[str],
    environ: Mapping[str, str] = os.environ,
) -> tuple[dict[str, DashboardNode], SourceStatus]:
    """One read of the dashboard at ``address`` under ``timeout_s``: its nodes by node id and
    the source's status; never raises."""
    return parsed(fetch(address, timeout_s, environ), address, cluster_ray_version)


def parsed(
    fetched: Fetched, address: Address, cluster_ray_version: Optional[str]
) -> tuple[dict[str, DashboardNode], SourceStatus]:
    """:func:`fetch`'s answer read (:func:`parse_summary`), or its failure."""
    if fetched.failed is not None:
        return {}, fetched.failed
    nodes, status = parse_summary(fetched.status, fetched.body, address.url, cluster_ray_version)
    if status.ok and fetched.withheld:
        status.detail += f"; Ray's token withheld: {fetched.withheld}"
    return nodes, status
