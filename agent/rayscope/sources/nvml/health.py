"""A GPU's health as NVML gives it: XID events (watched from the agent's start), ECC,
pending page retirements and row remaps, throttling, fallen off the bus. A field a GPU does
not support is absent (``None``), never 0 (``rayscope.core.gpu.health`` judges them)."""

import ctypes
from typing import Any, Callable, Optional

import pynvml

from rayscope.schema.report import GpuHealth
from rayscope.sources.nvml.calls import LIBRARY_TOO_OLD, GpuLost, query


def _address(handle: Any) -> Optional[int]:
    return ctypes.cast(handle, ctypes.c_void_p).value


MAX_EVENTS_PER_READ = 10_000
"""XID events taken per read at most: a storm of events never stalls a read."""


class XidWatch:
    """XID events, watched from the first read on (one NVML event set per process): NVML
    delivers each event once, so the counts are "since this agent started watching"."""

    def __init__(self) -> None:
        self._event_set: Any = None
        self._watched: dict[Optional[int], int] = {}  # handle address -> GPU index
        self._xids: dict[int, list[int]] = {}  # GPU index -> XID codes seen

    def watch(self, index: int, handle: Any) -> bool:
        """Register the GPU for XID events once; whether its events are being watched."""
        address = _address(handle)
        if address in self._watched:
            return True
        try:
            if self._event_set is None:
                self._event_set = pynvml.nvmlEventSetCreate()
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
        except (pynvml.NVMLError, LIBRARY_TOO_OLD):
            return False
        self._watched[address] = index
        self._xids.setdefault(index, [])
        return True

    def drain(self) -> None:
        """Every XID event waiting, without blocking (timeout 0)."""
        if self._event_set is None:
            return
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, 0)
            except (pynvml.NVMLError, LIBRARY_TOO_OLD):
                return  # NVML_ERROR_TIMEOUT: nothing more waiting
            index = self._watched.get(_address(data.device))
            if index is not None and data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                self._xids[index].append(int(data.eventData))

    def seen(self, index: int) -> list[int]:
        return self._xids.get(index, [])


XIDS = XidWatch()
"""This process's watch (NVML allows one event set per process to be useful here)."""


def _throttle_reasons(handle: Any) -> Optional[int]:
    """Clock event reasons, newest call first (``...ThrottleReasons`` on older drivers)."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        call: Optional[Callable[[Any], Any]] = getattr(pynvml, name, None)
        if call is None:
            continue

        def read(call: Callable[[Any], Any] = call) -> int:
            return int(call(handle))

        value = query(None, "clock_throttle_reasons", read, lost=True)
        if value is not None:
            return value
    return None


def read_health(index: int, handle: Any, xids: XidWatch = XIDS) -> GpuHealth:
    """XID events, ECC, pending retirements and remaps, throttling; lost when NVML says so."""
    # No errors dict: a field this GPU does not support (most consumer GPUs have no ECC or row
    # remapping) is absent, not an error on every row; only a lost GPU ends the read.
    try:
        watching = xids.watch(index, handle)
        xids.drain()
        ecc = query(
            None,
            "ecc_uncorrected_volatile",
            lambda: int(
                pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            ),
            lost=True,
        )
        retired = query(
            None,
            "retired_pages_pending",
            lambda: bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
            lost=True,
        )
        remapped = query(None, "remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(handle), lost=True)
        throttle = _throttle_reasons(handle)
    except GpuLost:
        return GpuHealth(lost=True)
    seen = xids.seen(index) if watching else None
    return GpuHealth(
        xid_errors=None if seen is None else len(seen),
        last_xid=seen[-1] if seen else None,
        ecc_uncorrected_volatile=ecc,
        retired_pages_pending=retired,
        remapped_rows_pending=None if remapped is None else bool(remapped[2]),
        row_remap_failure=None if remapped is None else bool(remapped[3]),
        clock_throttle_reasons=throttle,
    )
