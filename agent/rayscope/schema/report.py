"""The node report: what a node agent sends to the head, and the wire schema's rules.

This is the one schema that crosses a network between releases, so its rules are strict
(msgspec's schema evolution): every Struct is ``kw_only``; a field added after the first
release gets a default and never changes type, so a newer head decodes an older node's
report and the other way round (``tests/data/`` keeps a recorded schema-1 report that must
keep decoding). Annotations use ``Optional[...]``, not ``X | None``: msgspec evaluates them
at run time and the zipapp runs on Python 3.9.

A report's numbers and lists carry their bounds in their types (:data:`Count`,
:data:`Amount`, ``Annotated[list[...], Meta(max_length=...)]``): msgspec checks them, in C,
when the head decodes a report, and names the field that broke one. Building a Struct does
not check them. Strings are checked by ``rayscope.core.validate`` (SECURITY.md, rule 4).

The Structs a head agent holds by the thousand are ``gc=False`` (msgspec's option): they hold
scalars and containers of other Structs, never a reference back, so no cycle can form and the
garbage collector need not scan them. Measured at 10,000 nodes: report ingest 35k → 79k/s,
rollup 47 → 38 ms (``make bench``).

Units are in the names (``_bytes``, ``_mb``, ``_s``, ``_pct``).
"""

import sys
from typing import Annotated, Optional, TypeVar, Union

import msgspec

T = TypeVar("T")

REPORT_SCHEMA = 1
"""Version of :class:`NodeReport`; a head rejects newer ones."""

MAX_GPUS = 64
MAX_MIG_DEVICES = 8
"""NVIDIA's largest MIG split is 7 instances."""
MAX_DEVICES = 128
"""GPUs and MIG devices in one report, all told (``rayscope.core.validate``: a sum the types cannot
say): 16 GPUs split 7 ways, or 64 whole ones with room."""
MAX_PROCESSES_PER_GPU = 256
MAX_PROCESSES = 1024
"""GPU processes in one report, summed over its devices (``rayscope.core.validate``), and the length
of its process table."""
MAX_ERRORS = 64
"""Reasons a GPU's fields are unknown (one per NVML field at most)."""
MAX_HEALTH_FLAGS = 16
"""A GPU's health flags: one per problem ``rayscope.core.gpu.health`` names (7 today)."""
MAX_ITEMS = 512
"""Any other list or map in a report: sources, a raylet's resources and labels."""
MAX_REPORT_CHARS = 256 * 1024
"""Characters in all the strings of one report (``rayscope.core.validate``). With the bounds above,
a report decodes to at most :data:`MAX_REPORT_DECODED_BYTES` (tests/test_report_bounds.py
measures the largest one)."""
MAX_REPORT_DECODED_BYTES = 2 * 1024**2
"""What one report the head holds can cost in memory, at every bound at once."""

Count = Annotated[int, msgspec.Meta(ge=0)]
"""A non-negative integer: a pid, an index, bytes, a percentage, a counter."""
Amount = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
"""A finite, non-negative float: NaN fails ``ge``, infinity fails ``le``."""
ITEMS = msgspec.Meta(max_length=MAX_ITEMS)

Unset = msgspec.UnsetType
UNSET = msgspec.UNSET
"""A field added after the document's goldens were cut (the device-mode fields) defaults to ``UNSET``:
absent from the report and the JSON until an agent sets it, so an older agent's report (and
every bare-metal document before) reads exactly as before; :func:`known` reads it."""


def known(value: Union[T, Unset]) -> Optional[T]:
    """An ``UNSET``-default field's value, ``None`` when absent."""
    return None if isinstance(value, msgspec.UnsetType) else value


VIRTUALIZATION_MODE_NAMES = ("none", "passthrough", "vgpu_guest", "host_vgpu", "host_vsga", "unknown")
"""Every ``GpuDevice.virtualization_mode`` an agent sends (``rayscope.sources.nvml.modes``);
anything else reads as ``unknown``."""
COMPUTE_MODE_NAMES = ("default", "exclusive_thread", "prohibited", "exclusive_process", "unknown")
"""Every ``GpuDevice.compute_mode`` an agent sends; anything else reads as ``unknown``."""

STARTED_BY_RAY = "ray"
"""``NodeReport.started_by`` of an agent placed by ``head --agents ray``."""
AGENT_STARTERS = (STARTED_BY_RAY, "systemd", "manual")
"""Every way an agent may say it was started (``NodeReport.started_by``); anything else is
shown as ``other``: a report's own word is never printed."""


class SourceStatus(msgspec.Struct, kw_only=True, gc=False):
    """Whether one source answered. A failing source is data, never an exception."""

    name: str
    """``raylet``, ``gcs``, ``nvml`` or ``host``."""
    ok: bool
    reason: str = ""
    """Why it did not answer, in the operator's words (``NVML library not found ...``)."""
    detail: str = ""
    """What answered, when that matters (the GCS address, the NVML memory API used)."""


class GpuProcess(msgspec.Struct, kw_only=True, gc=False):
    """One process holding memory on one GPU, as the driver lists it
    (``nvidia-smi --query-compute-apps=pid,used_memory``; graphics processes too).

    ``pid`` is in the driver's pid namespace: the host's, even when rayscope runs in a container.
    """

    pid: Count
    used_memory_bytes: Optional[Count] = None
    """``None`` when the driver does not say (WDDM, some MIG set-ups, no permission)."""
    kinds: Annotated[list[str], msgspec.Meta(max_length=4)] = []
    """``compute``, ``graphics`` and/or ``mps`` (an MPS client): the NVML process lists the pid
    appeared in."""
    gpu_instance_id: Optional[Count] = None
    compute_instance_id: Optional[Count] = None


class ProcessInfo(msgspec.Struct, kw_only=True, gc=False):
    """What this host says about one GPU process's pid: psutil and Ray's own session logs."""

    pid: Count
    visible: bool = True
    """``False``: no such pid in this host's process table (exited, or another namespace)."""
    name: Optional[str] = None
    """The executable's name (``comm``), e.g. ``python``."""
    title: Optional[str] = None
    """The process title of the Ray worker that owns it: ``ray::Replica``,
    ``ray::ServeReplica:app:deployment``, ``ray::IDLE``; ``None`` outside Ray."""
    worker_pid: Optional[Count] = None
    """The Ray worker process that owns this pid: itself, or the ancestor the raylet started."""
    raylet_pid: Optional[Count] = None
    node_id: Optional[str] = None
    """The Ray node id of the raylet that started the worker (its command line)."""
    job_id: Optional[str] = None
    """Hex job id, from the worker's log file name in the raylet's session directory."""
    actor_id: Optional[str] = None
    """Hex actor id, where the worker's core log names the actor it created."""


class GpuUser(msgspec.Struct, kw_only=True, gc=False):
    """One actor, Ray worker or other process on one GPU: what it booked beside what it uses."""

    kind: str
    """``actor`` (in the GCS actor table), ``ray worker`` (a Ray worker the actor table does
    not name: a task), or ``process`` (outside Ray, or not mapped)."""
    pids: list[int] = []
    actor_id: Optional[str] = None
    name: str = ""
    """Actor name, else class name; for other processes the process title or name."""
    job_id: Optional[str] = None
    booked_gpu: Optional[float] = None
    """This GPU's share of the ``GPU`` resource it booked; ``None`` = booking not known."""
    booked_vram_mb: Optional[float] = None
    """This GPU's share of the ``VRAM_MB`` it booked; ``None`` = booking not known."""
    used_memory_bytes: Optional[int] = None
    """NVML: memory its processes hold on this GPU; ``None`` when the driver does not say."""
    flags: list[str] = []
    """``over_booking`` (uses more than it booked, over all its GPUs), ``unbooked`` (holds
    memory but booked nothing), ``booking_unknown`` (a Ray worker the actor table does not
    name), ``not_mapped`` (its pid could not be mapped to a process on this host)."""


class GpuAttribution(msgspec.Struct, kw_only=True, gc=False):
    """One GPU's bookings beside its measured memory (rayscope.core.gpu.attribution, never a source)."""

    booked_gpu: Optional[float] = None
    """Sum of the ``GPU`` shares booked on this device; ``None`` = the actor table was not read."""
    booked_vram_mb: Optional[float] = None
    booked_actors: int = 0
    capacity_mb: Optional[float] = None
    """The device's memory in MB (MiB, as ``VRAM_MB`` counts), from NVML."""
    unbooked_bytes: int = 0
    """Memory held by processes that booked nothing."""
    users: list[GpuUser] = []
    flags: list[str] = []
    """``full``: booked ``VRAM_MB`` on this device reaches its capacity."""


class GpuHealth(msgspec.Struct, kw_only=True, gc=False):
    """What an operator triages a GPU with, from NVML. ``None`` = not supported or not read
    (absent, never 0). DCGM's field in brackets says what each means."""

    xid_errors: Optional[Count] = None
    """XID events since this process began watching (the agent's start)
    [``DCGM_FI_DEV_XID_ERRORS`` holds the last one's code]."""
    last_xid: Optional[Count] = None
    ecc_uncorrected_volatile: Optional[Count] = None
    """Uncorrected ECC errors since the driver loaded [``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``]."""
    retired_pages_pending: Optional[bool] = None
    """Pages waiting to be retired at the next reset [``DCGM_FI_DEV_RETIRED_PENDING``]."""
    remapped_rows_pending: Optional[bool] = None
    """Rows waiting to be remapped at the next reset [``DCGM_FI_DEV_ROW_REMAP_PENDING``]."""
    row_remap_failure: Optional[bool] = None
    """A row remapping failed [``DCGM_FI_DEV_ROW_REMAP_FAILURE``]."""
    clock_throttle_reasons: Optional[Count] = None
    """NVML's clock event reason bits now [``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``]."""
    lost: bool = False
    """The GPU has fallen off the bus (``NVML_ERROR_GPU_IS_LOST``)."""


class GpuDevice(msgspec.Struct, kw_only=True, gc=False):
    """One GPU as NVML reports it (``nvidia-smi --query-gpu=...``). ``None`` = unknown."""

    index: Count
    name: Optional[str] = None
    uuid: Optional[str] = None
    memory_total_bytes: Optional[Count] = None
    memory_used_bytes: Optional[Count] = None
    """The used figure the agent trusts (:func:`rayscope.core.gpu.trust.gpu_used` reads it): NVML's on
    bare metal and pass-through; on a vGPU guest a fresh CUDA sample's, else ``None``
    (``memory_used_reason`` says why, ``nvml_memory_used_bytes`` keeps NVML's)."""
    memory_info_version: Optional[Count] = None
    """2 when ``nvmlDeviceGetMemoryInfo_v2`` answered, 1 for the v1 fallback."""
    utilization_gpu_pct: Optional[Count] = None
    errors: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_ERRORS)] = {}
    """Field name → why it is ``None`` (``Not Supported``, ``GPU is lost``)."""
    pci_bus_id: Optional[str] = None
    memory_reserved_bytes: Optional[Count] = None
    """Memory the driver reserves (memory info v2 only; ``None`` with v1)."""
    temperature_c: Optional[int] = None
    """Degrees Celsius: the one signed number in a report."""
    power_draw_mw: Optional[Count] = None
    power_limit_mw: Optional[Count] = None
    """The enforced power limit (``nvidia-smi --query-gpu=enforced.power.limit``), mW."""
    mig_enabled: Optional[bool] = None
    """Current MIG mode; ``False`` too where the GPU does not support MIG."""
    parent_index: Optional[Count] = None
    """A MIG instance: the index of its physical GPU (``index`` is then the MIG index)."""
    gpu_instance_id: Optional[Count] = None
    compute_instance_id: Optional[Count] = None
    mig_devices: "Annotated[list[GpuDevice], msgspec.Meta(max_length=MAX_MIG_DEVICES)]" = []
    # one string: 3.9/3.10 leave list["X"] unresolved
    """MIG instances of this GPU, each reported as its own device (their memory is part of
    the parent's: sums use the parents only)."""
    processes: Optional[Annotated[list[GpuProcess], msgspec.Meta(max_length=MAX_PROCESSES_PER_GPU)]] = None
    """Processes holding memory on this device; ``None`` when NVML could not list them
    (reason in ``errors``). On a MIG-enabled GPU they are listed on its MIG devices."""
    attribution: Optional[GpuAttribution] = None
    """Bookings beside measured memory; set by ``rayscope.core.gpu.attribution``, never by a node agent."""
    health: Optional[GpuHealth] = None
    """XID, ECC, row remapping, throttling, lost (``None``: not read, e.g. a MIG instance)."""
    process_list_version: Optional[Count] = None
    """The NVML process-list call version that answered: 3 (``_v3``, drivers >= 510.39) or
    2 (``_v2``, R450/R470)."""
    # What kind of device NVML talks to, and which used figure to trust. Each is
    # absent (UNSET) where the driver does not say, and in reports of agents older than these fields.
    virtualization_mode: Union[str, Unset] = UNSET
    """``nvmlDeviceGetVirtualizationMode``: ``none`` (bare metal), ``passthrough``,
    ``vgpu_guest`` (a VM on an NVIDIA vGPU: NVML's used memory is not the device's),
    ``host_vgpu``, ``host_vsga`` (the hypervisor host), ``unknown`` (a newer driver's code)."""
    compute_mode: Union[str, Unset] = UNSET
    """``nvmlDeviceGetComputeMode``: ``default``, ``exclusive_process``, ``exclusive_thread``,
    ``prohibited``, ``unknown``."""
    mps_serving: Union[bool, Unset] = UNSET
    """``True``: NVML lists MPS clients on this GPU (``nvmlDeviceGetMPSComputeRunningProcesses``;
    they are in ``processes`` with kind ``mps``); ``False``: that list is empty (NVML lists
    clients only: a server without a client reads ``False``)."""
    nvml_memory_used_bytes: Union[Count, Unset] = UNSET
    """NVML's own used figure, trusted or not (``memory_used_bytes`` is the trusted one)."""
    memory_used_source: Union[str, Unset] = UNSET
    """Where ``memory_used_bytes`` comes from: ``nvml``, or ``cuda`` (a fresh
    ``cuMemGetInfo`` sample, total − free, on a GPU whose NVML figure is not trusted);
    absent when it is ``None``. An agent older than this field sent NVML's figure (read as ``nvml``)."""
    memory_used_age_s: Union[Amount, Unset] = UNSET
    """Age of ``memory_used_bytes`` when the report was collected (0 for NVML's)."""
    memory_used_reason: Union[str, Unset] = UNSET
    """Why ``memory_used_bytes`` is ``None`` although NVML answered (``vGPU guest: NVML used not
    trusted; ...``)."""
    health_flags: Union[Annotated[list[str], msgspec.Meta(max_length=MAX_HEALTH_FLAGS)], Unset] = UNSET
    """What needs an operator on this GPU, one flag per problem in the operator's words
    (``XID 79 (2 since start)``, ``fallen off the bus``), judged from ``health`` once where
    the report is merged (``rayscope.core.gpu.settled``), never taken from a node agent;
    absent when nothing is wrong (and in a report)."""


class HostInfo(msgspec.Struct, kw_only=True, gc=False):
    """The machine itself, from the kernel via psutil."""

    hostname: str
    cpu_count: Optional[Count] = None
    load_1m: Optional[Amount] = None
    load_5m: Optional[Amount] = None
    load_15m: Optional[Amount] = None
    memory_total_bytes: Optional[Count] = None
    memory_available_bytes: Optional[Count] = None


class RayletInfo(msgspec.Struct, kw_only=True, gc=False):
    """The local raylet process, as its command line describes it."""

    pid: Count
    node_id: str
    node_ip: str
    is_head: bool = False
    gcs_address: Optional[str] = None
    session_dir: Optional[str] = None
    temp_dir: Optional[str] = None
    static_resources: Annotated[dict[str, Amount], ITEMS] = {}
    """``--static_resource_list``: what the node advertises (CPU, GPU, VRAM_MB, ...)."""
    labels: Annotated[dict[str, str], ITEMS] = {}
    python_executable: Optional[str] = None
    """The Ray node's own Python, first word of ``--python_worker_command``."""
    started_at: Optional[Amount] = None
    """The raylet process's start time (epoch seconds): with ``pid``, tells a restart apart."""
    cuda_visible_devices: Optional[str] = None
    """The raylet's ``CUDA_VISIBLE_DEVICES`` (its environment): Ray's GPU id *i* is entry *i*."""
    cuda_device_order: Optional[str] = None
    """The raylet's ``CUDA_DEVICE_ORDER`` (``PCI_BUS_ID``; unset = CUDA's fastest-first)."""
    environ_read: bool = False
    """Whether the raylet's environment could be read (else the two above are unknown)."""
    ray_version: Optional[str] = None
    """The Ray release the raylet binary belongs to (its package's dist-info); ``None`` unknown."""


class NodeReport(msgspec.Struct, kw_only=True, gc=False):
    """What a node agent knows about its own node: sent to the head, or read locally."""

    schema: Count = REPORT_SCHEMA
    node_id: str
    """The Ray node id this report is for; ``""`` when no raylet runs here."""
    collected_at: Amount
    """The node's own clock, for information only: staleness uses the head's clock."""
    raylet: Optional[RayletInfo] = None
    host: Optional[HostInfo] = None
    driver_version: Optional[str] = None
    gpus: Optional[Annotated[list[GpuDevice], msgspec.Meta(max_length=MAX_GPUS)]] = None
    """``None`` when NVML did not answer (see ``sources``); ``[]`` when it found no GPU."""
    sources: Annotated[list[SourceStatus], ITEMS] = []
    interval_s: Optional[Amount] = None
    """How often the agent sends: the head judges staleness by its own interval and this."""
    processes: Optional[Annotated[list[ProcessInfo], msgspec.Meta(max_length=MAX_PROCESSES)]] = None
    """This host's view of the GPU processes' pids; ``None`` when not read or not mappable."""
    started_by: str = ""
    """How the agent was started: ``ray`` (placed by ``head --agents ray``), ``systemd``,
    ``manual``; ``""`` from agents older than this field."""
