"""Which measurement a node's GPU memory shows, stated once. Pure: no I/O, no clock.

1. **A fresh report that measured the node**: a rayscope agent's, or this host's NVML read by
   the command itself (NVML answered, the report not stale). Each GPU keeps the agent's
   verdict, trusted or not: a vGPU guest's phantom is not replaced by the dashboard's copy of
   the same phantom.
2. **Else Ray's dashboard's figure** (``GET /nodes?view=summary``: what Ray's dashboard agent
   on the node read from NVML), for every GPU it lists, with its age: the reader's clock minus
   the dashboard's ``now`` (the node's clock: a node whose clock is ahead reads younger, one
   behind older; clamped at 0), shown while at most :data:`DASHBOARD_MAX_AGE_S` old. The
   dashboard does not say a GPU's virtualization mode: a GPU whose name ends in a vGPU profile
   (``A40-16C``) is judged a vGPU guest and its used figure not trusted
   (:func:`rayscope.core.gpu.trust.named_vgpu`); any other is read as bare metal.
3. **Else NA**, and the node's reason says why: the report's (``no agent``, ``stale report``,
   ``NVML did not answer``) and the dashboard's.

Per GPU: NVML lists every GPU of a node to whoever asks, rayscope's agent and Ray's dashboard
agent alike (``CUDA_VISIBLE_DEVICES`` hides none from NVML), so a node's GPUs come whole from
one of the two, and each GPU names its source (``memory_used_source``), as the node does
(``used_gpu_memory_source``, ``gpus_source``).
"""

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Optional

from msgspec.structs import replace

from rayscope.core.gpu.memory import put_memory
from rayscope.core.gpu.settled import settle_report
from rayscope.core.gpu.trust import named_vgpu
from rayscope.schema.dashboard import DASHBOARD_SOURCE, DashboardGpu, DashboardNode, DashboardRead
from rayscope.schema.report import UNSET, GpuDevice, GpuProcess, NodeReport, ProcessInfo, SourceStatus, known
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeStatus
from rayscope.units import number

DASHBOARD_MAX_AGE_S = 60.0
"""A dashboard figure older than this is not shown: Ray's dashboard agents sample every 5 s
(``REPORTER_UPDATE_INTERVAL_MS``), so a dozen samples were missed: the agent on the node has
stopped, or the node's clock is behind the reader's."""
MIG_INDEX_BASE = 1000
"""From Ray 2.49 the dashboard lists a MIG instance as index ``parent × 1000 + instance``."""
PROCESSES_NOT_BELIEVED = (
    "not believed: this Ray release's dashboard may write the memory-bus utilisation × the GPU's"
    " total (Ray 2.50-2.56, ray-project/ray#61456)"
)
"""The GPU's ``errors`` entry where the dashboard's per-process memory is not used."""


def measured_here(node: NodeStatus) -> bool:
    """Rule 1: a fresh report (an agent's, or this host's NVML) measured the node's GPUs."""
    return node.agent in ("local", "reporting") and node.gpus is not None


def figures_old(node: NodeStatus) -> bool:
    """Whether the node's GPU figures are a stale report's (kept, marked, not summed); a
    stale node whose figures are the dashboard's fresh ones is not."""
    return node.stale and known(node.gpus_source) is None


def dashboard_device(gpu: DashboardGpu, age_s: float) -> GpuDevice:
    """One GPU as the dashboard measured it, ``age_s`` old, judged (rule 2): the used figure
    trusted unless its name is a vGPU profile's; the processes' memory only where the
    dashboard's release writes it right (``processes_believed``); NVML's v1 figures
    (``memory_info_version`` 1: reserved memory counted as used)."""
    vgpu = named_vgpu(gpu.name)
    parent, index = divmod(gpu.index, MIG_INDEX_BASE) if gpu.index >= MIG_INDEX_BASE else (None, gpu.index)
    believed = gpu.processes_believed
    processes = [
        GpuProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes if believed else None)
        for p in gpu.processes
    ]
    return GpuDevice(
        index=index,
        parent_index=parent,
        name=gpu.name,
        uuid=gpu.uuid,
        memory_total_bytes=gpu.memory_total_bytes,
        memory_used_bytes=None if vgpu else gpu.memory_used_bytes,
        memory_info_version=1,
        utilization_gpu_pct=gpu.utilization_gpu_pct,
        processes=processes,
        errors={} if believed or not processes else {"process memory": PROCESSES_NOT_BELIEVED},
        nvml_memory_used_bytes=gpu.memory_used_bytes,
        memory_used_source=UNSET if vgpu else DASHBOARD_SOURCE,
        memory_used_age_s=UNSET if vgpu else age_s,
        memory_used_reason=vgpu or UNSET,
    )


def _why_not(entry: Optional[DashboardNode], age_s: Optional[float], total_gpu: float) -> str:
    """Why the dashboard has no figure to show for a node Ray counts ``total_gpu`` GPUs on;
    ``""`` when it has one. No GPU listed where Ray counts one is no measurement: its agent
    there reads no NVML (Ray's dashboard agent then sends ``gpus: []``, as for a CPU node)."""
    if entry is None:
        return "this node is not in its summary"
    if entry.gpus is None or age_s is None:
        return "no sample from this node's agent yet"
    if not entry.gpus and total_gpu > 0:
        return (
            f"it lists no GPU on this node, which Ray counts {number(total_gpu)} GPU on"
            " (its agent there reads no NVML)"
        )
    if age_s > DASHBOARD_MAX_AGE_S:
        return (
            f"its figure is {age_s:.0f}s old (its agent on the node stopped, or the node's clock is"
            " behind this one's)"
        )
    return ""


def _from_dashboard(node: NodeStatus, entry: DashboardNode, age_s: float) -> NodeStatus:
    settled = settle_report([dashboard_device(g, age_s) for g in entry.gpus or ()])
    gpus = settled.gpus or []
    taken = replace(node, gpus=gpus, gpus_source=DASHBOARD_SOURCE, collected_at=entry.measured_at)
    put_memory(taken, settled.memory, 0.0, False)
    if not gpus:  # no GPU there, by the dashboard's NVML read: its figure (0 of 0), of its age
        taken.used_gpu_memory_source, taken.used_gpu_memory_age_s = DASHBOARD_SOURCE, age_s
    return taken


NOT_READ = "not read"
"""A node's reason where the dashboard could not be read (its source's status says why)."""
NODE_AGENT_FIX = "for measured VRAM without it, run a rayscope node agent on each node"
"""What a failed dashboard's one line adds where its own reason names no fix for the VRAM."""


def _shown_status(read: DashboardRead, used: int, wanted: bool) -> list[SourceStatus]:
    """The dashboard's status for the document: with what it gave; its failure only where a
    GPU node was left without a figure (elsewhere nobody needed it), naming the fix."""
    status = read.status
    if status.ok:
        return [replace(status, detail=f"{status.detail}; the VRAM of {used} node(s) no agent measured")]
    if not wanted:
        return []
    fixed = "rayscope node agent" in status.reason
    return [status if fixed else replace(status, reason=f"{status.reason}; {NODE_AGENT_FIX}")]


def take_dashboard(
    nodes: MutableMapping[str, NodeStatus], read: Optional[DashboardRead], wall_now: float
) -> list[SourceStatus]:
    """Rules 2 and 3 for every alive scheduler node that rule 1 leaves unmeasured, in
    ``nodes`` (a node changed is replaced, never mutated: the head shares its scheduler
    nodes between queries); the dashboard's status to list with the sources. ``read``:
    ``None`` when the dashboard was not asked (off, or nothing needed it): nothing changes.
    ``wall_now``: the reader's wall clock, which the dashboard's ``now`` is compared with."""
    if read is None:
        return []
    used = 0
    wanted = False
    for node_id, node in list(nodes.items()):
        if (
            measured_here(node)
            or not node.alive
            or not node.in_scheduler
            or known(node.unreadable) is not None
        ):
            continue
        wanted = wanted or node.total_gpu > 0
        entry = read.nodes.get(node_id)
        measured_at = entry.measured_at if entry is not None else None
        age = None if measured_at is None else round(max(0.0, wall_now - measured_at), 1)
        why = _why_not(entry, age, node.total_gpu) if read.status.ok else NOT_READ
        if why or entry is None or age is None:
            nodes[node_id] = replace(
                node, used_gpu_memory_reason=f"{node.used_gpu_memory_reason}; Ray dashboard: {why}"
            )
            continue
        nodes[node_id] = _from_dashboard(node, entry, age)
        used += 1
    return _shown_status(read, used, wanted)


def dashboard_processes(
    node: NodeStatus, actors: Optional[Sequence[ActorBooking]]
) -> Optional[list[ProcessInfo]]:
    """The dashboard's GPU pids of ``node`` matched to actors through the actor table's
    worker pids, as an agent maps them on its host: a pid that is a live actor's worker on
    this node is that actor's, else the last worker pid of a dead actor there is that dead
    actor's (its leaked memory); any other is not mapped (no agent there to look). ``None``
    when the actor table was not read."""
    if actors is None:
        return None
    here = [a for a in actors if a.node_id == node.node_id and a.pid and a.state in ("ALIVE", "DEAD")]
    workers = {a.pid: a for a in sorted(here, key=lambda a: a.state == "ALIVE")}  # a live one wins
    pids = sorted({p.pid for g in node.gpus or () for p in g.processes or ()})
    found = []
    for pid in pids:
        actor = workers.get(pid)
        if actor is None:
            found.append(ProcessInfo(pid=pid, visible=False))
        else:
            found.append(ProcessInfo(pid=pid, worker_pid=pid, node_id=node.node_id, actor_id=actor.actor_id))
    return found


def dashboard_reports(
    status: ClusterStatus, actors: Optional[Sequence[ActorBooking]]
) -> Mapping[str, NodeReport]:
    """A report per node whose GPUs are the dashboard's (rule 2), for the attribution:
    its GPUs and their pids matched to actors (:func:`dashboard_processes`)."""
    return {
        node.node_id: NodeReport(
            node_id=node.node_id,
            collected_at=node.collected_at or 0.0,
            gpus=node.gpus,
            processes=dashboard_processes(node, actors),
        )
        for node in status.nodes.values()
        if known(node.gpus_source) == DASHBOARD_SOURCE and node.gpus is not None
    }
