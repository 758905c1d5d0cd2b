"""Each GPU settled once, where its report is merged: the used figure rayscope trusts (its
source, age and the reason it has none), NVML's trust, and what needs an operator.

Pure. :func:`settle_gpu` asks the rules (:func:`rayscope.core.gpu.trust.gpu_used`,
:func:`rayscope.core.gpu.health.health_flags`) and writes their verdict into the GPU's own
fields, the ones the status document carries (``memory_used_bytes``, ``memory_used_source``,
``memory_used_age_s``, ``memory_used_reason``, ``health_flags``). The rollup settles each
report's GPUs once (``rayscope.core.rollup``, cached on the report), Ray's dashboard's GPUs
where it takes them (``rayscope.core.gpu.precedence``), ``rayscope node`` its own.

Every output reads the verdict back with :func:`settled_used`, :func:`settled_trusted` and
:func:`settled_flags`, which judge nothing: the lines, ``--gpus``, the JSON, the metrics and
the page, and a client that decoded the head's document (the head settled it), all say the
same. A GPU whose fields already say the verdict is kept as it is (no copy), so a report of
an agent that settled it (``rayscope.core.gpu.trust.settle_on_agent``), or one older than the mode fields (no
source: NVML's figure), reads byte for byte as before.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

from msgspec.structs import replace

from rayscope.core.gpu.health import health_flags
from rayscope.core.gpu.memory import MeasuredMemory, measured_memory
from rayscope.core.gpu.trust import NOT_TRUSTED, GpuUsed, gpu_used, settled_used
from rayscope.schema.report import UNSET, GpuDevice, known


def settled_trusted(gpu: GpuDevice) -> bool:
    """Whether a settled GPU's NVML figures (its used memory, its processes') are the
    device's: not where a CUDA sample stands in for them, nor where the reason says they are
    not trusted (:data:`rayscope.core.gpu.trust.NOT_TRUSTED`, in every such reason)."""
    reason = known(gpu.memory_used_reason) or ""
    return known(gpu.memory_used_source) != "cuda" and NOT_TRUSTED not in reason


def settled_flags(gpu: GpuDevice) -> list[str]:
    """A settled GPU's health flags, in the operator's words; ``[]``: nothing wrong."""
    return known(gpu.health_flags) or []


def _verdict_fields(verdict: GpuUsed) -> dict[str, Any]:
    """The GPU fields that say ``verdict`` (absent where it has no value)."""
    return {
        "memory_used_bytes": verdict.used_bytes,
        "memory_used_source": verdict.source or UNSET,
        "memory_used_age_s": UNSET if verdict.source is None else verdict.age_s,
        "memory_used_reason": verdict.reason or UNSET,
        "nvml_memory_used_bytes": UNSET if verdict.nvml_used_bytes is None else verdict.nvml_used_bytes,
    }


def _says(gpu: GpuDevice, verdict: GpuUsed) -> bool:
    """Whether ``gpu``'s fields say ``verdict`` and nothing beside it: no figure the verdict
    has not, no source without a figure, no reason beside one."""
    if settled_used(gpu) != verdict or gpu.memory_used_bytes != verdict.used_bytes:
        return False
    if verdict.used_bytes is None:
        return known(gpu.memory_used_source) is None
    return not known(gpu.memory_used_reason)


def settle_gpu(gpu: GpuDevice) -> GpuDevice:
    """``gpu`` (and its MIG instances) with the rules' verdict in its fields; ``gpu`` itself
    where they say it already."""
    changes: dict[str, Any] = {}
    verdict = gpu_used(gpu)
    if not _says(gpu, verdict):
        changes.update(_verdict_fields(verdict))
    flags = health_flags(gpu)
    if flags != settled_flags(gpu):
        changes["health_flags"] = flags or UNSET
    migs = [settle_gpu(m) for m in gpu.mig_devices]
    if any(m is not n for m, n in zip(migs, gpu.mig_devices)):
        changes["mig_devices"] = migs
    return replace(gpu, **changes) if changes else gpu


def settle_gpus(gpus: Optional[Sequence[GpuDevice]]) -> Optional[list[GpuDevice]]:
    """:func:`settle_gpu` of each; ``None`` (NVML did not answer) stays ``None``."""
    return None if gpus is None else [settle_gpu(g) for g in gpus]


class SettledReport(NamedTuple):
    """A report's GPUs settled, and the node's memory sums from them: what the rollup keeps
    on the report (``ReceivedReport.memory``), computed once per report, not once per query."""

    gpus: Optional[list[GpuDevice]]
    memory: MeasuredMemory


def settle_report(gpus: Optional[Sequence[GpuDevice]]) -> SettledReport:
    """A report's GPUs settled, and their sums."""
    settled = settle_gpus(gpus)
    return SettledReport(settled, measured_memory(settled))
