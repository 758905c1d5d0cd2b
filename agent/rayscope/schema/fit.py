"""``rayscope fit``: the request and its answer (``fit --json``)."""

from typing import Optional, Union

import msgspec

from rayscope.schema.report import UNSET, Unset
from rayscope.schema.status import DOCUMENT_SCHEMA


class FitRequest(msgspec.Struct, kw_only=True):
    """What ``rayscope fit`` was asked: an app declared by GPU memory, or a raw Ray shape."""

    gpu_memory_mb: Optional[int] = None
    """MB of GPU memory per replica (BioEngine's ``gpu_memory_mb``); ``-1`` = a whole GPU."""
    shape: Optional[dict[str, float]] = None
    """A raw Ray resource shape per replica (``{"GPU": 0.5, "CPU": 1}``), instead of a size."""
    replicas: int = 1
    num_cpus: float = 0.0
    memory_mb: float = 0.0
    """Ray's ``memory`` resource per replica, in MB (Ray books it in bytes)."""
    gpu_total_mb: Optional[float] = None
    """The operator's size of the smallest GPU, in MB, for the fraction path."""
    sizing: str = "auto"
    """``auto`` (BioEngine's rule), ``vram`` or ``fraction``: how ``gpu_memory_mb`` is booked."""
    label_selector: Union[dict[str, str], Unset] = UNSET
    """Ray's ``label_selector`` in Ray's syntax (``{"zone": "!in(a,b)"}``): only the nodes it
    admits are candidates; absent: any node."""


class GpuFit(msgspec.Struct, kw_only=True):
    """One GPU of a chosen node, as NVML measured it, and the replicas the check put on it."""

    index: int
    free_bytes: int
    total_bytes: int
    replicas: int = 0
    short: bool = False
    """``True``: at least one replica put here did not find its memory free."""
    source: Union[str, Unset] = UNSET
    """``cuda``: ``free_bytes`` is from a CUDA sample (a vGPU guest), ``age_s`` old;
    ``ray-dashboard``: from Ray's dashboard (no agent measured the node), ``age_s`` old;
    absent: NVML's, read by an agent or on this host."""
    age_s: Union[float, Unset] = UNSET


class NodeFit(msgspec.Struct, kw_only=True):
    """How many replicas one node takes by its scheduler booking, and what NVML says."""

    node_id: str
    node_ip: Optional[str]
    head: bool
    accelerator_type: Optional[str] = None
    capacity: int
    """Replicas of the shape that fit the node's available resources."""
    placed: int = 0
    """Replicas the greedy placement put here."""
    missing: list[str] = []
    """Requested resources the node does not advertise at all (``VRAM_MB``, ``GPU``)."""
    limited_by: Optional[str] = None
    """The requested resource that bounds ``capacity``."""
    available: dict[str, float] = {}
    """What the scheduler has free of each requested resource (Ray's units)."""
    measured: str = "not_checked"
    """``ok``, ``short`` (booking fits, NVML memory does not), ``unknown`` or
    ``not_checked`` (nothing placed here, or the request names no memory size)."""
    measured_reason: str = ""
    not_checked_gpus: Union[list[int], Unset] = UNSET
    """GPUs whose used memory rayscope does not trust (a vGPU guest without a fresh CUDA
    sample): left out of the check, never a refusal; ``measured_reason`` says why. Absent when
    every GPU was checked."""
    need_bytes: Optional[int] = None
    """GPU memory one replica needs free, for the NVML check (``None``: not judged)."""
    gpus: list[GpuFit] = []
    per_device: Optional[bool] = None
    """``True``: ``GPU`` packed per device from Ray's placement; ``False``: node sums only
    (placement unknown); ``None``: the shape asks no ``GPU`` here."""


class FitResult(msgspec.Struct, kw_only=True):
    """What ``rayscope fit --json`` prints: the Ray shape, the placement, the answer."""

    schema: int = DOCUMENT_SCHEMA
    generated_at: float
    view: str
    """Where the cluster state came from (``gcs`` or ``head``, as in :class:`ClusterStatus`)."""
    request: FitRequest
    sizing: str
    """``vram_mb`` (``GPU`` 0.01 + ``VRAM_MB``), ``fraction``, ``whole_gpu`` or ``shape``."""
    sizing_reason: str = ""
    smallest_gpu_mb: Optional[float] = None
    """The GPU size the fraction path divided by, and ``smallest_gpu_from`` where it came from."""
    smallest_gpu_from: str = ""
    shape: dict[str, float] = {}
    """The Ray resource request of one replica (Ray's names and units)."""
    refused: Optional[str] = None
    """Why the request cannot be booked at all (more than 10% over the smallest GPU)."""
    replicas: int = 1
    placed: int = 0
    fits_booking: bool = False
    fits_measured: Optional[bool] = None
    """``False``: NVML shows too little free memory on a chosen GPU; ``None``: not measured."""
    fits: bool = False
    """The answer: fits by booking, and not refuted by measured memory."""
    nodes: list[NodeFit] = []
    hazard: Optional[str] = None
    """What the booking does that the request did not ask for (``num_gpus=0``: no GPU)."""
    per_device_note: str = ""
    """Why some nodes' ``GPU`` was judged on node sums, not per device."""
    hint: str = ""
    """What would place the replicas that were not: ``--sizing fraction`` where ``VRAM_MB``
    was booked and GPU nodes without it have room; ``""`` when nothing would."""
    admitted_nodes: Union[int, Unset] = UNSET
    """With a label selector: how many of the ``alive_nodes`` it admits (only those are in
    ``nodes``); absent without one."""
    alive_nodes: Union[int, Unset] = UNSET
    """With a label selector: the alive nodes it was matched against."""
    label_miss: Union[str, Unset] = UNSET
    """With a label selector that admits no node: why (the selector, and what the nodes hold
    for its keys); ``fits`` is then false. Absent otherwise."""
