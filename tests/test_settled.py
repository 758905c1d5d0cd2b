"""Decide once, in the merge: each GPU's trusted figure, its source and its health
flags are settled where its report is merged (rayscope.core.gpu.settled), and what the outputs
read back is what the rules say.

Positive control: make ``settle_gpu`` return ``gpu`` unchanged and the hostile claims below
read as claimed (a vGPU guest's NVML figure shown, no flag on a sick GPU).
"""

from collections.abc import Iterator

import msgspec

from rayscope.core.gpu.health import health_flags
from rayscope.core.gpu.settled import settle_gpu, settled_flags, settled_trusted
from rayscope.core.gpu.trust import gpu_used, nvml_trusted, settled_used
from rayscope.schema.report import GpuDevice, GpuHealth
from rayscope.schema.status import ClusterStatus
from tests import scenarios
from tests.page_scenarios import big_status

GIB = 1 << 30


def _statuses() -> Iterator[tuple[str, ClusterStatus]]:
    """The golden scenarios' documents, and the page's 40-node one (unhealthy GPUs)."""
    yield "seed", scenarios.seed_status()
    yield "mixed", scenarios.mixed_status()
    yield "busy", scenarios.busy_gpu_status()
    yield "fraction", scenarios.fraction_status()
    yield "embedded", scenarios.embedded_seed_status()
    yield "virtual", scenarios.virtual_status()
    yield "virtual_cuda", scenarios.virtual_status(cuda_age_s=3.0)
    yield "dashboard", scenarios.dashboard_status()
    yield "dashboard_edges", scenarios.dashboard_edges_status()
    yield "big", big_status(40)


def _leaves(gpus: list[GpuDevice]) -> Iterator[GpuDevice]:
    for gpu in gpus:
        yield gpu
        yield from gpu.mig_devices


def test_the_settled_values_are_what_the_rules_say() -> None:
    checked = 0
    for name, status in _statuses():
        gpus = [g for node in status.nodes.values() for g in _leaves(node.gpus or [])]
        checked += len(gpus)
        for gpu in gpus:
            assert settled_used(gpu) == gpu_used(gpu), (name, gpu.index)
            assert settled_trusted(gpu) == nvml_trusted(gpu), (name, gpu.index)
            assert settled_flags(gpu) == health_flags(gpu), (name, gpu.index)
            assert settle_gpu(gpu) is gpu  # settled once: settling again changes nothing
    assert checked > 300  # the 40 nodes of 8 GPUs and the scenarios'


def test_a_report_that_contradicts_the_rules_is_settled_as_they_say() -> None:
    claims = GpuDevice(
        index=0,
        memory_total_bytes=16 * GIB,
        memory_used_bytes=14 * GIB,
        memory_used_source="nvml",
        nvml_memory_used_bytes=14 * GIB,
        virtualization_mode="vgpu_guest",
        health=GpuHealth(xid_errors=2, last_xid=79),
        health_flags=["all fine"],
    )
    settled = settle_gpu(claims)
    assert settled.memory_used_bytes is None and not settled_trusted(settled)
    assert settled_used(settled) == gpu_used(claims)
    assert settled_flags(settled) == ["XID 79 (2 since start)"]
    healthy = settle_gpu(msgspec.structs.replace(claims, health=None, virtualization_mode="none"))
    assert "health_flags" not in msgspec.json.decode(msgspec.json.encode(healthy))
    assert settled_trusted(healthy) and settled_used(healthy).used_bytes == 14 * GIB
    for gpu in (settled, healthy):
        assert settle_gpu(gpu) is gpu
