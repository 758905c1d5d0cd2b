"""The cluster status document (``status --json``, ``/v1/status``) and what it is merged from.

Three GPU numbers that are never merged:

* ``total_gpu`` / ``used_gpu`` — Ray's ``GPU`` resource: device handles booked (fraction);
* ``total_vram_mb`` / ``used_vram_mb`` — Ray's custom ``VRAM_MB`` resource: memory booked;
* ``total_gpu_memory_bytes`` / ``used_gpu_memory_bytes`` — NVML: bytes the driver sees in use
  (rayscope's keys; BioEngine's ``total_gpu_memory`` / ``used_gpu_memory`` carry the same
  numbers in BioEngine's types: bytes or ``"NA"``).

Each key has one owner (docs/json.md): the keys BioEngine's ``get_cluster_state()`` defines
keep BioEngine's types and meanings; what rayscope knows beyond them is in keys of its own,
typed, ``null`` when unknown.

These types are the head's and the CLI's own (a head and its clients are one release), so a
field may change here when the document's ``schema`` (:data:`DOCUMENT_SCHEMA`) says so;
``rayscope.schema.report`` is the schema that crosses releases.
"""

from typing import Literal, Optional, Union

import msgspec

from rayscope.schema import DOCUMENT_SCHEMA as DOCUMENT_SCHEMA  # noqa: PLC0414 - re-exported (defined there for the fast path)
from rayscope.schema.pending import PendingDemand, PendingResources
from rayscope.schema.report import UNSET, Count, GpuDevice, GpuUser, NodeReport, SourceStatus, Unset

NA: Literal["NA"] = "NA"
"""BioEngine's word for a number it does not have (never ``null`` in its keys)."""

BytesOrNA = Union[Count, Literal["NA"]]
"""BioEngine's type for a node's GPU memory: int bytes, or the string ``"NA"``."""


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


class DeviceFree(msgspec.Struct, kw_only=True, gc=False):
    """One physical GPU of a Ray node as the scheduler placed work on it (rayscope.core.gpu.placement).

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
    actor_vram_mb: dict[str, float] = {}
    """Actor id → its share of :attr:`booked_vram_mb` (its ``VRAM_MB`` split evenly over its
    devices); only actors that booked ``VRAM_MB``. The page draws one segment per actor from
    it where no NVML report attributes the device."""
    memory_used_bytes: Optional[int] = None
    """The used figure rayscope trusts (``rayscope.core.gpu.trust.gpu_used``: NVML's, or a CUDA sample's on
    a vGPU guest), when the device was matched and measured."""
    memory_total_bytes: Optional[int] = None


class NodePlacement(msgspec.Struct, kw_only=True, gc=False):
    """A node's per-device placement (:class:`DeviceFree` per Ray GPU id)."""

    devices: list[DeviceFree] = []
    unplaced_gpu: float = 0.0
    """``GPU`` the node has booked that no actor accounts for (tasks, whose devices the actor
    table does not name): where it is > 0 the per-device free numbers are an upper bound."""
    note: str = ""
    """Why the Ray id → NVML device mapping is partial, in the operator's words."""


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
    """NVML: memory held by processes that booked nothing (a dead actor's worker included),
    summed over this node's GPUs."""
    unmapped_bytes: int = 0
    """NVML: memory held by pids this host could not map to a process (``not_mapped``),
    summed over this node's GPUs."""


class ReceivedReport(msgspec.Struct, kw_only=True, gc=False):
    """A node report as the rollup sees it: when it arrived, by the reader's own clock."""

    report: NodeReport
    received_at: float
    local: bool = False
    """``True``: read on this host by this command, not sent by an agent."""
    memory: Optional[object] = None
    """The rollup's cache (never encoded): the report's GPUs settled and their sums
    (``rayscope.core.gpu.settled.SettledReport``)."""
    merged: "Optional[tuple[NodeStatus, NodeStatus]]" = None
    """The rollup's cache: (scheduler node, that node merged with this fresh report, ages
    left out): a report is merged into the same scheduler node query after query."""


class NodeStatus(msgspec.Struct, kw_only=True, gc=False):
    """One node of the rollup: BioEngine's ``get_cluster_state`` node keys, then ours.

    ``nodes`` also holds nodes BioEngine would not list (dead ones with ``--all``, hosts the
    scheduler does not know), with values BioEngine's rules give them; BioEngine's ``nodes``
    are the entries with ``alive`` and ``in_scheduler``."""

    node_ip: Optional[str]
    head: bool
    total_cpu: float
    used_cpu: float
    total_gpu: float
    used_gpu: float
    total_gpu_memory: BytesOrNA
    """BioEngine's: ``0`` when ``total_gpu == 0``; else NVML's total over the node's GPUs
    when every GPU's is known (a stale report's too); else ``"NA"``. rayscope's figure,
    whatever ``total_gpu`` says, is :attr:`total_gpu_memory_bytes`."""
    used_gpu_memory: BytesOrNA
    """BioEngine's: ``0`` when ``total_gpu == 0``; else :attr:`used_gpu_memory_bytes` (a
    fresh report, every GPU's trusted figure known); else ``"NA"``."""
    total_vram_mb: float
    """MB booked capacity (``VRAM_MB``); 0 = this node does not book VRAM, not "free"."""
    used_vram_mb: float
    total_memory: float
    used_memory: float
    total_object_store_memory: float
    used_object_store_memory: float
    accelerator_type: Optional[str]
    """BioEngine's: ``"NA"`` when ``total_gpu == 0``; else Ray's ``accelerator_type:X``
    token, the key users schedule on ("G" = any GeForce), or ``None`` when the node has
    none (``rayscope.core.rollup.ray_accelerator`` reads it back as Ray's token or ``None``)."""
    slurm_job_id: Optional[str]
    node_id: str
    hostname: Optional[str] = None
    alive: bool = True
    in_scheduler: bool = True
    """``False``: an agent reports this node but the GCS does not know it (``no raylet``)."""
    labels: Union[dict[str, str], Unset] = UNSET
    """The node's Ray labels (``ray start --labels``, Ray's own ``ray.io/...``), as the GCS
    holds them, without ``ray.io/node-id`` (the node id is the entry's key); printable,
    bounded (``rayscope.core.capacity.selectors.shown_labels``). Absent where the node's Ray
    gives no labels of its own (before 2.49: selectors are not scheduled on there)."""
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
    """Set by ``rayscope.core.gpu.attribution`` (``status --gpus``); ``None`` otherwise."""
    placement: Optional[NodePlacement] = None
    """Ray's per-device placement (``rayscope.core.gpu.placement``); ``None`` when the actor table was
    not read."""
    collected_at: Optional[float] = None
    """The agent's clock when it collected the report (for information: staleness uses
    ``received_at``)."""
    received_at: Optional[float] = None
    """The reader's clock when the report arrived (the head's, for a pushed report)."""
    gpus_unmeasured: int = 0
    """GPUs the agent lists whose memory NVML did not give (a lost GPU): the node's sums
    that need it (``*_gpu_memory_bytes``, ``nvml_memory_used_bytes``) are then ``None``
    (BioEngine's keys ``"NA"``), never a sum without it."""
    total_gpu_memory_bytes: Optional[int] = None
    """NVML's total over the node's GPUs, whatever ``total_gpu`` says (a node may hold GPUs
    Ray was not told of), from its latest report, stale or not; ``0``: NVML answered and
    found no GPU; ``None``: not measured (no report, NVML failed, a GPU not measured)."""
    used_gpu_memory_bytes: Optional[int] = None
    """The used figure rayscope trusts, summed over the node's GPUs (each GPU's
    ``memory_used_bytes``); ``None`` when unknown, stale or unreliable
    (:attr:`used_gpu_memory_reason` says which)."""
    used_gpu_memory_source: Optional[str] = None
    """Where :attr:`used_gpu_memory_bytes` comes from: ``nvml`` (an agent's, or this host's
    NVML), ``cuda``, ``ray-dashboard`` (Ray's dashboard agent on the node, read from the
    dashboard: a node no fresh report measured) or ``mixed`` (GPUs of several); ``None``
    with it."""
    used_gpu_memory_age_s: Optional[float] = None
    """Age of its oldest figure by the reader's clock: the figure's age at collection plus
    the report's age (a dashboard figure: the reader's clock minus the dashboard's ``now``,
    the node's clock); ``None`` with it."""
    used_gpu_memory_reason: str = ""
    """Why :attr:`used_gpu_memory_bytes` is ``None``: ``no agent``, ``stale report``,
    ``NVML did not answer``, ``1 GPU(s) not measured``, and where Ray's dashboard was asked
    what it lacked (``no agent; Ray dashboard: no sample for this node``); ``""`` when it is
    known."""
    nvml_memory_used_bytes: Optional[int] = None
    """NVML's raw used, summed over the node's GPUs, as of the latest report (its age is
    ``report_age_s``), also where rayscope does not trust it; ``None``: not measured."""
    shared_gpus: Union[dict[str, list[str]], Unset] = UNSET
    """GPU UUID → the other nodes whose reports list the same GPU (time-slicing: several Ray
    nodes or containers on one physical GPU); absent when none is shared. The cluster's
    ``_bytes`` sums count such a GPU once (rayscope.core.gpu.memory.find_shared_gpus)."""
    gpus_source: Union[str, Unset] = UNSET
    """``ray-dashboard``: :attr:`gpus` (and the memory figures) are what Ray's dashboard
    agent on the node measured, because no fresh report of a rayscope agent (or this host's
    NVML) did (``rayscope.core.gpu.precedence``); absent when they are a report's."""
    unreadable: Union[str, Unset] = UNSET
    """Why the node's report could not be merged or rendered (``ValueError: ...``); its
    report's parts are then left out and the scheduler's numbers kept (rayscope.core.isolation).
    Absent when it could."""


class ClusterTotals(msgspec.Struct, kw_only=True):
    """Sums over alive nodes the scheduler knows (BioEngine's ``nodes``: the entries with
    ``alive`` and ``in_scheduler``)."""

    total_cpu: float = 0.0
    used_cpu: float = 0.0
    total_gpu: float = 0.0
    used_gpu: float = 0.0
    total_vram_mb: float = 0.0
    used_vram_mb: float = 0.0
    total_gpu_memory: Count = 0
    """BioEngine's: the sum of the nodes' ``total_gpu_memory`` that are numbers (``"NA"``
    skipped); ``0`` when none is. Total and used may cover different nodes."""
    used_gpu_memory: Count = 0
    """BioEngine's: the sum of the nodes' ``used_gpu_memory`` that are numbers."""
    total_gpu_memory_bytes: Optional[int] = None
    """rayscope's: NVML's total over the ``gpu_nodes_measured`` nodes (GPU nodes with a
    fresh report, total and trusted used both known); ``None`` when there is none."""
    used_gpu_memory_bytes: Optional[int] = None
    """rayscope's: the trusted used figure over the same nodes, so used/total is a use."""
    total_memory: float = 0.0
    used_memory: float = 0.0
    total_object_store_memory: float = 0.0
    used_object_store_memory: float = 0.0
    nodes_alive: int = 0
    nodes_dead: int = 0
    gpu_nodes: int = 0
    gpu_nodes_measured: int = 0
    """How many of ``gpu_nodes`` ``total_gpu_memory_bytes``/``used_gpu_memory_bytes`` cover."""
    shared_gpus: Union[Count, Unset] = UNSET
    """Physical GPUs more than one node reports (``nodes.*.shared_gpus``), counted once in the
    ``_bytes`` sums (BioEngine's sums add every node's, as BioEngine does); absent when none."""
    pending_resources: Union[PendingResources, msgspec.UnsetType] = msgspec.UNSET
    """BioEngine's shape of what waits; absent (``UNSET``) when the pending demand was not
    read, as BioEngine leaves it out outside SLURM mode (never ``null``)."""
    pending: Optional[list[PendingDemand]] = None
    """Each waiting shape with its reason (rayscope.core.capacity.pending); ``None`` when not read."""


class ClusterStatus(msgspec.Struct, kw_only=True):
    """The document ``status --json`` prints: BioEngine's shape plus rayscope's keys."""

    schema: int = DOCUMENT_SCHEMA
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
