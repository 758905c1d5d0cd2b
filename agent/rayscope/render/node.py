"""``rayscope node``: raylets, their booking, GPUs, host, sources."""

from typing import Optional

from rayscope.labels import printable_lines
from rayscope.render.fmt import booking, cpus, encode, gib, labels_text, source_notes
from rayscope.render.gpus import gpu_block_lines, mode_text, used_text
from rayscope.schema.node import AgentProcess, NodeDiagnostics
from rayscope.schema.report import GpuDevice, HostInfo, RayletInfo, known
from rayscope.schema.status import NodeStatus
from rayscope.units import number, size

# Resources a raylet advertises that say nothing to an operator reading `node`.
_HIDDEN_RESOURCE_PREFIXES = ("node:",)


def node_json(diag: NodeDiagnostics) -> str:
    """``rayscope node --json``."""
    return encode(diag)


def resources_text(resources: dict[str, float]) -> str:
    """Static resources as an operator reads them: memory in GiB, tokens without ``:1``."""
    words = []
    for name, value in sorted(resources.items()):
        if name.startswith(_HIDDEN_RESOURCE_PREFIXES):
            continue
        if name in ("memory", "object_store_memory"):
            words.append(f"{name} {size(value)}")
        else:
            words.append(f"{name} {number(value)}")
    return ", ".join(words)


def raylet_lines(raylet: RayletInfo, node: Optional[NodeStatus]) -> list[str]:
    """One raylet: identity, what the scheduler has booked on it, what it advertises."""
    role = "[HEAD]" if raylet.is_head else "[worker]"
    lines = [f"Ray node {raylet.node_ip} {role} {raylet.node_id}  raylet pid {raylet.pid}"]
    if node is not None:
        gpu = f"{booking(node)}  " if node.total_gpu > 0 else ""
        lines.append(f"  scheduler: {gpu}CPU: {cpus(node.used_cpu)}/{cpus(node.total_cpu)}")
        if labels_text(node):
            lines.append(f"  labels: {labels_text(node)}")
    else:
        lines.append("  scheduler: unknown (GCS not read)")
    lines.append(f"  advertises: {resources_text(raylet.static_resources)}")
    if raylet.gcs_address:
        lines.append(f"  gcs: {raylet.gcs_address}")
    return lines


def gpu_line(gpu: GpuDevice) -> str:
    """``GPU0 NVIDIA GeForce RTX 3090  used 5.8/24.0 GB  util 87%``; on a vGPU guest
    ``GPU0 NVIDIA A40-16C  vGPU guest  used NA/16.0 GB (NVML's 14.5 GB not trusted)  util 0%``."""
    util = "NA" if gpu.utilization_gpu_pct is None else f"{gpu.utilization_gpu_pct}%"
    figure, note = used_text(gpu)
    memory = f"{figure}/{gib(gpu.memory_total_bytes)} GB{note}"
    line = f"GPU{gpu.index} {gpu.name or 'NA'}{mode_text(gpu)}  used {memory}  util {util}"
    if gpu.errors:
        line += "  (" + "; ".join(f"{k}: {v}" for k, v in sorted(gpu.errors.items())) + ")"
    return line


def apart_lines(diag: NodeDiagnostics) -> list[str]:
    """``node --gpus``: each local raylet whose actors are not matched to this host's GPUs
    (measured on devices of its own), so that its absence above is not read as idle."""
    sharing = known(diag.gpu_raylets)
    if not sharing:
        return []
    return [
        f"not on these GPUs: Ray node {r.node_ip} {'[HEAD]' if r.is_head else '[worker]'} {r.node_id[:12]}"
        " (measured on other devices: `status --gpus` lists its GPUs)"
        for r in diag.raylets
        if r.node_id in diag.booking and r.node_id not in sharing
    ]


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


def agent_lines(agents: list[AgentProcess]) -> list[str]:
    """``Agents: pid 4242 push -> 10.0.0.1:7000 (systemd rayscope.service, user root)``: the
    rayscope node agents running here, or that none does."""
    if not agents:
        return ["Agents: none running here"]
    words = []
    for agent in agents:
        if agent.started_by == "ray":
            what, how = f"pid {agent.pid} placed by Ray", "head --agents ray"
        else:
            what = f"pid {agent.pid} push -> {agent.head or 'NA'}"
            how = f"systemd {agent.unit}" if agent.unit else agent.started_by
        words.append(f"{what} ({how}, user {agent.user or 'NA'})")
    return ["Agents: " + words[0], *("        " + w for w in words[1:])]


def node_lines(diag: NodeDiagnostics, gpus: bool = False) -> list[str]:
    """``rayscope node``: raylets and their booking, GPUs, host, the rayscope agents running
    here, which sources answered.
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
            lines += ["  " + line for line in apart_lines(diag)]
        else:
            lines += ["  " + gpu_line(g) for g in diag.gpus]
    else:
        lines.append("GPUs: NA")
    if diag.host is not None:
        lines.append(host_line(diag.host))
    if diag.agents is not None:
        lines += agent_lines(diag.agents)
    answered = ", ".join(f"{s.name} {'ok' if s.ok else 'no'}" for s in diag.sources)
    lines.append(f"Sources: {answered}")
    lines += ["  " + note for note in source_notes(diag.sources)]
    return printable_lines(lines)
