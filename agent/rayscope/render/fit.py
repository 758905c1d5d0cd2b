"""``rayscope fit``: the shape, the answer, per node how many replicas fit."""

from typing import Optional

from rayscope.labels import label_pairs, node_label, printable_lines
from rayscope.render.fmt import encode, gib
from rayscope.render.gpus import SOURCE_WORDS
from rayscope.schema.fit import FitResult, NodeFit
from rayscope.units import number, ray_round, size

UNBOUNDED = 10**9
"""``rayscope.core.capacity.fit``'s capacity for a shape that asks for nothing a node could run out of."""

FIT_SIZING_WORDS = {
    "vram_mb": "VRAM_MB booking",
    "fraction": "GPU fraction",
    "whole_gpu": "a whole GPU",
    "shape": "a raw Ray shape",
}


def shape_option_text(shape: dict[str, float]) -> str:
    """``{"GPU": 0.01, "VRAM_MB": 4096}``: the request in the same words as ``--shape``."""
    return "{" + ", ".join(f'"{name}": {number(value)}' for name, value in shape.items()) + "}"


def resource_amount(name: str, value: float) -> str:
    """An amount of a Ray resource in its unit: memory sizes readable, VRAM_MB in MB."""
    if name in ("memory", "object_store_memory"):
        return size(value)
    if name == "VRAM_MB":
        return f"{value:.0f} MB"
    return number(ray_round(value))


def fit_node_label(fit: NodeFit) -> str:
    """``127.0.0.1 [HEAD] G e0e0e0e0``: IP, role, accelerator, node id (IPs repeat on one host)."""
    words = [node_label(fit.node_ip, fit.node_id), "[HEAD]" if fit.head else "[worker]"]
    if fit.accelerator_type:
        words.append(fit.accelerator_type)
    words.append(fit.node_id[:8])
    return " ".join(words)


def fit_node_line(fit: NodeFit, shape: dict[str, float]) -> str:
    """``127.0.0.1 [HEAD] G e0e0e0e0: fits 0, gets 0 (VRAM_MB: 4096 MB free, needs 5120 MB)``."""
    fits = "any number" if fit.capacity >= UNBOUNDED else str(fit.capacity)
    line = f"{fit_node_label(fit)}: fits {fits}, gets {fit.placed}"
    if fit.missing:
        return line + " (" + ", ".join(f"no {name}" for name in fit.missing) + ")"
    if fit.limited_by is None:
        return line
    name = fit.limited_by
    if name == "GPU per device":
        free = f"no device has {number(shape['GPU'])} GPU free" if fit.capacity == 0 else "packed per device"
        return line + f" ({name}: {free})"
    free = resource_amount(name, fit.available.get(name, 0.0))
    if fit.capacity == 0:
        return line + f" ({name}: {free} free, needs {resource_amount(name, shape[name])})"
    return line + f" (limited by {name}: {free} free)"


def gpu_free_text(fit: NodeFit) -> str:
    """``GPU0 has 1.2 GB free`` for every GPU the check used (or could have used); a CUDA
    sample's figure says so: ``GPU0 has 15.2 GB free (CUDA, 3s old)``."""
    return ", ".join(
        f"GPU{g.index} has {gib(g.free_bytes)} GB free"
        + (
            f" ({SOURCE_WORDS[g.source]}, {g.age_s:.0f}s old)"
            if isinstance(g.age_s, float) and g.source in SOURCE_WORDS
            else ""
        )
        for g in fit.gpus
    )


def not_checked_text(fit: NodeFit) -> str:
    """``not checked on GPU0 (GPU0: vGPU guest: NVML used not trusted; ...)``, or ``""``."""
    if not isinstance(fit.not_checked_gpus, list) or not fit.not_checked_gpus:
        return ""
    gpus = ", ".join(f"GPU{i}" for i in fit.not_checked_gpus)
    return f"not checked on {gpus} ({fit.measured_reason})"


def fit_measured_line(fit: NodeFit) -> Optional[str]:
    """The driver's view under a node given replicas; ``None`` where it has nothing to say."""
    need = f" (needs {size(fit.need_bytes)} per replica)" if fit.need_bytes is not None else ""
    unchecked = not_checked_text(fit)
    also = f"; {unchecked}" if unchecked else ""
    if fit.measured == "short":
        return f"fits by booking, not by measured memory: {gpu_free_text(fit)}{need}{also}"
    if fit.measured == "ok":
        return f"measured: {gpu_free_text(fit)}{need}{also}"
    if fit.measured == "not_checked" and unchecked:
        checked = f"{gpu_free_text(fit)}{need}; " if fit.gpus else ""
        return f"measured memory: {checked}{unchecked}"
    return None


def fit_answer_line(result: FitResult) -> str:
    """``Fits: yes, 2/2 replicas placed`` — the overall answer first, as the exit code says."""
    if result.refused is not None:
        return f"Fits: no, refused: {result.refused}"
    if isinstance(result.label_miss, str):
        return f"Fits: no, {result.label_miss}"
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
    return f"Shape: {shape_option_text(result.shape)} per replica ({words}: {result.sizing_reason})"


def fit_selector_lines(result: FitResult) -> list[str]:
    """``Label selector: zone=b admits 1 of 3 alive node(s)`` (only those are candidates)."""
    selector = result.request.label_selector
    if not isinstance(selector, dict) or not isinstance(result.admitted_nodes, int):
        return []
    alive = result.alive_nodes if isinstance(result.alive_nodes, int) else result.admitted_nodes
    return [
        f"Label selector: {label_pairs(selector)} admits {result.admitted_nodes} of {alive} alive node(s)"
    ]


def fit_lines(result: FitResult) -> list[str]:
    """``rayscope fit``: the shape, the answer, per node how many fit, the driver's view."""
    lines = [fit_sizing_line(result), *fit_selector_lines(result), fit_answer_line(result)]
    if result.hazard:
        lines.append(f"Hazard: {result.hazard}")
    if result.hint:
        lines.append(f"Hint: {result.hint}")
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
    notes = [result.per_device_note] if result.per_device_note else []
    for reason, count in unmeasured.items():
        note = f"Measured memory: NA on {count} node(s) given replicas: {reason}"
        if result.view == "gcs" and "head agent" in reason:
            note += " (run `rayscope head` and `rayscope push` on every node)"
        notes.append(note)
    if notes:
        lines += ["", *notes]
    return printable_lines(lines)


def fit_json(result: FitResult) -> str:
    """``rayscope fit --json``."""
    return encode(result)
