"""A node's GPU memory summed: the trusted figures (:mod:`rayscope.core.gpu.trust`) over a
node, and BioEngine's keys from them.

Pure: a report's GPUs in, sums out. :func:`measured_memory` sums each GPU's trusted figure
over a node, :func:`bioengine_memory` turns the sums into BioEngine's ``total_gpu_memory`` /
``used_gpu_memory`` (``rayscope.core.rollup`` puts both on the node).
"""

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Optional

from rayscope.core.gpu.trust import settled_used
from rayscope.schema.report import GpuDevice
from rayscope.schema.status import NA, BytesOrNA, NodeStatus


class MeasuredMemory(NamedTuple):
    """A node's GPU memory from one report, summed over its GPUs (parents: a MIG
    instance's memory is part of its GPU's)."""

    total_bytes: Optional[int]
    """NVML's total; ``None`` when NVML did not answer or any GPU's total is unknown."""
    used_bytes: Optional[int]
    """The trusted used figure; ``None`` when any GPU's is unknown (``reason`` says why)."""
    nvml_used_bytes: Optional[int]
    """NVML's raw used; ``None`` when NVML did not answer or any GPU's is unknown."""
    source: Optional[str]
    """``nvml``, ``cuda`` or ``mixed``; ``None`` with ``used_bytes``."""
    age_s: Optional[float]
    """Age of the oldest figure at collection; ``None`` with ``used_bytes``."""
    reason: str
    unmeasured: int
    """GPUs whose NVML total or used is unknown (a lost GPU)."""


def measured_memory(gpus: Optional[Sequence[GpuDevice]]) -> MeasuredMemory:
    """A node's GPU memory from its report's GPUs, settled (:func:`settled_used` per GPU).

    A sum is ``None`` when any GPU's part is unknown (a lost GPU): a sum without it would be
    a made-up smaller number; ``0`` when NVML answered and found no GPU. One pass: the head
    runs this for every node on every query.
    """
    if gpus is None:
        return MeasuredMemory(None, None, None, None, None, "NVML did not answer", 0)
    total: Optional[int] = 0
    used: Optional[int] = 0
    nvml: Optional[int] = 0
    unmeasured = 0
    sources: set[str] = set()
    age = 0.0
    reason = ""
    for gpu in gpus:
        figure = settled_used(gpu)
        if gpu.memory_total_bytes is None or figure.nvml_used_bytes is None:
            unmeasured += 1
        total = None if total is None or gpu.memory_total_bytes is None else total + gpu.memory_total_bytes
        nvml = None if nvml is None or figure.nvml_used_bytes is None else nvml + figure.nvml_used_bytes
        if figure.used_bytes is None:
            used, reason = None, reason or figure.reason
            continue
        used = None if used is None else used + figure.used_bytes
        sources.add(figure.source or "nvml")
        age = max(age, figure.age_s or 0.0)
    if unmeasured:
        reason = f"{unmeasured} GPU(s) not measured"
    if used is None:
        return MeasuredMemory(total, None, nvml, None, None, reason or "not measured", unmeasured)
    source = "mixed" if len(sources) > 1 else next(iter(sources), "nvml")
    return MeasuredMemory(total, used, nvml, source, age, "", unmeasured)


def bioengine_memory(
    total_gpu: float, total_bytes: Optional[int], used_bytes: Optional[int]
) -> tuple[BytesOrNA, BytesOrNA]:
    """BioEngine's node ``total_gpu_memory`` and ``used_gpu_memory`` from rayscope's figures
    (``get_cluster_state``'s rules): ``0`` and ``0`` on a node without ``GPU``, else the
    bytes, or ``"NA"`` for a figure rayscope does not have (``used_bytes``: the trusted
    figure of a fresh report)."""
    if total_gpu == 0:
        return 0, 0
    return (NA if total_bytes is None else total_bytes), (NA if used_bytes is None else used_bytes)


def put_memory(node: NodeStatus, memory: MeasuredMemory, report_age_s: float, stale: bool) -> None:
    """The node's GPU memory keys from its measured GPUs (``memory``, a report's or the
    dashboard's, ``report_age_s`` old): rayscope's figures (a stale report keeps its total
    and NVML's raw used, not a used figure to trust), then BioEngine's from them. The one
    writer of these keys (``rayscope.core.rollup``, ``rayscope.core.gpu.precedence``)."""
    used = None if stale else memory.used_bytes
    node.total_gpu_memory_bytes = memory.total_bytes
    node.used_gpu_memory_bytes = used
    node.used_gpu_memory_source = None if used is None else memory.source
    node.used_gpu_memory_age_s = None if used is None else round((memory.age_s or 0.0) + report_age_s, 1)
    node.used_gpu_memory_reason = "stale report" if stale else memory.reason
    node.nvml_memory_used_bytes = memory.nvml_used_bytes
    node.gpus_unmeasured = memory.unmeasured
    node.total_gpu_memory, node.used_gpu_memory = bioengine_memory(node.total_gpu, memory.total_bytes, used)


def find_shared_gpus(nodes: Iterable[NodeStatus]) -> int:
    """Mark, on every node, the GPUs another node reports too (same UUID and model name:
    time-slicing puts several Ray nodes or containers on one physical GPU), in
    ``NodeStatus.shared_gpus``; how many physical GPUs are shared. One pass over the nodes'
    GPUs into a set (1 ms at 10,000 nodes of 8 GPUs); only where a UUID repeats, a second
    pass marks the nodes. A UUID under two model names is no shared GPU (a recorded or
    made-up UUID), and stays apart."""
    nodes = [n for n in nodes if n.gpus]
    uuids = [g.uuid for n in nodes for g in n.gpus or () if g.uuid]
    if len(set(uuids)) == len(uuids):  # the common case, in C: no UUID twice
        return 0
    first: dict[tuple[str, Optional[str]], NodeStatus] = {}
    shared: dict[tuple[str, Optional[str]], list[NodeStatus]] = {}
    for node in nodes:
        for gpu in node.gpus or ():
            if not gpu.uuid:
                continue
            key = (gpu.uuid, gpu.name)
            owner = first.setdefault(key, node)
            if owner is not node:
                holders = shared.setdefault(key, [owner])
                if node not in holders:
                    holders.append(node)
    for (uuid, _), holders in shared.items():
        for node in holders:
            marks = node.shared_gpus if isinstance(node.shared_gpus, dict) else {}
            marks[uuid] = [n.node_id for n in holders if n is not node]
            node.shared_gpus = marks
    return len(shared)


def shared_overcount(nodes: Iterable[NodeStatus]) -> tuple[int, int]:
    """(total, used) bytes that summing ``nodes`` counts more than once: each shared GPU's
    figures on every node after the first that lists it (a GPU the first's sum lacks, e.g.
    its used figure unknown, is not taken off)."""
    counted: set[str] = set()
    total = used = 0
    for node in nodes:
        if not isinstance(node.shared_gpus, dict):
            continue
        for gpu in node.gpus or ():
            if gpu.uuid not in node.shared_gpus:
                continue
            if gpu.uuid in counted:
                total += gpu.memory_total_bytes or 0
                used += settled_used(gpu).used_bytes or 0
            counted.add(gpu.uuid)
    return total, used
