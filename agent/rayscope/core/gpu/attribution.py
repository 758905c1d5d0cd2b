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
* ``unbooked``: memory held by a process outside Ray, or by an actor that booked neither
  ``GPU`` nor ``VRAM_MB`` (a Ray worker the actor table does not name — a task — is
  ``booking_unknown`` instead: tasks book too, but the actor table does not say what);
* ``full``: the ``VRAM_MB`` booked on one device reaches its memory; ``hidden_full``: a node
  with several GPUs whose node-wide ``VRAM_MB`` still shows room while a device is full.
"""

from collections.abc import Collection, Mapping, Sequence
from typing import Optional

import msgspec

from rayscope.core.actor_names import actor_name
from rayscope.core.gpu.placement import id_map, place_devices
from rayscope.schema.report import GpuAttribution, GpuDevice, GpuUser, NodeReport, ProcessInfo, RayletInfo
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeAttribution
from rayscope.units import MIB, ray_round

IdMaps = Mapping[str, Mapping[int, Optional[int]]]
"""Node id → (Ray GPU id → NVML index, ``None`` where the mapping is ambiguous). A node not
named keeps Ray's id as the NVML index (the raylet's environment was not read)."""


def nvml_index(id_maps: IdMaps, node_id: str, gpu_id: int) -> Optional[int]:
    """The NVML index of Ray's GPU ``gpu_id`` on ``node_id``; ``None`` when ambiguous."""
    mapping = id_maps.get(node_id)
    return gpu_id if mapping is None else mapping.get(gpu_id)


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
BOOKING_UNKNOWN = "booking_unknown"
NOT_MAPPED = "not_mapped"
FULL = "full"
HIDDEN_FULL = "hidden_full"

_KIND_ORDER = {"actor": 0, "ray worker": 1, "process": 2}


def _books_gpu(actor: ActorBooking) -> bool:
    return actor.required.get("GPU", 0.0) > 0 or actor.required.get("VRAM_MB", 0.0) > 0


def _device_key(gpu: GpuDevice) -> tuple[int, int]:
    return (gpu.index, -1) if gpu.parent_index is None else (gpu.parent_index, gpu.index)


def leaf_devices(gpus: Sequence[GpuDevice]) -> list[GpuDevice]:
    """The devices processes run on: each GPU, or its MIG instances where MIG is on."""
    leaves: list[GpuDevice] = []
    for gpu in gpus:
        leaves += gpu.mig_devices if gpu.mig_devices else [gpu]
    return leaves


def _add_used(user: GpuUser, used: Optional[int]) -> None:
    if used is not None:
        user.used_memory_bytes = (user.used_memory_bytes or 0) + used


class _Matcher:
    """GPU pid → who holds it (actor, Ray worker, other process), for one node group."""

    def __init__(
        self,
        processes: Optional[Sequence[ProcessInfo]],
        actors: Optional[Sequence[ActorBooking]],
        node_ids: Collection[str],
    ) -> None:
        self.processes = None if processes is None else {p.pid: p for p in processes}
        self.actors_read = actors is not None
        live = [a for a in actors or [] if a.node_id in node_ids and a.state == "ALIVE"]
        self.node_actors = sorted(live, key=lambda a: (actor_name(a), a.actor_id))
        self.by_pid = {(a.node_id, a.pid): a for a in live if a.pid}
        self.by_id = {a.actor_id: a for a in live}

    def owner(self, pid: int) -> tuple[str, GpuUser, Optional[ActorBooking]]:
        """(key, a fresh user, its actor) for one GPU pid."""
        info = self.processes.get(pid) if self.processes is not None else None
        if info is None or not info.visible:
            user = GpuUser(kind="process", pids=[pid], flags=[NOT_MAPPED])
            return f"pid:{pid}", user, None
        if info.worker_pid is None:  # outside Ray: books nothing by definition
            user = GpuUser(
                kind="process", pids=[pid], name=info.name or "", booked_gpu=0.0, booked_vram_mb=0.0
            )
            return f"pid:{pid}", user, None
        actor = self.by_pid.get((info.node_id or "", info.worker_pid))
        if actor is None and info.actor_id:
            actor = self.by_id.get(info.actor_id)
        if actor is not None:
            user = GpuUser(kind="actor", actor_id=actor.actor_id, name=actor_name(actor), job_id=actor.job_id)
            return f"actor:{actor.actor_id}", user, actor
        user = GpuUser(
            kind="ray worker",
            pids=[],
            name=info.title or info.name or "",
            job_id=info.job_id,
            flags=[BOOKING_UNKNOWN],
        )
        return f"worker:{info.worker_pid}", user, None


def _users_by_device(
    leaves: Sequence[GpuDevice], matcher: _Matcher
) -> tuple[dict[tuple[int, int], dict[str, GpuUser]], dict[str, ActorBooking]]:
    """Every GPU process, grouped by owner on each device; and the actors met."""
    per_device: dict[tuple[int, int], dict[str, GpuUser]] = {}
    seen: dict[str, ActorBooking] = {}
    for device in leaves:
        users = per_device.setdefault(_device_key(device), {})
        for process in device.processes or []:
            key, fresh, actor = matcher.owner(process.pid)
            user = users.setdefault(key, fresh)
            if process.pid not in user.pids:
                user.pids.append(process.pid)
            _add_used(user, process.used_memory_bytes)
            if actor is not None:
                seen[actor.actor_id] = actor
    return per_device, seen


def _place_idle_actors(
    leaves: Sequence[GpuDevice],
    per_device: dict[tuple[int, int], dict[str, GpuUser]],
    matcher: _Matcher,
    seen: dict[str, ActorBooking],
    id_maps: IdMaps,
) -> list[GpuUser]:
    """Actors that booked a GPU but hold no memory NVML lists: on the GPUs Ray gave them
    (used 0, or unknown where the device's processes are), else on no GPU."""
    devices = {_device_key(d): d for d in leaves}
    off_gpu: list[GpuUser] = []
    for actor in matcher.node_actors:
        if actor.actor_id in seen or not _books_gpu(actor):
            continue
        indices = [nvml_index(id_maps, actor.node_id, gpu_id) for gpu_id in actor.gpu_ids]
        targets = [(i, -1) for i in indices if i is not None and (i, -1) in devices]
        for key in targets:
            known = devices[key].processes is not None and matcher.processes is not None
            per_device[key][f"actor:{actor.actor_id}"] = GpuUser(
                kind="actor",
                actor_id=actor.actor_id,
                name=actor_name(actor),
                job_id=actor.job_id,
                used_memory_bytes=0 if known else None,
            )
        if targets:
            seen[actor.actor_id] = actor
        else:
            off_gpu.append(
                GpuUser(
                    kind="actor",
                    actor_id=actor.actor_id,
                    name=actor_name(actor),
                    job_id=actor.job_id,
                    pids=[actor.pid] if actor.pid else [],
                    booked_gpu=actor.required.get("GPU", 0.0),
                    booked_vram_mb=actor.required.get("VRAM_MB", 0.0),
                )
            )
    return off_gpu


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
    on = {_device_key(d)[0] for d, _ in placed}
    if shares and set(shares) == on:
        return {i: ray_round(q) for i, q in shares.items()}
    return {i: ray_round(actor.required.get("GPU", 0.0) / len(placed)) for i in on}


def _book(
    leaves: Sequence[GpuDevice],
    per_device: dict[tuple[int, int], dict[str, GpuUser]],
    seen: Mapping[str, ActorBooking],
    id_maps: IdMaps,
) -> None:
    """Each actor's booking on the devices it is on (Ray's per-device ``GPU`` where the
    devices are the ones Ray gave it, else split evenly), and everyone's flags."""
    devices = {_device_key(d): d for d in leaves}
    placements: dict[str, list[tuple[GpuDevice, GpuUser]]] = {}
    for key, users in per_device.items():
        for user in users.values():
            if user.actor_id is not None:
                placements.setdefault(user.actor_id, []).append((devices[key], user))
    for actor_id, placed in placements.items():
        actor = seen[actor_id]
        gpu_shares = _gpu_per_device(actor, placed, id_maps)
        for device, user in placed:
            user.booked_vram_mb = ray_round(actor.required.get("VRAM_MB", 0.0) / len(placed))
            user.booked_gpu = gpu_shares[_device_key(device)[0]]
            user.pids = user.pids or ([actor.pid] if actor.pid else [])
        used = sum(u.used_memory_bytes or 0 for _, u in placed)
        allowance = _allowance(actor, placed) if _books_gpu(actor) else 0.0
        flag = None
        if not _books_gpu(actor) and used > 0:
            flag = UNBOOKED
        elif allowance is not None and used > allowance > 0:
            flag = OVER_BOOKING
        for _, user in placed:
            user.flags += [flag] if flag else []
    for users in per_device.values():
        for user in users.values():
            if user.kind == "process" and user.booked_vram_mb == 0.0 and (user.used_memory_bytes or 0) > 0:
                user.flags.append(UNBOOKED)


def _device_attribution(device: GpuDevice, users: Sequence[GpuUser], actors_read: bool) -> GpuAttribution:
    actors = [u for u in users if u.kind == "actor"]
    capacity = None if device.memory_total_bytes is None else round(device.memory_total_bytes / MIB, 1)
    booked_vram = ray_round(sum(u.booked_vram_mb or 0.0 for u in actors)) if actors_read else None
    booked_gpu = ray_round(sum(u.booked_gpu or 0.0 for u in actors)) if actors_read else None
    full = booked_vram is not None and capacity is not None and booked_vram > 0 and booked_vram >= capacity
    return GpuAttribution(
        booked_gpu=booked_gpu,
        booked_vram_mb=booked_vram,
        booked_actors=sum(1 for u in actors if (u.booked_vram_mb or 0) > 0 or (u.booked_gpu or 0) > 0),
        capacity_mb=capacity,
        unbooked_bytes=sum(u.used_memory_bytes or 0 for u in users if UNBOOKED in u.flags),
        users=sorted(users, key=lambda u: (_KIND_ORDER[u.kind], u.name, u.actor_id or "", u.pids)),
        flags=[FULL] if full else [],
    )


def _parent_attribution(children: Sequence[GpuDevice], actors_read: bool) -> GpuAttribution:
    """A MIG-enabled GPU: the sums over its instances (their users are listed on them)."""
    parts = [c.attribution for c in children if c.attribution is not None]
    return GpuAttribution(
        booked_gpu=ray_round(sum(p.booked_gpu or 0.0 for p in parts)) if actors_read else None,
        booked_vram_mb=ray_round(sum(p.booked_vram_mb or 0.0 for p in parts)) if actors_read else None,
        booked_actors=sum(p.booked_actors for p in parts),
        unbooked_bytes=sum(p.unbooked_bytes for p in parts),
        flags=[FULL] if any(FULL in p.flags for p in parts) else [],
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
    matcher = _Matcher(processes, actors, node_ids)
    leaves = leaf_devices(gpus)
    per_device, seen = _users_by_device(leaves, matcher)
    off_gpu = _place_idle_actors(leaves, per_device, matcher, seen, id_maps) if actors is not None else []
    _book(leaves, per_device, seen, id_maps)
    attributed: list[GpuDevice] = []
    for gpu in gpus:
        if gpu.mig_devices:
            children = [
                msgspec.structs.replace(
                    c,
                    attribution=_device_attribution(
                        c, list(per_device[_device_key(c)].values()), matcher.actors_read
                    ),
                )
                for c in gpu.mig_devices
            ]
            parent = _parent_attribution(children, matcher.actors_read)
            attributed.append(msgspec.structs.replace(gpu, mig_devices=children, attribution=parent))
        else:
            users = list(per_device[_device_key(gpu)].values())
            attribution = _device_attribution(gpu, users, matcher.actors_read)
            attributed.append(msgspec.structs.replace(gpu, attribution=attribution))
    full = [g.index for g in attributed if g.attribution is not None and FULL in g.attribution.flags]
    hidden = len(gpus) > 1 and total_vram_mb > 0 and used_vram_mb < total_vram_mb and bool(full)
    users = [u for key in sorted(per_device) for u in per_device[key].values()]
    booked = {
        u.actor_id for u in users if u.actor_id and ((u.booked_vram_mb or 0) > 0 or (u.booked_gpu or 0) > 0)
    }
    node = NodeAttribution(
        booked_vram_mb=ray_round(sum(u.booked_vram_mb or 0.0 for u in users if u.actor_id))
        if matcher.actors_read
        else None,
        booked_gpu=ray_round(sum(u.booked_gpu or 0.0 for u in users if u.actor_id))
        if matcher.actors_read
        else None,
        booked_actors=len(booked),
        actors_used_bytes=sum(u.used_memory_bytes or 0 for u in users if u.actor_id),
        unbooked_bytes=sum(u.used_memory_bytes or 0 for u in users if UNBOOKED in u.flags),
        actors_read=matcher.actors_read,
        processes_mapped=processes is not None,
        node_total_vram_mb=total_vram_mb,
        node_used_vram_mb=used_vram_mb,
        full_gpus=full,
        flags=[HIDDEN_FULL] if hidden else [],
        off_gpu=off_gpu,
    )
    return attributed, node


def attribute_cluster(
    status: ClusterStatus,
    reports: Mapping[str, NodeReport],
    actors: Optional[Sequence[ActorBooking]],
    co_hosted: Optional[Mapping[str, Collection[str]]] = None,
    raylets: Optional[Mapping[str, RayletInfo]] = None,
) -> ClusterStatus:
    """``status`` with every reported node's GPUs attributed (a copy; the input is untouched).

    ``reports``: node id → its latest report (GPUs and processes). ``co_hosted``: node id →
    every node id sharing that node's host and GPUs (several raylets on one machine); a node
    not named is alone on its host. ``raylets``: node id → its raylet as read on this host
    (the embedded path), for nodes no report describes.

    With the actor table read, every node also gets Ray's per-device placement
    (:func:`rayscope.core.gpu.placement.place_devices`); a node shares the NVML devices of its host's
    report.
    """
    nodes = dict(status.nodes)
    id_maps: dict[str, Mapping[int, Optional[int]]] = {}
    by_node: dict[str, list[ActorBooking]] = {}  # once: per node over all actors was quadratic
    for booking in actors or ():
        by_node.setdefault(booking.node_id, []).append(booking)
    if actors is not None:
        for node_id, scheduled in nodes.items():
            group = set((co_hosted or {}).get(node_id, ())) | {node_id}
            host_reports = [reports[n] for n in sorted(group) if n in reports]
            own = reports.get(node_id)
            raylet = (raylets or {}).get(node_id) or (own.raylet if own is not None else None)
            gpus = next((r.gpus for r in host_reports if r.gpus is not None), None)
            placement = place_devices(scheduled, by_node.get(node_id, []), raylet, gpus)
            nodes[node_id] = msgspec.structs.replace(scheduled, placement=placement)
            if raylet is not None and raylet.environ_read and gpus is not None:
                id_maps[node_id] = id_map(placement)
    for node_id, report in reports.items():
        node = nodes.get(node_id)
        if node is None or report.gpus is None:
            continue
        group = set((co_hosted or {}).get(node_id, ())) | {node_id}
        members = [nodes[n] for n in group if n in nodes]
        gpus, attribution = attribute_node(
            report.gpus,
            report.processes,
            None if actors is None else [a for n in sorted(group) for a in by_node.get(n, [])],
            group,
            total_vram_mb=ray_round(sum(m.total_vram_mb for m in members)),
            used_vram_mb=ray_round(sum(m.used_vram_mb for m in members)),
            id_maps=id_maps,
        )
        nodes[node_id] = msgspec.structs.replace(node, gpus=gpus, attribution=attribution)
    return msgspec.structs.replace(status, nodes=nodes)
