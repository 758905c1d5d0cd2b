"""``/metrics`` and ``status --format prom``: Prometheus text exposition.

Names follow Prometheus base units: memory in bytes. ``VRAM_MB`` is counted by Ray in MiB
(BioEngine sizes it from ``nvidia-smi`` totals, which are MiB), so it is exposed times 2**20.
Per-device gauges (from Ray's placement, where the actor table was read) are labelled by
NVML UUID (``uuid``, empty where Ray's id could not be matched) and Ray's ``gpu_id``.

Every family passes ``promtool check metrics``: gauges carry no ``_total`` suffix (what a node
advertises to Ray is its ``_capacity``), event counts are counters named ``..._total``. The
names before that rename (:data:`RENAMED`) are written as well only when asked
(``legacy_names``), for dashboards built on them, until rayscope 0.3.
"""

from collections.abc import Callable, Iterable
from typing import Optional

from rayscope.core.capacity.pending import shape_text
from rayscope.core.gpu.precedence import figures_old
from rayscope.core.isolation import per_node
from rayscope.labels import printable
from rayscope.schema.report import COMPUTE_MODE_NAMES, VIRTUALIZATION_MODE_NAMES, GpuDevice, known
from rayscope.schema.status import ClusterStatus, DeviceFree, NodeStatus
from rayscope.units import MIB

# name, help, value of a node (None = unknown: the sample is left out, never written as 0)
_NODE_METRICS: tuple[tuple[str, str, Callable[[NodeStatus], Optional[float]]], ...] = (
    (
        "rayscope_gpus_booked",
        "GPUs booked: Ray's GPU resource in use (device handles).",
        lambda n: n.used_gpu,
    ),
    ("rayscope_gpus_capacity", "GPUs the node advertises to Ray.", lambda n: n.total_gpu),
    (
        "rayscope_vram_booked_bytes",
        "GPU memory booked through Ray's VRAM_MB resource (counted in MiB by Ray), in bytes.",
        lambda n: n.used_vram_mb * MIB,
    ),
    (
        "rayscope_vram_capacity_bytes",
        "VRAM_MB the node advertises to Ray (counted in MiB by Ray), in bytes (0: no VRAM booking).",
        lambda n: n.total_vram_mb * MIB,
    ),
    (
        "rayscope_gpu_memory_used_bytes",
        "GPU memory in use as NVML measures it, summed over the node's GPUs.",
        lambda n: (
            None if figures_old(n) or n.used_gpu_memory_bytes is None else float(n.used_gpu_memory_bytes)
        ),
    ),
    (
        "rayscope_gpu_memory_total_bytes",
        "GPU memory installed as NVML reports it, summed over the node's GPUs.",
        lambda n: (
            None if figures_old(n) or n.total_gpu_memory_bytes is None else float(n.total_gpu_memory_bytes)
        ),
    ),
    ("rayscope_cpus_booked", "CPUs booked: Ray's CPU resource in use.", lambda n: n.used_cpu),
    ("rayscope_cpus_capacity", "CPUs the node advertises to Ray.", lambda n: n.total_cpu),
    (
        "rayscope_report_age_seconds",
        "Age of the node agent's latest report (head's clock).",
        lambda n: n.report_age_s,
    ),
    ("rayscope_report_stale", "1 when the node agent's latest report is stale.", lambda n: float(n.stale)),
    ("rayscope_node_alive", "1 while the scheduler counts the node alive.", lambda n: float(n.alive)),
)


# name, help, value of one device of Ray's placement
_DEVICE_METRICS: tuple[tuple[str, str, Callable[[DeviceFree], Optional[float]]], ...] = (
    (
        "rayscope_device_gpu_booked",
        "Ray's GPU resource booked on this device by actors (resource_mapping).",
        lambda d: d.booked_gpu,
    ),
    (
        "rayscope_device_vram_booked_bytes",
        "VRAM_MB (MiB) of the actors placed on this device, in bytes: Ray books it node-wide.",
        lambda d: d.booked_vram_mb * MIB,
    ),
    (
        "rayscope_device_memory_used_bytes",
        "GPU memory in use on this device as NVML measures it (every process's), beside its booking.",
        lambda d: None if d.memory_used_bytes is None else float(d.memory_used_bytes),
    ),
    (
        "rayscope_device_memory_total_bytes",
        "GPU memory installed on this device as NVML reports it.",
        lambda d: None if d.memory_total_bytes is None else float(d.memory_total_bytes),
    ),
)


def _health(field: str) -> Callable[[GpuDevice], Optional[float]]:
    """A GPU's health ``field`` as a sample; ``None`` (absent) where NVML did not give it."""

    def value(gpu: GpuDevice) -> Optional[float]:
        number = None if gpu.health is None else getattr(gpu.health, field)
        return None if number is None else float(number)

    return value


# name, help (the DCGM field it matches), value of one GPU NVML reported; None = absent
_GPU_METRICS: tuple[tuple[str, str, Callable[[GpuDevice], Optional[float]]], ...] = (
    (
        "rayscope_gpu_xid_errors_total",
        "XID events since the node agent started watching (DCGM_FI_DEV_XID_ERRORS holds the last code).",
        _health("xid_errors"),
    ),
    (
        "rayscope_gpu_last_xid",
        "Code of the last XID event since the agent started (DCGM_FI_DEV_XID_ERRORS).",
        _health("last_xid"),
    ),
    (
        "rayscope_gpu_ecc_uncorrected_volatile_errors_total",
        "Uncorrected ECC errors since the driver loaded (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL).",
        _health("ecc_uncorrected_volatile"),
    ),
    (
        "rayscope_gpu_retired_pages_pending",
        "1 when pages wait to be retired at the next reset (DCGM_FI_DEV_RETIRED_PENDING).",
        _health("retired_pages_pending"),
    ),
    (
        "rayscope_gpu_row_remap_pending",
        "1 when rows wait to be remapped at the next reset (DCGM_FI_DEV_ROW_REMAP_PENDING).",
        _health("remapped_rows_pending"),
    ),
    (
        "rayscope_gpu_row_remap_failure",
        "1 when a row remapping failed (DCGM_FI_DEV_ROW_REMAP_FAILURE).",
        _health("row_remap_failure"),
    ),
    (
        "rayscope_gpu_clock_throttle_reasons",
        "NVML clock event reason bits now (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS).",
        _health("clock_throttle_reasons"),
    ),
    (
        "rayscope_gpu_temperature_celsius",
        "GPU temperature (DCGM_FI_DEV_GPU_TEMP).",
        lambda g: None if g.temperature_c is None else float(g.temperature_c),
    ),
    (
        "rayscope_gpu_power_usage_watts",
        "Power draw (DCGM_FI_DEV_POWER_USAGE).",
        lambda g: None if g.power_draw_mw is None else g.power_draw_mw / 1000,
    ),
    (
        "rayscope_gpu_power_limit_watts",
        "Enforced power limit (DCGM_FI_DEV_ENFORCED_POWER_LIMIT).",
        lambda g: None if g.power_limit_mw is None else g.power_limit_mw / 1000,
    ),
    (
        "rayscope_gpu_lost",
        "1 when the GPU has fallen off the bus (NVML GPU is lost; DCGM reports it as XID 79).",
        lambda g: None if g.health is None else float(g.health.lost),
    ),
    (
        "rayscope_gpu_mps_serving",
        "1 when NVML lists MPS clients on the GPU (nvmlDeviceGetMPSComputeRunningProcesses).",
        lambda g: None if known(g.mps_serving) is None else float(bool(g.mps_serving)),
    ),
)


# name, help, the GpuDevice field, its bounded values: 1 per GPU, the mode as a label
_MODE_METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "rayscope_gpu_virtualization_mode",
        "1, labelled with the GPU's NVML virtualization mode (vgpu_guest: NVML used memory not trusted).",
        "virtualization_mode",
        VIRTUALIZATION_MODE_NAMES,
    ),
    (
        "rayscope_gpu_compute_mode",
        "1, labelled with the GPU's NVML compute mode.",
        "compute_mode",
        COMPUTE_MODE_NAMES,
    ),
)
_UNREADABLE = (
    "rayscope_node_unreadable",
    "1 for a node whose report could not be merged or rendered (its report's numbers are left out).",
)
_SHARED_GPU = (
    "rayscope_gpu_shared_nodes",
    "Nodes that report this GPU (UUID) where more than one does (time-slicing): divide sums by it.",
)


RENAMED: dict[str, str] = {
    "rayscope_gpus_total": "rayscope_gpus_capacity",
    "rayscope_cpus_total": "rayscope_cpus_capacity",
    "rayscope_vram_total_bytes": "rayscope_vram_capacity_bytes",
    "rayscope_gpu_xid_errors": "rayscope_gpu_xid_errors_total",
    "rayscope_gpu_ecc_uncorrected_volatile_errors": "rayscope_gpu_ecc_uncorrected_volatile_errors_total",
}
"""Old name -> new name (rayscope 0.1 -> 0.2): gauges with a counter's ``_total`` suffix, the
capacity beside them for the same reason, and two event counts that were gauges. The old
names, all gauges, are written only with ``legacy_names``; rayscope 0.3 drops them."""


_CLUSTER_FAMILIES = (
    "rayscope_pending_demands",
    "rayscope_source_up",
    "rayscope_scheduler_view_age_seconds",
    "rayscope_scheduler_view_stale",
    "rayscope_scrape_per_device",
)
PER_DEVICE_HELP = (
    "1 when this answer carries the per-device families (rayscope_device_*: /metrics?gpus=1, the"
    " actor table read), 0 when not: the dashboard's per-GPU panels and the GPU booking alerts need them."
)
"""Said in every answer, so that a scrape without ``?gpus=1`` is seen (the dashboard's stat,
the ``RayscopePerDeviceMetricsMissing`` alert) rather than panels left empty and alerts that
cannot fire. Not the default: at 10,000 nodes of 8 GPUs they make /metrics 66 MB instead of
14 MB and the head attributes every GPU for each render (deploy/prometheus/README.md)."""


def family_names() -> list[str]:
    """Every family ``/metrics`` may carry under its current name (a family without a known
    value is left out): what dashboards and alert rules may query (deploy/, checked by tests)."""
    gpu = [name for name, _, _ in _GPU_METRICS] + [name for name, *_ in _MODE_METRICS] + [_SHARED_GPU[0]]
    nodes, devices = ([name for name, _, _ in table] for table in (_NODE_METRICS, _DEVICE_METRICS))
    return [*nodes, _UNREADABLE[0], *gpu, *devices, *_CLUSTER_FAMILIES]


def _type(name: str) -> str:
    """A family's type, told by its name as Prometheus's convention has it (promtool checks
    it): a count of events that only grows is a counter named ``..._total``; the rest are gauges."""
    return "counter" if name.endswith("_total") else "gauge"


def _node_label(node: NodeStatus) -> str:
    return f'node_id="{label_value(node.node_id)}"'


def family(name: str, help_text: str, samples: Iterable[tuple[str, Optional[float]]]) -> list[str]:
    """One gauge family from ``(labels, value)`` pairs; none at all when no value is known."""
    lines = [f"{name}{{{labels}}} {_sample(value)}" for labels, value in samples if value is not None]
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {_type(name)}", *lines] if lines else []


def _gpu_samples(nodes: list[NodeStatus]) -> list[str]:
    """Per GPU of every fresh NVML report, labelled by node, NVML index and UUID (each GPU's
    labels built once, not once per family: 11 families × 80,000 GPUs at 10,000 nodes)."""
    gpus = [
        (f'{node_labels},gpu="{gpu.index}",uuid="{label_value(gpu.uuid or "")}"', gpu)
        for node in nodes
        if not figures_old(node) and node.gpus
        for node_labels in (_node_label(node),)
        for gpu in node.gpus
    ]
    lines: list[str] = []
    for name, help_text, value_of in _GPU_METRICS:
        lines += family(name, help_text, ((labels, value_of(gpu)) for labels, gpu in gpus))
    for name, help_text, field, values in _MODE_METRICS:
        modes = ((labels, known(getattr(gpu, field))) for labels, gpu in gpus)
        samples = ((f'{labels},mode="{_bounded(mode, values)}"', 1.0) for labels, mode in modes if mode)
        lines += family(name, help_text, samples)
    shared = (
        (
            f'{_node_label(node)},gpu="{gpu.index}",uuid="{label_value(gpu.uuid or "")}"',
            float(len(others) + 1),
        )
        for node in nodes
        if not figures_old(node) and isinstance(node.shared_gpus, dict)
        for gpu in node.gpus or ()
        for others in (node.shared_gpus.get(gpu.uuid or ""),)
        if others
    )
    return lines + family(*_SHARED_GPU, shared)


def _bounded(value: str, values: tuple[str, ...]) -> str:
    """A report's mode as a label value: one of ``values``, else ``unknown`` (a label takes no
    word a report chose)."""
    return value if value in values else "unknown"


def _device_samples(nodes: list[NodeStatus]) -> list[str]:
    """Per device of Ray's placement, labelled by node, UUID and Ray's GPU id."""
    lines: list[str] = []
    for name, help_text, value_of in _DEVICE_METRICS:
        samples = (
            (f'{_node_label(node)},uuid="{label_value(d.uuid or "")}",gpu_id="{d.gpu_id}"', value_of(d))
            for node in nodes
            for d in (node.placement.devices if node.placement is not None else [])
        )
        lines += family(name, help_text, samples)
    return lines


def _sample(value: float) -> str:
    """Exact: ``25769803776``, not ``2.57698e+10``."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def label_value(value: str) -> str:
    """``value`` as a Prometheus label value: printable, with ``\\``, ``"`` and newlines escaped."""
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
        labels = f'kind="{kind}",shape="{label_value(shape)}",reason="{reason}"'
        lines.append(f"rayscope_pending_demands{{{labels}}} {count}")
    return lines


def legacy_families(lines: list[str]) -> list[str]:
    """The families of ``lines`` that :data:`RENAMED` renamed, again under their old names
    (gauges, the same samples), each HELP saying what replaced it. They fail ``promtool check
    metrics`` (the reason for the rename): written only when asked."""
    old_of = {new: old for old, new in RENAMED.items()}
    out: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        old = old_of.get(name)
        if old is not None:
            out.setdefault(old, []).append(old + line[len(name) :])
    legacy: list[str] = []
    for old, samples in out.items():
        help_text = f"Deprecated: renamed {RENAMED[old]} (same samples); rayscope 0.3 drops this name."
        legacy += [f"# HELP {old} {help_text}", f"# TYPE {old} gauge", *samples]
    return legacy


@per_node
def metrics_text(status: ClusterStatus, *, legacy_names: bool = False) -> str:
    """Prometheus text exposition (also node_exporter's textfile format): one family per
    quantity, labelled by node; unknown values are absent, not 0, and so are a stale
    report's NVML numbers (``rayscope_report_stale`` says why they went). ``legacy_names``:
    also the families under their names before :data:`RENAMED` (for one release; they fail
    ``promtool check metrics``)."""
    lines: list[str] = []
    nodes = list(status.nodes.values())
    labelled = [(f'{_node_label(n)},node_ip="{label_value(n.node_ip or "")}"', n) for n in nodes]
    for name, help_text, value_of in _NODE_METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {_type(name)}"]
        for labels, node in labelled:
            value = value_of(node)
            if value is not None:
                lines.append(f"{name}{{{labels}}} {_sample(value)}")
    lines += family(
        *_UNREADABLE, ((labels, 1.0) for labels, n in labelled if known(n.unreadable) is not None)
    )
    lines += _gpu_samples(nodes)
    lines += _device_samples(nodes)
    lines += pending_metrics(status)
    lines += ["# HELP rayscope_source_up 1 when the source answered.", "# TYPE rayscope_source_up gauge"]
    lines += [f'rayscope_source_up{{source="{label_value(s.name)}"}} {int(s.ok)}' for s in status.sources]
    lines += [
        "# HELP rayscope_scheduler_view_age_seconds Age of the scheduler's view (GCS read).",
        "# TYPE rayscope_scheduler_view_age_seconds gauge",
    ]
    if status.scheduler_age_s is not None:  # never read: absent, not 0
        lines.append(f"rayscope_scheduler_view_age_seconds {_sample(status.scheduler_age_s)}")
    lines += [
        "# HELP rayscope_scheduler_view_stale 1 when the scheduler's view is older than 3 intervals.",
        "# TYPE rayscope_scheduler_view_stale gauge",
        f"rayscope_scheduler_view_stale {int(status.scheduler_stale)}",
    ]
    per_device = any(n.placement is not None for n in nodes)
    lines += [
        f"# HELP rayscope_scrape_per_device {PER_DEVICE_HELP}",
        "# TYPE rayscope_scrape_per_device gauge",
        f"rayscope_scrape_per_device {int(per_device)}",
    ]
    if legacy_names:
        lines += legacy_families(lines)
    return "\n".join(lines) + "\n"
