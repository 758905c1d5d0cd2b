"""Every msgspec Struct rayscope reads, merges, sends or prints — and nothing else.

Units are in the names (``_bytes``, ``_mb``, ``_s``, ``_pct``). The three GPU numbers are
never merged:

* ``total_gpu`` / ``used_gpu`` — Ray's ``GPU`` resource: device handles booked (fraction);
* ``total_vram_mb`` / ``used_vram_mb`` — Ray's custom ``VRAM_MB`` resource: memory booked;
* ``total_gpu_memory`` / ``used_gpu_memory`` — NVML: bytes the driver sees in use.

Schema evolution (msgspec's rules): every Struct is ``kw_only``; a field added after the
first release gets a default and never changes type, so a newer head decodes an older
node's report and the other way round. Annotations use ``Optional[...]``, not ``X | None``:
msgspec evaluates them at run time and the zipapp runs on Python 3.9.

The Structs a head agent holds by the thousand are ``gc=False`` (msgspec's option): they hold
scalars and containers of other Structs, never a reference back, so no cycle can form and the
garbage collector need not scan them. Measured at 10,000 nodes: report ingest 35k → 79k/s,
rollup 47 → 38 ms (``make bench``).

A node report's numbers and lists carry their bounds in their types (:data:`Count`,
:data:`Amount`, ``Annotated[list[...], Meta(max_length=...)]``): msgspec checks them, in C,
when the head decodes a report, and names the field that broke one. Building a Struct does
not check them. Strings are checked by ``agent.validate`` (SECURITY.md, rule 4).
"""

import sys
from typing import Annotated, Optional

import msgspec

SCHEMA_VERSION = 1
"""Version of :class:`NodeReport` and :class:`ClusterStatus`; a head rejects newer ones."""

MAX_GPUS = 64
MAX_MIG_DEVICES = 16
"""NVIDIA's largest MIG split is 7 instances; 16 leaves room."""
MAX_PROCESSES_PER_GPU = 256
MAX_ITEMS = 4096
"""Any other list or map in a report: sources, a raylet's resources and labels, the process
table, a GPU's errors."""

Count = Annotated[int, msgspec.Meta(ge=0)]
"""A non-negative integer: a pid, an index, bytes, a percentage, a counter."""
Amount = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
"""A finite, non-negative float: NaN fails ``ge``, infinity fails ``le``."""
ITEMS = msgspec.Meta(max_length=MAX_ITEMS)


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
    kinds: Annotated[list[str], ITEMS] = []
    """``compute`` and/or ``graphics``: the NVML process lists the pid appeared in."""
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


class ActorBooking(msgspec.Struct, kw_only=True, gc=False):
    """One live actor as the GCS actor table holds it: what it booked, where it runs."""

    actor_id: str
    node_id: str
    pid: Optional[int] = None
    name: str = ""
    """The name given with ``options(name=...)``; ``""`` for an anonymous actor."""
    class_name: str = ""
    """``Replica``, ``ServeReplica:app:deployment``, ... (outer scopes as Ray records them)."""
    state: str = "ALIVE"
    job_id: str = ""
    required: dict[str, float] = {}
    """Required resources: ``GPU`` (device handles), ``VRAM_MB`` (MB booked), ``CPU``, ..."""
    gpu_ids: list[int] = []
    """The GPU ids Ray assigned it (indices of the raylet's visible GPUs)."""
    gpu_shares: list[tuple[int, float]] = []
    """``(gpu_id, quantity)``: how much of each of its GPU ids it holds (the actor table's
    ``resource_mapping``); empty from a reader that predates it."""


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
    """One GPU's bookings beside its measured memory (agent.attribution, never a source)."""

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


class NodeAttribution(msgspec.Struct, kw_only=True, gc=False):
    """A node's GPU attribution beyond single devices."""

    actors_read: bool = False
    """Whether the GCS actor table was read (else bookings are unknown, ``NA``)."""
    processes_mapped: bool = False
    """Whether GPU pids could be mapped to this host's processes (not in a container)."""
    node_total_vram_mb: float = 0.0
    node_used_vram_mb: float = 0.0
    full_gpus: list[int] = []
    """Indices of full devices (see :class:`GpuAttribution`)."""
    flags: list[str] = []
    """``hidden_full``: a multi-GPU node whose node-wide ``VRAM_MB`` shows room while a
    device is fully booked: the node-level number hides it."""
    off_gpu: list[GpuUser] = []
    """Actors of this node that booked ``GPU``/``VRAM_MB`` but are on none of its GPUs."""
    booked_vram_mb: Optional[float] = None
    """Summed over this node's GPUs: ``VRAM_MB`` the actors on them booked (``None``: the
    actor table was not read)."""
    booked_gpu: Optional[float] = None
    booked_actors: int = 0
    """Distinct actors with a ``GPU`` or ``VRAM_MB`` booking on this node's GPUs."""
    actors_used_bytes: int = 0
    """NVML: memory the actors' processes hold, summed over this node's GPUs."""
    unbooked_bytes: int = 0
    """NVML: memory held by processes that booked nothing, summed over this node's GPUs."""


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
    memory_info_version: Optional[Count] = None
    """2 when ``nvmlDeviceGetMemoryInfo_v2`` answered, 1 for the v1 fallback."""
    utilization_gpu_pct: Optional[Count] = None
    errors: Annotated[dict[str, str], ITEMS] = {}
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
    """Bookings beside measured memory; set by ``agent.attribution``, never by a node agent."""
    health: Optional[GpuHealth] = None
    """XID, ECC, row remapping, throttling, lost (``None``: not read, e.g. a MIG instance)."""
    process_list_version: Optional[Count] = None
    """The NVML process-list call version that answered: 3 (``_v3``, drivers >= 510.39) or
    2 (``_v2``, R450/R470)."""


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


class RayNode(msgspec.Struct, kw_only=True, gc=False):
    """One node as the Ray scheduler (the GCS) sees it."""

    node_id: str
    node_ip: str
    hostname: str = ""
    is_head: bool = False
    alive: bool = True
    total: dict[str, float] = {}
    available: Optional[dict[str, float]] = None
    """``None`` when the GCS holds no availability for the node (a dead node)."""
    labels: dict[str, str] = {}


class DeviceFree(msgspec.Struct, kw_only=True, gc=False):
    """One physical GPU of a Ray node as the scheduler placed work on it (agent.placement).

    Ray keeps one ``GPU`` number per node but hands each actor specific GPU ids; a fraction
    must fit on one device. This is that per-device view, from the actor table.
    """

    gpu_id: int
    """Ray's GPU id on its node (an index into the raylet's visible GPUs)."""
    visible_id: str
    """What ``ray.get_gpu_ids()`` returns in a worker on it: the raylet's
    ``CUDA_VISIBLE_DEVICES`` entry (an index or a UUID), else the id itself."""
    uuid: Optional[str] = None
    """NVML's UUID of the device; ``None`` when it cannot be told (see ``mapping``)."""
    nvml_index: Optional[int] = None
    mapping: str = ""
    """How the Ray id was matched to an NVML device, or why it could not be (``ambiguous: ...``)."""
    booked_gpu: float = 0.0
    """``GPU`` booked on this device by actors (the actor table's ``resource_mapping``)."""
    free_gpu: float = 1.0
    """``1 - booked_gpu``: what one more fraction may take here (tasks not counted, see
    :class:`NodePlacement`)."""
    booked_vram_mb: float = 0.0
    """``VRAM_MB`` (MiB) booked by the actors placed on this device (split evenly over an
    actor's devices): Ray books ``VRAM_MB`` node-wide and never binds it to a device."""
    actors: dict[str, float] = {}
    """Actor id → the ``GPU`` quantity it holds here."""
    memory_used_bytes: Optional[int] = None
    """NVML, when the device was matched and measured."""
    memory_total_bytes: Optional[int] = None


class NodePlacement(msgspec.Struct, kw_only=True, gc=False):
    """A node's per-device placement (:class:`DeviceFree` per Ray GPU id)."""

    devices: list[DeviceFree] = []
    unplaced_gpu: float = 0.0
    """``GPU`` the node has booked that no actor accounts for (tasks, whose devices the actor
    table does not name): where it is > 0 the per-device free numbers are an upper bound."""
    note: str = ""
    """Why the Ray id → NVML device mapping is partial, in the operator's words."""


class NodeReport(msgspec.Struct, kw_only=True, gc=False):
    """What a node agent knows about its own node: sent to the head, or read locally."""

    schema: Count = SCHEMA_VERSION
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
    processes: Optional[Annotated[list[ProcessInfo], ITEMS]] = None
    """This host's view of the GPU processes' pids; ``None`` when not read or not mappable."""
    started_by: str = ""
    """How the agent was started: ``ray`` (placed by ``head --agents ray``), ``systemd``,
    ``manual``; ``""`` from agents older than this field."""


class ReceivedReport(msgspec.Struct, kw_only=True, gc=False):
    """A node report as the rollup sees it: when it arrived, by the reader's own clock."""

    report: NodeReport
    received_at: float
    local: bool = False
    """``True``: read on this host by this command, not sent by an agent."""


class NodeStatus(msgspec.Struct, kw_only=True, gc=False):
    """One node of the rollup: BioEngine's ``get_cluster_state`` node keys, then ours."""

    node_ip: Optional[str]
    head: bool
    total_cpu: float
    used_cpu: float
    total_gpu: float
    used_gpu: float
    total_gpu_memory: Optional[int]
    """Bytes, NVML. ``None`` = nobody measured it (BioEngine wrote the string ``"NA"``)."""
    used_gpu_memory: Optional[int]
    total_vram_mb: float
    """MB booked capacity (``VRAM_MB``); 0 = this node does not book VRAM, not "free"."""
    used_vram_mb: float
    total_memory: float
    used_memory: float
    total_object_store_memory: float
    used_object_store_memory: float
    accelerator_type: Optional[str]
    """Ray's ``accelerator_type:X`` token: the key users schedule on ("G" = any GeForce)."""
    slurm_job_id: Optional[str]
    node_id: str
    hostname: Optional[str] = None
    alive: bool = True
    in_scheduler: bool = True
    """``False``: an agent reports this node but the GCS does not know it (``no raylet``)."""
    agent: str = "none"
    """Where the NVML/host numbers come from: ``local`` (read by this command),
    ``reporting`` (a fresh agent report), ``stale`` (an old one) or ``none``."""
    agent_started_by: str = ""
    """How the reporting agent was started (the report's ``started_by``); ``""`` if unknown."""
    report_age_s: Optional[float] = None
    stale: bool = False
    driver_version: Optional[str] = None
    gpus: Optional[list[GpuDevice]] = None
    sources: list[SourceStatus] = []
    attribution: Optional[NodeAttribution] = None
    """Set by ``agent.attribution`` (``status --gpus``); ``None`` otherwise."""
    placement: Optional[NodePlacement] = None
    """Ray's per-device placement (``agent.placement``); ``None`` when the actor table was
    not read."""
    collected_at: Optional[float] = None
    """The agent's clock when it collected the report (for information: staleness uses
    ``received_at``)."""
    received_at: Optional[float] = None
    """The reader's clock when the report arrived (the head's, for a pushed report)."""
    gpus_unmeasured: int = 0
    """GPUs the agent lists whose memory NVML did not give (a lost GPU): the node's
    ``total_gpu_memory``/``used_gpu_memory`` are then ``None``, not a sum without them."""


class PendingNode(msgspec.Struct, kw_only=True, gc=False):
    """One alive node as the autoscaler state holds it, beside the demand it was read with."""

    node_id: str
    node_ip: str = ""
    total: dict[str, float] = {}
    available: dict[str, float] = {}


class PendingRequest(msgspec.Struct, kw_only=True, gc=False):
    """One waiting shape of tasks and actors (Ray's pending resource request) and how many."""

    shape: dict[str, float]
    """Ray's names; inside a placement group ``GPU_group_<pg id>`` and ``bundle_group_<pg id>``."""
    count: int = 1


class PendingGang(msgspec.Struct, kw_only=True, gc=False):
    """One placement group that is not placed yet (Ray's pending gang resource request)."""

    bundles: list[dict[str, float]] = []
    details: str = ""
    """``<pg id>:<strategy>|<state>``, as Ray writes it."""


class PendingActor(msgspec.Struct, kw_only=True, gc=False):
    """One actor the GCS actor table holds as not placed yet. The field names are Ray's state
    API's (``ray list actors``), which BioEngine's ``pending_resources.actors`` carries."""

    actor_id: str
    name: str = ""
    class_name: str = ""
    state: str = "PENDING_CREATION"
    """``PENDING_CREATION`` (waits for resources) or ``DEPENDENCIES_UNREADY``."""
    job_id: str = ""
    required_resources: dict[str, float] = {}
    placement_group_id: str = ""
    """Hex id of the placement group it is to run in; ``""`` for none."""


class PendingRead(msgspec.Struct, kw_only=True, gc=False):
    """What ``gcs_read.read_pending`` read: the demand and the supply of one instant."""

    nodes: list[PendingNode] = []
    requests: list[PendingRequest] = []
    gangs: list[PendingGang] = []
    actors: list[PendingActor] = []
    device_use: dict[str, dict[str, dict[str, float]]] = {}
    """Node id → resource → device index (a string) → what live actors hold there."""


class PendingTask(msgspec.Struct, kw_only=True, gc=False):
    """A waiting task (not an actor) in BioEngine's ``pending_resources.tasks``."""

    required_resources: dict[str, float] = {}
    state: str = "PENDING_NODE_ASSIGNMENT"


class PendingResources(msgspec.Struct, kw_only=True):
    """BioEngine's ``cluster.pending_resources``: lists of dicts and their ``total``."""

    actors: list[PendingActor] = []
    """Waiting actors that ask for CPU, GPU or memory (BioEngine drops the others)."""
    jobs: list[dict[str, str]] = []
    """Always empty: submitted jobs wait in the dashboard's job manager, not in the GCS
    tables rayscope reads."""
    tasks: list[PendingTask] = []
    """Waiting tasks: the pending requests no waiting actor accounts for, one entry each."""
    total: int = 0
    """``len(actors) + len(jobs) + len(tasks)``, as BioEngine counts it."""


class PendingDemand(msgspec.Struct, kw_only=True):
    """One waiting shape and why it waits (rayscope's own ``cluster.pending``)."""

    kind: str
    """``request`` (tasks and actors) or ``placement_group``."""
    shape: dict[str, float]
    """Ray's names in Ray's order (sorted, as ``ray status`` prints them), placement-group
    suffixes taken off; for a placement group the sum of its bundles."""
    count: int
    names: list[str] = []
    """Names of the waiting actors of this shape (anonymous ones are counted, not named)."""
    jobs: list[str] = []
    bundles: list[dict[str, float]] = []
    """A placement group's bundles, as given."""
    placement_group: str = ""
    """Hex id of the placement group this demand belongs to, or is."""
    strategy: str = ""
    """A placement group's strategy (``PACK``, ``SPREAD``, ``STRICT_PACK``, ``STRICT_SPREAD``)."""
    reason: str
    """``infeasible``, ``fragmented``, ``vram_exhausted``, ``gpu_exhausted``,
    ``cpu_exhausted``, ``memory_exhausted``, ``resource_exhausted``,
    ``waits_placement_group`` or ``waits``."""
    reason_text: str
    by: str = "node_sum"
    """``device``: judged per GPU from the actor table's placement; ``node_sum``: by node
    sums only (the per-GPU placement of the nodes involved is not known)."""


class ClusterTotals(msgspec.Struct, kw_only=True):
    """Sums over alive nodes. NVML sums cover only nodes measured and fresh."""

    total_cpu: float = 0.0
    used_cpu: float = 0.0
    total_gpu: float = 0.0
    used_gpu: float = 0.0
    total_vram_mb: float = 0.0
    used_vram_mb: float = 0.0
    total_gpu_memory: Optional[int] = None
    used_gpu_memory: Optional[int] = None
    total_memory: float = 0.0
    used_memory: float = 0.0
    total_object_store_memory: float = 0.0
    used_object_store_memory: float = 0.0
    nodes_alive: int = 0
    nodes_dead: int = 0
    gpu_nodes: int = 0
    gpu_nodes_measured: int = 0
    """How many of ``gpu_nodes`` the NVML sums cover."""
    pending_resources: Optional[PendingResources] = None
    """BioEngine's shape of what waits; ``None`` when the pending demand was not read."""
    pending: Optional[list[PendingDemand]] = None
    """Each waiting shape with its reason (agent.pending); ``None`` when not read."""


class ClusterStatus(msgspec.Struct, kw_only=True):
    """The document ``status --json`` prints: BioEngine's shape plus rayscope's keys."""

    schema: int = SCHEMA_VERSION
    generated_at: float
    view: str
    """``gcs``: read straight from the GCS plus local NVML (no head agent);
    ``head``: served by a head agent from node agents' reports."""
    gcs_address: Optional[str] = None
    sources: list[SourceStatus] = []
    cluster: ClusterTotals
    nodes: dict[str, NodeStatus] = {}
    scheduler_age_s: Optional[float] = None
    """Seconds since the scheduler's view (nodes, liveness, bookings) was read, by the
    reader's clock; ``None`` when it was never read (then ``sources`` says why)."""
    scheduler_stale: bool = False
    """``True``: the view is older than 3 intervals: the GCS has stopped answering and
    nodes, liveness and bookings are as of ``scheduler_age_s`` ago."""


class AgentProcess(msgspec.Struct, kw_only=True, gc=False):
    """A rayscope node agent running on this host, as its process shows it (``rayscope node``)."""

    pid: int
    user: str = ""
    started_by: str
    """``ray`` (a Ray worker titled ``ray::RayscopeAgent``), ``systemd`` (its cgroup is a
    ``.service`` unit) or ``manual``, as ``status --head`` words it."""
    head: Optional[str] = None
    """The ``--head`` on its command line; ``None`` for an agent placed through Ray."""
    unit: Optional[str] = None
    """The systemd unit it runs in, if any."""


class NodeDiagnostics(msgspec.Struct, kw_only=True):
    """What ``rayscope node`` prints: this host's raylets, GPUs and host, and their booking."""

    schema: int = SCHEMA_VERSION
    generated_at: float
    gcs_address: Optional[str] = None
    raylets: list[RayletInfo] = []
    host: Optional[HostInfo] = None
    driver_version: Optional[str] = None
    gpus: Optional[list[GpuDevice]] = None
    booking: dict[str, NodeStatus] = {}
    """The local raylets' nodes as the scheduler sees them (empty if the GCS was not read)."""
    sources: list[SourceStatus] = []
    processes: Optional[list[ProcessInfo]] = None
    attribution: Optional[NodeAttribution] = None
    """This host's GPUs attributed to the local raylets' actors (``node --gpus``)."""
    agents: Optional[list[AgentProcess]] = None
    """rayscope node agents running on this host (``None``: not looked for)."""


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


class GpuFit(msgspec.Struct, kw_only=True):
    """One GPU of a chosen node, as NVML measured it, and the replicas the check put on it."""

    index: int
    free_bytes: int
    total_bytes: int
    replicas: int = 0
    short: bool = False
    """``True``: at least one replica put here did not find its memory free."""


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
    need_bytes: Optional[int] = None
    """GPU memory one replica needs free, for the NVML check (``None``: not judged)."""
    gpus: list[GpuFit] = []
    per_device: Optional[bool] = None
    """``True``: ``GPU`` packed per device from Ray's placement; ``False``: node sums only
    (placement unknown); ``None``: the shape asks no ``GPU`` here."""


class FitResult(msgspec.Struct, kw_only=True):
    """What ``rayscope fit --json`` prints: the Ray shape, the placement, the answer."""

    schema: int = SCHEMA_VERSION
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
