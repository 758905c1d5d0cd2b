"""Pure merge of the scheduler's view and node reports into one :class:`ClusterStatus`.

No I/O and no clock reads: ``now`` is a parameter. Derivation is BioEngine's
(``get_cluster_state``): ``used_X = total_X - available_X`` clamped at 0, per node, summed
over alive nodes for the cluster — extended with ``VRAM_MB`` and rounded to Ray's resource
unit (1e-4), since the GCS hands back ``1 - 0.96 = 0.040000000000000036``.
"""

from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from operator import attrgetter
from typing import Optional, cast

from msgspec.structs import replace

from rayscope.core.capacity.selectors import shown_labels
from rayscope.core.gpu.memory import bioengine_memory, find_shared_gpus, put_memory, shared_overcount
from rayscope.core.gpu.precedence import take_dashboard
from rayscope.core.gpu.settled import SettledReport, settle_report
from rayscope.core.isolation import guarded, unreadable_as
from rayscope.schema.dashboard import DashboardRead
from rayscope.schema.report import NodeReport, SourceStatus
from rayscope.schema.status import (
    DOCUMENT_SCHEMA,
    NA,
    ClusterStatus,
    ClusterTotals,
    NodeStatus,
    RayNode,
    ReceivedReport,
)
from rayscope.units import is_count, ray_round

STALE_INTERVALS = 3
"""A report older than this many reporting intervals is stale (docs/architecture.md, agents)."""


# (JSON key stem, Ray resource name): the scheduler quantities every node and the cluster carry.
SCHEDULER_RESOURCES: tuple[tuple[str, str], ...] = (
    ("cpu", "CPU"),
    ("gpu", "GPU"),
    ("vram_mb", "VRAM_MB"),
    ("memory", "memory"),
    ("object_store_memory", "object_store_memory"),
)


SCHEDULER_STEMS: dict[str, str] = {ray_name: stem for stem, ray_name in SCHEDULER_RESOURCES}
"""Ray resource name -> the stem of the ``total_<stem>`` / ``used_<stem>`` fields that carry it."""


def scheduler_view_ok(status: ClusterStatus) -> bool:
    """Whether the scheduler's view (the GCS read) is part of ``status``."""
    return any(s.name == "gcs" and s.ok for s in status.sources)


class SchedulerView(Enum):
    """What the scheduler's half of a status is worth."""

    FRESH = "fresh"
    """Read within :data:`STALE_INTERVALS` intervals (or just now, by the embedded default)."""
    OLD = "old"
    """Kept from an earlier read: the GCS has not answered for more than :data:`STALE_INTERVALS` intervals."""
    NONE = "none"
    """Never read: only agents' reports are there."""


def scheduler_view(status: ClusterStatus) -> SchedulerView:
    """Fresh, old or none. A head older than this field (no ``scheduler_age_s``) that says
    the GCS answered has a fresh view; one that says it did not has none."""
    if status.scheduler_age_s is None:
        return SchedulerView.FRESH if scheduler_view_ok(status) else SchedulerView.NONE
    return SchedulerView.OLD if status.scheduler_stale else SchedulerView.FRESH


def scheduler_failure(status: ClusterStatus) -> str:
    """`` (why the GCS could not be read)``, or ``""`` when it gave no reason."""
    reasons = [s.reason for s in status.sources if s.name == "gcs" and not s.ok and s.reason]
    return f" ({reasons[0]})" if reasons else ""


def schedulable_nodes(status: ClusterStatus) -> list[NodeStatus]:
    """Alive nodes the scheduler knows, in display order: the only places Ray can book."""
    return [n for n in status.nodes.values() if n.alive and n.in_scheduler]


def used_amount(total: float, available: float) -> float:
    """``total - available``, clamped at 0 and rounded to Ray's 1e-4 resource unit."""
    return ray_round(max(0.0, total - available))


def resource_tokens(resources: Iterable[str]) -> tuple[Optional[str], Optional[str], Optional[str], bool]:
    """(node IP, accelerator type, SLURM job id, is head) from a node's resource names, in one
    pass: ``node:<ip>``, ``accelerator_type:<token>``, ``slurm_job_id:<id>``,
    ``node:__internal_head__``. Prefixes are split off (``lstrip`` would eat token letters).
    Of several accelerator tokens (one declared beside the one Ray detected) the first by
    name: the GCS lists a node's resources in no fixed order."""
    ip = accelerator = slurm = None
    head = False
    for name in resources:
        kind, colon, value = name.partition(":")
        if not colon:
            continue
        if kind == "accelerator_type":
            accelerator = min(value, accelerator or value)
        elif kind == "slurm_job_id":
            slurm = value
        elif kind == "node":
            if value == "__internal_head__":
                head = True
            elif not value.startswith("__"):
                ip = value
    return ip, accelerator, slurm, head


def accelerator_type(resources: Iterable[str]) -> Optional[str]:
    """Ray's accelerator token from an ``accelerator_type:X`` resource."""
    return resource_tokens(resources)[1]


def slurm_job_id(resources: Iterable[str]) -> Optional[str]:
    """The SLURM job id BioEngine advertises as a ``slurm_job_id:<id>`` resource."""
    return resource_tokens(resources)[2]


def ray_accelerator(node: NodeStatus) -> Optional[str]:
    """The node's Ray accelerator token, or ``None``: BioEngine's ``accelerator_type`` read
    back (its ``"NA"`` on a node without ``GPU`` is no token)."""
    return None if node.total_gpu == 0 and node.accelerator_type == NA else node.accelerator_type


def _booking(total: Mapping[str, float], available: Mapping[str, float], name: str) -> tuple[float, float]:
    """(total, used) of one scheduler resource."""
    amount = float(total.get(name, 0.0))
    return amount, used_amount(amount, available.get(name, 0.0))


def _node(
    total: Mapping[str, float],
    available: Mapping[str, float],
    *,
    node_id: str,
    node_ip: Optional[str],
    head: bool,
    accelerator: Optional[str],
    slurm: Optional[str] = None,
) -> NodeStatus:
    total_cpu, used_cpu = _booking(total, available, "CPU")
    total_gpu, used_gpu = _booking(total, available, "GPU")
    total_vram, used_vram = _booking(total, available, "VRAM_MB")
    total_memory, used_memory = _booking(total, available, "memory")
    total_store, used_store = _booking(total, available, "object_store_memory")
    # rayscope's own keys stay unknown until an agent (or this host's NVML) measures the
    # node: never a made-up 0, not even for a node the scheduler gives no GPU (it may hold
    # GPUs Ray was not told of). BioEngine's keys say 0 there, and "NA" on a GPU node.
    total_gpu_memory, used_gpu_memory = bioengine_memory(total_gpu, None, None)
    return NodeStatus(
        node_ip=node_ip,
        head=head,
        total_cpu=total_cpu,
        used_cpu=used_cpu,
        total_gpu=total_gpu,
        used_gpu=used_gpu,
        total_gpu_memory=total_gpu_memory,
        used_gpu_memory=used_gpu_memory,
        total_vram_mb=total_vram,
        used_vram_mb=used_vram,
        total_memory=total_memory,
        used_memory=used_memory,
        total_object_store_memory=total_store,
        used_object_store_memory=used_store,
        accelerator_type=NA if total_gpu == 0 else accelerator,
        slurm_job_id=slurm,
        node_id=node_id,
        used_gpu_memory_reason="no agent",
    )


def _node_from_view(view: RayNode) -> NodeStatus:
    total = view.total
    # A dead node's availability is gone with it: nothing runs there, so nothing is used.
    available = view.available if view.alive and view.available is not None else total
    ip, accelerator, slurm, head = resource_tokens(total)
    node = _node(
        total,
        available,
        node_id=view.node_id,
        node_ip=view.node_ip or ip,
        head=view.is_head or head,
        accelerator=accelerator,
        slurm=slurm,
    )
    node.hostname = view.hostname or None
    node.alive = view.alive
    labels = shown_labels(view.labels)
    if labels is not None:
        node.labels = labels
    return node


def _node_from_report(report: NodeReport, key: str) -> NodeStatus:
    """A node an agent reports but the scheduler does not know: no booking to show. ``key``
    is its entry in the reports (``host:NAME`` for a host without a raylet), so several such
    hosts stay apart."""
    raylet = report.raylet
    node = _node(
        {},
        {},
        node_id=report.node_id or key,
        node_ip=raylet.node_ip if raylet else None,
        head=raylet.is_head if raylet else False,
        accelerator=accelerator_type(raylet.static_resources) if raylet else None,
    )
    node.in_scheduler = False
    return node


def _settled(received: ReceivedReport) -> SettledReport:
    """The report's GPUs settled (each GPU's trusted figure, its source and its health flags:
    rayscope.core.gpu.settled) and their sums, once per report (not once per query): every
    output reads them from the node."""
    if received.memory is None:
        received.memory = settle_report(received.report.gpus)
    return cast(SettledReport, received.memory)


def _apply_report(
    node: NodeStatus, received: ReceivedReport, now: float, stale_after_s: float, wall_offset: float
) -> None:
    report = received.report
    age = round(max(0.0, now - received.received_at), 1)
    # The head's interval only: a report's own interval_s must not decide its freshness.
    stale = not received.local and age > stale_after_s
    settled = _settled(received)
    put_memory(node, settled.memory, 0.0 if received.local else age, stale)
    node.collected_at = report.collected_at
    node.received_at = received.received_at + wall_offset
    node.gpus = settled.gpus
    node.driver_version = report.driver_version
    node.sources = report.sources
    node.hostname = report.host.hostname if report.host else node.hostname
    node.agent = "local" if received.local else ("stale" if stale else "reporting")
    node.agent_started_by = "" if received.local else report.started_by
    node.report_age_s = None if received.local else age
    node.stale = stale


def _merged_node(
    known: Optional[NodeStatus],
    received: ReceivedReport,
    key: str,
    now: float,
    stale_after_s: float,
    wall_offset: float,
) -> NodeStatus:
    """``known`` (the scheduler's node, or ``None``) with ``received`` applied, as of ``now``.

    A fresh report merges into the same scheduler node query after query, and only its ages
    change: that merge is kept on the report (``ReceivedReport.merged``) and copied with the
    ages of ``now``. A stale report, or a node the scheduler does not know, is merged whole.
    """
    age = round(max(0.0, now - received.received_at), 1)
    if known is None or (not received.local and age > stale_after_s):
        node = replace(known) if known is not None else _node_from_report(received.report, key)
        _apply_report(node, received, now, stale_after_s, wall_offset)
        return node
    cached = received.merged
    if cached is None or cached[0] is not known:
        template = replace(known)
        _apply_report(template, received, received.received_at, stale_after_s, 0.0)
        cached = received.merged = (known, template)  # a benign race: both threads build the same
    template = cached[1]
    if received.local:
        return replace(template, received_at=received.received_at + wall_offset)
    used_age = template.used_gpu_memory_age_s  # the figure's own age at collection
    return replace(
        template,
        received_at=received.received_at + wall_offset,
        report_age_s=age,
        used_gpu_memory_age_s=None if used_age is None else (round(used_age + age, 1) if used_age else age),
    )


def sort_key(node: NodeStatus) -> tuple[int, tuple[int, ...], str, str]:
    """Head first, then by IP numerically (names, ``10.0.0.²`` too, after addresses), then node id."""
    ip = node.node_ip or ""
    parts = ip.split(".")
    if len(parts) == 4 and all(is_count(p) for p in parts):
        return (0 if node.head else 1, tuple(map(int, parts)), "", node.node_id)
    return (0 if node.head else 1, (256,), ip, node.node_id)


_SUMMED = tuple(kind + stem for stem, _ in SCHEDULER_RESOURCES for kind in ("total_", "used_"))


def scheduler_sums(nodes: Iterable[NodeStatus]) -> dict[str, float]:
    """The scheduler's cluster sums (``total_cpu`` ... ``used_object_store_memory``) over
    alive scheduler nodes: a function of the scheduler's view alone (reports change no
    booking), so the head computes them once per view."""
    alive = [n for n in nodes if n.in_scheduler and n.alive]
    return {key: ray_round(sum(map(attrgetter(key), alive))) for key in _SUMMED}


def totals(
    nodes: Iterable[NodeStatus], sums: Optional[Mapping[str, float]] = None, shared_gpus: int = 0
) -> ClusterTotals:
    """Cluster sums over alive scheduler nodes (BioEngine's ``nodes``). BioEngine's GPU
    memory sums add the node values that are numbers; rayscope's cover the GPU nodes with a
    fresh report whose total and trusted used are both known (``gpu_nodes_measured``), each
    physical GPU once where several nodes report it (``shared_gpus``: how many do).
    ``sums``: :func:`scheduler_sums` of these nodes' scheduler view, when known."""
    in_scheduler = [n for n in nodes if n.in_scheduler]
    alive = [n for n in in_scheduler if n.alive]
    gpu_nodes = [n for n in alive if n.total_gpu > 0]
    measured = [
        n for n in gpu_nodes if n.total_gpu_memory_bytes is not None and n.used_gpu_memory_bytes is not None
    ]
    totals_ = ClusterTotals(
        nodes_alive=len(alive),
        nodes_dead=len(in_scheduler) - len(alive),
        gpu_nodes=len(gpu_nodes),
        gpu_nodes_measured=len(measured),
        total_gpu_memory=sum(n.total_gpu_memory for n in alive if isinstance(n.total_gpu_memory, int)),
        used_gpu_memory=sum(n.used_gpu_memory for n in alive if isinstance(n.used_gpu_memory, int)),
    )
    for key, value in (scheduler_sums(alive) if sums is None else sums).items():
        setattr(totals_, key, value)
    if measured:
        twice_total, twice_used = shared_overcount(measured) if shared_gpus else (0, 0)
        totals_.total_gpu_memory_bytes = sum(n.total_gpu_memory_bytes or 0 for n in measured) - twice_total
        totals_.used_gpu_memory_bytes = sum(n.used_gpu_memory_bytes or 0 for n in measured) - twice_used
    if shared_gpus:
        totals_.shared_gpus = shared_gpus
    return totals_


def scheduler_nodes(views: Sequence[RayNode]) -> dict[str, NodeStatus]:
    """The scheduler's half of the rollup, in display order. It changes once per GCS read,
    so the head agent computes it then and merges reports into it per query."""
    return {n.node_id: n for n in sorted(map(_node_from_view, views), key=sort_key)}


def merge(
    base: Mapping[str, NodeStatus],
    reports: Mapping[str, ReceivedReport],
    *,
    now: float,
    stale_after_s: float,
    view: str,
    gcs_address: Optional[str] = None,
    sources: Sequence[SourceStatus] = (),
    scheduler_read_at: Optional[float] = None,
    wall_now: Optional[float] = None,
    sums: Optional[Mapping[str, float]] = None,
    dashboard: Optional[DashboardRead] = None,
    gpus_unique: bool = False,
) -> ClusterStatus:
    """Merge the latest report per node id into :func:`scheduler_nodes` (left untouched),
    then Ray's dashboard's figures where no fresh report measured a node (``dashboard``:
    its read, ``None`` when not read; the rule: rayscope.core.gpu.precedence).

    ``scheduler_read_at``: when ``base`` was read (the reader's clock; ``None``: never):
    its age is carried, and past ``stale_after_s`` the view is flagged stale. ``now`` is the
    clock the receive times are on (the head's monotonic clock); ``wall_now`` the wall clock
    at the same instant, for ``generated_at`` and the ``received_at`` the document shows
    (default: ``now``, when both are one clock).

    A report for a node the scheduler does not know becomes a node with ``in_scheduler=False``;
    one that cannot be merged, an ``unreadable`` node (rayscope.core.isolation). ``sums``: those of
    ``base`` when kept. A report older than ``stale_after_s`` is stale: its used figure is
    left out of the cluster's sums. ``gpus_unique``: the head counted no GPU UUID twice."""
    wall_offset = 0.0 if wall_now is None else wall_now - now
    nodes = dict(base)
    unknown = False
    for node_id, received in reports.items():
        known = nodes.get(node_id)
        unknown = unknown or known is None
        args = (known, received, node_id, now, stale_after_s, wall_offset)  # a report that raises: unreadable
        nodes[node_id] = guarded("merge", node_id, unreadable_as(known, node_id), _merged_node, *args)
    sources = [*sources, *take_dashboard(nodes, dashboard, now + wall_offset)]
    ordered = sorted(nodes.values(), key=sort_key) if unknown else list(nodes.values())
    # Time-slicing: one physical GPU in several nodes' reports is said so, and summed once.
    shared = find_shared_gpus(ordered) if (reports or dashboard) and not gpus_unique else 0
    age = None if scheduler_read_at is None else round(max(0.0, now - scheduler_read_at), 1)
    return ClusterStatus(
        scheduler_age_s=age,
        scheduler_stale=age is not None and age > stale_after_s,
        schema=DOCUMENT_SCHEMA,
        generated_at=now + wall_offset,
        view=view,
        gcs_address=gcs_address,
        sources=list(sources),
        cluster=totals(ordered, sums, shared),
        nodes={n.node_id: n for n in ordered} if unknown else nodes,
    )
