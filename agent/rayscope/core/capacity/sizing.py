"""How one replica is booked: BioEngine AppBuilder's sizing (``_apply_gpu_memory``), and
what ``rayscope fit`` accepts as a request. Pure: no I/O, no clock.

For an app declared by ``gpu_memory_mb``:

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
"""

import json
import math
from collections.abc import Mapping
from typing import NamedTuple, Optional

from rayscope.core.gpu.precedence import figures_old
from rayscope.core.rollup import SCHEDULER_STEMS, schedulable_nodes
from rayscope.errors import EXIT_NO_DATA, EXIT_USAGE, AgentError
from rayscope.labels import node_label
from rayscope.schema.fit import FitRequest
from rayscope.schema.report import known
from rayscope.schema.status import ClusterStatus, NodeStatus
from rayscope.units import ACCELERATOR_PREFIX, MIB

EXIT_COULD_NOT_TELL = EXIT_NO_DATA
SIZINGS = ("auto", "vram", "fraction")

GPU_HANDLE = 0.01
"""BioEngine's ``_GPU_HANDLE_EPSILON``: the GPU fraction that only binds a device."""

WHOLE_GPU = -1

LIKELY_GB_BELOW_MB = 64
"""A ``--gpu-memory-mb`` under this many MB is more likely GB typed as MB (no model fits a
GPU in 4 MB): it is taken as given, with a warning that says what GB would be."""

GRACE = 0.1
"""BioEngine's ``_GPU_FRACTION_GRACE``: a rounded fraction up to 1 + 0.1 is booked as one
GPU; more is refused."""

FRACTION_DECIMALS = 2
"""BioEngine's ``_GPU_FRACTION_DECIMALS``: the fraction is rounded before anything else."""


def validate_shape(shape: Mapping[str, object]) -> dict[str, float]:
    """A raw Ray shape as rayscope can place it; ``ValueError`` saying what is wrong."""
    clean: dict[str, float] = {}
    for name, value in shape.items():
        if name not in SCHEDULER_STEMS and not name.startswith(ACCELERATOR_PREFIX):
            known = ", ".join([*SCHEDULER_STEMS, ACCELERATOR_PREFIX + "X"])
            raise ValueError(f"unknown resource {name!r}: rayscope places {known}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: {value!r} is not a number")
        try:
            amount = float(value)
        except OverflowError:  # a JSON integer of 400 digits: no float holds it
            raise ValueError(f"{name}: not a finite number") from None
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
    if node.gpus and not figures_old(node):
        sizes = [g.memory_total_bytes for g in node.gpus if g.memory_total_bytes is not None]
        if sizes:
            return min(sizes) / MIB, "Ray dashboard" if known(node.gpus_source) else "NVML"
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
        sizing = Sizing("whole_gpu", "--gpu-memory-mb -1, no VRAM_MB booked", {"GPU": 1.0})
    elif request.gpu_memory_mb is None or request.gpu_memory_mb <= 0:
        raise AgentError("--gpu-memory-mb must be more than 0, or -1 for a whole GPU", EXIT_COULD_NOT_TELL)
    else:
        sizing = _size_by_memory(status, request, request.gpu_memory_mb)
    if request.num_cpus > 0:
        sizing.shape["CPU"] = request.num_cpus
    if request.memory_mb > 0:
        sizing.shape["memory"] = request.memory_mb * MIB
    return sizing


def size_warning(gpu_memory_mb: Optional[int]) -> Optional[str]:
    """The one-line warning for a ``--gpu-memory-mb`` that reads like GB (see
    :data:`LIKELY_GB_BELOW_MB`); ``None`` for any other value."""
    if gpu_memory_mb is None or not 0 < gpu_memory_mb < LIKELY_GB_BELOW_MB:
        return None
    return (
        f"--gpu-memory-mb {gpu_memory_mb} is {gpu_memory_mb} MB, as given; the option is in MB"
        f" (for {gpu_memory_mb} GB give --gpu-memory-mb {gpu_memory_mb * 1024})"
    )


def fit_request(
    gpu_memory_mb: Optional[int],
    shape_json: Optional[str],
    replicas: int = 1,
    num_cpus: float = 0.0,
    memory_mb: float = 0.0,
    gpu_total_mb: Optional[float] = None,
    sizing: str = "auto",
) -> FitRequest:
    """The request ``rayscope fit`` was given, checked whole: one of a size and a shape, each
    resource given once; :class:`AgentError` (exit 2, a usage error) saying what is wrong."""

    def usage(message: str) -> AgentError:
        return AgentError(message, EXIT_USAGE)

    if gpu_memory_mb is not None and shape_json is not None:
        raise usage("give --gpu-memory-mb MB or --shape JSON, not both")
    if gpu_memory_mb is None and shape_json is None:
        raise usage("give one of --gpu-memory-mb MB or --shape JSON")
    if gpu_memory_mb is not None and gpu_memory_mb != WHOLE_GPU and gpu_memory_mb <= 0:
        raise usage("--gpu-memory-mb must be more than 0 MB, or -1 for a whole GPU")
    shape = None if shape_json is None else parse_shape(shape_json)
    if shape is not None:
        if num_cpus > 0 and "CPU" in shape:
            raise usage("--num-cpus and a CPU in --shape: give CPUs once")
        if memory_mb > 0 and "memory" in shape:
            raise usage("--memory-mb and a memory in --shape: give memory once")
        if sizing != "auto":
            raise usage("--sizing applies to --gpu-memory-mb, not to a raw --shape")
    return FitRequest(
        gpu_memory_mb=gpu_memory_mb,
        shape=shape,
        replicas=replicas,
        num_cpus=num_cpus,
        memory_mb=memory_mb,
        gpu_total_mb=gpu_total_mb,
        sizing=sizing,
    )


def parse_shape(text: str) -> dict[str, float]:
    """``--shape``: a JSON object of Ray resources, checked by :func:`validate_shape`."""
    try:
        raw = json.loads(text)
    except RecursionError:  # the operator's text, at the caller's shallow stack: no peer's
        raise AgentError("--shape is nested too deep: give a flat JSON object", EXIT_USAGE) from None
    except ValueError as err:
        raise AgentError(f"--shape is not JSON: {err}", EXIT_USAGE) from None
    if not isinstance(raw, dict):
        raise AgentError(
            """--shape takes a JSON object of Ray resources, e.g. '{"GPU": 0.5, "CPU": 1}'""", EXIT_USAGE
        )
    try:
        return validate_shape(raw)
    except ValueError as err:
        raise AgentError(f"--shape: {err}", EXIT_USAGE) from None
