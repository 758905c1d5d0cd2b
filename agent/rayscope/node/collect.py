"""Glue between the sources and the pure parts: one node's report, the embedded status,
the node diagnostics. The CLI and the node agent call these; they hold no formatting.
"""

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NamedTuple, Optional

import msgspec

from rayscope.core.capacity import pending
from rayscope.core.gpu.attribution import attribute_cluster, attribute_node, leaf_devices, sharing_devices
from rayscope.core.gpu.settled import settle_gpus
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.errors import EXIT_NO_DATA, EXIT_USAGE, AgentError
from rayscope.net.addresses import parse_address
from rayscope.net.deadline import Deadline
from rayscope.node.cuda_samples import CudaSamples, settle_on_agent_all
from rayscope.schema.node import NodeDiagnostics
from rayscope.schema.report import REPORT_SCHEMA, GpuDevice, NodeReport, ProcessInfo, RayletInfo, SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeStatus, RayNode, ReceivedReport
from rayscope.sources import host, procs, raylet
from rayscope.sources.dashboard.parallel import ParallelRead
from rayscope.sources.gcs import address as gcs_address
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import reader as gcs
from rayscope.sources.local_agents import find_agents
from rayscope.sources.nvml import devices as nvml
from rayscope.units import ray_round


def local_report(
    node_raylet: Optional[RayletInfo],
    now: float,
    nvml_timeout_s: float = nvml.TIMEOUT_S,
    cuda: Optional[CudaSamples] = None,
) -> NodeReport:
    """What this host knows about itself: its raylet, NVML and the host (never raises; a
    hung NVML call costs at most ``nvml_timeout_s``). Each GPU's used figure is the one
    rayscope trusts (:func:`rayscope.node.cuda_samples.settle_on_agent_all`; ``cuda``: the node agent's CUDA
    samples, where it takes them)."""
    driver, raw_gpus, nvml_status = nvml.read_gpus_within(nvml_timeout_s)
    gpus, cuda_sources = settle_on_agent_all(raw_gpus, cuda)
    host_info, host_status = host.read_host()
    processes, procs_sources = gpu_processes(gpus)
    return NodeReport(
        schema=REPORT_SCHEMA,
        node_id=node_raylet.node_id if node_raylet else "",
        collected_at=now,
        raylet=node_raylet,
        host=host_info,
        driver_version=driver,
        gpus=gpus,
        sources=[nvml_status, *cuda_sources, host_status, *procs_sources],
        processes=processes,
    )


def gpu_processes(
    gpus: Optional[Sequence[GpuDevice]],
) -> tuple[Optional[list[ProcessInfo]], list[SourceStatus]]:
    """This host's view of every pid NVML lists on ``gpus``; no read (and no status) when
    there is none."""
    pids = [p.pid for g in leaf_devices(gpus or []) for p in g.processes or []]
    if not pids:
        return ([] if gpus is not None else None), []
    processes, status = procs.read_processes(pids)
    return processes, [status]


def resolve_gcs(
    explicit: Optional[str],
    raylets: Sequence[RayletInfo],
    environ: Mapping[str, str] = os.environ,
    raylet_status: Optional[SourceStatus] = None,
) -> str:
    """The GCS address to read, or an :class:`AgentError` (exit 2) saying none is known (and,
    from ``raylet_status``, which raylets were refused)."""
    refused = raylet_status.reason if raylet_status is not None and not raylet_status.ok else ""
    address, origin = gcs_address.resolve_address(explicit, environ, raylets, refused)
    if address is None:
        raise AgentError(origin, EXIT_NO_DATA)
    try:
        return parse_address(address)
    except ValueError as err:
        raise AgentError(f"bad GCS address from {origin}: {err}", EXIT_USAGE) from None


def _attach_local(
    raylets: Sequence[RayletInfo], views: Sequence[RayNode], now: float, read: Optional[NodeReport] = None
) -> tuple[dict[str, ReceivedReport], list[SourceStatus]]:
    """This host's NVML and host facts, attached to the one local node of this cluster
    (``read``: this host's report when already read, else it is read here).

    Several raylets on one host share its GPUs: the measurement goes to one of them (the
    head's if it runs here) so the cluster sums count each GPU once.
    """
    known = {v.node_id for v in views}
    mine = raylet.pick_raylet([r for r in raylets if r.node_id in known], None)
    if mine is None:
        skipped = SourceStatus(
            name="nvml", ok=False, reason="not read: no raylet of this cluster runs on this host"
        )
        return {}, [skipped]
    if read is None:
        report = local_report(mine, now)
    else:
        report = msgspec.structs.replace(read, node_id=mine.node_id, raylet=mine)
    return {mine.node_id: ReceivedReport(report=report, received_at=now, local=True)}, report.sources


def attribute_here(
    status: ClusterStatus,
    reports: Mapping[str, ReceivedReport],
    actors: Optional[Sequence[ActorBooking]],
    raylets: Sequence[RayletInfo],
) -> ClusterStatus:
    """``status`` with its GPUs attributed, every raylet of this cluster on this host taken
    as sharing this host's GPUs unless the devices each was measured on say otherwise
    (:func:`rayscope.core.gpu.attribution.attribute_cluster` groups them by GPU UUID): the
    one rule of ``status --gpus`` and ``node --gpus``."""
    local = {r.node_id for r in raylets} & set(status.nodes)
    return attribute_cluster(
        status,
        {n: r.report for n, r in reports.items()},
        actors,
        {n: local for n in local},
        {r.node_id: r for r in raylets if r.node_id in local},
    )


def resolve_gcs_here(explicit: Optional[str]) -> str:
    """:func:`resolve_gcs` with this host's raylets."""
    raylets, status = raylet.find_raylets()
    return resolve_gcs(explicit, raylets, raylet_status=status)


def start_dashboard(option: Optional[str], deadline: Deadline) -> ParallelRead:
    """Ray's dashboard read of one command (``--dashboard``, ``$RAYSCOPE_DASHBOARD``, else
    the address the GCS published), begun as early as its address is known; a bad address the
    operator gave is a usage error (exit 2)."""
    try:
        return ParallelRead(option, deadline)
    except ValueError as err:
        raise AgentError(str(err), EXIT_USAGE) from None


class Here(NamedTuple):
    """The cluster as read from this host (:func:`cluster_here`)."""

    status: ClusterStatus
    views: list[RayNode]
    reports: dict[str, ReceivedReport]
    """This host's report, attached to its raylet of this cluster (none: no raylet of it here)."""


def cluster_here(
    address: str,
    timeout_s: float,
    raylets: Sequence[RayletInfo],
    clock: Callable[[], float],
    *,
    gpus: bool,
    dashboard: Optional[str],
    sources: Sequence[SourceStatus] = (),
    report: Optional[NodeReport] = None,
    ask_dashboard: bool = True,
) -> Here:
    """The GCS for every node, NVML for this host (``report`` when already read), Ray's
    dashboard for every node no fresh NVML read measured (its GET beside the GCS read, under
    one deadline of ``timeout_s``; ``dashboard``: ``--dashboard``'s value), merged; with
    ``gpus`` the actor table too (same child process) and every measured node's GPU memory
    attributed (:func:`attribute_here`). ``sources``: listed after the GCS's.
    ``ask_dashboard=False``: no dashboard read, and no word of it. An :class:`AgentError`
    (exit 2) when the GCS does not answer."""
    deadline = Deadline(timeout_s)
    early = start_dashboard(dashboard if ask_dashboard else "none", deadline)
    python = gcs_child.gcs_python(raylets, address, gcs.ray_importable())
    answer: list[dict[str, Any]] = []
    watch = gcs_child.Watch(deadline, early.on_child_line)
    views, actors, waiting, gcs_statuses = gcs_child.read_pending_too(
        address, timeout_s, python, actors=gpus, watch=watch, _answer=answer
    )
    if not gcs_statuses[0].ok:
        raise AgentError(gcs_statuses[0].reason, EXIT_NO_DATA)
    now = clock()
    reports, local_sources = _attach_local(raylets, views, now, report)
    said = answer[0] if answer else {}
    read = early.result(
        said.get("cluster_ray_version"), said.get("dashboard_url"), said.get("dashboard_url_error", "")
    )
    status = merge(
        scheduler_nodes(views),
        reports,
        now=now,
        stale_after_s=math.inf,
        view="gcs",
        gcs_address=address,
        sources=[
            *gcs_statuses,
            *sources,
            *local_sources,
            *([early.off_status()] if early.off and ask_dashboard else []),
        ],
        scheduler_read_at=now,
        dashboard=read,
    )
    status = pending.attach(status, waiting)
    return Here(attribute_here(status, reports, actors, raylets) if gpus else status, views, reports)


def embedded_status(
    explicit_gcs: Optional[str],
    timeout_s: float,
    clock: Callable[[], float] = time.time,
    gpus: bool = False,
    dashboard: Optional[str] = None,
) -> ClusterStatus:
    """``rayscope status`` without a head agent: :func:`cluster_here` with this host's
    raylets and the GCS they (or ``explicit_gcs``) name."""
    raylets, raylet_status = raylet.find_raylets()
    address = resolve_gcs(explicit_gcs, raylets, raylet_status=raylet_status)
    here = cluster_here(
        address, timeout_s, raylets, clock, gpus=gpus, dashboard=dashboard, sources=[raylet_status]
    )
    return here.status


def _local_booking(
    views: Sequence[RayNode], raylets: Sequence[RayletInfo], now: float
) -> dict[str, NodeStatus]:
    """The local raylets' nodes as the scheduler sees them (no report merged)."""
    local_ids = {r.node_id for r in raylets}
    mine = [v for v in views if v.node_id in local_ids]
    return dict(merge(scheduler_nodes(mine), {}, now=now, stale_after_s=math.inf, view="gcs").nodes)


def _gpus_here(
    address: str,
    timeout_s: float,
    raylets: Sequence[RayletInfo],
    clock: Callable[[], float],
    report: NodeReport,
) -> tuple[Optional[Here], list[SourceStatus]]:
    """``node --gpus``'s read: :func:`cluster_here` with this host's report, so this host's
    GPUs are attributed as ``status --gpus`` attributes them; ``None`` (and the GCS's
    failure) when the GCS does not answer."""
    try:
        # Ray's dashboard tells raylets apart by their devices: with one raylet here, no need.
        several = len(raylets) > 1
        here = cluster_here(
            address,
            timeout_s,
            raylets,
            clock,
            gpus=True,
            dashboard=None,
            report=report,
            ask_dashboard=several,
        )
    except AgentError as err:
        return None, [SourceStatus(name="gcs", ok=False, reason=str(err), detail=address), *report.sources]
    return here, here.status.sources


def node_diagnostics(
    explicit_gcs: Optional[str],
    timeout_s: float,
    clock: Callable[[], float] = time.time,
    gpus: bool = False,
) -> NodeDiagnostics:
    """``rayscope node``: this host's raylets, GPUs and host; their booking if the GCS answers.

    ``gpus``: also read the actor table and attribute this host's GPU memory to the actors
    of the raylets here that share its devices, by the rule of ``status --gpus``
    (:func:`attribute_here`: Ray's dashboard tells a raylet measured on devices of its own);
    bookings are ``NA`` where the GCS does not answer.
    """
    raylets, raylet_status = raylet.find_raylets()
    sources = [raylet_status]
    booking: dict[str, NodeStatus] = {}
    address: Optional[str] = None
    try:
        address = resolve_gcs(explicit_gcs, raylets, raylet_status=raylet_status)
    except AgentError as err:
        sources.append(SourceStatus(name="gcs", ok=False, reason=str(err)))
    report = local_report(None, clock())
    here: Optional[Here] = None
    if address is not None and gpus:
        here, read_sources = _gpus_here(address, timeout_s, raylets, clock, report)
        sources += read_sources
        booking = _local_booking(here.views, raylets, clock()) if here is not None else {}
    elif address is not None:
        python = gcs_child.gcs_python(raylets, address, gcs.ray_importable())
        views, _, gcs_statuses = gcs_child.read_cluster(address, timeout_s, python)
        sources += [*gcs_statuses, *report.sources]
        booking = _local_booking(views, raylets, clock())
    else:
        sources += report.sources
    settled = settle_gpus(report.gpus)  # as the rollup settles a report's: `node` reads them
    agents, agents_status = find_agents()
    diag = NodeDiagnostics(
        generated_at=clock(),
        gcs_address=address,
        raylets=raylets,
        host=report.host,
        driver_version=report.driver_version,
        gpus=settled,
        booking=booking,
        sources=[*sources, agents_status],
        processes=report.processes,
        agents=agents,
    )
    if gpus and settled is not None:
        _attribute_diagnostics(diag, here, raylets, booking)
    return diag


def _attribute_diagnostics(
    diag: NodeDiagnostics,
    here: Optional[Here],
    raylets: Sequence[RayletInfo],
    booking: Mapping[str, NodeStatus],
) -> None:
    """``diag``'s GPUs attributed: as :func:`cluster_here` attributed this host's node of the
    cluster, with the raylets that share its GPUs (``gpu_raylets``); where no raylet here is
    of the cluster read (or none was read), to every local raylet's actors, bookings unknown
    without the actor table."""
    mine = next(iter(here.reports), None) if here is not None else None
    if here is not None and mine is not None:
        node = here.status.nodes[mine]
        local = {r.node_id for r in raylets} & set(here.status.nodes)
        diag.gpus, diag.attribution = node.gpus, node.attribution
        diag.gpu_raylets = sorted(sharing_devices(here.status.nodes, {n: local for n in local})[mine])
        return
    assert diag.gpus is not None
    diag.gpus, diag.attribution = attribute_node(
        diag.gpus,
        diag.processes,
        None,
        {r.node_id for r in raylets},
        total_vram_mb=ray_round(sum(n.total_vram_mb for n in booking.values())),
        used_vram_mb=ray_round(sum(n.used_vram_mb for n in booking.values())),
    )
