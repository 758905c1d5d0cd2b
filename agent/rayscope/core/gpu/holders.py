"""Who holds each GPU process on a node: an actor, a Ray worker the actor table does not name
(a task), or a process outside Ray; and the actors that booked a GPU but hold no memory.

Pure: no I/O, no clock. The first half of :mod:`rayscope.core.gpu.attribution` (its docstring
says the rules in the operator's words), which then books these holders and sums them.
"""

from collections.abc import Collection, Mapping, Sequence
from typing import Optional

from rayscope.core.actor_names import actor_name
from rayscope.schema.report import GpuDevice, GpuUser, ProcessInfo
from rayscope.schema.status import ActorBooking

BOOKING_UNKNOWN = "booking_unknown"
NOT_MAPPED = "not_mapped"
ACTOR_DEAD = "actor_dead"
"""Memory held by the worker of an actor the GCS lists as dead: leaked, its booking released."""

PerDevice = dict[tuple[int, int], dict[str, GpuUser]]
"""Leaf device (:func:`slot`) → holder key (``actor:ID``, ``worker:PID``, ``pid:PID``) → its user."""

IdMaps = Mapping[str, Mapping[int, Optional[int]]]
"""Node id → (Ray GPU id → NVML index, ``None`` where the mapping is ambiguous). A node not
named keeps Ray's id as the NVML index (the raylet's environment was not read)."""


def nvml_index(id_maps: IdMaps, node_id: str, gpu_id: int) -> Optional[int]:
    """The NVML index of Ray's GPU ``gpu_id`` on ``node_id``; ``None`` when ambiguous."""
    mapping = id_maps.get(node_id)
    return gpu_id if mapping is None else mapping.get(gpu_id)


def books_gpu(actor: ActorBooking) -> bool:
    """Whether the actor booked any ``GPU`` or ``VRAM_MB``."""
    return actor.required.get("GPU", 0.0) > 0 or actor.required.get("VRAM_MB", 0.0) > 0


def slot(gpu: GpuDevice) -> tuple[int, int]:
    """Where a leaf device sits: ``(index, -1)`` for a GPU, ``(parent, index)`` for a MIG instance."""
    return (gpu.index, -1) if gpu.parent_index is None else (gpu.parent_index, gpu.index)


def _add_used(user: GpuUser, used: Optional[int]) -> None:
    if used is not None:
        user.used_memory_bytes = (user.used_memory_bytes or 0) + used


class Matcher:
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
        dead = [a for a in actors or [] if a.node_id in node_ids and a.state == "DEAD"]
        self.dead_by_pid = {(a.node_id, a.pid): a for a in dead if a.pid}
        self.dead_by_id = {a.actor_id: a for a in dead}

    def _dead(self, info: ProcessInfo) -> Optional[ActorBooking]:
        """The dead actor whose worker holds this process: the one its core log names, else
        the one whose last worker pid it is (where the log names no other actor)."""
        if info.actor_id:
            return self.dead_by_id.get(info.actor_id)
        return self.dead_by_pid.get((info.node_id or "", info.worker_pid or 0))

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
        if actor is None:
            actor = self._dead(info)
        if actor is not None:
            flags = [ACTOR_DEAD] if actor.state == "DEAD" else []
            user = GpuUser(
                kind="actor",
                actor_id=actor.actor_id,
                name=actor_name(actor),
                job_id=actor.job_id,
                flags=flags,
            )
            return f"actor:{actor.actor_id}", user, actor
        user = GpuUser(
            kind="ray worker",
            pids=[],
            name=info.title or info.name or "",
            job_id=info.job_id,
            flags=[BOOKING_UNKNOWN],
        )
        return f"worker:{info.worker_pid}", user, None


def users_by_device(
    leaves: Sequence[GpuDevice], matcher: Matcher
) -> tuple[PerDevice, dict[str, ActorBooking]]:
    """Every GPU process, grouped by owner on each device; and the actors met."""
    per_device: PerDevice = {}
    seen: dict[str, ActorBooking] = {}
    for device in leaves:
        users = per_device.setdefault(slot(device), {})
        for process in device.processes or []:
            key, fresh, actor = matcher.owner(process.pid)
            user = users.setdefault(key, fresh)
            if process.pid not in user.pids:
                user.pids.append(process.pid)
            _add_used(user, process.used_memory_bytes)
            if actor is not None:
                seen[actor.actor_id] = actor
    return per_device, seen


def place_idle_actors(
    leaves: Sequence[GpuDevice],
    per_device: PerDevice,
    matcher: Matcher,
    seen: dict[str, ActorBooking],
    id_maps: IdMaps,
) -> list[GpuUser]:
    """Actors that booked a GPU but hold no memory NVML lists: on the GPUs Ray gave them
    (used 0, or unknown where the device's processes are), else on no GPU."""
    devices = {slot(d): d for d in leaves}
    off_gpu: list[GpuUser] = []
    for actor in matcher.node_actors:
        if actor.actor_id in seen or not books_gpu(actor):
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
