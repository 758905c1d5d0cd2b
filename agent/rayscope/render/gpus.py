"""GPUs: bookings beside measured memory (``status --gpus``, ``node --gpus``)."""

from collections.abc import Mapping, Sequence
from typing import Optional

from rayscope.core.gpu.settled import settled_flags, settled_trusted
from rayscope.core.gpu.trust import settled_used
from rayscope.core.isolation import UNREADABLE, per_node
from rayscope.labels import printable_lines
from rayscope.render.fmt import gib, has_gpus, visible_nodes
from rayscope.schema.dashboard import DASHBOARD_SOURCE
from rayscope.schema.report import GpuDevice, GpuUser, known
from rayscope.schema.status import ClusterStatus, DeviceFree, NodeAttribution, NodeStatus
from rayscope.units import MIB

FULLER_BOOKED = 0.9
"""A device at least this booked (``GPU`` fraction, or ``VRAM_MB`` of its memory) ..."""
FULLER_THAN_NODE = 0.25
"""... and this much above the node's average gets its own line under the node's status."""

FLAG_WORDS = {
    "over_booking": "over booking",
    "unbooked": "unbooked",
    "booking_unknown": "booking unknown",
    "not_mapped": "not mapped",
    "actor_dead": "actor dead",
    "full": "full",
}


VIRTUALIZATION_WORDS = {
    "passthrough": "pass-through",
    "vgpu_guest": "vGPU guest",
    "host_vgpu": "vGPU host",
    "host_vsga": "vSGA host",
}
"""NVML's virtualization modes as a GPU's line names them; bare metal (``none``) says nothing,
any other value ``virtualization unknown`` (a report's own word is never printed)."""
COMPUTE_WORDS = {
    "exclusive_process": "exclusive process",
    "exclusive_thread": "exclusive thread",
    "prohibited": "compute prohibited",
}
"""Compute modes other than ``default`` as a GPU's line names them (else ``compute mode unknown``)."""


def mode_text(gpu: GpuDevice) -> str:
    """``  vGPU guest``, ``  exclusive process, MPS``: what kind of device this is, where it is
    not a plain GPU in the default compute mode (those lines read as they always did)."""
    words = []
    virtualization, compute = known(gpu.virtualization_mode), known(gpu.compute_mode)
    if virtualization not in (None, "none"):
        words.append(VIRTUALIZATION_WORDS.get(virtualization, "virtualization unknown"))
    if compute not in (None, "default"):
        words.append(COMPUTE_WORDS.get(compute, "compute mode unknown"))
    if known(gpu.mps_serving):
        words.append("MPS")
    return "  " + ", ".join(words) if words else ""


SOURCE_WORDS = {"cuda": "CUDA", DASHBOARD_SOURCE: "Ray dashboard"}
DASHBOARD_WORDS = (
    "measured by Ray's dashboard agent (no rayscope agent here): NVML's v1 used, reserved memory"
    " included; processes matched to actors by their worker pids"
)
"""What ``--gpus`` says under a node whose GPUs are Ray's dashboard's."""
"""How a GPU's line names a used figure that is not its agent's NVML read."""


def used_text(gpu: GpuDevice) -> tuple[str, str]:
    """(the used figure rayscope trusts, in GiB or ``NA``; what to say after it): ``""`` for
    NVML's where trusted, `` (CUDA, 3s old)`` for a CUDA sample's, `` (Ray dashboard, 3s
    old)`` for Ray's dashboard's, `` (NVML's 14.5 GB not trusted)`` where NVML's figure is
    not the device's."""
    figure = settled_used(gpu)  # the rollup's verdict (rayscope.core.gpu.settled), read
    if figure.source in SOURCE_WORDS:
        return gib(figure.used_bytes), f" ({SOURCE_WORDS[figure.source]}, {figure.age_s or 0.0:.0f}s old)"
    if settled_trusted(gpu):
        return gib(figure.used_bytes), ""
    raw = figure.nvml_used_bytes
    return gib(None), " (NVML not trusted)" if raw is None else f" (NVML's {gib(raw)} GB not trusted)"


def shared_text(gpu: GpuDevice, shared: Mapping[str, Sequence[str]]) -> str:
    """``  shared with 2 other nodes``: another node reports this GPU too (time-slicing)."""
    others = shared.get(gpu.uuid or "")
    return f"  shared with {_count(len(others), 'other node')}" if others else ""


def _flags_text(flags: Sequence[str]) -> str:
    return ("  " + ", ".join(FLAG_WORDS.get(f, f) for f in flags)) if flags else ""


def _errors_text(gpu: GpuDevice) -> str:
    if not gpu.errors:
        return ""
    return "  (" + "; ".join(f"{k}: {v}" for k, v in sorted(gpu.errors.items())) + ")"


def gpu_label(gpu: GpuDevice) -> str:
    """``GPU0``, or ``GPU0/MIG1`` for MIG instance 1 of GPU 0."""
    return f"GPU{gpu.index}" if gpu.parent_index is None else f"GPU{gpu.parent_index}/MIG{gpu.index}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def booked_text(gpu: GpuDevice) -> str:
    """``booked 20480 MB by 4 actors``: ``VRAM_MB`` where booked, else the ``GPU`` fraction
    (on a ``VRAM_MB`` node the fraction is a device handle, not the reservation)."""
    att = gpu.attribution
    if att is None:
        return "booked NA"
    users = att.users or [u for mig in gpu.mig_devices if mig.attribution for u in mig.attribution.users]
    return _booked_words(att.booked_vram_mb, users, att.booked_actors)


def _booked_words(vram_mb: Optional[float], users: Sequence[GpuUser], actors: int) -> str:
    """``booked 20480 MB + 0.33 GPU by 5 actors``: the ``GPU`` fraction counts only actors
    that booked no ``VRAM_MB``."""
    if vram_mb is None:
        return "booked NA"
    if actors == 0:
        return "booked nothing"
    fraction = sum(u.booked_gpu or 0.0 for u in users if u.kind == "actor" and not u.booked_vram_mb)
    parts = [f"{vram_mb:.0f} MB"] if vram_mb else []
    if fraction > 0:
        parts.append(f"{fraction:.2f} GPU")
    return f"booked {' + '.join(parts)} by {_count(actors, 'actor')}"


def gpu_booking_line(gpu: GpuDevice, shared: Mapping[str, Sequence[str]] = {}) -> str:
    """``GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 4 actors  used 21.3 GB  util 87%``;
    the device's kind after its name where it is not a plain GPU (``vGPU guest``)."""
    util = "NA" if gpu.utilization_gpu_pct is None else f"{gpu.utilization_gpu_pct}%"
    name = gpu.name or "NA"
    mig = "  MIG on" if gpu.mig_enabled else ""
    flags = _flags_text(gpu.attribution.flags) if gpu.attribution else ""
    flags += "  unhealthy" if settled_flags(gpu) else ""  # one flag; `node --gpus` says why
    flags += shared_text(gpu, shared)
    figure, note = used_text(gpu)
    used = f"used {figure} GB{note}"
    return (
        f"{gpu_label(gpu)} {name}{mig}{mode_text(gpu)}  {booked_text(gpu)}  {used}  util {util}"
        f"{flags}{_errors_text(gpu)}"
    )


def _watts(milliwatts: Optional[int]) -> str:
    return "NA" if milliwatts is None else f"{milliwatts / 1000:.0f}"


def gpu_details_line(gpu: GpuDevice) -> str:
    """``bus 00000000:01:00.0  temp 61 C  power 245/350 W  memory 21.3/24.0 GB, 0.3 GB reserved (v2)``."""
    figure, note = used_text(gpu)
    memory = f"memory {figure}/{gib(gpu.memory_total_bytes)} GB{note}"
    if gpu.memory_reserved_bytes is not None:
        memory += f", {gib(gpu.memory_reserved_bytes)} GB reserved"
    if gpu.memory_info_version is not None:
        memory += f" (v{gpu.memory_info_version})"
    if gpu.parent_index is not None:
        ids = f"GI {'NA' if gpu.gpu_instance_id is None else gpu.gpu_instance_id}"
        ids += f" CI {'NA' if gpu.compute_instance_id is None else gpu.compute_instance_id}"
        return f"{ids}  {memory}"
    temp = "NA" if gpu.temperature_c is None else f"{gpu.temperature_c}"
    power = f"power {_watts(gpu.power_draw_mw)}/{_watts(gpu.power_limit_mw)} W"
    return f"bus {gpu.pci_bus_id or 'NA'}  temp {temp} C  {power}  {memory}"


def user_label(user: GpuUser) -> str:
    """``federated-unet#a1b2`` (actor and its id's first 4 hex digits), ``ray::train pid 42``,
    ``pid 42 python``."""
    if user.kind == "actor" and user.actor_id:
        return f"{user.name}#{user.actor_id[:4]}"
    pids = ",".join(str(p) for p in user.pids)
    if user.kind == "ray worker":
        return f"{user.name or 'ray worker'} pid {pids}"
    return f"pid {pids} {user.name}".rstrip()


def _booking(user: GpuUser, actors_read: bool) -> str:
    """``5120 MB``, ``0.33 GPU``, ``nothing``; ``NA`` where the actor table was not read,
    ``unknown`` where it was and still says nothing of this holder (a task, a pid nobody
    could map)."""
    if user.booked_vram_mb is None or user.booked_gpu is None:
        return "unknown" if actors_read else "NA"
    if user.booked_vram_mb > 0:
        return f"{user.booked_vram_mb:.0f} MB"
    if user.booked_gpu > 0:
        return f"{user.booked_gpu:.2f} GPU"
    return "nothing"


def user_line(user: GpuUser, trusted: bool = True, actors_read: bool = True) -> str:
    """``federated-unet#a1b2 booked 5120 MB used 5.4 GB  over booking``; ``trusted=False``:
    the GPU's NVML figures are not the device's (a vGPU guest), and the line says so;
    ``actors_read``: whether the actor table was read (an unknown booking is ``NA`` if not)."""
    used = f"{gib(user.used_memory_bytes)} GB" + ("" if trusted else " (NVML, not trusted)")
    return f"{user_label(user)} booked {_booking(user, actors_read)} used {used}{_flags_text(user.flags)}"


def _read(gpu: GpuDevice) -> bool:
    """Whether the actor table was read for ``gpu``'s attribution (its booked sums are known)."""
    return gpu.attribution is not None and gpu.attribution.booked_gpu is not None


def node_attribution_lines(attribution: Optional[NodeAttribution], gpus: Sequence[GpuDevice]) -> list[str]:
    """What no single GPU line shows: a full device hidden by the node-wide ``VRAM_MB``, and
    actors that booked a GPU but are on none."""
    if attribution is None:
        return []
    lines = []
    if len(gpus) > 1:
        users = [
            u
            for leaf in gpus
            for g in (leaf.mig_devices or [leaf])
            if g.attribution
            for u in g.attribution.users
        ]
        booked = _booked_words(attribution.booked_vram_mb, users, attribution.booked_actors)
        mapped = attribution.processes_mapped
        actors_use = gib(attribution.actors_used_bytes if mapped and attribution.actors_read else None)
        unbooked = gib(attribution.unbooked_bytes if mapped else None)
        unmapped = f"  not mapped {gib(attribution.unmapped_bytes)} GB" if attribution.unmapped_bytes else ""
        lines.append(f"all GPUs: {booked}  actors use {actors_use} GB  unbooked {unbooked} GB{unmapped}")
    if "hidden_full" in attribution.flags:
        full = []
        for gpu in gpus:
            att = gpu.attribution
            if gpu.index in attribution.full_gpus and att is not None:
                full.append(f"GPU{gpu.index} ({att.booked_vram_mb or 0:.0f}/{att.capacity_mb or 0:.0f} MB)")
        node = f"{attribution.node_used_vram_mb:.0f}/{attribution.node_total_vram_mb:.0f} MB"
        lines.append(f"VRAM_MB booked node-wide {node} hides a full device: {', '.join(full)}")
    lines += [f"on no GPU: {user_line(u)}" for u in attribution.off_gpu]
    return lines


def gpu_block_lines(
    gpus: Sequence[GpuDevice],
    attribution: Optional[NodeAttribution],
    details: bool = False,
    shared: Mapping[str, Sequence[str]] = {},
) -> list[str]:
    """Per GPU its booking line, (details,) then one line per actor or process on it.
    ``shared``: UUID → the other nodes that report the same GPU."""
    lines: list[str] = []
    for gpu in gpus:
        trusted = settled_trusted(gpu)
        lines.append(gpu_booking_line(gpu, shared))
        if details and "device" not in gpu.errors:
            lines.append("  " + gpu_details_line(gpu))
        if details and settled_flags(gpu):
            lines.append("  health: " + "; ".join(settled_flags(gpu)))
        for mig in gpu.mig_devices:
            lines.append("  " + gpu_booking_line(mig))
            if details:
                lines.append("    " + gpu_details_line(mig))
            users = mig.attribution.users if mig.attribution else []
            lines += ["    " + user_line(u, trusted, _read(mig)) for u in users]
        users = gpu.attribution.users if gpu.attribution else []
        lines += ["  " + user_line(u, trusted, _read(gpu)) for u in users]
    return lines + node_attribution_lines(attribution, gpus)


def device_label(device: DeviceFree) -> str:
    """``GPU1 GPU-00000001-...``: NVML's index and UUID; Ray's id and entry when unmatched."""
    if device.nvml_index is not None:
        return f"GPU{device.nvml_index} {device.uuid or 'NA'}"
    return f"Ray GPU {device.gpu_id} ({device.visible_id})"


def device_line(device: DeviceFree) -> str:
    """``GPU1 GPU-00000001-...  booked 0.75 GPU + 30720 MiB VRAM_MB by 2 actors, 0.25 free
    used 3.0/40.0 GB``: Ray's placement on one device beside NVML's memory."""
    booked = f"booked {device.booked_gpu:.2f} GPU"
    if device.booked_vram_mb:
        booked += f" + {device.booked_vram_mb:.0f} MiB VRAM_MB"
    booked += f" by {_count(len(device.actors), 'actor')}, {device.free_gpu:.2f} free"
    used = f"used {gib(device.memory_used_bytes)}/{gib(device.memory_total_bytes)} GB"
    unmatched = f"  ({device.mapping})" if device.nvml_index is None and device.mapping else ""
    return f"{device_label(device)}  {booked}  {used}{unmatched}"


def _device_vram_share(device: DeviceFree, node: NodeStatus) -> Optional[float]:
    if node.total_vram_mb <= 0:
        return None
    if device.memory_total_bytes:
        return device.booked_vram_mb / (device.memory_total_bytes / MIB)
    return device.booked_vram_mb / (node.total_vram_mb / max(node.total_gpu, 1.0))


def fuller_devices(node: NodeStatus) -> list[DeviceFree]:
    """Devices of a multi-GPU node much fuller than the node's sums suggest: at least 90%
    booked (``GPU``, or ``VRAM_MB`` of the device's memory) and 25 points above the node."""
    if node.placement is None or node.total_gpu <= 1:
        return []
    node_gpu = node.used_gpu / node.total_gpu
    node_vram = node.used_vram_mb / node.total_vram_mb if node.total_vram_mb > 0 else 0.0
    fuller = []
    for device in node.placement.devices:
        vram = _device_vram_share(device, node)
        by_gpu = device.booked_gpu >= FULLER_BOOKED and device.booked_gpu - node_gpu >= FULLER_THAN_NODE
        by_vram = vram is not None and vram >= FULLER_BOOKED and vram - node_vram >= FULLER_THAN_NODE
        if by_gpu or by_vram:
            fuller.append(device)
    return fuller


def placement_lines(node: NodeStatus) -> list[str]:
    """``--gpus``: Ray's placement on every device of a multi-GPU node (on one GPU the node's
    own numbers are the device's), and what it cannot say."""
    placement = node.placement
    if placement is None or node.total_gpu <= 1:
        return []
    lines = ["Ray's placement per device (actor table):"]
    lines += ["  " + device_line(d) for d in placement.devices]
    if node.total_vram_mb > 0 and node.total_gpu > 1:
        lines.append(
            f"VRAM_MB is booked node-wide on {node.total_gpu:.0f} GPUs: Ray binds it to no device;"
            " per device above by the actors' placement"
        )
    if placement.unplaced_gpu > 0:
        lines.append(f"{placement.unplaced_gpu:.2f} GPU booked by tasks: device not known (booking unknown)")
    return lines


@per_node
def status_gpu_lines(status: ClusterStatus, include_dead: bool = False) -> list[str]:
    """``status --gpus``: after the status, per GPU node its GPUs, bookings and processes."""
    lines: list[str] = []
    for node in visible_nodes(status, include_dead):
        if not has_gpus(node):
            continue
        role = "[HEAD]" if node.head else "[worker]"
        lines += ["", f"GPUs of {node.node_ip or node.hostname or ''} {role} {node.node_id[:12]}:"]
        if known(node.gpus_source) == DASHBOARD_SOURCE:
            lines.append(f"  {DASHBOARD_WORDS}")
        if known(node.unreadable) is not None:
            lines.append(f"  {UNREADABLE}: {known(node.unreadable)}")
        elif node.gpus is None:
            lines.append("  NA: no NVML report for this node")
        elif not node.gpus:
            lines.append("  none: NVML found no GPU")
        else:
            shared = node.shared_gpus if isinstance(node.shared_gpus, dict) else {}
            lines += ["  " + line for line in gpu_block_lines(node.gpus, node.attribution, shared=shared)]
        lines += ["  " + line for line in placement_lines(node)]
    return printable_lines(lines)
