"""Will another app fit? Pure: a :class:`ClusterStatus` and a :class:`FitRequest` in, a
:class:`FitResult` out. No I/O, no clock.

The request's Ray shape is BioEngine's sizing (:mod:`rayscope.core.capacity.sizing`).

Placement is on what the scheduler has available per node (``total - used``, in Ray's 1e-4
fixed point, so 0.96 / 0.01 is 96, not 95.99). Replicas are spread one per node in turn,
as Ray Serve spreads replicas. ``GPU`` is packed per device, as Ray packs it: a fraction
needs that much free on one device, ``n`` whole GPUs need ``n`` free devices, taken from
Ray's own placement (:mod:`rayscope.core.gpu.placement`) where the actor table was read and every
booked ``GPU`` is an actor's; elsewhere node sums, and the answer says so. ``VRAM_MB`` is a
per-node resource, so Ray itself books it that way.

Beside the booking, the driver's view: on each node given replicas, the free memory per GPU
(fresh reports only; total − the used figure rayscope trusts, :func:`rayscope.core.gpu.trust.gpu_used`)
must hold what each replica needs, best case (each replica on the GPU with the most memory
left). A booking that fits where the memory does not is a "no". A GPU whose used figure is not
trusted (a vGPU guest without a fresh CUDA sample) is not checked: a replica that finds no room
on the checked GPUs may go there, and the node's check says "not checked", never "short".
"""

from collections.abc import Mapping, Sequence
from typing import Optional

import msgspec

from rayscope.core.capacity.fit_labels import admitted
from rayscope.core.capacity.sizing import EXIT_COULD_NOT_TELL, request_sizing, sizing_hazard
from rayscope.core.gpu.placement import device_free, placement_known, replicas_on_devices
from rayscope.core.gpu.precedence import NOT_READ, figures_old
from rayscope.core.gpu.trust import settled_used
from rayscope.core.rollup import (
    SCHEDULER_STEMS,
    SchedulerView,
    ray_accelerator,
    schedulable_nodes,
    scheduler_failure,
    scheduler_view,
)
from rayscope.errors import AgentError
from rayscope.labels import node_label
from rayscope.schema.dashboard import DASHBOARD_SOURCE
from rayscope.schema.fit import FitRequest, FitResult, GpuFit, NodeFit
from rayscope.schema.status import ClusterStatus, NodeStatus
from rayscope.units import ACCELERATOR_LABEL, ACCELERATOR_PREFIX, MIB, ray_round, ray_units

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1

UNBOUNDED = 10**9
"""Capacity of a node for a shape that asks for nothing it could run out of."""
PER_DEVICE = "GPU per device"


def available(node: NodeStatus, resource: str) -> Optional[float]:
    """What the scheduler has free of ``resource`` on ``node``; ``None`` = not advertised."""
    stem = SCHEDULER_STEMS.get(resource)
    if stem is not None:
        total: float = getattr(node, "total_" + stem)
        used: float = getattr(node, "used_" + stem)
        return max(0.0, total - used) if total > 0 else None
    if resource.startswith(ACCELERATOR_PREFIX):
        # The GCS view in ClusterStatus names the token but not its availability; nobody books it whole.
        # A node has the token its line shows and, from 2.49, the one Ray detected (its label).
        token = resource[len(ACCELERATOR_PREFIX) :]
        detected = node.labels.get(ACCELERATOR_LABEL) if isinstance(node.labels, dict) else None
        return 1.0 if token in (ray_accelerator(node), detected) else None
    return None


def node_capacity(node: NodeStatus, shape: Mapping[str, float]) -> NodeFit:
    """How many replicas of ``shape`` the node's available resources hold, and what bounds it."""
    fit = NodeFit(
        node_id=node.node_id,
        node_ip=node.node_ip,
        head=node.head,
        accelerator_type=ray_accelerator(node),
        capacity=0,
    )
    free = {resource: available(node, resource) for resource, amount in shape.items() if amount > 0}
    fit.capacity, fit.limited_by, fit.missing = replicas_in(free, shape)
    fit.available = {resource: ray_round(amount) for resource, amount in free.items() if amount is not None}
    if not free:  # e.g. num_gpus=0 and nothing else: nothing to run out of
        fit.capacity = UNBOUNDED
    gpu = shape.get("GPU", 0.0)
    if fit.missing or gpu <= 0:
        return fit
    if placement_known(node):  # Ray packs GPU per device: a fraction must fit on one
        fit.per_device = True
        on_devices = replicas_on_devices(device_free(node), gpu)
        if on_devices < fit.capacity:
            fit.capacity, fit.limited_by = on_devices, PER_DEVICE
    elif node.total_gpu > 1:  # one GPU: its sum is the device
        fit.per_device = False
    return fit


def replicas_in(
    free: Mapping[str, Optional[float]], shape: Mapping[str, float]
) -> tuple[int, Optional[str], list[str]]:
    """(how many replicas of ``shape`` fit in ``free``, the resource that bounds it, the
    requested resources ``free`` does not have at all: ``None`` or absent). Node sums, in
    Ray's 1e-4 fixed point; the one placement rule ``fit`` and ``pending`` share."""
    missing: list[str] = []
    counts: list[tuple[int, str]] = []
    for resource, amount in shape.items():
        if amount <= 0:
            continue
        have = free.get(resource)
        if have is None:
            missing.append(resource)
            continue
        counts.append((ray_units(have) // ray_units(amount), resource))
    if missing or not counts:
        return 0, None, missing
    capacity, limited_by = min(counts, key=lambda c: c[0])
    return capacity, limited_by, missing


def per_device_note(fits: Sequence[NodeFit], nodes: Sequence[NodeStatus]) -> str:
    """One line when some GPU node's ``GPU`` was judged on node sums, not per device."""
    summed = [n for f, n in zip(fits, nodes) if f.per_device is False]
    if not summed:
        return ""
    unknown = [n for n in summed if n.placement is None]
    tasks = [n for n in summed if n.placement is not None]
    why = []
    if unknown:
        why.append(f"{len(unknown)} without the actor table's placement")
    if tasks:
        why.append(f"{len(tasks)} with GPU booked by tasks, whose devices Ray does not publish")
    return f"GPU judged on node sums, not per device, on {len(summed)} node(s): " + "; ".join(why)


def spread(fits: Sequence[NodeFit], replicas: int) -> int:
    """Place ``replicas`` one per node in turn while nodes have room; how many were placed."""
    placed = 0
    while placed < replicas:
        progress = False
        for fit in fits:
            if placed < replicas and fit.placed < fit.capacity:
                fit.placed += 1
                placed += 1
                progress = True
        if not progress:
            break
    return placed


def need_bytes(shape: Mapping[str, float], request: FitRequest, gpu_total_bytes: int) -> Optional[int]:
    """GPU memory one replica needs free on a GPU of ``gpu_total_bytes``; ``None`` = not judged
    (a whole GPU, or a shape that names no memory)."""
    if shape.get("VRAM_MB", 0) > 0:
        return int(shape["VRAM_MB"] * MIB)
    gpu = shape.get("GPU", 0.0)
    if request.shape is None and request.gpu_memory_mb is not None and request.gpu_memory_mb > 0:
        return request.gpu_memory_mb * MIB
    if request.shape is not None and 0 < gpu < 1:
        return int(gpu * gpu_total_bytes)
    return None


def _no_measurement_reason(node: NodeStatus, view: str) -> str:
    if node.stale:
        age = f" ({node.report_age_s:.0f}s old)" if node.report_age_s is not None else ""
        return f"stale report{age}"
    if node.agent in ("local", "reporting"):  # measured here or by its agent: NVML itself failed
        failed = [s.reason for s in node.sources if s.name == "nvml" and not s.ok and s.reason]
        return failed[0] if failed else "NVML did not answer"
    dashboard = node.used_gpu_memory_reason.partition("; Ray dashboard: ")[2]
    if dashboard == NOT_READ:  # Ray's dashboard was asked (rayscope.core.gpu.precedence)
        return "not measured: no agent, and Ray's dashboard could not be read (`rayscope status` says why)"
    if dashboard:
        return f"not measured: no agent, and no figure from Ray's dashboard: {dashboard}"
    if view == "gcs":
        return "not measured: without a head agent only this host's NVML is read"
    return "no agent reports this node"


def measured_gpus(node: NodeStatus) -> tuple[list[GpuFit], dict[int, str]]:
    """The node's GPUs with a trusted used figure, free memory each; and the GPUs whose NVML
    figure is not trusted (index → why), left out of the check."""
    gpus: list[GpuFit] = []
    not_checked: dict[int, str] = {}
    for g in node.gpus or ():
        if g.memory_total_bytes is None:
            continue
        figure = settled_used(g)  # settled where the report was merged (rayscope.core.gpu.settled)
        if figure.used_bytes is None:
            if figure.reason and figure.nvml_used_bytes is not None:  # measured, not trusted
                not_checked[g.index] = figure.reason
            continue
        fit = GpuFit(
            index=g.index,
            free_bytes=max(0, g.memory_total_bytes - figure.used_bytes),
            total_bytes=g.memory_total_bytes,
        )
        if figure.source == DASHBOARD_SOURCE:  # its age is the figure's own, by the reader's clock
            fit.source, fit.age_s = DASHBOARD_SOURCE, figure.age_s or 0.0
        elif figure.source == "cuda":
            fit.source, fit.age_s = "cuda", round((figure.age_s or 0.0) + (node.report_age_s or 0.0), 1)
        gpus.append(fit)
    return gpus, not_checked


def check_measured(
    fit: NodeFit, node: NodeStatus, shape: Mapping[str, float], request: FitRequest, view: str
) -> None:
    """Put the replicas placed on ``node`` on its GPUs by NVML free memory, best case."""
    if fit.placed == 0:
        return
    if figures_old(node) or node.gpus is None:
        fit.measured, fit.measured_reason = "unknown", _no_measurement_reason(node, view)
        return
    gpus, not_checked = measured_gpus(node)
    if not_checked:
        fit.not_checked_gpus = sorted(not_checked)
        fit.measured_reason = " / ".join(sorted(set(not_checked.values())))
    if not gpus:
        if not_checked:
            fit.measured = "not_checked"
        else:
            fit.measured, fit.measured_reason = "unknown", "NVML measured no GPU memory on this node"
        return
    needs = [need_bytes(shape, request, g.total_bytes) for g in gpus]
    if any(n is None for n in needs):
        fit.measured, fit.measured_reason = "not_checked", "the request names no memory size"
        return
    fit.need_bytes = min(n for n in needs if n is not None)
    left = {g.index: g.free_bytes for g in gpus}
    by_index = {g.index: (g, need) for g, need in zip(gpus, needs)}
    short = unchecked = False
    for _ in range(fit.placed):
        index = max(left, key=lambda i: (left[i], -i))
        gpu, need = by_index[index]
        if need is not None and left[index] >= need:
            gpu.replicas += 1
            left[index] -= need
        elif not_checked:  # no room where measured: the GPUs not checked may have it
            unchecked = True
        else:
            gpu.replicas += 1
            gpu.short = short = True
    fit.gpus = gpus
    fit.measured = "short" if short else ("not_checked" if unchecked else "ok")


def fit(status: ClusterStatus, request: FitRequest) -> FitResult:
    """The answer to "will R more replicas fit?", by booking and by measured memory.

    Raises :class:`AgentError` (exit 2) when it cannot tell: no scheduler view, no alive
    node, a GPU size it would have to guess.
    """
    if request.replicas < 1:
        raise AgentError("--replicas must be at least 1", EXIT_COULD_NOT_TELL)
    view = scheduler_view(status)
    if view is not SchedulerView.FRESH:
        why = scheduler_failure(status)
        what = (
            "no scheduler view"
            if view is SchedulerView.NONE
            else (f"only a {status.scheduler_age_s or 0:.0f}s old scheduler view")
        )
        raise AgentError(f"could not tell: {what} of the cluster{why}", EXIT_COULD_NOT_TELL)
    nodes = schedulable_nodes(status)
    if not nodes:
        raise AgentError("could not tell: the scheduler knows no alive node", EXIT_COULD_NOT_TELL)
    sizing = request_sizing(status, request)
    shape = sizing.shape
    result = FitResult(
        generated_at=status.generated_at,
        view=status.view,
        request=request,
        sizing=sizing.name,
        sizing_reason=sizing.why,
        smallest_gpu_mb=None if sizing.smallest_mb is None else round(sizing.smallest_mb, 1),
        smallest_gpu_from=sizing.smallest_from,
        shape=shape,
        refused=sizing.refused,
        replicas=request.replicas,
        hazard=sizing_hazard(shape, sizing.name),
    )
    if sizing.refused is not None:
        return result
    nodes = _candidates(result, nodes, status)
    if isinstance(result.label_miss, str):
        return result
    result.nodes = [node_capacity(n, shape) for n in nodes]
    result.placed = spread(result.nodes, request.replicas)
    result.per_device_note = per_device_note(result.nodes, nodes)
    result.fits_booking = result.placed == request.replicas
    for node_fit, node in zip(result.nodes, nodes):
        check_measured(node_fit, node, shape, request, status.view)
    measured = [f.measured for f in result.nodes if f.placed > 0]
    if "short" in measured:
        result.fits_measured = False
    elif measured and all(m == "ok" for m in measured):
        result.fits_measured = True
    result.fits = result.fits_booking and result.fits_measured is not False
    result.hint = fraction_hint(status, request, nodes, result)
    return result


def fraction_hint(
    status: ClusterStatus, request: FitRequest, nodes: Sequence[NodeStatus], result: FitResult
) -> str:
    """Where ``auto`` booked ``VRAM_MB`` (some node advertises it) and not every replica was
    placed: what ``--sizing fraction`` (BioEngine's other path) would place, where GPU nodes
    that advertise none have room for it; ``""`` when they have none, it would place no
    more, or it could not size the GPU."""
    if request.sizing != "auto" or result.sizing != "vram_mb" or result.fits_booking:
        return ""
    try:
        other = request_sizing(status, msgspec.structs.replace(request, sizing="fraction"))
    except AgentError:  # a GPU size it would have to guess: no hint rather than a guess
        return ""
    if other.refused is not None or other.smallest_mb is None:
        return ""
    fits = [node_capacity(n, other.shape) for n in nodes]
    placed = spread(fits, request.replicas)
    where = [
        node_label(n.node_ip, n.node_id, n.hostname)
        for f, n in zip(fits, nodes)
        if f.capacity and n.total_vram_mb <= 0
    ]
    if placed <= result.placed or not where:
        return ""
    return (
        f"--sizing fraction places {placed}/{request.replicas} replica(s) by booking: GPU"
        f" {other.shape['GPU']:g} per replica ({request.gpu_memory_mb}/{other.smallest_mb:.0f} MB of the"
        f" smallest GPU, {other.smallest_from}); room on nodes without VRAM_MB: {', '.join(where)}"
    )


def _candidates(result: FitResult, nodes: list[NodeStatus], status: ClusterStatus) -> list[NodeStatus]:
    """The nodes the request's label selector admits (all without one), counted on ``result``."""
    chosen = admitted(result.request, nodes, status.sources)
    if isinstance(result.request.label_selector, dict):
        result.admitted_nodes, result.alive_nodes = len(chosen.nodes), len(nodes)
    if chosen.miss:
        result.label_miss = chosen.miss
    return chosen.nodes


def exit_code(result: FitResult) -> int:
    """0 = fits, 1 = does not fit (by booking, by measured memory, or refused)."""
    return EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT
