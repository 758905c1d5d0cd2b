"""Pure merge of the scheduler's view and node reports into one :class:`ClusterStatus`.

No I/O and no clock reads: ``now`` is a parameter. Derivation is BioEngine's
(``get_cluster_state``): ``used_X = total_X - available_X`` clamped at 0, per node, summed
over alive nodes for the cluster — extended with ``VRAM_MB`` and rounded to Ray's resource
unit (1e-4), since the GCS hands back ``1 - 0.96 = 0.040000000000000036``.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

from agent.model import (
    SCHEMA_VERSION,
    ClusterStatus,
    ClusterTotals,
    GpuDevice,
    NodeReport,
    NodeStatus,
    RayNode,
    ReceivedReport,
    SourceStatus,
)

RESOURCE_DECIMALS = 4
"""Ray stores resources as fixed point with 1e-4 resolution; more digits are float noise."""

HEAD_RESOURCE = "node:__internal_head__"
ACCELERATOR_PREFIX = "accelerator_type:"
SLURM_PREFIX = "slurm_job_id:"

# (JSON key stem, Ray resource name): the scheduler quantities every node and the cluster carry.
SCHEDULER_RESOURCES: tuple[tuple[str, str], ...] = (
    ("cpu", "CPU"),
    ("gpu", "GPU"),
    ("vram_mb", "VRAM_MB"),
    ("memory", "memory"),
    ("object_store_memory", "object_store_memory"),
)


def used_amount(total: float, available: float) -> float:
    """``total - available``, clamped at 0 and rounded to Ray's 1e-4 resource unit."""
    return round(max(0.0, total - available), RESOURCE_DECIMALS)


def accelerator_type(resources: Iterable[str]) -> Optional[str]:
    """Ray's accelerator token from an ``accelerator_type:X`` resource (``removeprefix``:
    ``lstrip`` would eat leading letters of the token itself)."""
    for name in resources:
        if name.startswith(ACCELERATOR_PREFIX):
            return name[len(ACCELERATOR_PREFIX) :]
    return None


def slurm_job_id(resources: Iterable[str]) -> Optional[str]:
    """The SLURM job id BioEngine advertises as a ``slurm_job_id:<id>`` resource."""
    for name in resources:
        if name.startswith(SLURM_PREFIX):
            return name[len(SLURM_PREFIX) :]
    return None


def node_ip_from_resources(resources: Iterable[str]) -> Optional[str]:
    """The ``node:<ip>`` resource Ray gives every node (not ``node:__internal_head__``)."""
    for name in resources:
        if name.startswith("node:") and not name.startswith("node:__"):
            return name[len("node:") :]
    return None


def measured_memory(gpus: Optional[Sequence[GpuDevice]]) -> tuple[Optional[int], Optional[int]]:
    """(total, used) bytes summed over the GPUs whose memory NVML reported.

    ``None`` when NVML did not answer, or answered for no GPU's memory; ``(0, 0)`` when it
    answered and found no GPU.
    """
    if gpus is None:
        return None, None
    totals = [g.memory_total_bytes for g in gpus if g.memory_total_bytes is not None]
    useds = [g.memory_used_bytes for g in gpus if g.memory_used_bytes is not None]
    return (
        sum(totals) if totals or not gpus else None,
        sum(useds) if useds or not gpus else None,
    )


def _scheduler_numbers(view: RayNode) -> dict[str, float]:
    """``total_<stem>`` and ``used_<stem>`` for every scheduler resource of one node."""
    available = view.available if view.available is not None else view.total
    numbers: dict[str, float] = {}
    for stem, resource in SCHEDULER_RESOURCES:
        total = round(float(view.total.get(resource, 0.0)), RESOURCE_DECIMALS)
        numbers["total_" + stem] = total
        # A dead node's availability is gone with it; nothing runs there, so 0 used.
        numbers["used_" + stem] = used_amount(total, available.get(resource, 0.0)) if view.alive else 0.0
    return numbers


def _node(
    numbers: Mapping[str, float],
    *,
    node_id: str,
    node_ip: Optional[str],
    head: bool,
    accelerator: Optional[str],
    slurm: Optional[str] = None,
) -> NodeStatus:
    cpu_only = numbers.get("total_gpu", 0.0) == 0
    return NodeStatus(
        node_ip=node_ip,
        head=head,
        total_cpu=numbers.get("total_cpu", 0.0),
        used_cpu=numbers.get("used_cpu", 0.0),
        total_gpu=numbers.get("total_gpu", 0.0),
        used_gpu=numbers.get("used_gpu", 0.0),
        # BioEngine reports 0 bytes for nodes the scheduler gives no GPU; unknown otherwise.
        total_gpu_memory=0 if cpu_only else None,
        used_gpu_memory=0 if cpu_only else None,
        total_vram_mb=numbers.get("total_vram_mb", 0.0),
        used_vram_mb=numbers.get("used_vram_mb", 0.0),
        total_memory=numbers.get("total_memory", 0.0),
        used_memory=numbers.get("used_memory", 0.0),
        total_object_store_memory=numbers.get("total_object_store_memory", 0.0),
        used_object_store_memory=numbers.get("used_object_store_memory", 0.0),
        accelerator_type=accelerator,
        slurm_job_id=slurm,
        node_id=node_id,
    )


def _node_from_view(view: RayNode) -> NodeStatus:
    node = _node(
        _scheduler_numbers(view),
        node_id=view.node_id,
        node_ip=view.node_ip or node_ip_from_resources(view.total),
        head=view.is_head or HEAD_RESOURCE in view.total,
        accelerator=accelerator_type(view.total),
        slurm=slurm_job_id(view.total),
    )
    node.hostname = view.hostname or None
    node.alive = view.alive
    return node


def _node_from_report(report: NodeReport) -> NodeStatus:
    """A node an agent reports but the scheduler does not know: no booking to show."""
    raylet = report.raylet
    node = _node(
        {},
        node_id=report.node_id,
        node_ip=raylet.node_ip if raylet else None,
        head=raylet.is_head if raylet else False,
        accelerator=accelerator_type(raylet.static_resources) if raylet else None,
    )
    node.in_scheduler = False
    return node


def _apply_report(node: NodeStatus, received: ReceivedReport, now: float, stale_after_s: float) -> None:
    report = received.report
    age = round(max(0.0, now - received.received_at), 1)
    stale = not received.local and age > stale_after_s
    total, used = measured_memory(report.gpus)
    node.total_gpu_memory = total
    node.used_gpu_memory = used
    node.gpus = report.gpus
    node.driver_version = report.driver_version
    node.sources = report.sources
    node.hostname = report.host.hostname if report.host else node.hostname
    node.agent = "local" if received.local else ("stale" if stale else "reporting")
    node.report_age_s = None if received.local else age
    node.stale = stale


def sort_key(node: NodeStatus) -> tuple[int, tuple[int, ...], str, str]:
    """Head first, then by IP numerically (names after addresses), then node id."""
    ip = node.node_ip or ""
    try:
        numeric: tuple[int, ...] = tuple(int(part) for part in ip.split("."))
        if len(numeric) != 4:
            raise ValueError(ip)
        name = ""
    except ValueError:
        numeric, name = (256,), ip
    return (0 if node.head else 1, numeric, name, node.node_id)


def totals(nodes: Iterable[NodeStatus]) -> ClusterTotals:
    """Cluster sums over alive scheduler nodes; NVML sums only over fresh measurements."""
    sums = ClusterTotals()
    measured_total: list[int] = []
    measured_used: list[int] = []
    for node in nodes:
        if not node.in_scheduler:
            continue
        if not node.alive:
            sums.nodes_dead += 1
            continue
        sums.nodes_alive += 1
        for stem, _ in SCHEDULER_RESOURCES:
            for kind in ("total_", "used_"):
                key = kind + stem
                setattr(sums, key, getattr(sums, key) + getattr(node, key))
        if node.total_gpu > 0:
            sums.gpu_nodes += 1
            if not node.stale and node.total_gpu_memory is not None:
                sums.gpu_nodes_measured += 1
                measured_total.append(node.total_gpu_memory)
                measured_used.append(node.used_gpu_memory or 0)
    for stem, _ in SCHEDULER_RESOURCES:
        for kind in ("total_", "used_"):
            key = kind + stem
            setattr(sums, key, round(getattr(sums, key), RESOURCE_DECIMALS))
    if measured_total:
        sums.total_gpu_memory = sum(measured_total)
        sums.used_gpu_memory = sum(measured_used)
    return sums


def rollup(
    views: Sequence[RayNode],
    reports: Mapping[str, ReceivedReport],
    *,
    now: float,
    stale_after_s: float,
    view: str,
    gcs_address: Optional[str] = None,
    sources: Sequence[SourceStatus] = (),
) -> ClusterStatus:
    """Merge the scheduler's nodes with the latest report per node id.

    A report for a node the scheduler does not know becomes a node with
    ``in_scheduler=False``; a report older than ``stale_after_s`` (by the reader's clock,
    ``now - received_at``) is marked stale and left out of the cluster's NVML sums.
    """
    nodes: dict[str, NodeStatus] = {v.node_id: _node_from_view(v) for v in views}
    for node_id, received in reports.items():
        node = nodes.get(node_id)
        if node is None:
            node = nodes[node_id] = _node_from_report(received.report)
        _apply_report(node, received, now, stale_after_s)
    ordered = sorted(nodes.values(), key=sort_key)
    return ClusterStatus(
        schema=SCHEMA_VERSION,
        generated_at=now,
        view=view,
        gcs_address=gcs_address,
        sources=list(sources),
        cluster=totals(ordered),
        nodes={n.node_id: n for n in ordered},
    )
