"""Per-device placement's scenarios: four A100s with UUIDs and PCI bus ids on one node, its
raylet's environment, and actors booked on devices (``gpu_shares`` as the GCS lists them)."""

from typing import Optional

from rayscope.core.gpu.placement import place_devices
from rayscope.schema.report import GpuDevice, RayletInfo, SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, ClusterTotals, NodeStatus
from tests.scenarios import a100_worker

NODE = "4a" * 28


GIB = 1024**3


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-5f1c-4d3e-9a7b-000000000000"


def gpu(index: int, bus: str, name: str = "NVIDIA A100-SXM4-40GB", used_gib: float = 1.0) -> GpuDevice:
    return GpuDevice(
        index=index,
        name=name,
        uuid=uuid(index),
        pci_bus_id=bus,
        memory_total_bytes=40 * GIB,
        memory_used_bytes=int(used_gib * GIB),
        processes=[],
    )


FOUR = [gpu(i, f"00000000:{0x17 + i * 0x10:02X}:00.0") for i in range(4)]


def raylet(visible: Optional[str], order: Optional[str] = None, read: bool = True) -> RayletInfo:
    return RayletInfo(
        pid=1,
        node_id=NODE,
        node_ip="10.0.0.9",
        cuda_visible_devices=visible,
        cuda_device_order=order,
        environ_read=read,
    )


def node(total_gpu: float, used_gpu: float, total_vram: float = 0.0, used_vram: float = 0.0) -> NodeStatus:
    return a100_worker(
        NODE,
        total_cpu=32,
        total_gpu=total_gpu,
        used_gpu=used_gpu,
        total_vram_mb=total_vram,
        used_vram_mb=used_vram,
    )


def booking(
    actor_id: str, shares: list[tuple[int, float]], vram_mb: float = 0.0, pid: int = 0
) -> ActorBooking:
    required = {"GPU": sum(q for _, q in shares)}
    if vram_mb:
        required["VRAM_MB"] = vram_mb
    return ActorBooking(
        actor_id=actor_id,
        node_id=NODE,
        pid=pid or None,
        name=actor_id,
        required=required,
        gpu_ids=[i for i, _ in shares],
        gpu_shares=shares,
    )


def fragmented_status(tasks_gpu: float = 0.0) -> ClusterStatus:
    """One 2-GPU node with a 0.6 replica on each device: 0.8 free by the node sum."""
    status = node(2, 1.2 + tasks_gpu)
    actors = [booking("a", [(0, 0.6)]), booking("b", [(1, 0.6)])]
    status.placement = place_devices(status, actors, raylet(None, "PCI_BUS_ID"), FOUR[:2])
    return ClusterStatus(
        generated_at=0.0,
        view="gcs",
        sources=[SourceStatus(name="gcs", ok=True)],
        cluster=ClusterTotals(),
        nodes={NODE: status},
    )
