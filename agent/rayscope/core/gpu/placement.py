"""Which physical GPU each booking sits on: Ray's own per-device placement, pure.

Ray keeps one ``GPU`` number per node, but it hands every worker specific GPU ids and a
fraction must fit on a single device. The GCS actor table records, per actor, the ids it
holds and how much of each (``resource_mapping``, read by ``sources/gcs_read``). This module
turns that into one :class:`DeviceFree` per device of a node, and matches Ray's ids to NVML
devices.

Ray's GPU id *i* is the *i*-th entry of the raylet's ``CUDA_VISIBLE_DEVICES`` (all GPUs when
unset). An entry is an index or a UUID (``GPU-…``, a prefix is enough for CUDA):

* a UUID names its device: matched by NVML UUID prefix, unambiguous when one device matches;
* an index counts in CUDA's order. ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: PCI bus order, which
  NVML's bus ids give exactly. CUDA's default is "fastest first" (the rest unspecified): on a
  node whose GPUs are all one model that is PCI bus order in practice, and said so on the
  device; on a node mixing models it is ambiguous, and the device stays unmatched.

``VRAM_MB`` is a node-wide resource: Ray never binds it to a device. A device's
``booked_vram_mb`` is the ``VRAM_MB`` of the actors placed on it by their ``GPU`` ids.
"""

from collections.abc import Mapping, Sequence
from typing import Optional

from rayscope.core.gpu.trust import settled_used
from rayscope.schema.report import GpuDevice, RayletInfo
from rayscope.schema.status import ActorBooking, DeviceFree, NodePlacement, NodeStatus
from rayscope.units import RAY_UNITS_PER_ONE, is_count, parse_count, ray_round

PCI_BUS_ID = "PCI_BUS_ID"
EPSILON = 1 / RAY_UNITS_PER_ONE
"""One of Ray's resource units: a smaller remainder is float noise."""


def visible_entries(text: Optional[str]) -> Optional[list[str]]:
    """``CUDA_VISIBLE_DEVICES`` as a list of entries; ``None`` when unset."""
    if text is None:
        return None
    return [e.strip() for e in text.split(",") if e.strip()]


def _by_uuid(entry: str, gpus: Sequence[GpuDevice]) -> tuple[Optional[GpuDevice], str]:
    every = [d for gpu in gpus for d in [gpu, *gpu.mig_devices]]
    candidates = [d for d in every if d.uuid and d.uuid.startswith(entry)]
    if len(candidates) == 1:
        return candidates[0], f"UUID {entry}"
    if not candidates:
        return None, f"ambiguous: no NVML device has UUID {entry}"
    return None, f"ambiguous: {len(candidates)} NVML devices match UUID prefix {entry}"


def _by_index(index: int, order: Optional[str], gpus: Sequence[GpuDevice]) -> tuple[Optional[GpuDevice], str]:
    if index < 0 or index >= len(gpus):
        return None, f"ambiguous: CUDA index {index} but NVML lists {len(gpus)} GPU(s)"
    if any(g.pci_bus_id is None for g in gpus):
        return None, "ambiguous: NVML gave no PCI bus id for every GPU, CUDA's order unknown"
    by_bus = sorted(gpus, key=lambda g: (g.pci_bus_id or "").lower())
    if order == PCI_BUS_ID:
        return by_bus[index], f"CUDA index {index}, PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)"
    if len(gpus) == 1:
        return by_bus[0], "the only GPU"
    models = sorted({g.name or "?" for g in gpus})
    if len(models) > 1:
        return None, (
            f"ambiguous: CUDA index {index} in CUDA's fastest-first order on mixed GPUs"
            f" ({', '.join(models)}): set CUDA_DEVICE_ORDER=PCI_BUS_ID on the raylet"
        )
    return by_bus[index], f"CUDA index {index}, fastest-first order, one GPU model: PCI bus order"


def match_visible(
    count: int, raylet: Optional[RayletInfo], gpus: Optional[Sequence[GpuDevice]]
) -> list[tuple[str, Optional[GpuDevice], str]]:
    """Per Ray GPU id ``0..count-1``: (what ``ray.get_gpu_ids()`` says, the NVML device or
    ``None``, how it was matched or why not)."""
    entries = visible_entries(raylet.cuda_visible_devices) if raylet is not None else None
    order = raylet.cuda_device_order if raylet is not None else None
    physical = sorted(gpus or [], key=lambda g: g.index)
    out: list[tuple[str, Optional[GpuDevice], str]] = []
    for gpu_id in range(count):
        entry = entries[gpu_id] if entries is not None and gpu_id < len(entries) else str(gpu_id)
        if gpus is None:
            out.append((entry, None, "no NVML report for this node"))
        elif len(physical) == 1 and count == 1:
            out.append((entry, physical[0], "the only GPU"))
        elif raylet is None or not raylet.environ_read:
            why = "ambiguous: the raylet's environment (CUDA_VISIBLE_DEVICES) was not read"
            out.append((entry, None, why))
        elif entries is not None and gpu_id >= len(entries):
            out.append((entry, None, f"ambiguous: Ray id {gpu_id} beyond CUDA_VISIBLE_DEVICES"))
        elif is_count(entry):  # ASCII digits: CUDA reads "²" as no index (SECURITY.md, rule 1)
            out.append((entry, *_by_index(parse_count(entry, "CUDA_VISIBLE_DEVICES"), order, physical)))
        else:
            out.append((entry, *_by_uuid(entry, physical)))
    return out


def _shares(actor: ActorBooking) -> list[tuple[int, float]]:
    """The actor's ``GPU`` per id; an even split of its ``GPU`` where the reader gave ids only."""
    if actor.gpu_shares:
        return [(int(i), float(q)) for i, q in actor.gpu_shares]
    if not actor.gpu_ids:
        return []
    each = actor.required.get("GPU", 0.0) / len(actor.gpu_ids)
    return [(i, each) for i in actor.gpu_ids]


def _physical_index(gpu: Optional[GpuDevice]) -> Optional[int]:
    if gpu is None:
        return None
    return gpu.index if gpu.parent_index is None else gpu.parent_index


def place_devices(
    node: NodeStatus,
    actors: Sequence[ActorBooking],
    raylet: Optional[RayletInfo] = None,
    gpus: Optional[Sequence[GpuDevice]] = None,
) -> NodePlacement:
    """One :class:`DeviceFree` per Ray GPU id of ``node``: what the live actors hold there.

    ``raylet``: the node's raylet with its environment (``CUDA_VISIBLE_DEVICES``); ``gpus``:
    the NVML devices the node sees. Without them devices are still placed, by Ray id, but
    not matched to an NVML device.
    """
    count = int(node.total_gpu + EPSILON)
    devices = [
        DeviceFree(
            gpu_id=i,
            visible_id=entry,
            uuid=gpu.uuid if gpu is not None else None,
            nvml_index=_physical_index(gpu),
            mapping=how,
            memory_used_bytes=settled_used(gpu).used_bytes if gpu is not None else None,
            memory_total_bytes=gpu.memory_total_bytes if gpu is not None else None,
            actors={},
            actor_vram_mb={},
        )
        for i, (entry, gpu, how) in enumerate(match_visible(count, raylet, gpus))
    ]
    placed = 0.0
    for actor in sorted(actors, key=lambda a: a.actor_id):
        if actor.node_id != node.node_id or actor.state != "ALIVE":
            continue
        shares = [(i, q) for i, q in _shares(actor) if 0 <= i < count]
        vram = actor.required.get("VRAM_MB", 0.0)
        for gpu_id, quantity in shares:
            device = devices[gpu_id]
            device.actors[actor.actor_id] = ray_round(device.actors.get(actor.actor_id, 0.0) + quantity)
            device.booked_gpu = ray_round(device.booked_gpu + quantity)
            device.booked_vram_mb = ray_round(device.booked_vram_mb + vram / len(shares))
            if vram:
                share = device.actor_vram_mb.get(actor.actor_id, 0.0) + vram / len(shares)
                device.actor_vram_mb[actor.actor_id] = ray_round(share)
            placed += quantity
    for device in devices:
        device.free_gpu = ray_round(max(0.0, 1.0 - device.booked_gpu))
    unplaced = ray_round(max(0.0, node.used_gpu - placed))
    notes = sorted({d.mapping for d in devices if d.uuid is None and d.mapping})
    unplaced = unplaced if unplaced > EPSILON else 0.0
    return NodePlacement(devices=devices, unplaced_gpu=unplaced, note="; ".join(notes))


def device_free(node: NodeStatus) -> list[DeviceFree]:
    """The node's devices with what each has free (``[]`` when placement was not read)."""
    return list(node.placement.devices) if node.placement is not None else []


def placement_known(node: NodeStatus) -> bool:
    """Whether per-device free numbers are exact: placement read, and every ``GPU`` the node
    booked is held by actors (tasks' devices are not in the actor table)."""
    return node.placement is not None and node.placement.unplaced_gpu == 0.0


def replicas_on_devices(devices: Sequence[DeviceFree], gpu: float) -> int:
    """How many replicas asking ``gpu`` each the devices take (see :func:`replicas_on_free`)."""
    return replicas_on_free([d.free_gpu for d in devices], gpu)


def replicas_on_free(free_gpu: Sequence[float], gpu: float) -> int:
    """How many replicas asking ``gpu`` each fit devices with these free fractions, packed
    as Ray packs them: a fraction below 1 on one device with that much free; ``n`` whole
    GPUs on ``n`` wholly free devices. Shared by ``fit`` and the pending-demand reasons."""
    units = round(gpu * 10_000)
    if units <= 0:
        return 10**9
    if units < 10_000:
        return sum(round(free * 10_000) // units for free in free_gpu)
    whole = sum(1 for free in free_gpu if round(free * 10_000) >= 10_000)
    return whole // (units // 10_000)


def id_map(placement: Optional[NodePlacement]) -> Mapping[int, Optional[int]]:
    """Ray GPU id → NVML index (``None`` where ambiguous), for attribution."""
    if placement is None:
        return {}
    return {d.gpu_id: d.nvml_index for d in placement.devices}
