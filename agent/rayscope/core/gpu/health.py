"""Whether a GPU needs an operator, from what NVML reported (:class:`GpuHealth`). Pure.

One flag per problem, in the operator's words; a field NVML did not support is absent and
raises no flag. Clock reasons that are not a fault (idle, application clocks, sync boost,
display) raise none either.
"""

from rayscope.schema.report import GpuDevice

# NVML clock event reason bits that mean the GPU is held back (nvmlClocksEventReason*).
THROTTLE_FAULTS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def throttle_names(reasons: int) -> list[str]:
    """The fault bits of a clock event reason mask, by name."""
    return [name for bit, name in THROTTLE_FAULTS.items() if reasons & bit]


def health_flags(gpu: GpuDevice) -> list[str]:
    """``["fallen off the bus"]``, ``["XID 79 (2 since start)", "3 uncorrected ECC errors"]``:
    what is wrong with this GPU; ``[]`` when nothing NVML reported is."""
    health = gpu.health
    if health is None:
        return []
    if health.lost:
        return ["fallen off the bus"]
    flags = []
    if health.xid_errors:
        flags.append(f"XID {health.last_xid} ({health.xid_errors} since start)")
    if health.ecc_uncorrected_volatile:
        flags.append(f"{health.ecc_uncorrected_volatile} uncorrected ECC errors")
    if health.retired_pages_pending:
        flags.append("retired pages pending (reset the GPU)")
    if health.remapped_rows_pending:
        flags.append("row remap pending (reset the GPU)")
    if health.row_remap_failure:
        flags.append("row remap failed")
    throttled = throttle_names(health.clock_throttle_reasons or 0)
    if throttled:
        flags.append("throttled: " + ", ".join(throttled))
    if gpu.power_draw_mw is not None and gpu.power_limit_mw and gpu.power_draw_mw > gpu.power_limit_mw:
        flags.append("power over limit")
    return flags
