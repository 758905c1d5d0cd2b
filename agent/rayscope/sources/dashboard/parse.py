"""The dashboard's node summary read: every node's GPU memory as the dashboard agent Ray runs
on each node (``ray[default]``) measured it.

Pure: the answer's bytes in (the tests feed it recorded answers, ``tests/data/dashboard/``),
nodes by node id and the source's status out (:func:`parse_summary`). The answer is decoded with
a bound on its depth (:mod:`rayscope.net.peer_json`); every number goes through msgspec's
bounds or :func:`rayscope.units.parse_count`, every string through
:func:`rayscope.labels.printable`; a node whose entry breaks a rule is left out and counted, the
others stand. What each Ray release answers: ``docs/dashboard.md``.
"""

from typing import Annotated, Optional, Union

import msgspec

from rayscope.labels import printable
from rayscope.net import peer_json
from rayscope.schema.dashboard import DASHBOARD_STATUS, DashboardGpu, DashboardNode, DashboardProcess
from rayscope.schema.report import MAX_DEVICES, MAX_PROCESSES_PER_GPU, Amount, SourceStatus
from rayscope.units import MIB, parse_count

SOURCE = DASHBOARD_STATUS
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
    utilization_gpu: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    """Raw: a utilisation that is no percentage costs the GPU its utilisation, not its memory."""
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


def failed(reason: str) -> SourceStatus:
    """The dashboard source's failure, ``reason`` its one line (the one maker, for every
    part of this folder)."""
    return SourceStatus(name=SOURCE, ok=False, reason=reason)


def _number(value: Union[int, str], what: str, maximum: int) -> int:
    return parse_count(value, what, maximum) if isinstance(value, str) else value


def _bytes(mib: Union[int, float, str], what: str) -> int:
    """A MiB figure (bounded by its type) in bytes; a fraction of a MiB rounds down."""
    if isinstance(mib, float):
        return int(mib * MIB)
    return _number(mib, what, MAX_MEMORY_MIB) * MIB


_PERCENT = msgspec.json.Decoder(Annotated[float, msgspec.Meta(ge=0, le=100)])


def _percent(raw: msgspec.Raw) -> Optional[int]:
    """NVML's GPU utilisation as the dashboard sends it (``utilizationGpu``, 0-100), rounded;
    ``None`` when absent (empty) or not such a number."""
    if not raw:
        return None
    try:
        value: float = _PERCENT.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return round(value)


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
        utilization_gpu_pct=_percent(raw.utilization_gpu),
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
        return {}, failed(f"the Ray dashboard at {url} answered HTTP {status}: {_said(body)}")
    try:
        answer = _decoded_answer(body)
    except peer_json.PeerJsonError as err:
        return {}, failed(f"the Ray dashboard at {url} answered no node summary ({str(err)[:120]})")
    if not answer.result or answer.data is None:
        return {}, failed(
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
