"""Pure formatting: ClusterStatus / NodeDiagnostics → human lines or JSON. Never queries.

The status lines are a contract (DESIGN.md "Status lines"): GPU fractions ``.2f``, GPU
totals and CPUs ``.0f``, ``booked: used/total MB`` only where the node advertises
``VRAM_MB``, NVML memory in GiB ``.1f`` labelled ``GB`` with ``NA`` for unknown numbers.
Units, thresholds and wording live here and nowhere else.
"""

import difflib
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Optional

import msgspec

from agent.model import (
    ClusterStatus,
    FitResult,
    GpuDevice,
    GpuUser,
    HostInfo,
    NodeAttribution,
    NodeDiagnostics,
    NodeFit,
    NodeStatus,
    RayletInfo,
    SourceStatus,
)

GIB = 1024**3
MIB = 1024**2

# Resources a raylet advertises that say nothing to an operator reading `node`.
_HIDDEN_RESOURCE_PREFIXES = ("node:",)


def gib(value: Optional[float]) -> str:
    """Bytes as GiB with one decimal (labelled ``GB`` like nvidia-smi does), ``NA`` if unknown."""
    return "NA" if value is None else f"{value / GIB:.1f}"


def size(value: float) -> str:
    """Bytes for reading, not for columns: ``23.2 GB`` or ``150 MB`` (binary units)."""
    return f"{value / GIB:.1f} GB" if value >= GIB else f"{value / MIB:.0f} MB"


def visible_nodes(status: ClusterStatus, include_dead: bool) -> list[NodeStatus]:
    """The nodes to show, in display order (the rollup already sorted them)."""
    return [n for n in status.nodes.values() if include_dead or n.alive]


def has_gpus(node: NodeStatus) -> bool:
    """Scheduler GPUs, or — for a node the scheduler does not know — GPUs its agent saw
    (or could not count)."""
    if node.in_scheduler:
        return node.total_gpu > 0
    return node.gpus is None or len(node.gpus) > 0


def node_markers(node: NodeStatus, view: str, scheduler_ok: bool) -> list[str]:
    """What to append to a node's line so old or missing numbers are never silent."""
    markers = []
    if not node.alive:
        markers.append("dead")
    if not node.in_scheduler:
        markers.append("no raylet" if scheduler_ok else "not in scheduler view")
    if node.stale and node.report_age_s is not None:
        markers.append(f"stale {node.report_age_s:.0f}s")
    if view == "head" and node.agent == "none" and node.alive:
        markers.append("no agent")
    return markers


def booking(node: NodeStatus) -> str:
    """``GPU: 0.04/1 booked: 20480/24576 MB`` — the scheduler's two GPU numbers."""
    text = f"GPU: {node.used_gpu:.2f}/{node.total_gpu:.0f}"
    if node.total_vram_mb > 0:
        text += f" booked: {node.used_vram_mb:.0f}/{node.total_vram_mb:.0f} MB"
    return text


def node_line(node: NodeStatus, view: str = "gcs", scheduler_ok: bool = True) -> str:
    """One node, e.g. ``10.0.0.5 [worker] T4 GPU: 0.99/1 VRAM: 5.8/24.0 GB  CPU: 6/8``."""
    words = [node.node_ip or node.hostname or node.node_id[:12], "[HEAD]" if node.head else "[worker]"]
    cpu = f"CPU: {node.used_cpu:.0f}/{node.total_cpu:.0f}"
    memory = f"VRAM: {gib(node.used_gpu_memory)}/{gib(node.total_gpu_memory)} GB"
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
    markers = node_markers(node, view, scheduler_ok)
    return line + ("  " + ", ".join(markers) if markers else "")


def cluster_line(status: ClusterStatus) -> str:
    """``Cluster: 16/32 CPUs, 1.03/2 GPUs, booked: 20480/24576 MB``."""
    c = status.cluster
    line = f"Cluster: {c.used_cpu:.0f}/{c.total_cpu:.0f} CPUs, {c.used_gpu:.2f}/{c.total_gpu:.0f} GPUs"
    if c.total_vram_mb > 0:
        line += f", booked: {c.used_vram_mb:.0f}/{c.total_vram_mb:.0f} MB"
    return line


def _source_ok(sources: Sequence[SourceStatus], name: str) -> bool:
    return any(s.name == name and s.ok for s in sources)


def source_notes(sources: Sequence[SourceStatus]) -> list[str]:
    """``NVML: NVML library not found ...`` for every source that did not answer."""
    return [f"{s.name.upper()}: {s.reason}" for s in sources if not s.ok]


def source_details(sources: Sequence[SourceStatus]) -> list[str]:
    """``--verbose``: each source, whether it answered, and what answered
    (``gcs: ok, 10.0.0.1:6379 via /opt/ray/bin/python``), or why it did not."""
    lines = ["sources:"]
    for s in sources:
        line = f"  {s.name}: {'ok' if s.ok else 'no'}"
        line += f", {s.detail}" if s.detail else ""
        line += f" ({s.reason})" if s.reason else ""
        lines.append(line)
    return lines


def status_lines(status: ClusterStatus, include_dead: bool = False) -> list[str]:
    """The human status: cluster line, GPU nodes, CPU-only nodes, then notes."""
    scheduler_ok = _source_ok(status.sources, "gcs")
    nodes = visible_nodes(status, include_dead)
    gpu_nodes = [n for n in nodes if has_gpus(n)]
    cpu_nodes = [n for n in nodes if not has_gpus(n)]
    lines = [cluster_line(status)]
    for title, group in (("GPU nodes:", gpu_nodes), ("CPU-only nodes:", cpu_nodes)):
        if group:
            lines += ["", title]
            lines += ["  " + node_line(n, status.view, scheduler_ok) for n in group]
    notes = source_notes(status.sources)
    unmeasured = status.cluster.gpu_nodes - status.cluster.gpu_nodes_measured
    if status.view == "gcs" and unmeasured > 0:
        notes.append(
            f"VRAM: NA on {unmeasured} GPU node(s): without a head agent only this host's"
            " NVML is read (run `rayscope head` and `rayscope push` on every node)"
        )
    if notes:
        lines += ["", *notes]
    return lines


def _encode(value: object, indent: int = 2) -> str:
    raw = msgspec.json.encode(value)
    return (msgspec.json.format(raw, indent=indent) if indent else raw).decode()


def status_json(status: ClusterStatus, include_dead: bool = False, indent: int = 2) -> str:
    """The JSON document: BioEngine's ``{"cluster": ..., "nodes": ...}`` plus our keys.
    ``indent=0`` is compact (what the head agent serves)."""
    if not include_dead:
        nodes = {n.node_id: n for n in visible_nodes(status, include_dead)}
        status = msgspec.structs.replace(status, nodes=nodes)
    return _encode(status, indent)


# name, help, value of a node (None = unknown: the sample is left out, never written as 0)
_NODE_METRICS: tuple[tuple[str, str, Callable[[NodeStatus], Optional[float]]], ...] = (
    (
        "rayscope_gpus_booked",
        "GPUs booked: Ray's GPU resource in use (device handles).",
        lambda n: n.used_gpu,
    ),
    ("rayscope_gpus_total", "GPUs the node advertises to Ray.", lambda n: n.total_gpu),
    (
        "rayscope_vram_booked_megabytes",
        "GPU memory booked through Ray's VRAM_MB resource.",
        lambda n: n.used_vram_mb,
    ),
    (
        "rayscope_vram_total_megabytes",
        "VRAM_MB the node advertises (0: no VRAM booking).",
        lambda n: n.total_vram_mb,
    ),
    (
        "rayscope_gpu_memory_used_bytes",
        "GPU memory in use as NVML measures it.",
        lambda n: None if n.stale or n.used_gpu_memory is None else float(n.used_gpu_memory),
    ),
    (
        "rayscope_gpu_memory_total_bytes",
        "GPU memory installed as NVML reports it.",
        lambda n: None if n.stale or n.total_gpu_memory is None else float(n.total_gpu_memory),
    ),
    ("rayscope_cpus_booked", "CPUs booked: Ray's CPU resource in use.", lambda n: n.used_cpu),
    ("rayscope_cpus_total", "CPUs the node advertises to Ray.", lambda n: n.total_cpu),
    (
        "rayscope_report_age_seconds",
        "Age of the node agent's latest report (head's clock).",
        lambda n: n.report_age_s,
    ),
    ("rayscope_report_stale", "1 when the node agent's latest report is stale.", lambda n: float(n.stale)),
    ("rayscope_node_alive", "1 while the scheduler counts the node alive.", lambda n: float(n.alive)),
)


def _sample(value: float) -> str:
    """Exact: ``25769803776``, not ``2.57698e+10``."""
    return str(int(value)) if value.is_integer() else repr(value)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(status: ClusterStatus) -> str:
    """Prometheus text exposition (also node_exporter's textfile format): one gauge family
    per quantity, labelled by node; unknown values are absent, not 0, and so are a stale
    report's NVML numbers (``rayscope_report_stale`` says why they went)."""
    lines: list[str] = []
    nodes = list(status.nodes.values())
    for name, help_text, value_of in _NODE_METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for node in nodes:
            value = value_of(node)
            if value is not None:
                labels = f'node_id="{_label(node.node_id)}",node_ip="{_label(node.node_ip or "")}"'
                lines.append(f"{name}{{{labels}}} {_sample(value)}")
    lines += ["# HELP rayscope_source_up 1 when the source answered.", "# TYPE rayscope_source_up gauge"]
    lines += [f'rayscope_source_up{{source="{_label(s.name)}"}} {int(s.ok)}' for s in status.sources]
    return "\n".join(lines) + "\n"


def node_json(diag: NodeDiagnostics) -> str:
    """``rayscope node --json``."""
    return _encode(diag)


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:g}"


def resources_text(resources: dict[str, float]) -> str:
    """Static resources as an operator reads them: memory in GiB, tokens without ``:1``."""
    words = []
    for name, value in sorted(resources.items()):
        if name.startswith(_HIDDEN_RESOURCE_PREFIXES):
            continue
        if name in ("memory", "object_store_memory"):
            words.append(f"{name} {size(value)}")
        else:
            words.append(f"{name} {_number(value)}")
    return ", ".join(words)


def raylet_lines(raylet: RayletInfo, node: Optional[NodeStatus]) -> list[str]:
    """One raylet: identity, what the scheduler has booked on it, what it advertises."""
    role = "[HEAD]" if raylet.is_head else "[worker]"
    lines = [f"Ray node {raylet.node_ip} {role} {raylet.node_id}  raylet pid {raylet.pid}"]
    if node is not None:
        gpu = f"{booking(node)}  " if node.total_gpu > 0 else ""
        lines.append(f"  scheduler: {gpu}CPU: {node.used_cpu:.0f}/{node.total_cpu:.0f}")
    else:
        lines.append("  scheduler: unknown (GCS not read)")
    lines.append(f"  advertises: {resources_text(raylet.static_resources)}")
    if raylet.gcs_address:
        lines.append(f"  gcs: {raylet.gcs_address}")
    return lines


def gpu_line(gpu: GpuDevice) -> str:
    """``GPU0 NVIDIA GeForce RTX 3090  used 5.8/24.0 GB  util 87%``."""
    util = "NA" if gpu.utilization_gpu_pct is None else f"{gpu.utilization_gpu_pct}%"
    memory = f"{gib(gpu.memory_used_bytes)}/{gib(gpu.memory_total_bytes)} GB"
    line = f"GPU{gpu.index} {gpu.name or 'NA'}  used {memory}  util {util}"
    if gpu.errors:
        line += "  (" + "; ".join(f"{k}: {v}" for k, v in sorted(gpu.errors.items())) + ")"
    return line


def host_line(host: HostInfo) -> str:
    """``Host gpu-07: 64 CPUs, load 3.10 2.90 2.80, memory 120.3/503.8 GB used``."""
    parts = [f"Host {host.hostname}:"]
    if host.cpu_count is not None:
        parts.append(f"{host.cpu_count} CPUs,")
    if host.load_1m is not None:
        parts.append(f"load {host.load_1m:.2f} {host.load_5m:.2f} {host.load_15m:.2f},")
    if host.memory_total_bytes is not None and host.memory_available_bytes is not None:
        used = host.memory_total_bytes - host.memory_available_bytes
        parts.append(f"memory {gib(used)}/{gib(host.memory_total_bytes)} GB used")
    return " ".join(parts).rstrip(",")


def node_lines(diag: NodeDiagnostics, gpus: bool = False) -> list[str]:
    """``rayscope node``: raylets and their booking, GPUs, host, which sources answered.
    ``gpus``: each GPU's details, bookings and processes (``node --gpus``)."""
    lines: list[str] = []
    for raylet in diag.raylets:
        lines += raylet_lines(raylet, diag.booking.get(raylet.node_id))
    if not diag.raylets:
        lines.append("Ray node: none (no raylet process on this host)")
    if diag.gpus is not None:
        driver = f" (driver {diag.driver_version})" if diag.driver_version else ""
        lines.append(f"GPUs: {len(diag.gpus)}{driver}")
        if gpus:
            lines += ["  " + line for line in gpu_block_lines(diag.gpus, diag.attribution, details=True)]
        else:
            lines += ["  " + gpu_line(g) for g in diag.gpus]
    else:
        lines.append("GPUs: NA")
    if diag.host is not None:
        lines.append(host_line(diag.host))
    answered = ", ".join(f"{s.name} {'ok' if s.ok else 'no'}" for s in diag.sources)
    lines.append(f"Sources: {answered}")
    lines += ["  " + note for note in source_notes(diag.sources)]
    return lines


# --- GPUs: bookings beside measured memory (`status --gpus`, `node --gpus`) -------------

FLAG_WORDS = {
    "over_booking": "over booking",
    "unbooked": "unbooked",
    "booking_unknown": "booking unknown",
    "not_mapped": "not mapped",
    "full": "full",
}


def _flags_text(flags: Sequence[str]) -> str:
    return ("  " + ", ".join(FLAG_WORDS.get(f, f) for f in flags)) if flags else ""


def _errors_text(gpu: GpuDevice) -> str:
    if not gpu.errors:
        return ""
    return "  (" + "; ".join(f"{k}: {v}" for k, v in sorted(gpu.errors.items())) + ")"


def gpu_label(gpu: GpuDevice) -> str:
    """``GPU0``, or ``GPU0/MIG1`` for MIG instance 1 of GPU 0."""
    return f"GPU{gpu.index}" if gpu.parent_index is None else f"GPU{gpu.parent_index}/MIG{gpu.index}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def booked_text(gpu: GpuDevice) -> str:
    """``booked 20480 MB by 4 actors``: ``VRAM_MB`` where booked, else the ``GPU`` fraction
    (on a ``VRAM_MB`` node the fraction is a device handle, not the reservation)."""
    att = gpu.attribution
    if att is None:
        return "booked NA"
    users = att.users or [u for mig in gpu.mig_devices if mig.attribution for u in mig.attribution.users]
    return _booked_words(att.booked_vram_mb, users, att.booked_actors)


def _booked_words(vram_mb: Optional[float], users: Sequence[GpuUser], actors: int) -> str:
    """``booked 20480 MB + 0.33 GPU by 5 actors``: the ``GPU`` fraction counts only actors
    that booked no ``VRAM_MB``."""
    if vram_mb is None:
        return "booked NA"
    if actors == 0:
        return "booked nothing"
    fraction = sum(u.booked_gpu or 0.0 for u in users if u.kind == "actor" and not u.booked_vram_mb)
    parts = [f"{vram_mb:.0f} MB"] if vram_mb else []
    if fraction > 0:
        parts.append(f"{fraction:.2f} GPU")
    return f"booked {' + '.join(parts)} by {_count(actors, 'actor')}"


def gpu_booking_line(gpu: GpuDevice) -> str:
    """``GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 4 actors  used 21.3 GB  util 87%``."""
    util = "NA" if gpu.utilization_gpu_pct is None else f"{gpu.utilization_gpu_pct}%"
    name = gpu.name or "NA"
    mig = "  MIG on" if gpu.mig_enabled else ""
    flags = _flags_text(gpu.attribution.flags) if gpu.attribution else ""
    used = f"used {gib(gpu.memory_used_bytes)} GB"
    return f"{gpu_label(gpu)} {name}{mig}  {booked_text(gpu)}  {used}  util {util}{flags}{_errors_text(gpu)}"


def _watts(milliwatts: Optional[int]) -> str:
    return "NA" if milliwatts is None else f"{milliwatts / 1000:.0f}"


def gpu_details_line(gpu: GpuDevice) -> str:
    """``bus 00000000:01:00.0  temp 61 C  power 245/350 W  memory 21.3/24.0 GB, 0.3 GB reserved (v2)``."""
    memory = f"memory {gib(gpu.memory_used_bytes)}/{gib(gpu.memory_total_bytes)} GB"
    if gpu.memory_reserved_bytes is not None:
        memory += f", {gib(gpu.memory_reserved_bytes)} GB reserved"
    if gpu.memory_info_version is not None:
        memory += f" (v{gpu.memory_info_version})"
    if gpu.parent_index is not None:
        ids = f"GI {'NA' if gpu.gpu_instance_id is None else gpu.gpu_instance_id}"
        ids += f" CI {'NA' if gpu.compute_instance_id is None else gpu.compute_instance_id}"
        return f"{ids}  {memory}"
    temp = "NA" if gpu.temperature_c is None else f"{gpu.temperature_c}"
    power = f"power {_watts(gpu.power_draw_mw)}/{_watts(gpu.power_limit_mw)} W"
    return f"bus {gpu.pci_bus_id or 'NA'}  temp {temp} C  {power}  {memory}"


def user_label(user: GpuUser) -> str:
    """``federated-unet#a1b2`` (actor and its id's first 4 hex digits), ``ray::train pid 42``,
    ``pid 42 python``."""
    if user.kind == "actor" and user.actor_id:
        return f"{user.name}#{user.actor_id[:4]}"
    pids = ",".join(str(p) for p in user.pids)
    if user.kind == "ray worker":
        return f"{user.name or 'ray worker'} pid {pids}"
    return f"pid {pids} {user.name}".rstrip()


def _booking(user: GpuUser) -> str:
    if user.booked_vram_mb is None or user.booked_gpu is None:
        return "NA"
    if user.booked_vram_mb > 0:
        return f"{user.booked_vram_mb:.0f} MB"
    if user.booked_gpu > 0:
        return f"{user.booked_gpu:.2f} GPU"
    return "nothing"


def user_line(user: GpuUser) -> str:
    """``federated-unet#a1b2 booked 5120 MB used 5.4 GB  over booking``."""
    used = f"{gib(user.used_memory_bytes)} GB"
    return f"{user_label(user)} booked {_booking(user)} used {used}{_flags_text(user.flags)}"


def node_attribution_lines(attribution: Optional[NodeAttribution], gpus: Sequence[GpuDevice]) -> list[str]:
    """What no single GPU line shows: a full device hidden by the node-wide ``VRAM_MB``, and
    actors that booked a GPU but are on none."""
    if attribution is None:
        return []
    lines = []
    if len(gpus) > 1:
        users = [
            u
            for leaf in gpus
            for g in (leaf.mig_devices or [leaf])
            if g.attribution
            for u in g.attribution.users
        ]
        booked = _booked_words(attribution.booked_vram_mb, users, attribution.booked_actors)
        mapped = attribution.processes_mapped
        actors_use = gib(attribution.actors_used_bytes if mapped and attribution.actors_read else None)
        unbooked = gib(attribution.unbooked_bytes if mapped else None)
        lines.append(f"all GPUs: {booked}  actors use {actors_use} GB  unbooked {unbooked} GB")
    if "hidden_full" in attribution.flags:
        full = []
        for gpu in gpus:
            att = gpu.attribution
            if gpu.index in attribution.full_gpus and att is not None:
                full.append(f"GPU{gpu.index} ({att.booked_vram_mb or 0:.0f}/{att.capacity_mb or 0:.0f} MB)")
        node = f"{attribution.node_used_vram_mb:.0f}/{attribution.node_total_vram_mb:.0f} MB"
        lines.append(f"VRAM_MB booked node-wide {node} hides a full device: {', '.join(full)}")
    lines += [f"on no GPU: {user_line(u)}" for u in attribution.off_gpu]
    return lines


def gpu_block_lines(
    gpus: Sequence[GpuDevice], attribution: Optional[NodeAttribution], details: bool = False
) -> list[str]:
    """Per GPU its booking line, (details,) then one line per actor or process on it."""
    lines: list[str] = []
    for gpu in gpus:
        lines.append(gpu_booking_line(gpu))
        if details and "device" not in gpu.errors:
            lines.append("  " + gpu_details_line(gpu))
        for mig in gpu.mig_devices:
            lines.append("  " + gpu_booking_line(mig))
            if details:
                lines.append("    " + gpu_details_line(mig))
            users = mig.attribution.users if mig.attribution else []
            lines += ["    " + user_line(u) for u in users]
        users = gpu.attribution.users if gpu.attribution else []
        lines += ["  " + user_line(u) for u in users]
    return lines + node_attribution_lines(attribution, gpus)


def status_gpu_lines(status: ClusterStatus, include_dead: bool = False) -> list[str]:
    """``status --gpus``: after the status, per GPU node its GPUs, bookings and processes."""
    lines: list[str] = []
    for node in visible_nodes(status, include_dead):
        if not has_gpus(node):
            continue
        role = "[HEAD]" if node.head else "[worker]"
        lines += ["", f"GPUs of {node.node_ip or node.hostname or ''} {role} {node.node_id[:12]}:"]
        if node.gpus is None:
            lines.append("  NA: no NVML report for this node")
        elif not node.gpus:
            lines.append("  none: NVML found no GPU")
        else:
            lines += ["  " + line for line in gpu_block_lines(node.gpus, node.attribution)]
    return lines


# --- rayscope fit -------------------------------------------------------------------------

FIT_SIZING_WORDS = {
    "vram_mb": "VRAM_MB booking",
    "fraction": "GPU fraction",
    "whole_gpu": "a whole GPU",
    "shape": "a raw Ray shape",
}


def shape_text(shape: dict[str, float]) -> str:
    """``{"GPU": 0.01, "VRAM_MB": 4096}``: the request in the same words as ``--shape``."""
    return "{" + ", ".join(f'"{name}": {_number(value)}' for name, value in shape.items()) + "}"


def resource_amount(name: str, value: float) -> str:
    """An amount of a Ray resource in its unit: memory sizes readable, VRAM_MB in MB."""
    if name in ("memory", "object_store_memory"):
        return size(value)
    if name == "VRAM_MB":
        return f"{value:.0f} MB"
    return _number(round(value, 4))


def fit_node_label(fit: NodeFit) -> str:
    """``127.0.0.1 [HEAD] G e0e0e0e0``: IP, role, accelerator, node id (IPs repeat on one host)."""
    words = [fit.node_ip or fit.node_id[:12], "[HEAD]" if fit.head else "[worker]"]
    if fit.accelerator_type:
        words.append(fit.accelerator_type)
    words.append(fit.node_id[:8])
    return " ".join(words)


def fit_node_line(fit: NodeFit, shape: dict[str, float]) -> str:
    """``127.0.0.1 [HEAD] G e0e0e0e0: fits 0, gets 0 (VRAM_MB: 4096 MB free, needs 5120 MB)``."""
    line = f"{fit_node_label(fit)}: fits {fit.capacity}, gets {fit.placed}"
    if fit.missing:
        return line + " (" + ", ".join(f"no {name}" for name in fit.missing) + ")"
    if fit.limited_by is None:
        return line
    name = fit.limited_by
    free = resource_amount(name, fit.available.get(name, 0.0))
    if fit.capacity == 0:
        return line + f" ({name}: {free} free, needs {resource_amount(name, shape[name])})"
    return line + f" (limited by {name}: {free} free)"


def gpu_free_text(fit: NodeFit) -> str:
    """``GPU0 has 1.2 GB free`` for every GPU the check used (or could have used)."""
    return ", ".join(f"GPU{g.index} has {gib(g.free_bytes)} GB free" for g in fit.gpus)


def fit_measured_line(fit: NodeFit) -> Optional[str]:
    """The driver's view under a node given replicas; ``None`` where it has nothing to say."""
    need = f" (needs {size(fit.need_bytes)} per replica)" if fit.need_bytes is not None else ""
    if fit.measured == "short":
        return f"fits by booking, not by measured memory: {gpu_free_text(fit)}{need}"
    if fit.measured == "ok":
        return f"measured: {gpu_free_text(fit)}{need}"
    return None


def fit_answer_line(result: FitResult) -> str:
    """``Fits: yes, 2/2 replicas placed`` — the overall answer first, as the exit code says."""
    if result.refused is not None:
        return f"Fits: no, refused: {result.refused}"
    answer = "yes" if result.fits else "no"
    line = f"Fits: {answer}, {result.placed}/{result.replicas} replica(s) placed by booking"
    if result.fits_booking and result.fits_measured is False:
        line += ", not by measured memory"
    return line


def fit_sizing_line(result: FitResult) -> str:
    """``Shape: {"GPU": 0.01, "VRAM_MB": 4096} per replica (VRAM_MB booking: ...)``."""
    words = FIT_SIZING_WORDS.get(result.sizing, result.sizing)
    mb = result.request.gpu_memory_mb
    if result.sizing == "fraction" and result.smallest_gpu_mb is not None and mb is not None:
        words += f" {mb}/{result.smallest_gpu_mb:.0f} MB of the smallest GPU ({result.smallest_gpu_from})"
    return f"Shape: {shape_text(result.shape)} per replica ({words}: {result.sizing_reason})"


def fit_lines(result: FitResult) -> list[str]:
    """``rayscope fit``: the shape, the answer, per node how many fit, the driver's view."""
    lines = [fit_sizing_line(result), fit_answer_line(result)]
    if result.nodes:
        lines += ["", "Nodes:"]
    unmeasured: dict[str, int] = {}
    for fit in result.nodes:
        lines.append("  " + fit_node_line(fit, result.shape))
        measured = fit_measured_line(fit)
        if measured is not None:
            lines.append("    " + measured)
        if fit.measured == "unknown":
            unmeasured[fit.measured_reason] = unmeasured.get(fit.measured_reason, 0) + 1
    notes = []
    for reason, count in unmeasured.items():
        note = f"Measured memory: NA on {count} node(s) given replicas: {reason}"
        if result.view == "gcs" and "head agent" in reason:
            note += " (run `rayscope head` and `rayscope push` on every node)"
        notes.append(note)
    if notes:
        lines += ["", *notes]
    return lines


def fit_json(result: FitResult) -> str:
    """``rayscope fit --json``."""
    return _encode(result)


# --- cron-safe status: NDJSON lines, completeness (the textfile format is metrics_text) ---


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


def completeness_note(status: ClusterStatus) -> Optional[str]:
    """Why ``status`` exits 2 (``no data: ...``) or 1 (``partial: stale report from 1
    node(s): 10.0.0.5 (42s)``); ``None`` when complete. Mirrors ``completeness``."""
    scheduler_ok = _source_ok(status.sources, "gcs")
    reasons = [s.reason for s in status.sources if s.name == "gcs" and not s.ok]
    why = f" ({reasons[0]})" if reasons else ""
    reporting = any(n.agent != "none" for n in status.nodes.values())
    if not status.nodes or (not scheduler_ok and not reporting):
        return f"no data: no node in the scheduler's view{why} and no agent report"
    if not scheduler_ok:
        return f"partial: no scheduler view{why}: only the agents' reports are shown"
    stale = [n for n in status.nodes.values() if n.alive and n.stale]
    if stale:
        names = ", ".join(
            f"{n.node_ip or n.hostname or n.node_id[:12]} ({n.report_age_s or 0:.0f}s)" for n in stale
        )
        return f"partial: stale report from {len(stale)} node(s): {names}"
    return None


# --- status --watch -----------------------------------------------------------------------

HIGHLIGHT_ON = "\x1b[7m"  # reverse video: readable on any palette, no colour assumed
HIGHLIGHT_OFF = "\x1b[27m"
_TOKEN_SPLIT = re.compile(r"([\s/,:()\[\]]+)")


def watch_header(interval_s: float, generated_at: float) -> str:
    """``Every 2s: rayscope status    14:03:07`` — watch(1)'s header, the data's own time."""
    clock = time.strftime("%H:%M:%S", time.localtime(generated_at))
    return f"Every {_number(interval_s)}s: rayscope status    {clock}"


def fit_screen(lines: Sequence[str], columns: int, rows: int) -> list[str]:
    """Cut lines to the terminal, so a redraw in place never wraps or scrolls."""
    return [line[: max(columns, 1)] for line in lines[: max(rows, 1)]]


def _highlight_pair(before: str, after: str) -> str:
    old, new = _TOKEN_SPLIT.split(before), _TOKEN_SPLIT.split(after)
    if len(old) != len(new):
        return HIGHLIGHT_ON + after + HIGHLIGHT_OFF
    return "".join(
        f"{HIGHLIGHT_ON}{b}{HIGHLIGHT_OFF}" if a != b and not _TOKEN_SPLIT.fullmatch(b) else b
        for a, b in zip(old, new)
    )


def highlight_changes(previous: Optional[Sequence[str]], current: Sequence[str]) -> list[str]:
    """``current`` with every value that differs from ``previous`` in reverse video.

    Lines are aligned as a diff aligns them (a node appearing shifts the rest, it does not
    light them all up); paired lines are compared word by word, so ``0.33/1`` → ``0.58/1``
    marks only ``0.58``. New lines are marked whole.
    """
    if previous is None:
        return list(current)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(a=list(previous), b=list(current), autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out += current[j1:j2]
        elif op in ("replace", "insert"):
            for k in range(j2 - j1):
                after = current[j1 + k]
                if op == "replace" and i1 + k < i2:
                    out.append(_highlight_pair(previous[i1 + k], after))
                elif after:
                    out.append(HIGHLIGHT_ON + after + HIGHLIGHT_OFF)
                else:
                    out.append(after)
    return out
