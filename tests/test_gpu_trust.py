"""The GPU trust rule (``rayscope.core.gpu.trust``) from a table: per case, what a report or the
dashboard says of one GPU, and the figure rayscope believes, its source and why not.

Each row is one case of :func:`gpu_used`; a second table drives the agent's side
(:func:`settle_on_agent`): the verdict it writes is the one ``gpu_used`` reads back.
"""

from typing import Any, NamedTuple, Optional

import msgspec
import pytest

from rayscope.core.gpu.trust import NOT_TRUSTED, CudaFigure, gpu_used, settle_on_agent
from rayscope.schema.dashboard import DASHBOARD_SOURCE
from rayscope.schema.report import GpuDevice

GIB = 2**30
TOTAL, USED, CUDA = 16 * GIB, 4 * GIB, 2 * GIB


def gpu(name: str = "NVIDIA A40", total: Optional[int] = TOTAL, **fields: Any) -> GpuDevice:
    return msgspec.structs.replace(GpuDevice(index=0, name=name, memory_total_bytes=total), **fields)


class Case(NamedTuple):
    what: str
    device: GpuDevice
    believed: Optional[int]
    source: Optional[str]
    reason: str  # a part of the reason ("" : none)


NVML: dict[str, Any] = {
    "memory_used_bytes": USED,
    "nvml_memory_used_bytes": USED,
    "memory_used_source": "nvml",
}
CASES = [
    Case("bare metal: NVML's", gpu(virtualization_mode="none", **NVML), USED, "nvml", ""),
    Case("pass-through: NVML's", gpu(virtualization_mode="passthrough", **NVML), USED, "nvml", ""),
    Case("vGPU host: NVML's", gpu(virtualization_mode="host_vgpu", **NVML), USED, "nvml", ""),
    Case("a driver without modes: NVML's", gpu(**NVML), USED, "nvml", ""),
    Case("an agent older than the mode fields", gpu(memory_used_bytes=USED), USED, "nvml", ""),
    Case(
        "vGPU guest claiming NVML's: not believed",
        gpu(virtualization_mode="vgpu_guest", **NVML),
        None,
        None,
        f"vGPU guest: {NOT_TRUSTED}",
    ),
    Case(
        "vGPU guest with a CUDA sample: CUDA's",
        gpu(
            virtualization_mode="vgpu_guest",
            memory_used_bytes=CUDA,
            memory_used_source="cuda",
            memory_used_age_s=3.0,
            nvml_memory_used_bytes=USED,
        ),
        CUDA,
        "cuda",
        "",
    ),
    Case(
        "bare metal claiming a CUDA sample: not a verdict",
        gpu(
            virtualization_mode="none",
            memory_used_bytes=CUDA,
            memory_used_source="cuda",
            nvml_memory_used_bytes=USED,
        ),
        None,
        None,
        "",
    ),
    Case(
        "a mode this rayscope has no name for",
        gpu(virtualization_mode="unknown", **NVML),
        None,
        None,
        f"virtualization mode unknown: {NOT_TRUSTED}",
    ),
    Case(
        "the dashboard's figure (no mode)",
        gpu(memory_used_bytes=USED, memory_used_source=DASHBOARD_SOURCE, memory_used_age_s=2.0),
        USED,
        DASHBOARD_SOURCE,
        "",
    ),
    Case(
        "used above its total, from any source",
        gpu(total=2 * GIB, virtualization_mode="none", **NVML),
        None,
        None,
        "above its total 2.0 GB: not a measurement",
    ),
    Case(
        "a GPU with no memory",
        gpu(total=0, memory_used_bytes=USED, memory_used_source=DASHBOARD_SOURCE),
        None,
        None,
        "a total of 0 MB is no GPU's",
    ),
    Case(
        "a trusted mode whose report says not trusted: no verdict, no figure",
        gpu(virtualization_mode="none", nvml_memory_used_bytes=USED, memory_used_reason=f"x: {NOT_TRUSTED}"),
        None,
        None,
        "",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_the_figure_believed(case: Case) -> None:
    verdict = gpu_used(case.device)
    assert (verdict.used_bytes, verdict.source) == (case.believed, case.source)
    if case.reason:
        assert case.reason in verdict.reason
    else:
        assert verdict.reason == ""


AGENT_CASES: list[tuple[str, Optional[CudaFigure], float, Optional[int], Optional[str], str]] = [
    # (mode, CUDA figure, fresh for s) → (believed, source, a part of the reason)
    ("none", None, 0.0, USED, "nvml", ""),
    ("vgpu_guest", None, 30.0, None, None, "no CUDA sample: RAYSCOPE_CUDA_SAMPLE_S not set"),
    ("vgpu_guest", CudaFigure(CUDA, 3.0, ""), 30.0, CUDA, "cuda", ""),
    ("vgpu_guest", CudaFigure(CUDA, 90.0, ""), 30.0, None, None, "CUDA sample 90s old (fresh for 30s)"),
    ("vgpu_guest", CudaFigure(None, None, "cuInit failed"), 30.0, None, None, "CUDA: cuInit failed"),
]


@pytest.mark.parametrize(("mode", "cuda", "fresh_s", "believed", "source", "reason"), AGENT_CASES)
def test_the_agent_writes_the_verdict_the_rule_reads_back(
    mode: str,
    cuda: Optional[CudaFigure],
    fresh_s: float,
    believed: Optional[int],
    source: Optional[str],
    reason: str,
) -> None:
    raw = gpu(virtualization_mode=mode, nvml_memory_used_bytes=USED)
    settled = settle_on_agent(raw, cuda, fresh_s)
    assert (settled.memory_used_bytes, gpu_used(settled).source) == (believed, source)
    assert reason in (gpu_used(settled).reason if believed is None else "")
    assert gpu_used(settled) == gpu_used(
        settle_on_agent(settled, cuda, fresh_s)
    )  # settling twice changes nothing
