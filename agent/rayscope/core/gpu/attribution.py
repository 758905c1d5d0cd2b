"""Who holds the GPU memory: each actor's booking beside its measured memory, per GPU and node.

Pure: no I/O, no clock. Inputs are a node's NVML devices (with their processes), this host's
view of those pids (:class:`ProcessInfo`) and the GCS actor table (:class:`ActorBooking`);
the output is the same devices with a :class:`GpuAttribution` each, and a
:class:`NodeAttribution`. The head agent calls :func:`attribute_node` per node report; the
embedded ``status``/``node`` paths call it for this host.

Rules, in the operator's words:

* a GPU process belongs to the actor whose worker (the pid, or its ancestor the raylet
  started) has that pid on that node in the actor table;
* an actor's booking is ``VRAM_MB`` where it booked any (``GPU`` is then a device handle),
  else its ``GPU`` fraction of the device's memory; split evenly over the GPUs it is on;
* ``over_booking``: its processes hold more than it booked, over all its GPUs;
* ``unbooked``: memory held by a process outside Ray, by an actor that booked neither
  ``GPU`` nor ``VRAM_MB``, or by the worker of an actor the GCS lists as dead
  (``actor_dead``: leaked, Ray released its booking); a Ray worker the actor table does not
  name (a task) is ``booking_unknown`` instead: tasks book too, but the actor table does
  not say what; a pid this host cannot see is ``not_mapped``, summed apart;
* ``full``: the ``VRAM_MB`` booked on one device reaches its memory; ``hidden_full``: a node
  with several GPUs whose node-wide ``VRAM_MB`` still shows room while a device is full.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Optional

import msgspec

from rayscope.core.gpu.holders import (
    ACTOR_DEAD,
    NOT_MAPPED,
    IdMaps,
    Matcher,
    PerDevice,
    books_gpu,
    nvml_index,
    place_idle_actors,
    slot,
    users_by_device,
)
from rayscope.core.gpu.placement import id_map, place_devices
from rayscope.core.gpu.precedence import dashboard_reports
from rayscope.core.gpu.settled import settle_gpus
from rayscope.core.isolation import guarded, unreadable_as
from rayscope.schema.report import (
    GpuAttribution,
    GpuDevice,
    GpuUser,
    NodeReport,
    ProcessInfo,
    RayletInfo,
    known,
)
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeAttribution, NodeStatus
from rayscope.units import MIB, ray_round


def leaf_devices(gpus: Sequence[GpuDevice]) -> list[GpuDevice]:
    """The devices processes run on: each GPU, or its MIG instances where MIG is on."""
    leaves: list[GpuDevice] = []
    for gpu in gpus:
        leaves += gpu.mig_devices if gpu.mig_devices else [gpu]
    return leaves


def _device_shares(actor: ActorBooking, id_maps: IdMaps) -> dict[int, float]:
    """NVML index → the ``GPU`` quantity the actor holds there (Ray's ``resource_mapping``)."""
    shares: dict[int, float] = {}
    for gpu_id, quantity in actor.gpu_shares:
        index = nvml_index(id_maps, actor.node_id, int(gpu_id))
        if index is not None:
            shares[index] = shares.get(index, 0.0) + float(quantity)
    return shares


OVER_BOOKING = "over_booking"
UNBOOKED = "unbooked"
FULL = "full"
HIDDEN_FULL = "hidden_full"

_KIND_ORDER = {"actor": 0, "ray worker": 1, "process": 2}


def _allowance(actor: ActorBooking, placed: Sequence[tuple[GpuDevice, GpuUser]]) -> Optional[float]:
    """Bytes the actor booked over the devices it is on: its ``VRAM_MB`` where it booked any,
    else its ``GPU`` share of each device's memory; ``None`` when a device's size is unknown."""
    if actor.required.get("VRAM_MB", 0.0) > 0:
        return sum((user.booked_vram_mb or 0.0) * MIB for _, user in placed)
    allowance = 0.0
    for device, user in placed:
        if device.memory_total_bytes is None:
            return None
        allowance += (user.booked_gpu or 0.0) * device.memory_total_bytes
    return allowance


def _gpu_per_device(
    actor: ActorBooking, placed: Sequence[tuple[GpuDevice, GpuUser]], id_maps: IdMaps
) -> dict[int, float]:
    """Device → the actor's ``GPU`` there: Ray's own per-device quantity where the devices it
    is on are the ones Ray gave it, else its ``GPU`` split evenly."""
    shares = _device_shares(actor, id_maps)
    on = {slot(d)[0] for d, _ in placed}
    if shares and set(shares) == on:
        return {i: ray_round(q) for i, q in shares.items()}
    return {i: ray_round(actor.required.get("GPU", 0.0) / len(placed)) for i in on}


def _placements(
    leaves: Sequence[GpuDevice], per_device: PerDevice
) -> dict[str, list[tuple[GpuDevice, GpuUser]]]:
    """Actor id → each device it is on, with its user there."""
    devices = {slot(d): d for d in leaves}
    placements: dict[str, list[tuple[GpuDevice, GpuUser]]] = {}
    for key, users in per_device.items():
        for user in users.values():
            if user.actor_id is not None:
                placements.setdefault(user.actor_id, []).append((devices[key], user))
    return placements


def _actor_flag(actor: ActorBooking, placed: Sequence[tuple[GpuDevice, GpuUser]]) -> Optional[str]:
    """``unbooked`` (memory held, nothing booked), ``over_booking`` (more held than booked over
    all its GPUs) or ``None``."""
    used = sum(u.used_memory_bytes or 0 for _, u in placed)
    if not books_gpu(actor):
        return UNBOOKED if used > 0 else None
    allowance = _allowance(actor, placed)
    return OVER_BOOKING if allowance is not None and used > allowance > 0 else None


def _unbooked_process(user: GpuUser) -> bool:
    """A process outside Ray (it books nothing) that holds memory."""
    return user.kind == "process" and user.booked_vram_mb == 0.0 and (user.used_memory_bytes or 0) > 0


def _book(
    leaves: Sequence[GpuDevice],
    per_device: PerDevice,
    seen: Mapping[str, ActorBooking],
    id_maps: IdMaps,
) -> None:
    """Each actor's booking on the devices it is on (Ray's per-device ``GPU`` where the
    devices are the ones Ray gave it, else split evenly), and everyone's flags."""
    for actor_id, placed in _placements(leaves, per_device).items():
        actor = seen[actor_id]
        if actor.state == "DEAD":  # Ray released its booking: what it holds is leaked
            actor = msgspec.structs.replace(actor, required={}, gpu_shares=[])
        gpu_shares = _gpu_per_device(actor, placed, id_maps)
        for device, user in placed:
            user.booked_vram_mb = ray_round(actor.required.get("VRAM_MB", 0.0) / len(placed))
            user.booked_gpu = gpu_shares[slot(device)[0]]
            user.pids = user.pids or ([actor.pid] if actor.pid else [])
        flag = _actor_flag(actor, placed)  # judged on the bookings just made
        for _, user in placed:
            user.flags += [flag] if flag else []
    for users in per_device.values():
        for user in users.values():
            if _unbooked_process(user):
                user.flags.append(UNBOOKED)


def _booked_sum(amounts: Iterable[Optional[float]], actors_read: bool) -> Optional[float]:
    """Booked amounts summed at Ray's resolution; ``None`` (unknown) when the actor table was
    not read."""
    return ray_round(sum(a or 0.0 for a in amounts)) if actors_read else None


def _has_booking(user: GpuUser) -> bool:
    return (user.booked_vram_mb or 0) > 0 or (user.booked_gpu or 0) > 0


def _device_attribution(device: GpuDevice, users: Sequence[GpuUser], actors_read: bool) -> GpuAttribution:
    actors = [u for u in users if u.kind == "actor"]
    capacity = None if device.memory_total_bytes is None else round(device.memory_total_bytes / MIB, 1)
    booked_vram = _booked_sum((u.booked_vram_mb for u in actors), actors_read)
    full = booked_vram is not None and capacity is not None and booked_vram > 0 and booked_vram >= capacity
    return GpuAttribution(
        booked_gpu=_booked_sum((u.booked_gpu for u in actors), actors_read),
        booked_vram_mb=booked_vram,
        booked_actors=sum(1 for u in actors if _has_booking(u)),
        capacity_mb=capacity,
        unbooked_bytes=sum(u.used_memory_bytes or 0 for u in users if UNBOOKED in u.flags),
        users=sorted(users, key=lambda u: (_KIND_ORDER[u.kind], u.name, u.actor_id or "", u.pids)),
        flags=[FULL] if full else [],
    )


def _parent_attribution(children: Sequence[GpuDevice], actors_read: bool) -> GpuAttribution:
    """A MIG-enabled GPU: the sums over its instances (their users are listed on them)."""
    parts = [c.attribution for c in children if c.attribution is not None]
    return GpuAttribution(
        booked_gpu=_booked_sum((p.booked_gpu for p in parts), actors_read),
        booked_vram_mb=_booked_sum((p.booked_vram_mb for p in parts), actors_read),
        booked_actors=sum(p.booked_actors for p in parts),
        unbooked_bytes=sum(p.unbooked_bytes for p in parts),
        flags=[FULL] if any(FULL in p.flags for p in parts) else [],
    )


def _attributed(gpu: GpuDevice, per_device: PerDevice, actors_read: bool) -> GpuDevice:
    """``gpu`` with its attribution; a MIG-enabled GPU with each instance's, and their sums."""
    if not gpu.mig_devices:
        users = list(per_device[slot(gpu)].values())
        return msgspec.structs.replace(gpu, attribution=_device_attribution(gpu, users, actors_read))
    children = [_attributed(c, per_device, actors_read) for c in gpu.mig_devices]
    parent = _parent_attribution(children, actors_read)
    return msgspec.structs.replace(gpu, mig_devices=children, attribution=parent)


def _full_gpus(attributed: Sequence[GpuDevice], vram_mb: tuple[float, float]) -> tuple[list[int], list[str]]:
    """The indices of the full GPUs, and ``hidden_full`` where the node-wide ``VRAM_MB``
    (``vram_mb``: the scheduler's total, used) still shows room on a node of several GPUs."""
    full = [g.index for g in attributed if g.attribution is not None and FULL in g.attribution.flags]
    total_vram_mb, used_vram_mb = vram_mb
    hidden = len(attributed) > 1 and total_vram_mb > 0 and used_vram_mb < total_vram_mb and bool(full)
    return full, [HIDDEN_FULL] if hidden else []


def _node_attribution(
    attributed: Sequence[GpuDevice],
    users: Sequence[GpuUser],
    matcher: Matcher,
    off_gpu: list[GpuUser],
    vram_mb: tuple[float, float],
) -> NodeAttribution:
    """The node's sums over its users (actors, Ray workers, processes) and its full GPUs."""
    full, flags = _full_gpus(attributed, vram_mb)
    actors = [u for u in users if u.actor_id and ACTOR_DEAD not in u.flags]
    return NodeAttribution(
        booked_vram_mb=_booked_sum((u.booked_vram_mb for u in actors), matcher.actors_read),
        booked_gpu=_booked_sum((u.booked_gpu for u in actors), matcher.actors_read),
        booked_actors=len({u.actor_id for u in actors if _has_booking(u)}),
        actors_used_bytes=sum(u.used_memory_bytes or 0 for u in actors),
        unbooked_bytes=sum(u.used_memory_bytes or 0 for u in users if UNBOOKED in u.flags),
        unmapped_bytes=sum(u.used_memory_bytes or 0 for u in users if NOT_MAPPED in u.flags),
        actors_read=matcher.actors_read,
        processes_mapped=matcher.processes is not None,
        node_total_vram_mb=vram_mb[0],
        node_used_vram_mb=vram_mb[1],
        full_gpus=full,
        flags=flags,
        off_gpu=off_gpu,
    )


def attribute_node(
    gpus: Sequence[GpuDevice],
    processes: Optional[Sequence[ProcessInfo]],
    actors: Optional[Sequence[ActorBooking]],
    node_ids: Collection[str],
    *,
    total_vram_mb: float = 0.0,
    used_vram_mb: float = 0.0,
    id_maps: Optional[IdMaps] = None,
) -> tuple[list[GpuDevice], NodeAttribution]:
    """One node's GPUs with their attribution, and the node's own.

    ``processes``: this host's view of the GPU pids (``None``: not mappable, e.g. from a
    container). ``actors``: the GCS actor table (``None``: not read; bookings are then
    unknown). ``node_ids``: the Ray nodes whose actors may use these GPUs (one node, or every
    raylet of a host running several). ``total_vram_mb``/``used_vram_mb``: the scheduler's
    node-wide ``VRAM_MB``, for the hidden-full-device check. ``id_maps``: per node, Ray's GPU
    ids → NVML indices (:mod:`rayscope.core.gpu.placement`); by default Ray's id is taken as the index.
    """
    id_maps = id_maps or {}
    matcher = Matcher(processes, actors, node_ids)
    leaves = leaf_devices(gpus)
    per_device, seen = users_by_device(leaves, matcher)
    off_gpu = place_idle_actors(leaves, per_device, matcher, seen, id_maps) if actors is not None else []
    _book(leaves, per_device, seen, id_maps)
    attributed = [_attributed(gpu, per_device, matcher.actors_read) for gpu in gpus]
    users = [u for key in sorted(per_device) for u in per_device[key].values()]
    vram_mb = (total_vram_mb, used_vram_mb)
    return attributed, _node_attribution(attributed, users, matcher, off_gpu, vram_mb)


def _settled(
    nodes: Mapping[str, NodeStatus], reports: Mapping[str, NodeReport], node_id: str
) -> Optional[list[GpuDevice]]:
    """The GPUs of ``node_id``'s report as the merge settled them (rayscope.core.gpu.settled)."""
    merged = nodes.get(node_id)
    if merged is not None and merged.gpus is not None:
        return merged.gpus
    return settle_gpus(reports[node_id].gpus)


def sharing_devices(
    nodes: Mapping[str, NodeStatus], co_hosted: Mapping[str, Collection[str]]
) -> dict[str, set[str]]:
    """Node id → the node ids whose actors may hold memory on its GPUs: itself, and the nodes
    ``co_hosted`` says share its host. Except where the devices two of them were measured on
    are known and have no UUID in common (raylets in containers that share the host's name
    and network, each given its own GPUs; Ray's dashboard agent reads NVML in its raylet's
    environment): then neither holds memory on the other's devices."""

    def uuids(n: str) -> set[str]:
        node = nodes.get(n)
        gpus = node.gpus if node is not None else None
        return {g.uuid for g in gpus or () if g.uuid}

    def apart(own: set[str], other: str) -> bool:
        theirs = uuids(other)
        return bool(own and theirs and not own & theirs)

    def group(n: str) -> set[str]:
        others = set(co_hosted.get(n, ())) - {n}
        if not others:  # most nodes have a host of their own: no UUID to read
            return {n}
        own = uuids(n)
        return {n} | {m for m in others if not apart(own, m)}

    return {n: group(n) for n in nodes}


def attribute_cluster(
    status: ClusterStatus,
    reports: Mapping[str, NodeReport],
    actors: Optional[Sequence[ActorBooking]],
    co_hosted: Optional[Mapping[str, Collection[str]]] = None,
    raylets: Optional[Mapping[str, RayletInfo]] = None,
) -> ClusterStatus:
    """``status`` with every reported node's GPUs attributed (a copy; the input is untouched)
    and, with the actor table read, Ray's placement per device (``placement.place_devices``).
    A node whose share raises is ``unreadable`` (rayscope.core.isolation); the others go on.

    ``reports``: node id → its latest report (GPUs and processes). ``co_hosted``: node id →
    every node id sharing that node's host and GPUs (several raylets on one machine, sharing
    the NVML devices of the host's report). ``raylets``: node id → its raylet as read on this
    host (the embedded path), for nodes no report describes. A node whose GPUs are Ray's
    dashboard's (rayscope.core.gpu.precedence) is attributed from them, its pids matched to
    the actors' worker pids."""
    nodes = dict(status.nodes)
    id_maps: dict[str, Mapping[int, Optional[int]]] = {}
    groups = sharing_devices(nodes, co_hosted or {})
    reports = {**reports, **dashboard_reports(status, actors)}
    by_node: dict[str, list[ActorBooking]] = {}  # once: per node over all actors was quadratic
    for booking in actors or ():
        by_node.setdefault(booking.node_id, []).append(booking)
    live = {n: [a for a in group if a.state == "ALIVE"] for n, group in by_node.items()}

    def placed(node: NodeStatus) -> NodeStatus:
        own = reports.get(node.node_id)
        host_ids = ([node.node_id] if own else []) + [
            n for n in sorted(groups[node.node_id] - {node.node_id}) if n in reports
        ]
        raylet = (raylets or {}).get(node.node_id) or (own.raylet if own is not None else None)
        gpus = next((g for n in host_ids for g in (_settled(nodes, reports, n),) if g is not None), None)
        placement = place_devices(node, live.get(node.node_id, []), raylet, gpus)
        if raylet is not None and raylet.environ_read and gpus is not None:
            id_maps[node.node_id] = id_map(placement)
        return msgspec.structs.replace(node, placement=placement)

    def attributed(node: NodeStatus, report: NodeReport) -> NodeStatus:
        members = [nodes[n] for n in groups[node.node_id] if n in nodes]
        gpus, attribution = attribute_node(
            _settled(nodes, reports, node.node_id) or [],
            report.processes,
            None if actors is None else [a for n in sorted(groups[node.node_id]) for a in by_node.get(n, [])],
            groups[node.node_id],
            total_vram_mb=ray_round(sum(m.total_vram_mb for m in members)),
            used_vram_mb=ray_round(sum(m.used_vram_mb for m in members)),
            id_maps=id_maps,
        )
        return msgspec.structs.replace(node, gpus=gpus, attribution=attribution)

    for node_id, each in nodes.items():
        if actors is not None and known(each.unreadable) is None:
            nodes[node_id] = guarded("merge", node_id, unreadable_as(each, node_id), placed, each)
    for node_id, report in reports.items():
        node = nodes.get(node_id)
        if node is not None and report.gpus is not None and known(node.unreadable) is None:
            nodes[node_id] = guarded("merge", node_id, unreadable_as(node, node_id), attributed, node, report)
    return msgspec.structs.replace(status, nodes=nodes)
