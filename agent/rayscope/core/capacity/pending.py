"""What waits to be placed, and why it does not fit. Pure: a :class:`PendingRead` in (one
autoscaler-state read and the actor table, see ``gcs_read.read_pending``), the JSON's
``cluster.pending`` and BioEngine's ``cluster.pending_resources`` out. No I/O, no clock.

Each waiting shape gets one reason: ``waits_placement_group`` when it is to run in a
placement group that is not placed yet, else :func:`rayscope.core.capacity.reasons.judge`'s
(infeasible, waits, fragmented, or what is exhausted), judged against the free resources of
the same read; per device by :func:`gpus_free_from_actors` (Ray's own per-device placement,
``resource_mapping`` in the actor table) where it can tell.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Optional

import msgspec

from rayscope.core.capacity import selectors as sel
from rayscope.core.capacity.label_reasons import judge_gang_selected, judge_selected
from rayscope.core.capacity.reasons import DeviceFree, Judgement, bundle_total, canonical, judge, judge_gang
from rayscope.schema.pending import (
    LabelSelector,
    PendingActor,
    PendingDemand,
    PendingGang,
    PendingNode,
    PendingRead,
    PendingResources,
    PendingTask,
)
from rayscope.schema.status import ClusterStatus
from rayscope.units import number, ray_round, ray_units

BIOENGINE_LIST_LIMIT = 100
"""BioEngine lists pending entries through Ray's state API, which answers at most 100 per
list (one call each for actors, jobs and tasks)."""
BIOENGINE_HARDWARE = ("CPU", "GPU", "memory")
"""The resources BioEngine reads, under these literal names, to tell an actor that needs a node."""

# Placement-group resources as Ray names them: CPU_group_<pg id>, CPU_group_<bundle>_<pg id>.
_GROUP = re.compile(r"^(?P<name>.+?)_group_(?:\d+_)?(?P<pg>[0-9a-f]+)$")
_GROUP_MARKER = "bundle"


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
    return " ".join(f"{name}={number(amount)}" for name, amount in shape.items())


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


def _gang_parts(gang: PendingGang) -> tuple[str, str, str]:
    """(placement group id, strategy, state) from Ray's ``<id>:<strategy>|<state>``."""
    head, _, state = gang.details.partition("|")
    group, _, strategy = head.partition(":")
    return group, strategy, state


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


def judge_pending(
    read: PendingRead, device_free: Optional[DeviceFree] = None
) -> tuple[PendingResources, list[PendingDemand]]:
    """BioEngine's ``pending_resources`` and rayscope's ``pending`` list from one read."""
    device_free = device_free or gpus_free_from_actors(read)
    demands, tasks, unmatched = _requests(read, device_free)
    demands += [_actor_demand(actor, read, device_free) for actor in unmatched]
    demands += [_gang_demand(gang, read.nodes, device_free) for gang in read.gangs]
    actors = [a for a in read.actors if bioengine_lists(a)][:BIOENGINE_LIST_LIMIT]
    tasks = tasks[:BIOENGINE_LIST_LIMIT]
    resources = PendingResources(actors=actors, jobs=[], tasks=tasks, total=len(actors) + len(tasks))
    return resources, merge_demands(demands)


def _requests(
    read: PendingRead, device_free: DeviceFree
) -> tuple[list[PendingDemand], list[PendingTask], list[PendingActor]]:
    """The scheduler's demand, one entry per request with the actors it matches; the tasks
    BioEngine lists for the rest of each request; and the actors no request matched."""
    gangs = {_gang_parts(g)[0]: g for g in read.gangs}
    unmatched = list(read.actors)
    demands: list[PendingDemand] = []
    tasks: list[PendingTask] = []
    for request in read.requests:
        shape, group = split_group(request.shape)
        primary = request.label_selectors[0] if request.label_selectors else []
        mine = [
            a
            for a in unmatched
            if _same(a.required_resources, request.shape) and sel.same(_actor_selector(a), primary)
        ][: request.count]
        unmatched = [a for a in unmatched if a not in mine]
        options = _options(request.label_selectors, mine, read)
        if group:
            judgement, admitted = _in_group(group, gangs.get(group)), None
        else:
            judgement, admitted = _judge(shape, options, read.nodes, device_free)
        demand = _demand("request", shape, request.count, mine, judgement, group)
        demands.append(_selected(demand, options, admitted))
        tasks += [PendingTask(required_resources=shape)] * max(0, request.count - len(mine))
    return demands, tasks, unmatched


def _actor_selector(actor: PendingActor) -> LabelSelector:
    return sel.parse_read(actor.label_selector) if isinstance(actor.label_selector, dict) else []


def _options(
    selectors: Sequence[LabelSelector], actors: Sequence[PendingActor], read: PendingRead
) -> list[LabelSelector]:
    """A demand's selector and fallbacks: the autoscaler state's; where it holds no fallback
    (Ray 2.53-2.57) and its actors' table entries name some (2.55+), those."""
    options = list(selectors)
    if len(options) <= 1:
        fallbacks = next(
            (read.actor_fallbacks[a.actor_id] for a in actors if a.actor_id in read.actor_fallbacks), []
        )
        if fallbacks:
            options = [options[0] if options else [], *fallbacks]
    return options


def _judge(
    shape: Mapping[str, float],
    options: Sequence[LabelSelector],
    nodes: Sequence[PendingNode],
    device_free: DeviceFree,
) -> tuple[Judgement, Optional[int]]:
    """:func:`judge`, on the nodes the selectors admit where the demand names any."""
    if not any(options):
        return judge(shape, nodes, device_free), None
    return judge_selected(shape, [list(o) for o in options], nodes, device_free)


def _selected(
    demand: PendingDemand, options: Sequence[LabelSelector], admitted: Optional[int]
) -> PendingDemand:
    """``demand`` with its selectors in Ray's syntax and the count its selector admits."""
    if options and options[0]:
        demand.label_selector = sel.as_dict(options[0])
    if len(options) > 1:
        demand.fallback_selectors = [sel.as_dict(o) for o in options[1:]]
    if admitted is not None:
        demand.admitted_nodes = admitted
    return demand


def _in_group(group: str, gang: Optional[PendingGang]) -> Judgement:
    """A request to run in the placement group ``group`` (``gang``: that group, if it waits)."""
    if gang is None:
        return Judgement(
            "waits_placement_group", f"waits on placement group {group[:12]}: no room left in its bundles"
        )
    strategy = _gang_parts(gang)[1]
    return Judgement(
        "waits_placement_group",
        f"waits on placement group {group[:12]} ({strategy}), which is not placed yet",
    )


def _actor_demand(actor: PendingActor, read: PendingRead, device_free: DeviceFree) -> PendingDemand:
    """An actor in the actor table, not (yet) in the scheduler's demand."""
    shape, group = split_group(actor.required_resources)
    options = _options([_actor_selector(actor)], [actor], read)
    admitted = None
    if actor.state == "DEPENDENCIES_UNREADY":
        judgement = Judgement("waits", "waits on its dependencies (its arguments are not ready yet)")
    elif group:
        judgement = Judgement("waits_placement_group", f"waits on placement group {group[:12]}")
    else:
        judgement, admitted = _judge(shape, options, read.nodes, device_free)
    return _selected(_demand("actor", shape, 1, [actor], judgement, group), options, admitted)


def _gang_demand(gang: PendingGang, nodes: Sequence[PendingNode], device_free: DeviceFree) -> PendingDemand:
    """A placement group not placed yet: the sum of its bundles, judged bundle by bundle."""
    group, strategy, _ = _gang_parts(gang)
    bundles = [canonical(b) for b in gang.bundles]
    chosen = gang.bundle_selectors if len(gang.bundle_selectors) == len(bundles) else []
    if any(chosen):
        judgement = judge_gang_selected(bundles, chosen, strategy, nodes, device_free)
    else:
        judgement = judge_gang(bundles, strategy, nodes, device_free)
    demand = _demand("placement_group", canonical(bundle_total(bundles)), 1, [], judgement, group)
    demand.bundles, demand.strategy = bundles, strategy
    if any(chosen):
        demand.bundle_selectors = [sel.as_dict(option) for option in chosen]
    return demand


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
    merged: dict[tuple[str, str, str, str, str, str, str], PendingDemand] = {}
    for demand in demands:
        key = (
            demand.kind,
            shape_text(demand.shape),
            repr((demand.label_selector, demand.fallback_selectors, demand.bundle_selectors)),
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
    resources, demands = judge_pending(read)
    cluster = msgspec.structs.replace(status.cluster, pending_resources=resources, pending=demands)
    return msgspec.structs.replace(status, cluster=cluster)
