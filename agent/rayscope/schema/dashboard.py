"""What Ray's own dashboard says about every node's GPUs (``GET /nodes?view=summary``), as
:mod:`rayscope.sources.dashboard` reads it: per node, the GPUs its dashboard agent measured
through NVML, and when.

Figures are converted from the dashboard's MiB to bytes (``MiB × 2**20``: the dashboard
rounds each figure down to whole MiB, so a byte figure here is up to 1 MiB under NVML's).
Strings are printable (:func:`rayscope.labels.printable`) and bounded here; numbers are bounded
in the types, as in :mod:`rayscope.schema.report`. Structs and nothing else.
"""

from typing import Annotated, Optional

import msgspec

from rayscope.schema.report import MAX_DEVICES, MAX_PROCESSES_PER_GPU, Amount, Count, SourceStatus

DASHBOARD_SOURCE = "ray-dashboard"
"""How a figure read here names its source (``used_gpu_memory_source``)."""
DASHBOARD_STATUS = "dashboard"
"""The source's name in every document's ``sources`` (its ``SourceStatus``)."""
DASHBOARD_OFF = "not read"
"""How the source's ``detail`` starts when the operator turned it off (``--dashboard none``)."""


class DashboardProcess(msgspec.Struct, kw_only=True, gc=False):
    """One process holding memory on one GPU, as the node's dashboard agent listed it
    (NVML's compute and graphics process lists; one entry per pid)."""

    pid: Count
    """In the pid namespace of the node's dashboard agent (the host's, outside containers)."""
    used_memory_bytes: Optional[Count] = None
    """``None`` where the dashboard gave no figure."""


class DashboardGpu(msgspec.Struct, kw_only=True, gc=False):
    """One GPU (or, from Ray 2.49 on, one MIG instance) of one node, as its dashboard agent
    measured it with NVML (``nvmlDeviceGetMemoryInfo``, the v1 call: ``used`` includes the
    memory the driver reserves, unlike the v2 figure rayscope's own agent reads)."""

    index: Count
    """NVML's device index; a MIG instance reads ``parent × 1000 + instance`` (Ray 2.49+)."""
    uuid: Optional[str] = None
    name: Optional[str] = None
    memory_total_bytes: Count
    memory_used_bytes: Count
    utilization_gpu_pct: Optional[Count] = None
    """NVML's GPU utilisation the dashboard sends (``utilizationGpu``), 0-100."""
    processes: Annotated[list[DashboardProcess], msgspec.Meta(max_length=MAX_PROCESSES_PER_GPU)] = []
    processes_believed: bool = False
    """Whether ``processes``' memory figures are the processes' memory: ``False`` for a
    cluster of Ray 2.50-2.56, which may write the memory-bus utilisation × the GPU's total
    instead (ray-project/ray#61456), or of an unknown release (``docs/dashboard.md``)."""


class DashboardNode(msgspec.Struct, kw_only=True, gc=False):
    """One node of the summary."""

    node_id: str
    """Hex Ray node id (``raylet.nodeId``), as the GCS read writes it."""
    node_ip: Optional[str] = None
    """``raylet.nodeManagerAddress``."""
    measured_at: Optional[Amount] = None
    """The dashboard agent's ``now``: epoch seconds, on the node's own clock, of the sample
    the GPUs come from; ``None`` when the node's agent has not reported yet."""
    gpus: Optional[Annotated[list[DashboardGpu], msgspec.Meta(max_length=MAX_DEVICES)]] = None
    """``None`` when the node's agent has not reported (no sample yet); ``[]``: no GPU found."""


class DashboardRead(msgspec.Struct, kw_only=True, gc=False):
    """One read of the dashboard, as the rollup takes it (``rayscope.core.gpu.precedence``)."""

    nodes: dict[str, DashboardNode] = {}
    """By node id; empty when the read failed (``status`` says why)."""
    status: SourceStatus
    """The source's status (``dashboard``): what answered, or why nothing did."""
