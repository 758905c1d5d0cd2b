"""``/metrics`` and ``status --format prom``: Prometheus text exposition."""

from collections.abc import Callable
from typing import Optional

from agent.model import ClusterStatus, NodeStatus
from agent.pending import shape_text
from agent.validate import printable

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
    return printable(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def pending_metrics(status: ClusterStatus) -> list[str]:
    """``rayscope_pending_demands{kind,shape,reason}``: how many wait, per shape and reason.
    Bounded labels: the shape in Ray's order (``GPU=0.5 VRAM_MB=8192``), a reason code, the
    kind; never an actor's name. No family when the pending demand was not read."""
    if status.cluster.pending is None:
        return []
    counts: dict[tuple[str, str, str], int] = {}
    for demand in status.cluster.pending:
        key = (demand.kind, shape_text(demand.shape), demand.reason)
        counts[key] = counts.get(key, 0) + demand.count
    lines = [
        "# HELP rayscope_pending_demands Tasks, actors and placement groups waiting to be placed.",
        "# TYPE rayscope_pending_demands gauge",
    ]
    for (kind, shape, reason), count in sorted(counts.items()):
        labels = f'kind="{kind}",shape="{_label(shape)}",reason="{reason}"'
        lines.append(f"rayscope_pending_demands{{{labels}}} {count}")
    return lines


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
    lines += pending_metrics(status)
    lines += ["# HELP rayscope_source_up 1 when the source answered.", "# TYPE rayscope_source_up gauge"]
    lines += [f'rayscope_source_up{{source="{_label(s.name)}"}} {int(s.ok)}' for s in status.sources]
    return "\n".join(lines) + "\n"
