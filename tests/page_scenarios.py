"""Clusters for the head's page: the seed with its actors, and a big one (N nodes × 8 GPUs)
with actors placed per device, processes and the odd problem, for size and readability."""

from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from rayscope.core.gpu.attribution import attribute_cluster
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.schema.report import GpuHealth, GpuProcess, NodeReport, ProcessInfo, RayletInfo, SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, RayNode, ReceivedReport
from tests.scenarios import NOW
from tests.tools.bench import synthetic_reports, synthetic_views

if TYPE_CHECKING:
    from rayscope.schema.usage import AppUsage, UsageDocument

GPUS = 8
VRAM_MB = 81920.0


def head_merge(views: list[RayNode], received: dict[str, ReceivedReport], gcs_address: str) -> ClusterStatus:
    """The head's merge of ``views`` (read 1 s ago) and ``received`` at ``NOW``, both GCS reads ok."""
    return merge(
        scheduler_nodes(views),
        received,
        now=NOW,
        stale_after_s=15.0,
        view="head",
        gcs_address=gcs_address,
        sources=[SourceStatus(name="gcs", ok=True), SourceStatus(name="gcs_actors", ok=True)],
        scheduler_read_at=NOW - 1.0,
    )


def _actor(node: int, gpu: int, replica: int, node_id: str, vram_mb: float) -> ActorBooking:
    return ActorBooking(
        actor_id=f"{node:08x}{gpu:04x}{replica:04x}" + "0" * 16,
        node_id=node_id,
        pid=100_000 + node * 100 + gpu * 10 + replica,
        name=f"app-{(node + gpu) % 7}-replica-{replica}",
        required={"GPU": 0.01, "VRAM_MB": vram_mb},
        gpu_ids=[gpu],
        gpu_shares=[(gpu, 0.01)],
    )


def big_status(nodes: int) -> ClusterStatus:
    """``nodes`` nodes of 8 × A100 80 GB, booked by ``VRAM_MB``, 1-3 replicas per GPU; every
    17th node stale, GPU 3 of every 10th unhealthy (XID 79), GPU 0 of every 13th booked full
    while its node's sum shows room."""
    reports, actors = [], []
    for i, base in enumerate(synthetic_reports(nodes)):
        assert base.raylet is not None and base.gpus is not None
        raylet = RayletInfo(
            pid=base.raylet.pid,
            node_id=base.node_id,
            node_ip=base.raylet.node_ip,
            cuda_visible_devices=",".join(str(g) for g in range(GPUS)),
            cuda_device_order="PCI_BUS_ID",
            environ_read=True,
        )
        gpus, processes = [], []
        for gpu in base.gpus:
            replicas = 1 + (i + gpu.index) % 3
            vram = VRAM_MB / 4 if i % 13 or gpu.index else VRAM_MB / replicas
            mine = [_actor(i, gpu.index, r, base.node_id, vram) for r in range(replicas)]
            actors += mine
            procs = [GpuProcess(pid=a.pid or 0, used_memory_bytes=int(vram * 0.9) << 20) for a in mine]
            processes += [
                ProcessInfo(pid=a.pid or 0, title="ray::Replica", worker_pid=a.pid, node_id=base.node_id)
                for a in mine
            ]
            health = GpuHealth(xid_errors=1, last_xid=79) if i % 10 == 0 and gpu.index == 3 else None
            bus = f"00000000:{gpu.index + 1:02x}:00.0"
            used = sum(p.used_memory_bytes or 0 for p in procs) + (1 << 29)  # + a CUDA context's worth
            gpus.append(replace(gpu, processes=procs, health=health, pci_bus_id=bus, memory_used_bytes=used))
        report = NodeReport(
            node_id=base.node_id,
            collected_at=base.collected_at,
            raylet=raylet,
            host=base.host,
            gpus=gpus,
            sources=base.sources,
            processes=processes,
        )
        reports.append(report)
    views: list[RayNode] = []
    by_node: dict[str, list[ActorBooking]] = {}
    for booking in actors:
        by_node.setdefault(booking.node_id, []).append(booking)
    for view in synthetic_views(reports):
        mine = by_node.get(view.node_id, [])
        booked = {k: sum(a.required[k] for a in mine) for k in ("GPU", "VRAM_MB")}
        available = {**(view.available or {}), **{k: view.total[k] - booked[k] for k in booked}}
        views.append(replace(view, available=available, hostname=f"gpu-{len(views):05d}"))
    received = {
        r.node_id: ReceivedReport(report=r, received_at=NOW - (60.0 if n % 17 == 5 else 2.0))
        for n, r in enumerate(reports)
    }
    status = head_merge(views, received, "10.0.0.1:6379")
    fresh = {k: r.report for k, r in received.items() if not status.nodes[k].stale}
    return attribute_cluster(status, fresh, actors)


VM = "5e" * 28
"""A node whose agent reports without NVML (no driver in the VM): Ray's placement only."""


def first_hour_status() -> ClusterStatus:
    """What a new operator's first hour shows: Europa's agent with NVML and its
    four replicas; a VM of the same booking whose agent has no NVML (its bars from Ray's
    placement: a segment per actor still); the deNBI T4 and its 0.33 app without an agent;
    the CPU node. As a head serves it with ``?gpus=1``."""
    from tests.scenarios import CPU, EUROPA, SEED_REPORTS, SEED_VIEWS, T4, report, view
    from tests.support.seeds import EUROPA_ACTORS, EUROPA_PROCESSES, actor, outsider, seed_with_gpus

    seeded, _ = seed_with_gpus()
    europa = seeded.nodes[EUROPA]
    europa_report = NodeReport(
        node_id=EUROPA,
        collected_at=NOW - 2,
        raylet=SEED_REPORTS[EUROPA].report.raylet,
        host=SEED_REPORTS[EUROPA].report.host,
        gpus=[replace(g, attribution=None) for g in europa.gpus or []],
        processes=[*EUROPA_PROCESSES, outsider(7000, "jupyter-lab")],
    )
    vm_view = view(
        VM,
        "10.0.0.6",
        {"CPU": 8, "GPU": 1, "VRAM_MB": 24576, "accelerator_type:A10G": 1},
        {"CPU": 4, "GPU": 0.96, "VRAM_MB": 4096, "accelerator_type:A10G": 1},
    )
    views = [SEED_VIEWS[0], vm_view, *SEED_VIEWS[1:]]
    received = {
        EUROPA: ReceivedReport(report=europa_report, received_at=NOW - 2),
        VM: report(VM, None, "10.0.0.6"),
        CPU: SEED_REPORTS[CPU],
    }
    status = head_merge(views, received, "172.17.0.3:6379")
    vm_actors = [
        actor(
            f"5e{i:02x}" + "0" * 28,
            300 + i,
            f"SERVE_REPLICA::seg#cellpose#{i:04x}",
            vram_mb=5120,
            gpu=0.01,
            node_id=VM,
        )
        for i in range(4)
    ]
    denbi = actor("d00d" + "0" * 28, 900, name="denbi-app", gpu=0.33, node_id=T4)
    fresh = {k: r.report for k, r in received.items()}
    return attribute_cluster(status, fresh, [*EUROPA_ACTORS, *vm_actors, denbi])


def unet_usage(**measured: Any) -> "AppUsage":
    """The federated-unet app's usage line: 4 replicas (one actor each) that book 5120 MB of
    VRAM each, with ``measured`` (its peak, p95, samples, suggestion) set."""
    from rayscope.schema.usage import AppUsage

    return AppUsage(
        app="federated-unet", replicas=4, actors=4, booked_mb=5120.0, booked_vram_mb=5120.0, **measured
    )


def first_hour_usage() -> "UsageDocument":
    """The head's usage history beside it: one app measured, one that held no GPU memory."""
    from rayscope.schema.usage import AppUsage, UsageDocument

    unet = unet_usage(
        peak_used_bytes=5530 * 1024**2,
        p95_used_bytes=5400 * 1024**2,
        samples=712,
        suggested_vram_mb=6144,
        frees_mb=-4096.0,
        oom_risk=True,
    )
    idle = AppUsage(
        app="denbi-app",
        replicas=1,
        actors=1,
        booked_mb=5069.0,
        booked_gpu=0.33,
        samples=0,
        reason="held no GPU memory in the window (its processes are not on a measured GPU)",
    )
    return UsageDocument(
        generated_at=NOW, window_s=3600, head_window_s=3600, slot_s=5, headroom_pct=10,
        known_since=NOW - 3600, covered_s=3600, apps=[unet, idle],
    )  # fmt: skip
