"""The segments of a GPU's booked lane on the page: one per actor, from the attribution of an
agent's NVML report, or from Ray's placement where no report names the device."""

from collections.abc import Sequence
from typing import NamedTuple, Optional

from rayscope.render.fmt import gib
from rayscope.render.gpus import user_label
from rayscope.schema.report import GpuDevice, GpuUser
from rayscope.schema.status import DeviceFree


class Segment(NamedTuple):
    """One booking on a device: who, and how much of its memory (MiB)."""

    hover: str
    mib: float


def user_hover(user: GpuUser) -> str:
    booked = []
    if user.booked_vram_mb:
        booked.append(f"{user.booked_vram_mb:.0f} MB VRAM_MB")
    if user.booked_gpu:
        booked.append(f"GPU {user.booked_gpu:.2f}")
    uses = "" if user.used_memory_bytes is None else f", uses {gib(user.used_memory_bytes)} GB"
    return f"{user_label(user)}: booked {' + '.join(booked) or 'nothing'}{uses}"


def actor_segments(users: Sequence[GpuUser], capacity: Optional[float], vram_node: bool) -> list[Segment]:
    """An actor's segment: its ``VRAM_MB`` here; on a node without ``VRAM_MB`` its fraction."""
    segments = []
    for user in users:
        if user.kind != "actor":
            continue
        if vram_node and user.booked_vram_mb:
            segments.append(Segment(user_hover(user), user.booked_vram_mb))
        elif not vram_node and user.booked_gpu and capacity:
            segments.append(Segment(user_hover(user), user.booked_gpu * capacity))
    return segments


def placed_segments(device: DeviceFree, capacity: Optional[float], vram_node: bool) -> list[Segment]:
    """Where no NVML report attributes the device: a segment per actor of Ray's placement
    (its id: names and use come with an agent's NVML report)."""
    segments = []
    for actor_id, gpu in sorted(device.actors.items()):
        vram = device.actor_vram_mb.get(actor_id, 0.0)
        booked = " + ".join([f"{vram:.0f} MB VRAM_MB"] * bool(vram) + [f"GPU {gpu:.2f}"] * bool(gpu))
        hover = f"actor {actor_id}: booked {booked or 'nothing'} (no NVML report: its name and use not known)"
        if vram_node and vram:
            segments.append(Segment(hover, vram))
        elif not vram_node and gpu and capacity:
            segments.append(Segment(hover, gpu * capacity))
    return segments


def gpu_users(gpu: GpuDevice) -> list[GpuUser]:
    if gpu.attribution is not None and gpu.attribution.users:
        return gpu.attribution.users
    return [u for mig in gpu.mig_devices if mig.attribution for u in mig.attribution.users]
