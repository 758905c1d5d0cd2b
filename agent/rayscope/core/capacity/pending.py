"""What waits to be placed, and why it does not fit. Pure: a :class:`PendingRead` in (one
autoscaler-state read and the actor table, see ``gcs_read.read_pending``), the JSON's
``cluster.pending`` and BioEngine's ``cluster.pending_resources`` out. No I/O, no clock.

Each waiting shape gets one reason, judged against the free resources of the same read, in
this order:

* ``waits_placement_group``: it is to run in a placement group that is not placed yet;
* ``infeasible``: no node has the resource at all, or not that much of it (an accelerator
  type nobody has, 2 GPUs on 1-GPU nodes);
* ``waits``: the cluster has room for it now: it waits on its dependencies or the scheduler;
* ``fragmented``: a node has the GPU fraction free by its sum, but no single device has it
  (Ray puts a fraction below 1 on one device, whole GPUs on free devices);
* ``vram_exhausted``, ``gpu_exhausted``, ``cpu_exhausted``, ``memory_exhausted``,
  ``resource_exhausted``: what the best node lacks, naming what it has free.

Node sums come from :func:`rayscope.core.capacity.fit.replicas_in`, the placement rule ``fit`` uses. The
per-device check is one function, :data:`DeviceFree`: by default
:func:`gpus_free_from_actors` (Ray's own per-device placement, ``resource_mapping`` in the
actor table); where it cannot tell (a task holds GPUs: tasks are not in the actor table) the
judgement is by node sums, and the reason says so (``by``).
"""

import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Optional

import msgspec

from rayscope.core.capacity.fit import replicas_in
from rayscope.core.gpu.placement import replicas_on_free
from rayscope.labels import node_label
from rayscope.schema.pending import (
    PendingActor,
    PendingDemand,
    PendingGang,
    PendingNode,
    PendingRead,
    PendingResources,
    PendingTask,
)
from rayscope.schema.status import ClusterStatus
from rayscope.units import ACCELERATOR_PREFIX, GIB, MIB, ray_round, ray_units

BIOENGINE_LIST_LIMIT = 100
"""BioEngine lists pending entries through Ray's state API, which answers at most 100 per
list (one call each for actors, jobs and tasks)."""
BIOENGINE_HARDWARE = ("CPU", "GPU", "memory")
"""The resources BioEngine reads, under these literal names, to tell an actor that needs a node."""

# Placement-group resources as Ray names them: CPU_group_<pg id>, CPU_group_<bundle>_<pg id>.
_GROUP = re.compile(r"^(?P<name>.+?)_group_(?:\d+_)?(?P<pg>[0-9a-f]+)$")
_GROUP_MARKER = "bundle"
# Which resource a reason names first when the best node lacks several.
_EXHAUSTED_ORDER = ("VRAM_MB", "GPU", "CPU", "memory")
_EXHAUSTED_CODE = {
    "VRAM_MB": "vram_exhausted",
    "GPU": "gpu_exhausted",
    "CPU": "cpu_exhausted",
    "memory": "memory_exhausted",
}

DeviceFree = Callable[[PendingNode], Optional[list[tuple[int, float]]]]
"""A node → ``[(GPU index, fraction free)]`` of its devices; ``None`` = not known."""


def canonical(shape: Mapping[str, float]) -> dict[str, float]:
    """Ray's order, as ``ray status`` prints a demand: names sorted; zero amounts dropped."""
    return {name: ray_round(amount) for name, amount in sorted(shape.items()) if amount > 0}


def split_group(shape: Mapping[str, float]) -> tuple[dict[str, float], str]:
    """(the shape with placement-group suffixes taken off, the placement group's hex id or
    ``""``): ``GPU_group_<id>: 2`` → ``GPU: 2``; ``bundle_group_<id>`` is Ray's own marker."""
    clean: dict[str, float] = {}
    group = ""
    for name, amount in shape.items():
        match = _GROUP.match(name)
        if match is None:
            clean[name] = clean.get(name, 0.0) + amount
            continue
        group = match.group("pg")
        if match.group("name") != _GROUP_MARKER:
            clean[match.group("name")] = clean.get(match.group("name"), 0.0) + amount
    return canonical(clean), group


def shape_text(shape: Mapping[str, float]) -> str:
    """``GPU=0.5 accelerator_type:A10G=0.001``: Ray's names and amounts, Ray's order."""
    return " ".join(f"{name}={_number(amount)}" for name, amount in shape.items())


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:g}"


def amount_text(resource: str, amount: float) -> str:
    """An amount in the operator's unit: ``8192 MB`` of VRAM_MB, ``2.0 GB`` of memory."""
    if resource == "VRAM_MB":
        return f"{amount:.0f} MB"
    if resource in ("memory", "object_store_memory"):
        return f"{amount / GIB:.1f} GB" if amount >= GIB else f"{amount / MIB:.0f} MB"
    return f"{_number(ray_round(amount))} {resource}"


def _label(node: PendingNode) -> str:
    return node_label(node.node_ip, node.node_id)


def gpus_free_from_actors(read: PendingRead) -> DeviceFree:
    """Per GPU of a node, the fraction free: 1 minus what the live actors hold there
    (``resource_mapping``). ``None`` when the actors do not account for the node's whole
    ``GPU`` booking (tasks hold GPUs too and are not in the actor table)."""

    def free(node: PendingNode) -> Optional[list[tuple[int, float]]]:
        count = int(node.total.get("GPU", 0.0))
        held = read.device_use.get(node.node_id, {}).get("GPU", {})
        booked = node.total.get("GPU", 0.0) - node.available.get("GPU", 0.0)
        if ray_units(sum(held.values())) != ray_units(booked):
            return None
        return [(index, ray_round(1.0 - held.get(str(index), 0.0))) for index in range(count)]

    return free


def devices_hold(devices: Sequence[tuple[int, float]], gpu: float) -> bool:
    """Whether one replica asking ``gpu`` fits these devices, by Ray's packing rule (the
    one ``fit`` uses: :func:`rayscope.core.gpu.placement.replicas_on_free`)."""
    return gpu <= 0 or replicas_on_free([free for _, free in devices], gpu) >= 1


def devices_text(devices: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"GPU {index}: {_number(free)} free" for index, free in devices)


class Judgement(NamedTuple):
    reason: str
    text: str
    by: str = "node_sum"


def _free(node: PendingNode, resource: str) -> Optional[float]:
    """What ``node`` has free of ``resource``; ``None`` = it does not have it at all."""
    if resource not in node.total:
        return None
    return max(0.0, node.available.get(resource, 0.0))


def _infeasible(shape: Mapping[str, float], nodes: Sequence[PendingNode]) -> Optional[str]:
    """Why no node could ever hold ``shape`` (its totals), or ``None`` when one could."""
    if any(replicas_in(node.total, shape)[0] >= 1 for node in nodes):
        return None
    for resource, amount in shape.items():
        have = [node.total[resource] for node in nodes if resource in node.total]
        if not have:
            if resource.startswith(ACCELERATOR_PREFIX):
                kinds = sorted(
                    {
                        n[len(ACCELERATOR_PREFIX) :]
                        for node in nodes
                        for n in node.total
                        if n.startswith(ACCELERATOR_PREFIX)
                    }
                )
                here = f" (accelerator types here: {', '.join(kinds)})" if kinds else " (no node names one)"
                return f"no node has {resource}{here}"
            return f"no node has {resource}"
        if ray_units(max(have)) < ray_units(amount):
            most = amount_text(resource, max(have))
            return f"no node has {amount_text(resource, amount)} (at most {most} on one node)"
    return "no single node has all of it: " + ", ".join(shape)


def judge(shape: Mapping[str, float], nodes: Sequence[PendingNode], device_free: DeviceFree) -> Judgement:
    """Why ``shape`` (placement-group suffixes off) does not run now on ``nodes``."""
    if not shape:
        return Judgement("waits", "it asks for no resources: it waits on the scheduler")
    why = _infeasible(shape, nodes)
    if why is not None:
        return Judgement("infeasible", why)
    able = [node for node in nodes if replicas_in(node.total, shape)[0] >= 1]
    room = [node for node in able if replicas_in({r: _free(node, r) for r in shape}, shape)[0] >= 1]
    gpu = shape.get("GPU", 0.0)
    by = "node_sum"
    if room:
        fragmented: list[tuple[PendingNode, list[tuple[int, float]]]] = []
        for node in room:
            devices = device_free(node) if gpu > 0 else None
            if devices is not None:
                by = "device"
                if not devices_hold(devices, gpu):
                    fragmented.append((node, devices))
                    continue
            way = "per GPU" if devices is not None else "by node sums"
            return Judgement(
                "waits",
                f"the cluster has room for it now ({_label(node)}, {way}):"
                " it waits on its dependencies or the scheduler",
                "device" if devices is not None else "node_sum",
            )
        node, devices = max(fragmented, key=lambda entry: _free(entry[0], "GPU") or 0.0)
        summed = _number(ray_round(_free(node, "GPU") or 0.0))
        lacking_device = (
            f"no single GPU has {_number(gpu)}" if gpu < 1 else f"not {int(gpu)} GPU(s) wholly free"
        )
        return Judgement(
            "fragmented",
            f"free by the node sum ({summed} GPU on {_label(node)}), but {lacking_device}:"
            f" {devices_text(devices)}",
            "device",
        )
    short = [
        (node, [r for r in shape if ray_units(_free(node, r) or 0.0) < ray_units(shape[r])]) for node in able
    ]
    order = {r: i for i, r in enumerate(_EXHAUSTED_ORDER)}
    node, lacking = min(short, key=lambda entry: len(entry[1]))
    resource = min(lacking, key=lambda r: (order.get(r, len(order)), r))
    best = max(able, key=lambda n: _free(n, resource) or 0.0)
    have = _free(best, resource) or 0.0
    code = _EXHAUSTED_CODE.get(resource, "resource_exhausted")
    text = (
        f"{resource} exhausted: needs {amount_text(resource, shape[resource])}, the best node"
        f" ({_label(best)}) has {amount_text(resource, have)} free"
        f" of {amount_text(resource, best.total[resource])}"
    )
    return Judgement(code, text, by)


def _gang_parts(gang: PendingGang) -> tuple[str, str, str]:
    """(placement group id, strategy, state) from Ray's ``<id>:<strategy>|<state>``."""
    head, _, state = gang.details.partition("|")
    group, _, strategy = head.partition(":")
    return group, strategy, state


def judge_gang(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    nodes: Sequence[PendingNode],
    device_free: DeviceFree,
) -> Judgement:
    """Why a placement group is not placed: all bundles on one node (``STRICT_PACK``) or
    bundle by bundle on the free resources left, one node each for ``STRICT_SPREAD``."""
    if strategy == "STRICT_PACK" or len(bundles) <= 1:
        total: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return judge(canonical(total), nodes, device_free)
    for bundle in bundles:
        why = _infeasible(bundle, nodes)
        if why is not None:
            return Judgement("infeasible", why)
    left = [
        PendingNode(node_id=n.node_id, node_ip=n.node_ip, total=n.total, available=dict(n.available))
        for n in nodes
    ]
    used: set[str] = set()
    for bundle in bundles:
        spots = [n for n in left if not (strategy == "STRICT_SPREAD" and n.node_id in used)]
        spot = next((n for n in spots if replicas_in({r: _free(n, r) for r in bundle}, bundle)[0] >= 1), None)
        if spot is None:
            return judge(bundle, spots, device_free)
        used.add(spot.node_id)
        for name, amount in bundle.items():
            spot.available[name] = spot.available.get(name, 0.0) - amount
    return Judgement("waits", "the cluster has room for it now (by node sums): Ray is placing it")


def _same(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return canonical(a) == canonical(b)


def bioengine_lists(actor: PendingActor) -> bool:
    """Whether BioEngine's ``pending_resources.actors`` has the actor (``get_cluster_state``:
    the state API's ``PENDING_CREATION`` actors whose ``required_resources`` ask ``CPU``,
    ``GPU`` or ``memory`` by those literal names). Not there: ``DEPENDENCIES_UNREADY``
    actors, and actors inside a placement group, which the state API lists with
    ``CPU_group_<pg>`` names (checked on Ray 2.60). rayscope's ``pending`` explains both."""
    asks = actor.required_resources
    return actor.state == "PENDING_CREATION" and any(asks.get(r, 0.0) > 0 for r in BIOENGINE_HARDWARE)


def explain(
    read: PendingRead, device_free: Optional[DeviceFree] = None
) -> tuple[PendingResources, list[PendingDemand]]:
    """BioEngine's ``pending_resources`` and rayscope's ``pending`` list from one read."""
    device_free = device_free or gpus_free_from_actors(read)
    nodes = read.nodes
    gangs = {(_gang_parts(g)[0]): g for g in read.gangs}
    unmatched = list(read.actors)
    demands: list[PendingDemand] = []
    tasks: list[PendingTask] = []
    for request in read.requests:
        shape, group = split_group(request.shape)
        mine = [a for a in unmatched if _same(a.required_resources, request.shape)][: request.count]
        unmatched = [a for a in unmatched if a not in mine]
        if group:
            gang = gangs.get(group)
            strategy = _gang_parts(gang)[1] if gang is not None else ""
            judgement = Judgement(
                "waits_placement_group",
                f"waits on placement group {group[:12]}"
                + (
                    f" ({strategy}), which is not placed yet"
                    if gang is not None
                    else ": no room left in its bundles"
                ),
            )
        else:
            judgement = judge(shape, nodes, device_free)
        demands.append(_demand("request", shape, request.count, mine, judgement, group))
        tasks += [PendingTask(required_resources=shape)] * max(0, request.count - len(mine))
    for actor in unmatched:  # in the actor table, not (yet) in the scheduler's demand
        shape, group = split_group(actor.required_resources)
        if actor.state == "DEPENDENCIES_UNREADY":
            judgement = Judgement("waits", "waits on its dependencies (its arguments are not ready yet)")
        elif group:
            judgement = Judgement("waits_placement_group", f"waits on placement group {group[:12]}")
        else:
            judgement = judge(shape, nodes, device_free)
        demands.append(_demand("actor", shape, 1, [actor], judgement, group))
    for gang in read.gangs:
        group, strategy, _ = _gang_parts(gang)
        bundles = [canonical(b) for b in gang.bundles]
        total: dict[str, float] = {}
        for bundle in bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        judgement = judge_gang(bundles, strategy, nodes, device_free)
        demand = _demand("placement_group", canonical(total), 1, [], judgement, group)
        demand.bundles, demand.strategy = bundles, strategy
        demands.append(demand)
    actors = [a for a in read.actors if bioengine_lists(a)][:BIOENGINE_LIST_LIMIT]
    tasks = tasks[:BIOENGINE_LIST_LIMIT]
    resources = PendingResources(actors=actors, jobs=[], tasks=tasks, total=len(actors) + len(tasks))
    return resources, merge_demands(demands)


def _demand(
    kind: str,
    shape: dict[str, float],
    count: int,
    actors: Sequence[PendingActor],
    judgement: Judgement,
    group: str,
) -> PendingDemand:
    return PendingDemand(
        kind=kind,
        shape=shape,
        count=count,
        names=sorted(a.name for a in actors if a.name),
        jobs=sorted({a.job_id for a in actors if a.job_id}),
        placement_group=group,
        reason=judgement.reason,
        reason_text=judgement.text,
        by=judgement.by,
    )


def merge_demands(demands: Sequence[PendingDemand]) -> list[PendingDemand]:
    """One entry per kind, shape, placement group and reason (actors seen one by one are
    counted together), in a stable order: requests, actors, placement groups; most first."""
    merged: dict[tuple[str, str, str, str, str, str], PendingDemand] = {}
    for demand in demands:
        key = (
            demand.kind,
            shape_text(demand.shape),
            demand.strategy,
            repr(demand.bundles) if demand.kind == "placement_group" else demand.placement_group,
            demand.reason,
            demand.reason_text,
        )
        seen = merged.get(key)
        if seen is None:
            merged[key] = demand
            continue
        seen.count += demand.count
        seen.names = sorted(seen.names + demand.names)
        seen.jobs = sorted(set(seen.jobs) | set(demand.jobs))
        if demand.placement_group != seen.placement_group:
            seen.placement_group = ""
    kinds = {"request": 0, "actor": 1, "placement_group": 2}
    return sorted(
        merged.values(), key=lambda d: (kinds.get(d.kind, 3), -d.count, shape_text(d.shape), d.reason)
    )


def attach(status: ClusterStatus, read: Optional[PendingRead]) -> ClusterStatus:
    """``status`` with its cluster block's ``pending_resources`` and ``pending`` filled in
    from ``read`` (left ``None`` when the pending demand was not read)."""
    if read is None:
        return status
    resources, demands = explain(read)
    cluster = msgspec.structs.replace(status.cluster, pending_resources=resources, pending=demands)
    return msgspec.structs.replace(status, cluster=cluster)
