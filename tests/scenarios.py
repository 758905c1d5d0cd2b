"""Recorded cluster states for the pure tests and the golden files.

``seed`` is the cluster of the status example in docs/architecture.md (Europa head booked by VRAM_MB, a T4
worker booked by fraction, a CPU-only worker), every node reporting to a head agent.
``mixed`` is what goes wrong in real clusters: a stale agent, a node without agent, an
agent whose node the scheduler does not know, a dead node, a lost GPU.
"""

import json
import math
from pathlib import Path
from typing import Optional

import msgspec

from rayscope.core.capacity import pending
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.schema.dashboard import DashboardGpu, DashboardNode, DashboardProcess, DashboardRead
from rayscope.schema.node import NodeDiagnostics
from rayscope.schema.pending import PendingRead
from rayscope.schema.report import GpuDevice, GpuProcess, HostInfo, NodeReport, RayletInfo, SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeStatus, RayNode, ReceivedReport

DATA = Path(__file__).resolve().parent / "data"
NOW = 1_796_000_000.0
GIB = 1024**3
RTX_3090_BYTES = 24 * GIB

EUROPA = "e0" * 28
T4 = "a5" * 28
CPU = "c7" * 28
DEAD = "de" * 28
UNKNOWN = "99" * 28
NO_AGENT = "0a" * 28


def recorded_gcs_nodes() -> list[RayNode]:
    """``gcs_read.read_nodes`` on the live seed topology (Ray 2.60.0), as recorded."""
    raw = json.loads((DATA / "gcs_seed_nodes.json").read_text())["nodes"]
    return msgspec.convert(raw, list[RayNode])


def recorded_raylet_argv(name: str) -> list[str]:
    argv: list[str] = json.loads((DATA / f"raylet_cmdline_{name}.json").read_text())["argv"]
    return argv


def view(
    node_id: str,
    ip: str,
    total: dict[str, float],
    available: Optional[dict[str, float]],
    *,
    alive: bool = True,
) -> RayNode:
    resources = {f"node:{ip}": 1.0, **total}
    return RayNode(
        node_id=node_id,
        node_ip=ip,
        hostname=f"host-{ip}",
        is_head="node:__internal_head__" in total,
        alive=alive,
        total=resources,
        available=None if available is None else {f"node:{ip}": 1.0, **available},
    )


def gpu(index: int, used_gib: float, name: str = "NVIDIA GeForce RTX 3090") -> GpuDevice:
    return GpuDevice(
        index=index,
        name=name,
        uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
        memory_total_bytes=RTX_3090_BYTES,
        memory_used_bytes=int(used_gib * GIB),
        memory_info_version=2,
        utilization_gpu_pct=87,
    )


def report(node_id: str, gpus: Optional[list[GpuDevice]], ip: str, *, age_s: float = 2.0) -> ReceivedReport:
    sources = [SourceStatus(name="nvml", ok=gpus is not None), SourceStatus(name="host", ok=True)]
    body = NodeReport(
        node_id=node_id,
        collected_at=NOW - age_s,
        raylet=RayletInfo(pid=4242, node_id=node_id, node_ip=ip),
        host=HostInfo(hostname=f"host-{ip}", cpu_count=16),
        driver_version="550.54.14" if gpus is not None else None,
        gpus=gpus,
        sources=sources,
    )
    return ReceivedReport(report=body, received_at=NOW - age_s)


GB = 1e9
SEED_VIEWS = [
    view(
        EUROPA,
        "172.17.0.3",
        {"CPU": 8, "GPU": 1, "VRAM_MB": 24576, "accelerator_type:G": 1, "node:__internal_head__": 1,
         "memory": 32 * GB, "object_store_memory": 4 * GB},
        {"GPU": 0.96, "VRAM_MB": 4096, "accelerator_type:G": 1, "node:__internal_head__": 1,
         "memory": 32 * GB, "object_store_memory": 4 * GB},
    ),
    view(
        T4,
        "10.0.0.5",
        {"CPU": 8, "GPU": 1, "accelerator_type:T4": 1, "memory": 16 * GB, "object_store_memory": 2 * GB},
        {"CPU": 2, "GPU": 0.01, "accelerator_type:T4": 1, "memory": 12 * GB, "object_store_memory": 2 * GB},
    ),
    view(
        CPU,
        "10.0.0.7",
        {"CPU": 16, "memory": 64 * GB, "object_store_memory": 8 * GB, "slurm_job_id:8812": 1},
        {"CPU": 14, "memory": 64 * GB, "object_store_memory": 7 * GB, "slurm_job_id:8812": 1},
    ),
]  # fmt: skip
SEED_REPORTS = {
    EUROPA: report(EUROPA, [gpu(0, 5.8)], "172.17.0.3"),
    T4: report(T4, [gpu(0, 5.8, "Tesla T4")], "10.0.0.5"),
    CPU: report(CPU, [], "10.0.0.7"),
}


def head_view(
    views: list[RayNode], reports: dict[str, ReceivedReport], gcs: str = "172.17.0.3:6379"
) -> ClusterStatus:
    """The rollup a head agent serves at ``NOW`` (interval 5 s: stale after 15 s)."""
    return merge(
        scheduler_nodes(views),
        reports,
        now=NOW,
        stale_after_s=15.0,
        view="head",
        gcs_address=gcs,
        sources=[SourceStatus(name="gcs", ok=True, detail=gcs)],
        scheduler_read_at=NOW - 1.0,
    )


def seed_status() -> ClusterStatus:
    """The example cluster of docs/architecture.md, every node's agent reporting."""
    return head_view(SEED_VIEWS, SEED_REPORTS)


def mixed_status() -> ClusterStatus:
    """A cluster with every kind of missing data."""
    views = [
        *SEED_VIEWS,
        view(DEAD, "10.0.0.9", {"CPU": 4, "GPU": 1, "accelerator_type:T4": 1}, None, alive=False),
        view(NO_AGENT, "10.0.0.11", {"CPU": 4, "GPU": 2, "accelerator_type:A100": 1}, {"CPU": 4, "GPU": 1.5}),
    ]
    lost = GpuDevice(index=1, errors={"device": "GPU is lost"})
    reports = {
        EUROPA: report(EUROPA, [gpu(0, 5.8), lost], "172.17.0.3"),
        T4: report(T4, [gpu(0, 3.1, "Tesla T4")], "10.0.0.5", age_s=42.0),
        CPU: report(CPU, [], "10.0.0.7"),
        UNKNOWN: report(UNKNOWN, None, "10.0.0.12"),
    }
    return head_view(views, reports)


def seed_node_diagnostics() -> NodeDiagnostics:
    """``rayscope node`` on the Europa head: the recorded raylet, one RTX 3090."""
    from rayscope.sources.raylet import parse_raylet_cmdline

    raylet = parse_raylet_cmdline(recorded_raylet_argv("head"), pid=4471)
    assert raylet is not None
    status = seed_status()
    return NodeDiagnostics(
        generated_at=NOW,
        gcs_address=raylet.gcs_address,
        raylets=[raylet],
        host=HostInfo(
            hostname="bioengine-worker-europa",
            cpu_count=8,
            load_1m=3.1,
            load_5m=2.9,
            load_15m=2.8,
            memory_total_bytes=32 * GIB,
            memory_available_bytes=20 * GIB,
        ),
        driver_version="550.54.14",
        gpus=[gpu(0, 5.8)],
        booking={raylet.node_id: msgspec.structs.replace(status.nodes[EUROPA], node_id=raylet.node_id)},
        sources=[
            SourceStatus(name="raylet", ok=True),
            SourceStatus(name="gcs", ok=True),
            SourceStatus(name="nvml", ok=True, detail="1 GPU(s), memory info v2"),
            SourceStatus(name="host", ok=True),
        ],
    )


# --- rayscope fit: recorded states a head agent (or this host's NVML) would produce --------

MIB = 1024**2
T4_MIB = 15360  # what NVML reports as a Tesla T4's memory.total
A100_MIB = 40960
A100 = "a1" * 28


def gpu_mib(index: int, total_mib: int, used_mib: int, name: str) -> GpuDevice:
    return GpuDevice(
        index=index,
        name=name,
        uuid=f"GPU-{index:08x}-1111-1111-1111-111111111111",
        memory_total_bytes=total_mib * MIB,
        memory_used_bytes=used_mib * MIB,
        memory_info_version=2,
        utilization_gpu_pct=40,
    )


def busy_gpu_status() -> ClusterStatus:
    """The seed's cluster, but Europa's RTX 3090 is nearly full by NVML (22.8 of 24 GB used:
    something outside Ray's booking holds memory) while VRAM_MB still has 4096 MB free."""
    reports = {
        **SEED_REPORTS,
        EUROPA: report(EUROPA, [gpu(0, 22.8)], "172.17.0.3"),
    }
    return head_view(SEED_VIEWS, reports)


def fraction_status() -> ClusterStatus:
    """A cluster without VRAM_MB (deNBI-like): a T4 node 0.33 booked and a two-A100 node
    with 1.5 GPUs free, every agent reporting NVML. The smallest GPU is the T4's 15360 MB."""
    views = [
        view(
            T4,
            "10.0.0.5",
            {"CPU": 8, "GPU": 1, "accelerator_type:T4": 1, "node:__internal_head__": 1, "memory": 16 * GB},
            {"CPU": 7, "GPU": 0.67, "accelerator_type:T4": 1, "node:__internal_head__": 1, "memory": 16 * GB},
        ),
        view(
            A100,
            "10.0.0.6",
            {"CPU": 32, "GPU": 2, "accelerator_type:A100": 1, "memory": 128 * GB},
            {"CPU": 30, "GPU": 1.5, "accelerator_type:A100": 1, "memory": 128 * GB},
        ),
        view(CPU, "10.0.0.7", {"CPU": 16, "memory": 64 * GB}, {"CPU": 16, "memory": 64 * GB}),
    ]
    reports = {
        T4: report(T4, [gpu_mib(0, T4_MIB, 5000, "Tesla T4")], "10.0.0.5"),
        A100: report(
            A100,
            [
                gpu_mib(0, A100_MIB, 20000, "NVIDIA A100-SXM4-40GB"),
                gpu_mib(1, A100_MIB, 2000, "NVIDIA A100-SXM4-40GB"),
            ],
            "10.0.0.6",
        ),
        CPU: report(CPU, [], "10.0.0.7"),
    }
    return head_view(views, reports, gcs="10.0.0.5:6379")


def embedded_seed_status() -> ClusterStatus:
    """The seed's scheduler view as ``status`` reads it without a head agent, on a host
    where no raylet of the cluster runs: no node has NVML numbers."""
    return merge(
        scheduler_nodes(SEED_VIEWS),
        {},
        now=NOW,
        stale_after_s=float("inf"),
        view="gcs",
        gcs_address="172.17.0.3:6379",
        sources=[SourceStatus(name="gcs", ok=True, detail="172.17.0.3:6379")],
    )


def recorded_pending_read() -> tuple[list[RayNode], PendingRead]:
    """``gcs_read.py ADDRESS TIMEOUT pending`` on the live ``pending`` topology (Ray 2.60.0),
    as recorded with the waiting actors and placement group of tests/test_live_pending.py."""
    raw = json.loads((DATA / "gcs_pending_read.json").read_text())
    return msgspec.convert(raw["nodes"], list[RayNode]), msgspec.convert(raw["pending"], PendingRead)


def embedded_pending(nodes: list[RayNode], read: PendingRead) -> ClusterStatus:
    """The embedded status of ``nodes`` (no agent reports) with ``read``'s waiting demand
    attached; the GCS's node and pending reads both answered."""
    status = merge(
        scheduler_nodes(nodes),
        {},
        now=NOW,
        stale_after_s=math.inf,
        view="gcs",
        sources=[SourceStatus(name="gcs", ok=True), SourceStatus(name="gcs_pending", ok=True)],
    )
    return pending.attach(status, read)


def pending_status() -> ClusterStatus:
    """The embedded status of the recorded pending cluster: a fragmented 2-GPU node, a full
    VRAM_MB node, an accelerator type nobody has, a placement group that cannot be placed."""
    nodes, read = recorded_pending_read()
    return embedded_pending(nodes, read)


def labels_pending_status() -> ClusterStatus:
    """The embedded status of a recorded labelled cluster (Ray 2.60.0, tests/test_live_labels.py:
    head ``zone=a`` with 24576 MB of ``VRAM_MB``, a node ``zone=b`` with 16384 MB) and the
    demand that waits there on its label selectors."""
    raw = json.loads((DATA / "gcs_labels_read.json").read_text())
    nodes, read = msgspec.convert(raw["nodes"], list[RayNode]), msgspec.convert(raw["pending"], PendingRead)
    return embedded_pending(nodes, read)


def a100_worker(node_id: str, **fields: object) -> NodeStatus:
    """A bare worker node at 10.0.0.9 (A100s, nothing booked, NVML not reported), with
    ``fields`` replaced: the node the per-GPU unit tests start from."""
    base = NodeStatus(
        node_ip="10.0.0.9",
        head=False,
        total_cpu=8,
        used_cpu=0,
        total_gpu=1,
        used_gpu=0,
        total_gpu_memory="NA",
        used_gpu_memory="NA",
        total_vram_mb=0,
        used_vram_mb=0,
        total_memory=0,
        used_memory=0,
        total_object_store_memory=0,
        used_object_store_memory=0,
        accelerator_type="A100",
        slurm_job_id=None,
        node_id=node_id,
    )
    return msgspec.structs.replace(base, **fields)


# --- virtual and shared GPUs: what node agents report, settled as they settle it -----

VGPU = "a4" * 28
PASSTHROUGH = "9a" * 28
HOST_VGPU = "40" * 28
MPS = "35" * 28
SLICE_A, SLICE_B = "5a" * 28, "5b" * 28
A40_16C_BYTES = 16 * GIB
T4_BYTES = T4_MIB * MIB


def virtual_gpu(index: int, name: str, total: int, nvml_used: int, mode: str, **fields: object) -> GpuDevice:
    """A GPU as ``rayscope.sources.nvml.devices`` reads it on a driver that reports its mode (NVML's own
    used figure, not yet judged)."""
    base = GpuDevice(
        index=index,
        name=name,
        uuid=f"GPU-{index:08x}-2020-2020-2020-{name.encode().hex()[-12:]:0>12}",
        pci_bus_id=f"00000000:{0x41 + index:02X}:00.0",
        memory_total_bytes=total,
        memory_used_bytes=nvml_used,
        nvml_memory_used_bytes=nvml_used,
        memory_info_version=2,
        utilization_gpu_pct=0,
        virtualization_mode=mode,
        compute_mode="default",
        processes=[],
        process_list_version=3,
        mps_serving=False,
    )
    return msgspec.structs.replace(base, **fields)


def virtual_status(cuda_age_s: Optional[float] = None) -> ClusterStatus:
    """Six nodes, every agent reporting: a vGPU guest (an idle A40-16C slice whose NVML claims
    14.5 of 16 GiB used; with ``cuda_age_s``, a CUDA sample that old says 0.8 GiB), a
    pass-through A100, a vGPU host's A40, an MPS server in exclusive-process mode with two
    clients, and two Ray nodes time-slicing one T4 (the same UUID in both reports)."""
    from rayscope.core.gpu.trust import CudaFigure, settle_on_agent

    slice_of_a40 = virtual_gpu(0, "NVIDIA A40-16C", A40_16C_BYTES, int(14.5 * GIB), "vgpu_guest")
    cuda = None if cuda_age_s is None else CudaFigure(int(0.8 * GIB), cuda_age_s, "")
    mps_gpu = virtual_gpu(
        0,
        "NVIDIA GeForce RTX 3090",
        RTX_3090_BYTES,
        6 * GIB,
        "none",
        compute_mode="exclusive_process",
        mps_serving=True,
        processes=[
            GpuProcess(pid=3001, used_memory_bytes=int(0.4 * GIB), kinds=["compute"]),
            GpuProcess(pid=3002, used_memory_bytes=3 * GIB, kinds=["mps"]),
            GpuProcess(pid=3003, used_memory_bytes=2 * GIB, kinds=["mps"]),
        ],
    )
    sliced = virtual_gpu(0, "Tesla T4", T4_BYTES, 3 * GIB, "none")
    gpus = {
        VGPU: [settle_on_agent(slice_of_a40, cuda, 120.0) if cuda else settle_on_agent(slice_of_a40)],
        PASSTHROUGH: [
            settle_on_agent(virtual_gpu(0, "NVIDIA A100-SXM4-40GB", A100_MIB * MIB, 6 * GIB, "passthrough"))
        ],
        HOST_VGPU: [settle_on_agent(virtual_gpu(0, "NVIDIA A40", 48 * GIB, 32 * GIB, "host_vgpu"))],
        MPS: [settle_on_agent(mps_gpu)],
        SLICE_A: [settle_on_agent(sliced)],
        SLICE_B: [settle_on_agent(msgspec.structs.replace(sliced, nvml_memory_used_bytes=int(3.1 * GIB)))],
    }
    accelerators = {
        VGPU: "A40",
        PASSTHROUGH: "A100",
        HOST_VGPU: "A40",
        MPS: "G",
        SLICE_A: "T4",
        SLICE_B: "T4",
    }
    views = []
    reports = {}
    for i, (node_id, node_gpus) in enumerate(gpus.items()):
        ip = f"10.0.2.{i + 1}"
        total = {"CPU": 8, "GPU": 1, f"accelerator_type:{accelerators[node_id]}": 1, "memory": 32 * GB}
        free = {"CPU": 8, "GPU": 1, f"accelerator_type:{accelerators[node_id]}": 1, "memory": 32 * GB}
        if node_id == VGPU:
            total.update({"node:__internal_head__": 1, "VRAM_MB": 16384})
            free.update({"node:__internal_head__": 1, "VRAM_MB": 12288, "GPU": 0.99})
        views.append(view(node_id, ip, total, free))
        reports[node_id] = report(node_id, node_gpus, ip)
    return head_view(views, reports, gcs="10.0.2.1:6379")


def vgpu_node_diagnostics(cuda_age_s: Optional[float] = None) -> NodeDiagnostics:
    """``rayscope node --gpus`` on the vGPU guest of :func:`virtual_status`."""
    status = virtual_status(cuda_age_s)
    node = status.nodes[VGPU]
    return NodeDiagnostics(
        generated_at=NOW,
        gcs_address="10.0.2.1:6379",
        raylets=[RayletInfo(pid=4242, node_id=VGPU, node_ip="10.0.2.1", is_head=True)],
        host=HostInfo(hostname="denbi-vgpu-1", cpu_count=8),
        driver_version="550.54.15",
        gpus=node.gpus,
        booking={VGPU: node},
        sources=[SourceStatus(name="raylet", ok=True), SourceStatus(name="nvml", ok=True)],
    )


# --- Ray's dashboard: nodes no agent measures, as its summary gives them ------------

VGPU_WORKER = "a6" * 28
SILENT = "5e" * 28
LATE = "1a" * 28
APP_PID = 4711


def dashboard_gpu(name: str, total_mib: int, used_mib: int, processes: dict[int, int]) -> DashboardGpu:
    """One GPU of the summary as ``rayscope.sources.dashboard`` parses it (MiB → bytes)."""
    return DashboardGpu(
        index=0,
        uuid=f"GPU-{name.encode().hex()[-8:]:0>8}-dash-0000-0000-000000000000",
        name=name,
        memory_total_bytes=total_mib * MIB,
        memory_used_bytes=used_mib * MIB,
        processes=[DashboardProcess(pid=pid, used_memory_bytes=mib * MIB) for pid, mib in processes.items()],
        processes_believed=True,
    )


def dashboard_read(ok: bool = True, extra: Optional[dict[str, DashboardNode]] = None) -> DashboardRead:
    """Ray 2.60's dashboard on the seed: the T4 worker 3.4 s ago (deNBI's app, pid
    :data:`APP_PID`, holding 4.2 GiB; a process outside Ray 0.2 GiB), the CPU node with no
    GPU; ``ok=False``: a dashboard that did not answer."""
    if not ok:
        reason = "the Ray dashboard at http://172.17.0.3:8265 answered HTTP 500: Internal Server Error"
        return DashboardRead(status=SourceStatus(name="dashboard", ok=False, reason=reason))
    nodes = {
        T4: DashboardNode(
            node_id=T4,
            node_ip="10.0.0.5",
            measured_at=NOW - 3.4,
            gpus=[dashboard_gpu("Tesla T4", T4_MIB, 4915, {APP_PID: 4300, 9001: 204})],
        ),
        CPU: DashboardNode(node_id=CPU, node_ip="10.0.0.7", measured_at=NOW - 3.4, gpus=[]),
        **(extra or {}),
    }
    detail = f"http://172.17.0.3:8265: {len(nodes)} node(s); address from GCS"
    return DashboardRead(nodes=nodes, status=SourceStatus(name="dashboard", ok=True, detail=detail))


DASHBOARD_ACTORS = [
    ActorBooking(
        actor_id="d1" * 16,
        node_id=T4,
        pid=APP_PID,
        name="denbi-app",
        class_name="Replica",
        job_id="01000000",
        required={"GPU": 0.33, "CPU": 1},
        gpu_ids=[0],
        gpu_shares=[(0, 0.33)],
    )
]


def dashboard_status(
    read: Optional[DashboardRead] = None,
    views: Optional[list[RayNode]] = None,
    gpus: bool = False,
    asked: bool = True,
) -> ClusterStatus:
    """``status`` without a head agent on Europa's host (its NVML read here), the seed's
    other nodes from Ray's dashboard (``read``, by default :func:`dashboard_read`; ``asked``
    false: not read, as before this); ``gpus``: attributed as ``status --gpus``
    attributes them (the actor table: :data:`DASHBOARD_ACTORS`)."""
    from rayscope.core.gpu.attribution import attribute_cluster

    local = report(EUROPA, [gpu(0, 18.8)], "172.17.0.3", age_s=0.0)
    local.local = True
    status = merge(
        scheduler_nodes(views or SEED_VIEWS),
        {EUROPA: local},
        now=NOW,
        stale_after_s=math.inf,
        view="gcs",
        gcs_address="172.17.0.3:6379",
        sources=[SourceStatus(name="gcs", ok=True, detail="172.17.0.3:6379")],
        scheduler_read_at=NOW,
        dashboard=None if not asked else (dashboard_read() if read is None else read),
    )
    if not gpus:
        return status
    return attribute_cluster(status, {EUROPA: local.report}, DASHBOARD_ACTORS, {EUROPA: {EUROPA}}, {})


def dashboard_edges_status() -> ClusterStatus:
    """What rule 3 says, beside the seed: a vGPU guest named by its profile (``NVIDIA
    A40-16C``, NVML's 14.5 GiB not trusted), a node whose dashboard figure is 75 s old, one
    whose dashboard agent has not reported yet, and one the summary does not list."""
    a100: dict[str, float] = {"CPU": 8, "GPU": 1, "accelerator_type:A100": 1}
    views = [
        *SEED_VIEWS,
        view(VGPU_WORKER, "10.0.0.21", {"CPU": 8, "GPU": 1, "accelerator_type:A40": 1}, {"CPU": 8, "GPU": 1}),
        view(LATE, "10.0.0.22", a100, {"CPU": 8, "GPU": 1}),
        view(SILENT, "10.0.0.23", a100, {"CPU": 8, "GPU": 1}),
        view(NO_AGENT, "10.0.0.24", a100, {"CPU": 8, "GPU": 1}),
    ]
    extra = {
        VGPU_WORKER: DashboardNode(
            node_id=VGPU_WORKER,
            measured_at=NOW - 2.0,
            gpus=[dashboard_gpu("NVIDIA A40-16C", 16384, 14848, {})],
        ),
        LATE: DashboardNode(
            node_id=LATE,
            measured_at=NOW - 75.0,
            gpus=[dashboard_gpu("NVIDIA A100-SXM4-40GB", 40960, 6144, {})],
        ),
        SILENT: DashboardNode(node_id=SILENT),
    }
    return dashboard_status(dashboard_read(extra=extra), views)
