"""GPU health, pure: flags from NVML's health fields, and their /metrics gauges.

Positive control: writing an unsupported field (``None``) as 0 puts a sample where the
absent-not-zero assertions expect none; dropping a fault bit from THROTTLE_FAULTS fails the
throttle flag.
"""

from rayscope.core.gpu.health import health_flags, throttle_names
from rayscope.render.metrics import metrics_text
from rayscope.schema.report import GpuDevice, GpuHealth
from rayscope.schema.status import ClusterStatus, ClusterTotals
from tests.scenarios import a100_worker

NODE = "4a" * 28
UUID = "GPU-00000001-5f1c-4d3e-9a7b-000000000000"


def node_with(gpu: GpuDevice) -> ClusterStatus:
    status = a100_worker(NODE, gpus=[gpu])
    return ClusterStatus(generated_at=0.0, view="head", cluster=ClusterTotals(), nodes={NODE: status})


def test_flags_name_each_problem_and_nothing_for_a_healthy_gpu() -> None:
    healthy = GpuDevice(
        index=0, health=GpuHealth(xid_errors=0, ecc_uncorrected_volatile=0, clock_throttle_reasons=0x1)
    )
    assert health_flags(healthy) == []  # idle clocks are no fault
    sick = GpuDevice(
        index=1,
        power_draw_mw=410_000,
        power_limit_mw=400_000,
        health=GpuHealth(
            xid_errors=2,
            last_xid=79,
            ecc_uncorrected_volatile=3,
            retired_pages_pending=True,
            remapped_rows_pending=True,
            row_remap_failure=True,
            clock_throttle_reasons=0x4 | 0x20 | 0x2,
        ),
    )
    assert health_flags(sick) == [
        "XID 79 (2 since start)",
        "3 uncorrected ECC errors",
        "retired pages pending (reset the GPU)",
        "row remap pending (reset the GPU)",
        "row remap failed",
        "throttled: sw_power_cap, sw_thermal",
        "power over limit",
    ]
    assert health_flags(GpuDevice(index=2, health=GpuHealth(lost=True))) == ["fallen off the bus"]
    assert throttle_names(0x48) == ["hw_slowdown", "hw_thermal"]


def test_health_metrics_use_dcgm_meanings_and_leave_unsupported_fields_out() -> None:
    gpu = GpuDevice(
        index=1,
        uuid=UUID,
        temperature_c=83,
        power_draw_mw=250_500,
        health=GpuHealth(
            xid_errors=1, last_xid=79, ecc_uncorrected_volatile=None, clock_throttle_reasons=0x48
        ),
    )
    text = metrics_text(node_with(gpu))
    labels = f'node_id="{NODE}",gpu="1",uuid="{UUID}"'
    assert f"rayscope_gpu_xid_errors_total{{{labels}}} 1" in text
    assert f"rayscope_gpu_last_xid{{{labels}}} 79" in text
    assert f"rayscope_gpu_clock_throttle_reasons{{{labels}}} 72" in text
    assert f"rayscope_gpu_temperature_celsius{{{labels}}} 83" in text
    assert f"rayscope_gpu_power_usage_watts{{{labels}}} 250.5" in text
    assert f"rayscope_gpu_lost{{{labels}}} 0" in text
    assert "rayscope_gpu_ecc_uncorrected_volatile_errors" not in text  # unsupported: absent, not 0
    assert "rayscope_gpu_power_limit_watts" not in text
