"""Will another app fit? Pure: a :class:`ClusterStatus` and a :class:`FitRequest` in, a
:class:`FitResult` out. No I/O, no clock.

The request shape is BioEngine AppBuilder's (``_apply_gpu_memory``) for an app declared by
``gpu_memory_mb``:

* on a cluster where a node advertises ``VRAM_MB``: ``GPU`` 0.01 (a device handle, so CUDA
  sees a GPU) plus ``VRAM_MB`` = the request — the real reservation;
* otherwise ``GPU`` = round(MB / the smallest GPU's MB, 2), rounded first: a rounded fraction
  over 1.1 is refused, up to 1.1 is booked as 1.0 (so 16898 MB on a 15360 MB GPU, 1.1001
  raw, rounds to 1.1 and deploys as one GPU); under 0.005 of the GPU it rounds to 0, and
  BioEngine books ``num_gpus=0``: the replica runs with no GPU at all (said as a hazard);
  with no GPU node to size against, a whole GPU;
* ``-1``: a whole GPU, ``VRAM_MB`` packing ignored.

The smallest GPU's MB: ``--gpu-total-mb`` if given, else per GPU node the smallest GPU NVML
measured (fresh reports only), else that node's ``VRAM_MB`` total divided by its GPU count.
When a GPU node has neither, the answer is "could not tell" (exit 2), never a guess.

Placement is on what the scheduler has available per node (``total - used``, in Ray's 1e-4
fixed point, so 0.96 / 0.01 is 96, not 95.99). Replicas are spread one per node in turn,
as Ray Serve spreads replicas. ``GPU`` is packed per device, as Ray packs it: a fraction
needs that much free on one device, ``n`` whole GPUs need ``n`` free devices, taken from
Ray's own placement (:mod:`agent.placement`) where the actor table was read and every
booked ``GPU`` is an actor's; elsewhere node sums, and the answer says so. ``VRAM_MB`` is a
per-node resource, so Ray itself books it that way.

Beside the booking, the driver's view: on each node given replicas, NVML's free memory per
GPU (fresh reports only) must hold what each replica needs, best case (each replica on the
GPU with the most memory left). A booking that fits where the memory does not is a "no".
"""

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Optional

from agent.errors import AgentError
from agent.placement import device_free, placement_known, replicas_on_devices
from agent.rollup import SCHEDULER_STEMS, SchedulerView, schedulable_nodes, scheduler_failure, scheduler_view
from agent.schema.fit import FitRequest, FitResult, GpuFit, NodeFit
from agent.schema.status import ClusterStatus, NodeStatus
from agent.text import node_label
from agent.units import ACCELERATOR_PREFIX, MIB, ray_round, ray_units

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_COULD_NOT_TELL = 2

GPU_HANDLE = 0.01
"""BioEngine's ``_GPU_HANDLE_EPSILON``: the GPU fraction that only binds a device."""
WHOLE_GPU = -1
GRACE = 0.1
"""BioEngine's ``_GPU_FRACTION_GRACE``: a rounded fraction up to 1 + 0.1 is booked as one
GPU; more is refused."""
FRACTION_DECIMALS = 2
"""BioEngine's ``_GPU_FRACTION_DECIMALS``: the fraction is rounded before anything else."""
UNBOUNDED = 10**9
"""Capacity of a node for a shape that asks for nothing it could run out of."""
PER_DEVICE = "GPU per device"


def validate_shape(shape: Mapping[str, object]) -> dict[str, float]:
    """A raw Ray shape as rayscope can place it; ``ValueError`` saying what is wrong."""
    clean: dict[str, float] = {}
    for name, value in shape.items():
        if name not in SCHEDULER_STEMS and not name.startswith(ACCELERATOR_PREFIX):
            known = ", ".join([*SCHEDULER_STEMS, ACCELERATOR_PREFIX + "X"])
            raise ValueError(f"unknown resource {name!r}: rayscope places {known}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: {value!r} is not a number")
        amount = float(value)
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"{name}: {value!r} must be a number of at least 0")
        if name == "GPU" and amount > 1 and amount != int(amount):
            raise ValueError(f"GPU: {value!r}: Ray books more than one GPU only in whole GPUs")
        clean[name] = amount
    if not any(amount > 0 for amount in clean.values()):
        raise ValueError("the shape requests nothing: every replica would fit anywhere")
    return clean


def advertises_vram(status: ClusterStatus) -> bool:
    """BioEngine's ``vram_resource_advertised``: some alive node offers ``VRAM_MB``."""
    return any(n.total_vram_mb > 0 for n in schedulable_nodes(status))


def gpu_size_mb(node: NodeStatus) -> tuple[Optional[float], str]:
    """(MB of the node's smallest GPU, where that came from); ``(None, "")`` if unknown."""
    if node.gpus and not node.stale:
        sizes = [g.memory_total_bytes for g in node.gpus if g.memory_total_bytes is not None]
        if sizes:
            return min(sizes) / MIB, "NVML"
    if node.total_vram_mb > 0 and node.total_gpu > 0:
        return node.total_vram_mb / node.total_gpu, "VRAM_MB"
    return None, ""


def smallest_gpu(status: ClusterStatus, override_mb: Optional[float]) -> tuple[Optional[float], str]:
    """(MB, origin) of the smallest GPU the fraction path divides by; ``(None, ...)`` when the
    cluster has no GPU node. Raises "could not tell" when a GPU node's size is unknown."""
    if override_mb is not None:
        return override_mb, "--gpu-total-mb"
    gpu_nodes = [n for n in schedulable_nodes(status) if n.total_gpu > 0]
    if not gpu_nodes:
        return None, "no GPU node"
    sizes = [(gpu_size_mb(n), n) for n in gpu_nodes]
    unknown = [n for (size, _), n in sizes if size is None]
    if unknown:
        raise AgentError(
            f"could not tell: the GPU memory size of {len(unknown)} GPU node(s) is unknown"
            " (no NVML measurement, no VRAM_MB): pass --gpu-total-mb",
            EXIT_COULD_NOT_TELL,
        )
    (size_mb, origin), node = min(sizes, key=lambda entry: entry[0][0] or 0.0)
    assert size_mb is not None
    return size_mb, f"{origin} on {node_label(node.node_ip, node.node_id, node.hostname)}"


def available(node: NodeStatus, resource: str) -> Optional[float]:
    """What the scheduler has free of ``resource`` on ``node``; ``None`` = not advertised."""
    stem = SCHEDULER_STEMS.get(resource)
    if stem is not None:
        total: float = getattr(node, "total_" + stem)
        used: float = getattr(node, "used_" + stem)
        return max(0.0, total - used) if total > 0 else None
    if resource.startswith(ACCELERATOR_PREFIX):
        # The GCS view in ClusterStatus names the token but not its availability; nobody books it whole.
        return 1.0 if node.accelerator_type == resource[len(ACCELERATOR_PREFIX) :] else None
    return None


def node_capacity(node: NodeStatus, shape: Mapping[str, float]) -> NodeFit:
    """How many replicas of ``shape`` the node's available resources hold, and what bounds it."""
    fit = NodeFit(
        node_id=node.node_id,
        node_ip=node.node_ip,
        head=node.head,
        accelerator_type=node.accelerator_type,
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
    if view == "gcs":
        return "not measured: without a head agent only this host's NVML is read"
    return "no agent reports this node"


def check_measured(
    fit: NodeFit, node: NodeStatus, shape: Mapping[str, float], request: FitRequest, view: str
) -> None:
    """Put the replicas placed on ``node`` on its GPUs by NVML free memory, best case."""
    if fit.placed == 0:
        return
    if node.stale or node.gpus is None:
        fit.measured, fit.measured_reason = "unknown", _no_measurement_reason(node, view)
        return
    gpus = [
        GpuFit(
            index=g.index,
            free_bytes=max(0, g.memory_total_bytes - g.memory_used_bytes),
            total_bytes=g.memory_total_bytes,
        )
        for g in node.gpus
        if g.memory_total_bytes is not None and g.memory_used_bytes is not None
    ]
    if not gpus:
        fit.measured, fit.measured_reason = "unknown", "NVML measured no GPU memory on this node"
        return
    needs = [need_bytes(shape, request, g.total_bytes) for g in gpus]
    if any(n is None for n in needs):
        fit.measured, fit.measured_reason = "not_checked", "the request names no memory size"
        return
    fit.need_bytes = min(n for n in needs if n is not None)
    left = {g.index: g.free_bytes for g in gpus}
    by_index = {g.index: (g, need) for g, need in zip(gpus, needs)}
    short = False
    for _ in range(fit.placed):
        index = max(left, key=lambda i: (left[i], -i))
        gpu, need = by_index[index]
        gpu.replicas += 1
        if need is None or left[index] < need:
            gpu.short = short = True
        else:
            left[index] -= need
    fit.gpus = gpus
    fit.measured = "short" if short else "ok"


def gpu_fraction(mb: int, smallest_mb: float) -> Optional[float]:
    """BioEngine's ``num_gpus`` for ``mb`` on a smallest GPU of ``smallest_mb``, exactly as
    ``AppBuilder._apply_gpu_memory`` books it: the fraction is rounded to 2 decimals first;
    a rounded fraction over 1.1 is refused (``None``); otherwise the smaller of it and 1.0.
    Under 0.005 of the GPU this is 0.0: no GPU at all (see :func:`sizing_hazard`)."""
    fraction = round(int(mb) / smallest_mb, FRACTION_DECIMALS)
    if fraction > 1.0 + GRACE:
        return None
    return min(1.0, fraction)


def sizing_hazard(shape: Mapping[str, float], sizing: str) -> Optional[str]:
    """What the booking BioEngine makes will do that the app's author did not ask for."""
    if sizing == "fraction" and shape.get("GPU", 0.0) == 0.0:
        return (
            "BioEngine books num_gpus=0 for this request (under 0.5% of the smallest GPU"
            " rounds to 0): the replica runs with no GPU, CUDA sees no device"
        )
    return None


class Sizing(NamedTuple):
    """How one replica is booked: BioEngine's path, why, and the Ray shape it gives."""

    name: str
    why: str
    shape: dict[str, float]
    smallest_mb: Optional[float] = None
    smallest_from: str = ""
    refused: Optional[str] = None


def _size_by_memory(status: ClusterStatus, request: FitRequest, mb: int) -> Sizing:
    mode = request.sizing
    if mode == "auto":
        mode = "vram" if advertises_vram(status) else "fraction"
        why = "a node advertises VRAM_MB" if mode == "vram" else "no node advertises VRAM_MB"
    else:
        why = f"--sizing {mode}"
    if mode == "vram":
        return Sizing("vram_mb", why, {"GPU": GPU_HANDLE, "VRAM_MB": float(mb)})
    smallest, origin = smallest_gpu(status, request.gpu_total_mb)
    if smallest is None:
        return Sizing(
            "fraction", why + "; no GPU node to size against: a whole GPU", {"GPU": 1.0}, None, origin
        )
    gpu = gpu_fraction(mb, smallest)
    if gpu is None:
        fraction = round(mb / smallest, FRACTION_DECIMALS)
        refused = (
            f"{mb} MiB is {fraction:.2f} of the smallest GPU ({smallest:.0f} MiB, {origin}),"
            " over the 1.1 BioEngine allows"
        )
        return Sizing("fraction", why, {"GPU": fraction}, smallest, origin, refused)
    return Sizing("fraction", why, {"GPU": gpu}, smallest, origin)


def request_sizing(status: ClusterStatus, request: FitRequest) -> Sizing:
    """The Ray shape of one replica, BioEngine's way (see the module docstring)."""
    if request.shape is not None:
        sizing = Sizing("shape", "--shape", dict(request.shape))
    elif request.gpu_memory_mb == WHOLE_GPU:
        sizing = Sizing("whole_gpu", "-1 asks for a whole GPU (VRAM_MB packing ignored)", {"GPU": 1.0})
    elif request.gpu_memory_mb is None or request.gpu_memory_mb <= 0:
        raise AgentError("--gpu-memory-mb must be more than 0, or -1 for a whole GPU", EXIT_COULD_NOT_TELL)
    else:
        sizing = _size_by_memory(status, request, request.gpu_memory_mb)
    if request.num_cpus > 0:
        sizing.shape["CPU"] = request.num_cpus
    if request.memory_mb > 0:
        sizing.shape["memory"] = request.memory_mb * MIB
    return sizing


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
    return result


def exit_code(result: FitResult) -> int:
    """0 = fits, 1 = does not fit (by booking, by measured memory, or refused)."""
    return EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT
