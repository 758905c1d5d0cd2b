"""The seed cluster with Europa's GPU processes and actors (``status --gpus``'s scenario), and
the builders of devices, processes and actor bookings in the shapes the sources return them."""

from typing import Optional

from rayscope.core.gpu.attribution import attribute_cluster
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.render.gpus import status_gpu_lines
from rayscope.render.status import status_lines
from rayscope.schema.report import GpuDevice, GpuProcess, NodeReport, ProcessInfo, SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, ReceivedReport
from tests.scenarios import EUROPA, NOW, SEED_REPORTS, SEED_VIEWS, T4

GIB = 1024**3
NODE = EUROPA


SEED_SOURCES = [SourceStatus(name="gcs", ok=True), SourceStatus(name="gcs_actors", ok=True)]


RAYLET_PID = 4471


def device(
    index: int,
    used_gib: float,
    processes: Optional[list[GpuProcess]],
    total_gib: float = 24.0,
    name: str = "NVIDIA GeForce RTX 3090",
) -> GpuDevice:
    return GpuDevice(
        index=index,
        name=name,
        memory_total_bytes=int(total_gib * GIB),
        memory_used_bytes=int(used_gib * GIB),
        memory_info_version=2,
        utilization_gpu_pct=87,
        processes=processes,
    )


def gpu_process(pid: int, used_gib: float) -> GpuProcess:
    return GpuProcess(pid=pid, used_memory_bytes=int(used_gib * GIB), kinds=["compute"])


def worker(
    pid: int, title: str = "ray::ServeReplica:unet:federated-unet", node_id: str = NODE
) -> ProcessInfo:
    return ProcessInfo(
        pid=pid, name=title, title=title, worker_pid=pid, raylet_pid=RAYLET_PID, node_id=node_id
    )


def outsider(pid: int, name: str = "python") -> ProcessInfo:
    return ProcessInfo(pid=pid, name=name)


def actor(
    actor_id: str,
    pid: int,
    name: str = "SERVE_REPLICA::unet#federated-unet#k3x9",
    *,
    vram_mb: float = 0.0,
    gpu: float = 0.0,
    gpu_ids: Optional[list[int]] = None,
    node_id: str = NODE,
) -> ActorBooking:
    required = {"CPU": 1.0}
    if gpu:
        required["GPU"] = gpu
    if vram_mb:
        required["VRAM_MB"] = vram_mb
    return ActorBooking(
        actor_id=actor_id,
        node_id=node_id,
        pid=pid,
        name=name,
        class_name="ServeReplica:unet:federated-unet" if name.startswith("SERVE_REPLICA::") else "Replica",
        job_id="01000000",
        required=required,
        gpu_ids=[0] if gpu_ids is None and gpu else (gpu_ids or []),
    )


# Europa as the seed describes it: four federated-unet replicas of 5120 MB on an RTX 3090,
# one of them above its booking, and a notebook outside Ray holding memory too.
EUROPA_ACTORS = [
    actor("a1b2" + "0" * 28, 101, vram_mb=5120, gpu=0.01),
    actor("c3d4" + "0" * 28, 102, vram_mb=5120, gpu=0.01),
    actor("e5f6" + "0" * 28, 103, vram_mb=5120, gpu=0.01),
    actor("0789" + "0" * 28, 104, vram_mb=5120, gpu=0.01),
]


EUROPA_GPU = device(
    0,
    21.3,
    [gpu_process(101, 5.4), gpu_process(102, 4.9), gpu_process(103, 5.0), gpu_process(104, 4.8)],
)


EUROPA_PROCESSES = [worker(101), worker(102), worker(103), worker(104)]


def seed_with_gpus() -> tuple[ClusterStatus, str]:
    """The seed cluster, Europa's agent reporting its GPU processes: ``status --gpus`` lines."""
    europa_gpu = device(0, 22.5, [*(EUROPA_GPU.processes or []), gpu_process(7000, 1.2)])
    europa = NodeReport(
        node_id=NODE,
        collected_at=NOW - 2,
        raylet=SEED_REPORTS[NODE].report.raylet,
        host=SEED_REPORTS[NODE].report.host,
        gpus=[europa_gpu],
        processes=[*EUROPA_PROCESSES, outsider(7000, "jupyter-lab")],
    )
    reports = {**SEED_REPORTS, NODE: ReceivedReport(report=europa, received_at=NOW - 2)}
    status = merge(
        scheduler_nodes(SEED_VIEWS), reports, now=NOW, stale_after_s=15.0, view="head", sources=SEED_SOURCES
    )
    denbi = actor("d00d" + "0" * 28, 900, name="denbi-app", gpu=0.99, node_id=T4)
    attributed = attribute_cluster(status, {n: r.report for n, r in reports.items()}, [*EUROPA_ACTORS, denbi])
    lines = status_lines(attributed) + status_gpu_lines(attributed)
    return attributed, "\n".join(lines) + "\n"
