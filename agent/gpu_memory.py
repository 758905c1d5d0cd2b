"""A node's GPU memory: which used figure rayscope trusts, and BioEngine's keys from it.

Pure: a report's GPUs in, sums out. :func:`gpu_used` is the one place a GPU's trust is
judged (issue 20 extends it for vGPU guests); :func:`measured_memory` sums it over a node,
:func:`bioengine_memory` turns the sums into BioEngine's ``total_gpu_memory`` /
``used_gpu_memory`` (``agent.rollup`` puts both on the node).
"""

from collections.abc import Sequence
from typing import NamedTuple, Optional

from agent.schema.report import GpuDevice
from agent.schema.status import NA, BytesOrNA


class GpuUsed(NamedTuple):
    """One GPU's used memory as the rollup judges it."""

    used_bytes: Optional[int]
    """The figure the agent trusts (``GpuDevice.memory_used_bytes``); ``None``: none."""
    source: Optional[str]
    """``nvml`` or ``cuda``; ``None`` with ``used_bytes``."""
    age_s: Optional[float]
    """Age of the figure when the report was collected (0 for NVML, read then)."""
    reason: str
    """Why ``used_bytes`` is ``None`` although NVML answered; ``""`` otherwise."""
    nvml_used_bytes: Optional[int]
    """NVML's raw used figure, trusted or not."""


def gpu_used(gpu: GpuDevice) -> GpuUsed:
    """One GPU's trusted used figure, its source, age and reason, and NVML's raw figure.

    The one place the report's per-GPU trust enters the rollup. The report does not carry
    ``memory_used_source`` / ``memory_used_age_s`` / ``memory_used_reason`` /
    ``nvml_memory_used_bytes`` yet (issue 20 adds them for vGPU guests), so the trusted
    figure is NVML's, read at collection: source ``nvml``, age 0, and the raw one the same.
    """
    used = gpu.memory_used_bytes
    known = used is not None
    return GpuUsed(used, "nvml" if known else None, 0.0 if known else None, "", used)


class MeasuredMemory(NamedTuple):
    """A node's GPU memory from one report, summed over its GPUs (parents: a MIG
    instance's memory is part of its GPU's)."""

    total_bytes: Optional[int]
    """NVML's total; ``None`` when NVML did not answer or any GPU's total is unknown."""
    used_bytes: Optional[int]
    """The trusted used figure; ``None`` when any GPU's is unknown (``reason`` says why)."""
    nvml_used_bytes: Optional[int]
    """NVML's raw used; ``None`` when NVML did not answer or any GPU's is unknown."""
    source: Optional[str]
    """``nvml``, ``cuda`` or ``mixed``; ``None`` with ``used_bytes``."""
    age_s: Optional[float]
    """Age of the oldest figure at collection; ``None`` with ``used_bytes``."""
    reason: str
    unmeasured: int
    """GPUs whose NVML total or used is unknown (a lost GPU)."""


def measured_memory(gpus: Optional[Sequence[GpuDevice]]) -> MeasuredMemory:
    """A node's GPU memory from its report's GPUs (:func:`gpu_used` per GPU).

    A sum is ``None`` when any GPU's part is unknown (a lost GPU): a sum without it would be
    a made-up smaller number; ``0`` when NVML answered and found no GPU. One pass: the head
    runs this for every node on every query.
    """
    if gpus is None:
        return MeasuredMemory(None, None, None, None, None, "NVML did not answer", 0)
    total: Optional[int] = 0
    used: Optional[int] = 0
    nvml: Optional[int] = 0
    unmeasured = 0
    sources: set[str] = set()
    age = 0.0
    reason = ""
    for gpu in gpus:
        figure = gpu_used(gpu)
        if gpu.memory_total_bytes is None or figure.nvml_used_bytes is None:
            unmeasured += 1
        total = None if total is None or gpu.memory_total_bytes is None else total + gpu.memory_total_bytes
        nvml = None if nvml is None or figure.nvml_used_bytes is None else nvml + figure.nvml_used_bytes
        if figure.used_bytes is None:
            used, reason = None, reason or figure.reason
            continue
        used = None if used is None else used + figure.used_bytes
        sources.add(figure.source or "nvml")
        age = max(age, figure.age_s or 0.0)
    if unmeasured:
        reason = f"{unmeasured} GPU(s) not measured"
    if used is None:
        return MeasuredMemory(total, None, nvml, None, None, reason or "not measured", unmeasured)
    source = "mixed" if len(sources) > 1 else next(iter(sources), "nvml")
    return MeasuredMemory(total, used, nvml, source, age, "", unmeasured)


def bioengine_memory(
    total_gpu: float, total_bytes: Optional[int], used_bytes: Optional[int]
) -> tuple[BytesOrNA, BytesOrNA]:
    """BioEngine's node ``total_gpu_memory`` and ``used_gpu_memory`` from rayscope's figures
    (``get_cluster_state``'s rules): ``0`` and ``0`` on a node without ``GPU``, else the
    bytes, or ``"NA"`` for a figure rayscope does not have (``used_bytes``: the trusted
    figure of a fresh report)."""
    if total_gpu == 0:
        return 0, 0
    return (NA if total_bytes is None else total_bytes), (NA if used_bytes is None else used_bytes)
