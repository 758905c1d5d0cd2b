"""``rayscope status``: the status lines, the JSON document, NDJSON lines for ``--append``,
and the completeness note.

The status lines are a contract (the seed's format, see docs/architecture.md): GPU fractions
``.2f``, GPU totals and CPUs ``.0f``, ``booked: used/total MB`` only where the node advertises
``VRAM_MB``, NVML memory in GiB ``.1f`` labelled ``GB`` with ``NA`` for unknown numbers.
"""

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Optional

import msgspec

from rayscope.core.capacity.pending import shape_text
from rayscope.core.isolation import UNREADABLE, per_node
from rayscope.core.rollup import SchedulerView, scheduler_view
from rayscope.labels import SHORT_ID_CHARS, label_pairs, node_label, printable_lines
from rayscope.render.fmt import (
    booking,
    cpus,
    encode,
    gib,
    has_gpus,
    shown_used_bytes,
    source_notes,
    visible_nodes,
    vram_note,
)
from rayscope.render.gpus import device_line, fuller_devices, status_gpu_lines
from rayscope.schema.dashboard import DASHBOARD_OFF, DASHBOARD_STATUS
from rayscope.schema.pending import PendingDemand
from rayscope.schema.report import AGENT_STARTERS, SourceStatus, known
from rayscope.schema.status import ClusterStatus, NodeStatus


def node_markers(
    node: NodeStatus, view: str, scheduler_ok: bool, scheduler_age_s: Optional[float] = None
) -> list[str]:
    """What to append to a node's line so old or missing numbers are never silent.
    ``scheduler_age_s``: set when the scheduler's view is old (its nodes are marked)."""
    reason = known(node.unreadable)
    markers = [] if reason is None else [f"{UNREADABLE}: {reason}"]
    if view == "head" and node.agent in ("reporting", "stale") and node.agent_started_by:
        # How the node is covered; a report's own word, so only a known one is shown.
        starter = node.agent_started_by if node.agent_started_by in AGENT_STARTERS else "other"
        markers.append(f"agent: {starter}")
    if not node.alive:
        markers.append("dead")
    if not node.in_scheduler:
        markers.append("no raylet" if scheduler_ok else "not in scheduler view")
    elif scheduler_age_s is not None:
        markers.append(f"scheduler view {scheduler_age_s:.0f}s old")
    if node.stale and node.report_age_s is not None:
        markers.append(f"stale {node.report_age_s:.0f}s")
    if view == "head" and node.agent == "none" and node.alive and reason is None:
        markers.append("no agent")
    if node.gpus_unmeasured:
        markers.append(f"{node.gpus_unmeasured} GPU(s) not measured")
    return markers


def node_line(
    node: NodeStatus,
    view: str = "gcs",
    scheduler_ok: bool = True,
    scheduler_age_s: Optional[float] = None,
    markers: Optional[list[str]] = None,
) -> str:
    """One node, e.g. ``10.0.0.5 [worker] T4 GPU: 0.99/1 VRAM: 5.8/24.0 GB  CPU: 6/8``."""
    words = [node_label(node.node_ip, node.node_id, node.hostname), "[HEAD]" if node.head else "[worker]"]
    cpu = f"CPU: {cpus(node.used_cpu)}/{cpus(node.total_cpu)}"
    memory = f"VRAM: {gib(shown_used_bytes(node))}/{gib(node.total_gpu_memory_bytes)} GB{vram_note(node)}"
    if not node.in_scheduler:  # an agent's node the scheduler does not know: nothing booked to show
        words.append(memory)
    elif node.total_gpu > 0:
        if node.accelerator_type:
            words.append(node.accelerator_type)
        # The seed's format: a booking segment is followed by two spaces, a bare fraction by one.
        gap = "  " if node.total_vram_mb > 0 else " "
        words.append(f"{booking(node)}{gap}{memory}  {cpu}")
    else:
        words.append(cpu)
    line = " ".join(words)
    if markers is None:
        markers = node_markers(node, view, scheduler_ok, scheduler_age_s)
    return line + ("  " + ", ".join(markers) if markers else "")


def dead_lines(
    status: ClusterStatus, include_dead: bool, scheduler_ok: bool, old_age: Optional[float]
) -> list[str]:
    """``Dead nodes:`` and a line each (``include_dead``), else one line that counts them."""
    dead = [n for n in status.nodes.values() if not n.alive]
    if not dead:
        return []
    if include_dead:
        markers = [node_markers(n, status.view, scheduler_ok, old_age) for n in dead]
        return ["", "Dead nodes:"] + ["  " + dead_line(n, m) for n, m in zip(dead, markers)]
    return ["", f"{len(dead)} dead node{'s' * (len(dead) != 1)}: --all lists {'them' if dead[1:] else 'it'}"]


def dead_line(node: NodeStatus, markers: Sequence[str]) -> str:
    """A node Ray marked dead, apart from the live ones: what it had (where the GCS still says)
    and its id, which a node restarted on the same host does not share, e.g.
    ``10.0.0.9 [worker] T4, 1 GPU, 4 CPUs, node 5a5a5a5a5a5a  dead``."""
    words = [node_label(node.node_ip, node.node_id, node.hostname), "[HEAD]" if node.head else "[worker]"]
    had = [f"{node.accelerator_type}," if node.accelerator_type and node.total_gpu else ""]
    had += [
        f"{n:.0f} {what}{'s' * (n != 1)},"
        for n, what in ((node.total_gpu, "GPU"), (node.total_cpu, "CPU"))
        if n
    ]
    words += [w for w in had if w] + [f"node {node.node_id[:SHORT_ID_CHARS]}"]
    return " ".join(words) + "  " + ", ".join(markers)


def cluster_line(status: ClusterStatus) -> str:
    """``Cluster: 16/32 CPUs, 1.03/2 GPUs, booked: 20480/24576 MB``."""
    c = status.cluster
    line = f"Cluster: {cpus(c.used_cpu)}/{cpus(c.total_cpu)} CPUs, {c.used_gpu:.2f}/{c.total_gpu:.0f} GPUs"
    if c.total_vram_mb > 0:
        line += f", booked: {c.used_vram_mb:.0f}/{c.total_vram_mb:.0f} MB"
    return line


def source_details(sources: Sequence[SourceStatus]) -> list[str]:
    """``--verbose``: each source, whether it answered, and what answered
    (``gcs: ok, 10.0.0.1:6379 via /opt/ray/bin/python``), or why it did not."""
    lines = ["sources:"]
    for s in sources:
        line = f"  {s.name}: {'ok' if s.ok else 'no'}"
        line += f", {s.detail}" if s.detail else ""
        line += f" ({s.reason})" if s.reason else ""
        lines.append(line)
    return printable_lines(lines)


SUMMARY_NODES = 50
"""Above this many nodes, ``status`` lists only the nodes that need attention (``--all``: every one)."""


@per_node
def status_lines(status: ClusterStatus, include_dead: bool = False, summary: bool = False) -> list[str]:
    """The human status: cluster line, GPU nodes, CPU-only nodes, then notes. ``summary``:
    on a cluster of more than :data:`SUMMARY_NODES` nodes, a node gets its line only when
    it needs attention (a marker other than how its agent was started, or a device fuller
    than the node sum); one line counts the others."""
    state = scheduler_view(status)
    scheduler_ok = state is not SchedulerView.NONE
    old_age = status.scheduler_age_s if state is SchedulerView.OLD else None
    nodes = visible_nodes(status, include_dead=False)
    summary = summary and len(nodes) > SUMMARY_NODES
    gpu_nodes = [n for n in nodes if has_gpus(n)]
    cpu_nodes = [n for n in nodes if not has_gpus(n)]
    lines = [cluster_line(status)]
    for title, group in (("GPU nodes:", gpu_nodes), ("CPU-only nodes:", cpu_nodes)):
        if group:
            lines += ["", title]
            quiet = 0
            for n in group:
                markers = node_markers(n, status.view, scheduler_ok, old_age)
                fuller = fuller_devices(n)
                if summary and not fuller and all(m.startswith("agent: ") for m in markers):
                    quiet += 1
                    continue
                lines.append("  " + node_line(n, status.view, scheduler_ok, old_age, markers))
                # A device much fuller than the node sum: its own line (needs Ray's placement).
                lines += ["    " + device_line(d) + "  fuller than the node sum" for d in fuller]
            if quiet:
                lines.append(f"  ... and {quiet} more, nothing to flag (--all lists every node)")
    lines += dead_lines(status, include_dead, scheduler_ok, old_age)
    lines += pending_lines(status, old_age)
    notes = source_notes(status.sources)
    if old_age is not None:
        notes.insert(
            0,
            f"SCHEDULER VIEW: {old_age:.0f}s old (the GCS stopped answering): nodes, liveness"
            " and bookings are as of then",
        )
    unmeasured = status.cluster.gpu_nodes - status.cluster.gpu_nodes_measured
    if status.view == "gcs" and unmeasured > 0:
        notes.append(vram_na_note(status, unmeasured))
        notes += unmeasured_reasons(status)
    if notes:
        lines += ["", *notes]
    return printable_lines(lines)


def dashboard_answered(status: ClusterStatus) -> bool:
    """Ray's dashboard was read and answered (else its own ``DASHBOARD:`` line says why not)."""
    return any(
        s.name == DASHBOARD_STATUS and s.ok and not s.detail.startswith(DASHBOARD_OFF) for s in status.sources
    )


REASONS_SHOWN = 5
"""Unmeasured GPU nodes whose reason the embedded view's note lists; the rest are counted."""


def unmeasured_reasons(status: ClusterStatus) -> list[str]:
    """``  10.0.0.23: Ray dashboard: no sample from this node's agent yet``: why each alive GPU
    node the note counts has no measured VRAM, in words on the lines (``--json`` has it too,
    as ``used_gpu_memory_reason``); a node whose own line says why (``(vGPU: ...)``) is not
    repeated. "no agent" is every node's in this view and is left out. Only where the dashboard
    answered: else its ``DASHBOARD:`` line is the reason."""
    if not dashboard_answered(status):
        return []
    said = []
    for node in status.nodes.values():
        counted = node.alive and node.in_scheduler and node.total_gpu > 0
        if not counted or node.used_gpu_memory_bytes is not None:
            continue
        reason = node.used_gpu_memory_reason.removeprefix("no agent").lstrip("; ")
        if reason and not vram_note(node):
            said.append(f"  {node.node_ip}: {reason}")
    more = len(said) - REASONS_SHOWN
    rest = [f"  ... and {more} more (--json: used_gpu_memory_reason)"] if more > 0 else []
    return said[:REASONS_SHOWN] + rest


def vram_na_note(status: ClusterStatus, unmeasured: int) -> str:
    """Why ``unmeasured`` GPU nodes read ``VRAM: NA`` in the embedded view: neither this
    host's NVML nor, where it answered, Ray's dashboard measured them."""
    if dashboard_answered(status):
        return (
            f"VRAM: NA on {unmeasured} GPU node(s): neither this host's NVML nor Ray's dashboard"
            " measured them (--json: each node's used_gpu_memory_reason); run `rayscope head`"
            " and `rayscope push` on every node"
        )
    return (
        f"VRAM: NA on {unmeasured} GPU node(s): without a head agent only this host's"
        " NVML is read (run `rayscope head` and `rayscope push` on every node)"
    )


def selects_text(demand: PendingDemand) -> str:
    """``  selects zone=b, else zone=c``: a demand's label selector and fallbacks (Ray's
    syntax); a placement group's per bundle; ``""`` where it names none."""
    if isinstance(demand.bundle_selectors, list):
        per_bundle = ", ".join(f"{{{label_pairs(b)}}}" for b in demand.bundle_selectors)
        return f"  selects [{per_bundle}]"
    if not isinstance(demand.label_selector, dict):
        return ""
    fallbacks = demand.fallback_selectors if isinstance(demand.fallback_selectors, list) else []
    return "  selects " + ", else ".join(label_pairs(s) for s in [demand.label_selector, *fallbacks])


def demand_line(demand: PendingDemand) -> str:
    """``2 × GPU=0.5 accelerator_type:A10G=0.001  actors: half-0, half-1``; with a label
    selector ``1 × GPU=0.01 VRAM_MB=20000  selects zone=b  actors: big``."""
    if demand.kind == "placement_group":
        bundles = ", ".join("{" + shape_text(b) + "}" for b in demand.bundles)
        text = f"{demand.count} × placement group {demand.strategy} [{bundles}]"
    else:
        text = f"{demand.count} × {shape_text(demand.shape) or 'no resources'}"
    text += selects_text(demand)
    if demand.names:
        text += "  actors: " + ", ".join(demand.names)
    return text


def pending_lines(status: ClusterStatus, old_age: Optional[float] = None) -> list[str]:
    """``Pending:``, one line per waiting shape and its reason under it; nothing when
    nothing waits (or the pending demand was not read). ``old_age``: the scheduler view's
    age when it is old; the demand was read with it, so the header says as of when."""
    demands = status.cluster.pending or []
    if not demands:
        return []
    lines = ["", "Pending:" if old_age is None else f"Pending: (scheduler view {old_age:.0f}s old)"]
    for demand in demands:
        lines.append("  " + demand_line(demand))
        lines.append(f"    {demand.reason_text}")
    return lines


@per_node
def status_json(status: ClusterStatus, include_dead: bool = False, indent: int = 2) -> str:
    """The JSON document: BioEngine's ``{"cluster": ..., "nodes": ...}`` plus our keys.
    ``indent=0`` is compact (what the head agent serves)."""
    return encode(_shown(status, include_dead), indent)


@per_node
def status_json_bytes(status: ClusterStatus, include_dead: bool = False) -> bytes:
    """:func:`status_json`, compact, as the bytes the head serves (52 MB at 10,000 nodes of
    8 GPUs: no round trip through ``str``)."""
    return msgspec.json.encode(_shown(status, include_dead))


_ENCODER = msgspec.json.Encoder()


@per_node
def status_json_into(status: ClusterStatus, buffer: bytearray, include_dead: bool = False) -> bytearray:
    """:func:`status_json_bytes` written into ``buffer`` (its pages already the process's:
    no fresh 52 MB per render at 10,000 nodes); ``buffer``."""
    _ENCODER.encode_into(_shown(status, include_dead), buffer)
    return buffer


def _shown(status: ClusterStatus, include_dead: bool) -> ClusterStatus:
    if include_dead:
        return status
    return msgspec.structs.replace(status, nodes={n.node_id: n for n in visible_nodes(status, include_dead)})


@per_node
def status_ndjson(status: ClusterStatus, include_dead: bool = False) -> str:
    """One line of ``--append``: the JSON document, compact, led by an ISO-8601 UTC
    ``timestamp`` (``generated_at`` is the same instant in epoch seconds)."""
    if not include_dead:
        status = msgspec.structs.replace(
            status, nodes={n.node_id: n for n in visible_nodes(status, include_dead)}
        )
    stamp = datetime.fromtimestamp(status.generated_at, tz=timezone.utc)
    timestamp = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return msgspec.json.encode({"timestamp": timestamp, **msgspec.to_builtins(status)}).decode()


def render_status(result: ClusterStatus, fmt: str, include_dead: bool, gpus: bool) -> str:
    """The status as ``fmt`` (``text``: the lines, and with ``gpus`` the per-GPU block)."""
    if fmt == "json":
        return status_json(result, include_dead=include_dead) + "\n"
    if fmt == "prom":
        from rayscope.render.metrics import metrics_text

        return metrics_text(result)
    return "\n".join(status_text_lines(result, include_dead, gpus)) + "\n"


def status_text_lines(result: ClusterStatus, include_dead: bool, gpus: bool) -> list[str]:
    """``status``'s lines (the summary of a large cluster unless ``include_dead``), and with
    ``gpus`` the per-GPU block: what the CLI prints and the head serves as ``format=lines``."""
    lines = status_lines(result, include_dead=include_dead, summary=not include_dead)
    if not gpus:
        return lines
    return lines + status_gpu_lines(result, include_dead=include_dead)
