"""Formatting shared by every output: GiB figures, bookings, JSON, which nodes to show.

Units, and how a number or a size is written (``number``, ``size``), come from
:mod:`rayscope.units`; thresholds and wording of one output live in its module.
"""

from collections.abc import Sequence
from typing import Optional

import msgspec

from rayscope.core.gpu.settled import settled_trusted
from rayscope.core.gpu.trust import NOT_TRUSTED, settled_used, untrusted_label
from rayscope.labels import label_pairs
from rayscope.schema.report import SourceStatus, known
from rayscope.schema.status import ClusterStatus, NodeStatus
from rayscope.units import GIB


def gib(value: Optional[float]) -> str:
    """Bytes as GiB with one decimal (labelled ``GB`` like nvidia-smi does), ``NA`` if unknown."""
    return "NA" if value is None else f"{value / GIB:.1f}"


def shown_used_bytes(node: NodeStatus) -> Optional[int]:
    """The used GPU memory a node's line shows: rayscope's trusted figure; for a stale
    report the trusted figure it last had (the line says ``stale Ns``); ``None``: unknown.
    Never BioEngine's ``used_gpu_memory``, whose ``"NA"`` is no number."""
    if not node.stale:
        return node.used_gpu_memory_bytes
    figures = [settled_used(g).used_bytes for g in node.gpus] if node.gpus is not None else [None]
    return None if None in figures else sum(f or 0 for f in figures)


def vram_note(node: NodeStatus) -> str:
    """What a node's ``VRAM:`` figure says about itself where a GPU's NVML used figure is not
    trusted (a vGPU guest): `` (vGPU: NVML used not trusted)``, or `` (vGPU: CUDA 12s old)``
    while fresh CUDA samples stand in (their age by the reader's clock); ``""`` elsewhere, so
    bare metal and pass-through read as they always did."""
    plain = node.used_gpu_memory_source == "nvml" or (
        node.used_gpu_memory_source is None and NOT_TRUSTED not in node.used_gpu_memory_reason
    )
    if plain and not node.stale and not node.gpus_unmeasured:  # the rollup's verdict: no GPU to say it of
        return ""
    untrusted = [g for g in node.gpus or () if not settled_trusted(g)]  # as the rollup settled them
    if not untrusted:
        return ""
    label = untrusted_label(known(untrusted[0].virtualization_mode), untrusted[0].name)
    figures = [settled_used(g) for g in untrusted]
    if any(f.used_bytes is None for f in figures):
        return f" ({label}: {NOT_TRUSTED})"
    age = max(f.age_s or 0.0 for f in figures) + (node.report_age_s or 0.0)
    return f" ({label}: CUDA {age:.0f}s old)"


def visible_nodes(status: ClusterStatus, include_dead: bool) -> list[NodeStatus]:
    """The nodes to show, in display order (the rollup already sorted them)."""
    return [n for n in status.nodes.values() if include_dead or n.alive]


def has_gpus(node: NodeStatus) -> bool:
    """Scheduler GPUs, or — for a node the scheduler does not know — GPUs its agent saw
    (or could not count)."""
    if node.in_scheduler:
        return node.total_gpu > 0
    return node.gpus is None or len(node.gpus) > 0


def booking(node: NodeStatus) -> str:
    """``GPU: 0.04/1 booked: 20480/24576 MB`` — the scheduler's two GPU numbers."""
    text = f"GPU: {node.used_gpu:.2f}/{node.total_gpu:.0f}"
    if node.total_vram_mb > 0:
        text += f" booked: {node.used_vram_mb:.0f}/{node.total_vram_mb:.0f} MB"
    return text


def source_notes(sources: Sequence[SourceStatus]) -> list[str]:
    """``NVML: NVML library not found ...`` for every source that did not answer."""
    return [f"{s.name.upper()}: {s.reason}" for s in sources if not s.ok]


def cpus(value: float) -> str:
    """CPUs booked: ``8`` when whole, ``0.50`` when Ray booked a fraction (the seed's rule for
    GPU fractions, ``.2f``), so half a CPU never prints as ``0``. Ray's 1e-4 fixed point
    decides what counts as whole."""
    return f"{value:.0f}" if abs(value - round(value)) < 5e-5 else f"{value:.2f}"


def encode(value: object, indent: int = 2) -> str:
    """A Struct as JSON: indented, or compact with ``indent=0``."""
    raw = msgspec.json.encode(value)
    return (msgspec.json.format(raw, indent=indent) if indent else raw).decode()


def labels_text(node: NodeStatus) -> str:
    """``zone=a ray.io/accelerator-type=A100``: the node's Ray labels as ``node`` and the page
    show them (already printable and bounded where merged; ``ray.io/node-id`` left out);
    ``""`` where it has none or its Ray gives none."""
    return label_pairs(node.labels) if isinstance(node.labels, dict) else ""
