"""Why one shape does not run now: one reason, judged against the free resources of one
read, decided first (a :class:`Decision`) and then said (a :class:`Judgement`). Pure: no
I/O, no clock; :mod:`rayscope.core.capacity.pending` asks it for every waiting shape.

The reasons, in this order (``waits_placement_group``, a shape to run in a placement group
not placed yet, is told apart before a shape gets here):

* ``infeasible``: no node has the resource at all, or not that much of it (an accelerator
  type nobody has, 2 GPUs on 1-GPU nodes);
* ``waits``: the cluster has room for it now: it waits on its dependencies or the scheduler;
* ``fragmented``: a node has the GPU fraction free by its sum, but no single device has it
  (Ray puts a fraction below 1 on one device, whole GPUs on free devices);
* ``vram_exhausted``, ``gpu_exhausted``, ``cpu_exhausted``, ``memory_exhausted``,
  ``resource_exhausted``: what the best node lacks, naming what it has free.

Node sums come from :func:`rayscope.core.capacity.fit.replicas_in`, the placement rule ``fit``
uses. The per-device check is one function, :data:`DeviceFree` (by default
:func:`rayscope.core.capacity.pending.gpus_free_from_actors`, Ray's own per-device placement);
where it cannot tell (a task holds GPUs: tasks are not in the actor table) the judgement is
by node sums, and the reason says so (``by``).
"""

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Optional

from rayscope.core.capacity.fit import replicas_in
from rayscope.core.gpu.placement import replicas_on_free
from rayscope.labels import node_label
from rayscope.schema.pending import PendingNode
from rayscope.units import ACCELERATOR_PREFIX, number, ray_round, ray_units, size

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


def amount_text(resource: str, amount: float) -> str:
    """An amount in the operator's unit: ``8192 MB`` of VRAM_MB, ``2.0 GB`` of memory."""
    if resource == "VRAM_MB":
        return f"{amount:.0f} MB"
    if resource in ("memory", "object_store_memory"):
        return size(amount)
    return f"{number(ray_round(amount))} {resource}"


def _label(node: PendingNode) -> str:
    return node_label(node.node_ip, node.node_id)


def devices_hold(devices: Sequence[tuple[int, float]], gpu: float) -> bool:
    """Whether one replica asking ``gpu`` fits these devices, by Ray's packing rule (the
    one ``fit`` uses: :func:`rayscope.core.gpu.placement.replicas_on_free`)."""
    return gpu <= 0 or replicas_on_free([free for _, free in devices], gpu) >= 1


def devices_text(devices: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"GPU {index}: {number(free)} free" for index, free in devices)


class Judgement(NamedTuple):
    reason: str
    text: str
    by: str = "node_sum"


def _free(node: PendingNode, resource: str) -> Optional[float]:
    """What ``node`` has free of ``resource``; ``None`` = it does not have it at all."""
    if resource not in node.total:
        return None
    return max(0.0, node.available.get(resource, 0.0))


def has_room(node: PendingNode, shape: Mapping[str, float]) -> bool:
    """Whether ``node``'s free resources hold one ``shape`` now (by its sums)."""
    return replicas_in({r: _free(node, r) for r in shape}, shape)[0] >= 1


def _accelerator_kinds(nodes: Sequence[PendingNode]) -> str:
    """`` (accelerator types here: A10G, T4)``, or `` (no node names one)``."""
    names = {name for node in nodes for name in node.total if name.startswith(ACCELERATOR_PREFIX)}
    kinds = sorted(name[len(ACCELERATOR_PREFIX) :] for name in names)
    return f" (accelerator types here: {', '.join(kinds)})" if kinds else " (no node names one)"


def _infeasible(shape: Mapping[str, float], nodes: Sequence[PendingNode]) -> Optional[str]:
    """Why no node could ever hold ``shape`` (its totals), or ``None`` when one could."""
    if any(replicas_in(node.total, shape)[0] >= 1 for node in nodes):
        return None
    for resource, amount in shape.items():
        have = [node.total[resource] for node in nodes if resource in node.total]
        if not have:
            here = _accelerator_kinds(nodes) if resource.startswith(ACCELERATOR_PREFIX) else ""
            return f"no node has {resource}{here}"
        if ray_units(max(have)) < ray_units(amount):
            most = amount_text(resource, max(have))
            return f"no node has {amount_text(resource, amount)} (at most {most} on one node)"
    return "no single node has all of it: " + ", ".join(shape)


class Decision(NamedTuple):
    """Why a shape that some node could hold does not run now, before it is said
    (:func:`_say`): the reason code, how it was judged, and what the sentence names."""

    reason: str
    """``waits``, ``fragmented``, or an ``..._exhausted`` code."""
    node: PendingNode
    """``waits``: a node with room; ``fragmented``: the one with the most GPU free by its sum;
    exhausted: the one with the most free of :attr:`resource`."""
    by: str = "node_sum"
    resource: str = ""
    """Exhausted: what the node with the fewest resources short lacks (in ``_EXHAUSTED_ORDER``)."""
    devices: Sequence[tuple[int, float]] = ()
    """``fragmented``: the node's devices and the fraction each has free."""


def _decide(shape: Mapping[str, float], nodes: Sequence[PendingNode], device_free: DeviceFree) -> Decision:
    """Where ``shape`` fits some node: whether one has room now (by node sums, then per device)
    and, where none has, what is exhausted."""
    able = [node for node in nodes if replicas_in(node.total, shape)[0] >= 1]
    room = [node for node in able if has_room(node, shape)]
    return _with_room(shape, room, device_free) if room else _exhausted(shape, able)


def _with_room(shape: Mapping[str, float], room: Sequence[PendingNode], device_free: DeviceFree) -> Decision:
    """``waits`` on the first node whose devices hold the ``GPU`` asked (or that has no per-device
    answer); ``fragmented`` when every node with room by its sum has no device that holds it."""
    gpu = shape.get("GPU", 0.0)
    fragmented: list[tuple[PendingNode, list[tuple[int, float]]]] = []
    for node in room:
        devices = device_free(node) if gpu > 0 else None
        if devices is None:
            return Decision("waits", node)
        if devices_hold(devices, gpu):
            return Decision("waits", node, "device")
        fragmented.append((node, devices))
    node, devices = max(fragmented, key=lambda entry: _free(entry[0], "GPU") or 0.0)
    return Decision("fragmented", node, "device", devices=devices)


def _exhausted(shape: Mapping[str, float], able: Sequence[PendingNode]) -> Decision:
    """What the node with the fewest resources short lacks first, and the node with most of it."""
    short = [
        (node, [r for r in shape if ray_units(_free(node, r) or 0.0) < ray_units(shape[r])]) for node in able
    ]
    order = {r: i for i, r in enumerate(_EXHAUSTED_ORDER)}
    _, lacking = min(short, key=lambda entry: len(entry[1]))
    resource = min(lacking, key=lambda r: (order.get(r, len(order)), r))
    best = max(able, key=lambda n: _free(n, resource) or 0.0)
    return Decision(_EXHAUSTED_CODE.get(resource, "resource_exhausted"), best, resource=resource)


def _say(shape: Mapping[str, float], decision: Decision) -> Judgement:
    """A :class:`Decision` in the operator's words."""
    node = decision.node
    if decision.reason == "waits":
        way = "per GPU" if decision.by == "device" else "by node sums"
        text = f"the cluster has room for it now ({_label(node)}, {way}):"
        return Judgement("waits", text + " it waits on its dependencies or the scheduler", decision.by)
    if decision.reason == "fragmented":
        gpu = shape.get("GPU", 0.0)
        summed = number(ray_round(_free(node, "GPU") or 0.0))
        lacking = f"no single GPU has {number(gpu)}" if gpu < 1 else f"not {int(gpu)} GPU(s) wholly free"
        text = f"free by the node sum ({summed} GPU on {_label(node)}), but {lacking}:"
        return Judgement("fragmented", f"{text} {devices_text(decision.devices)}", "device")
    resource = decision.resource
    text = (
        f"{resource} exhausted: needs {amount_text(resource, shape[resource])}, the best node"
        f" ({_label(node)}) has {amount_text(resource, _free(node, resource) or 0.0)} free"
        f" of {amount_text(resource, node.total[resource])}"
    )
    return Judgement(decision.reason, text, decision.by)


def judge(shape: Mapping[str, float], nodes: Sequence[PendingNode], device_free: DeviceFree) -> Judgement:
    """Why ``shape`` (placement-group suffixes off) does not run now on ``nodes``."""
    if not shape:
        return Judgement("waits", "it asks for no resources: it waits on the scheduler")
    why = _infeasible(shape, nodes)
    if why is not None:
        return Judgement("infeasible", why)
    return _say(shape, _decide(shape, nodes, device_free))


def bundle_total(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """What a placement group's bundles ask for together."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def judge_gang(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    nodes: Sequence[PendingNode],
    device_free: DeviceFree,
    admitted: Optional[Sequence[Sequence[PendingNode]]] = None,
) -> Judgement:
    """Why a placement group is not placed: all bundles on one node (``STRICT_PACK``) or
    bundle by bundle on the free resources left, one node each for ``STRICT_SPREAD``.
    ``admitted``: per bundle, the nodes its label selector admits (``nodes``: those all admit)."""
    if strategy == "STRICT_PACK" or len(bundles) <= 1:
        return judge(canonical(bundle_total(bundles)), nodes, device_free)
    for i, bundle in enumerate(bundles):
        why = _infeasible(bundle, nodes if admitted is None else admitted[i])
        if why is not None:
            return Judgement("infeasible", why)
    return _bundle_by_bundle(bundles, strategy == "STRICT_SPREAD", nodes, device_free, admitted)


def _no_node_of_its_own(bundle: int, nodes: int, selected: bool) -> Judgement:
    """``STRICT_SPREAD`` with more bundles than nodes it may use: never placed here."""
    where = "its label selector admits" if selected else "alive"
    return Judgement(
        "infeasible",
        f"STRICT_SPREAD: bundle {bundle} has no node of its own left ({nodes} node(s) {where},"
        f" {bundle} bundle(s) before it)",
    )


def _bundle_by_bundle(
    bundles: Sequence[Mapping[str, float]],
    spread: bool,
    nodes: Sequence[PendingNode],
    device_free: DeviceFree,
    admitted: Optional[Sequence[Sequence[PendingNode]]] = None,
) -> Judgement:
    """Each bundle on the first node with room left (a node of its own each when ``spread``,
    one its selector admits where ``admitted`` says); the first bundle that finds none is
    judged on the nodes it could still go to."""
    pool = nodes if admitted is None else list({n.node_id: n for group in admitted for n in group}.values())
    left = [
        PendingNode(node_id=n.node_id, node_ip=n.node_ip, total=n.total, available=dict(n.available))
        for n in pool
    ]
    allowed = None if admitted is None else [{n.node_id for n in group} for group in admitted]
    used: set[str] = set()
    for i, bundle in enumerate(bundles):
        spots = [
            n
            for n in left
            if not (spread and n.node_id in used) and (allowed is None or n.node_id in allowed[i])
        ]
        if not spots:
            return _no_node_of_its_own(i, len(left), allowed is not None)
        spot = next((n for n in spots if has_room(n, bundle)), None)
        if spot is None:
            return judge(bundle, spots, device_free)
        used.add(spot.node_id)
        for name, amount in bundle.items():
            spot.available[name] = spot.available.get(name, 0.0) - amount
    return Judgement("waits", "the cluster has room for it now (by node sums): Ray is placing it")
