"""GPUs as the NVIDIA driver reports them, through NVML (the real ``pynvml`` binding).

Owns pynvml: every ``NVMLError`` becomes data. A missing library or driver, or a library
that does not match the loaded kernel driver, becomes the source's status with a hint; one
failed field of one GPU becomes ``None`` plus an entry in that GPU's ``errors``; one lost GPU
degrades its own row only. NVML is initialised once per process and shut down at exit; a
failed initialisation is retried with capped exponential backoff (an agent started before
the driver loaded picks it up later). :func:`read_gpus_within` runs the read in a worker
thread under a deadline: a hung driver call becomes a timed-out source, and the thread is
abandoned (no second one starts while it still hangs).

Command line equivalent: ``nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,
memory.used,memory.reserved,utilization.gpu,temperature.gpu,power.draw,enforced.power.limit,
mig.mode.current,driver_version --format=csv`` and ``nvidia-smi --query-compute-apps=pid,
used_memory`` (graphics processes too). MIG instances are read as devices of their own. A
GPU's health (XID, ECC, remapping, throttling) is :mod:`rayscope.sources.nvml.health`; what kind
of device it is (virtualization and compute mode, MPS clients) :mod:`rayscope.sources.nvml.modes`.
"""

import atexit
import contextlib
import threading
import time
from typing import Any, Callable, Optional

import pynvml

from rayscope import errors
from rayscope.schema.report import UNSET, GpuDevice, GpuHealth, GpuProcess, SourceStatus
from rayscope.sources import libraries
from rayscope.sources.nvml import modes as nvml_modes
from rayscope.sources.nvml.calls import newest_list, query
from rayscope.sources.nvml.calls import text as _text
from rayscope.sources.nvml.health import read_health
from rayscope.units import seconds

LIBRARY = "libnvidia-ml.so.1"
INIT_RETRY_START_S = 1.0
INIT_RETRY_MAX_S = 60.0
"""A failed ``nvmlInit`` is tried again after 1, 2, 4 ... 60 s (each collection before that
answers with the last reason, at no cost)."""
TIMEOUT_S = 5.0
"""Default deadline of one collection (every GPU, every field)."""

# NVML return codes → what an operator should read (and do).
_REASONS: dict[int, str] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this node"
    ),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded (is the nvidia kernel module in?)",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "driver/library version mismatch: libnvidia-ml differs from the loaded kernel"
        " driver (reload the nvidia module or reboot after a driver update)"
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to query NVML (check /dev/nvidia* access)",
}


def reason_for(err: "pynvml.NVMLError") -> str:
    """The operator's reading of an NVML error."""
    return _REASONS.get(err.value, f"NVML error: {err}")


def _init() -> Optional[str]:
    """``nvmlInit``, pynvml's library first loaded from a trusted path
    (:mod:`rayscope.sources.libraries`; pynvml itself would load it by name, the working
    directory included): the reason it failed, or ``None``."""
    try:
        with pynvml.libLoadLock:
            if pynvml.nvmlLib is None:
                try:
                    pynvml.nvmlLib = libraries.load(LIBRARY)
                except OSError:  # read as pynvml reads a library that does not load
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from None
        pynvml.nvmlInit()
    except libraries.NotFound as err:
        return f"{_REASONS[pynvml.NVML_ERROR_LIBRARY_NOT_FOUND]} (refused {err})"
    except pynvml.NVMLError as err:
        return reason_for(err)
    except OSError as err:  # a library that exists but cannot load
        return f"NVML library failed to load: {err}"
    return None


def _shutdown() -> None:
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


class NvmlInit:
    """NVML initialised once per process, shut down at exit; a failed ``nvmlInit`` is tried
    again with capped exponential backoff (an agent started before the driver loaded picks
    it up later), each call before then answering with the last reason at no cost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: Optional[str] = None
        self._done = False
        self._next_at = 0.0  # monotonic clock: no nvmlInit before this after a failure
        self._retry_s = 0.0

    def ensure(self, clock: Callable[[], float] = time.monotonic) -> Optional[str]:
        """The reason NVML cannot be used now, or ``None`` once it is initialised."""
        with self._lock:
            if self._done:
                return None
            now = clock()
            if self._error is not None and now < self._next_at:
                return self._error
            self._error = _init()
            if self._error is None:
                self._done = True
                atexit.register(_shutdown)
                return None
            self._retry_s = min(INIT_RETRY_MAX_S, max(INIT_RETRY_START_S, 2 * self._retry_s))
            self._next_at = now + self._retry_s
            return self._error


INIT = NvmlInit()
"""This process's NVML (nvmlInit counts per process)."""


def _memory(
    handle: Any, errors: dict[str, str]
) -> tuple[Optional[int], Optional[int], Optional[int], Optional[int]]:
    """(total, used, reserved, API version): v2 counts reserved memory apart (drivers ≥ 510),
    v1 where the driver or library lacks v2 (then reserved is unknown and part of used)."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return int(info.total), int(info.used), int(info.reserved), 2
    except pynvml.NVMLError:
        pass
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), None, 1
    except pynvml.NVMLError as err:
        errors["memory"] = _text(err)
        return None, None, None, None


def _mig_mode(handle: Any, errors: dict[str, str]) -> Optional[bool]:
    """Current MIG mode. A GPU without MIG support answers Not Supported: that is "off",
    quietly, not an error on every consumer GPU's row."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as err:
        if err.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return False
        errors["mig_enabled"] = _text(err)
        return None
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _used_memory(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def merge_processes(
    compute: list[Any], graphics: list[Any], mps: Optional[list[Any]] = None
) -> list[GpuProcess]:
    """One entry per pid from NVML's compute, graphics and MPS client lists, by pid.

    A pid in several lists (nvidia-smi's ``C+G``) holds one memory context: the larger figure
    is kept, not the sum. Under MPS the compute list shows the server and the MPS list the
    clients (the Ray actors), so attribution finds them there.
    """
    merged: dict[int, GpuProcess] = {}
    for kind, entries in (("compute", compute), ("graphics", graphics), ("mps", mps or [])):
        for entry in entries:
            pid = int(entry.pid)
            used = _used_memory(getattr(entry, "usedGpuMemory", None))
            known = merged.get(pid)
            if known is None:
                merged[pid] = GpuProcess(
                    pid=pid,
                    used_memory_bytes=used,
                    kinds=[kind],
                    gpu_instance_id=_instance_id(getattr(entry, "gpuInstanceId", None)),
                    compute_instance_id=_instance_id(getattr(entry, "computeInstanceId", None)),
                )
                continue
            known.kinds.append(kind)
            if used is not None:
                known.used_memory_bytes = max(used, known.used_memory_bytes or 0)
    return sorted(merged.values(), key=lambda p: p.pid)


def _instance_id(value: Any) -> Optional[int]:
    """NVML writes 0xFFFFFFFF for "no MIG instance"."""
    if value is None or int(value) == 0xFFFFFFFF:
        return None
    return int(value)


PROCESS_LIST_VERSIONS = (3, 2)
"""The process-list calls pynvml offers, newest first. ``_v3`` needs a driver >= 510.39;
R450/R470 drivers export only ``_v2`` (same struct), and nvidia-ml-py 13's unversioned call
is ``_v3``: without the fallback every GPU's process list there comes back empty."""


def _process_list(
    handle: Any, kind: str, errors: dict[str, str]
) -> tuple[Optional[list[Any]], Optional[int]]:
    """One NVML process list (``Compute`` or ``Graphics``) through the newest call version
    this driver exports: (entries, version that answered); ``(None, None)`` on failure."""
    field = f"{kind.lower()}_processes"
    try:
        entries, version = newest_list(handle, f"nvmlDeviceGet{kind}RunningProcesses", PROCESS_LIST_VERSIONS)
    except pynvml.NVMLError as err:
        errors[field] = _text(err)
        return None, None
    if entries is None:
        errors[field] = "Function Not Found (no process-list call version this driver exports)"
    return entries, version


def _processes(
    handle: Any, errors: dict[str, str]
) -> tuple[Optional[list[GpuProcess]], Optional[int], Optional[bool]]:
    """Compute, graphics and MPS client processes, the call version that answered (``None``
    only when neither compute nor graphics list could be read), and whether MPS clients are
    listed (``None``: the driver has no MPS list).

    Graphics lists are Not Supported on many datacenter GPUs: that is quiet, not an error.
    """
    mps, _ = nvml_modes.mps_processes(handle, errors)
    compute, version = _process_list(handle, "Compute", errors)
    graphics_errors: dict[str, str] = {}
    graphics, graphics_version = _process_list(handle, "Graphics", graphics_errors)
    if graphics is None and graphics_errors["graphics_processes"] != "Not Supported":
        errors.update(graphics_errors)
    serving = None if mps is None else bool(mps)
    if compute is None and graphics is None:
        return None, None, serving
    return merge_processes(compute or [], graphics or [], mps), version or graphics_version, serving


def _shared_fields(handle: Any, errors: dict[str, str]) -> dict[str, Any]:
    """What a GPU and a MIG instance both report, each for itself: name, uuid, memory
    (v2, v1 fallback) and utilization."""
    total, used, reserved, version = _memory(handle, errors)
    util = query(errors, "utilization_gpu_pct", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    return {
        "name": query(errors, "name", lambda: _text(pynvml.nvmlDeviceGetName(handle))),
        "uuid": query(errors, "uuid", lambda: _text(pynvml.nvmlDeviceGetUUID(handle))),
        "memory_total_bytes": total,
        "memory_used_bytes": used,  # trusted only once core.gpu.trust.settle_on_agent judged it
        "nvml_memory_used_bytes": UNSET if used is None else used,
        "memory_reserved_bytes": reserved,
        "memory_info_version": version,
        "utilization_gpu_pct": None if util is None else int(util),
    }


def _read_mig_device(parent_index: int, mig_index: int, handle: Any) -> GpuDevice:
    """One MIG instance as a device of its own (memory, utilization and processes are its own;
    temperature and power are the physical GPU's and are read there)."""
    errors: dict[str, str] = {}
    processes, version, mps = _processes(handle, errors)
    return GpuDevice(
        index=mig_index,
        parent_index=parent_index,
        **_shared_fields(handle, errors),
        gpu_instance_id=query(
            errors, "gpu_instance_id", lambda: int(pynvml.nvmlDeviceGetGpuInstanceId(handle))
        ),
        compute_instance_id=query(
            errors, "compute_instance_id", lambda: int(pynvml.nvmlDeviceGetComputeInstanceId(handle))
        ),
        processes=processes,
        process_list_version=version,
        mps_serving=UNSET if mps is None else mps,
        errors=errors,
    )


def _mig_devices(index: int, handle: Any, errors: dict[str, str]) -> list[GpuDevice]:
    """The MIG instances that exist on a MIG-enabled GPU (empty slots answer Not Found)."""
    slots = query(errors, "mig_devices", lambda: int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)))
    devices = []
    for slot in range(slots or 0):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError as err:
            if err.value != pynvml.NVML_ERROR_NOT_FOUND:
                devices.append(GpuDevice(index=slot, parent_index=index, errors={"device": _text(err)}))
            continue
        devices.append(_read_mig_device(index, slot, mig))
    return devices


def read_device(index: int) -> GpuDevice:
    """One GPU; a GPU NVML cannot reach is a row with only its index and the reason."""
    errors: dict[str, str] = {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as err:
        lost = GpuHealth(lost=True) if err.value == pynvml.NVML_ERROR_GPU_IS_LOST else None
        return GpuDevice(index=index, errors={"device": _text(err)}, health=lost)
    mig = _mig_mode(handle, errors)
    # On a MIG GPU the processes are listed on its instances, not twice.
    processes, version, mps = (None, None, None) if mig else _processes(handle, errors)
    virtualization = nvml_modes.virtualization_mode(handle, errors)
    compute = nvml_modes.compute_mode(handle, errors)
    return GpuDevice(
        index=index,
        **_shared_fields(handle, errors),
        pci_bus_id=query(errors, "pci_bus_id", lambda: _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)),
        temperature_c=query(
            errors,
            "temperature_c",
            lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        ),
        power_draw_mw=query(errors, "power_draw_mw", lambda: int(pynvml.nvmlDeviceGetPowerUsage(handle))),
        power_limit_mw=query(
            errors, "power_limit_mw", lambda: int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        ),
        mig_enabled=mig,
        mig_devices=_mig_devices(index, handle, errors) if mig else [],
        processes=processes,
        process_list_version=version,
        health=read_health(index, handle),
        virtualization_mode=UNSET if virtualization is None else virtualization,
        compute_mode=UNSET if compute is None else compute,
        mps_serving=UNSET if mps is None else mps,
        errors=errors,
    )


def read_gpus() -> tuple[Optional[str], Optional[list[GpuDevice]], SourceStatus]:
    """(driver version, GPUs, status). GPUs are ``None`` when NVML did not answer."""
    failure = INIT.ensure()
    if failure is not None:
        return None, None, SourceStatus(name="nvml", ok=False, reason=failure)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return None, None, SourceStatus(name="nvml", ok=False, reason=reason_for(err))
    driver = query(None, "driver", lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
    gpus = [read_device(i) for i in range(count)]
    versions = sorted({g.memory_info_version for g in gpus if g.memory_info_version})
    detail = f"{count} GPU(s)" + (f", memory info v{'/v'.join(map(str, versions))}" if versions else "")
    leaves = [d for g in gpus for d in (g.mig_devices or [g])]
    lists = sorted({d.process_list_version for d in leaves if d.process_list_version})
    detail += f", process list v{'/v'.join(map(str, lists))}" if lists else ""
    return driver, gpus, SourceStatus(name="nvml", ok=True, detail=detail)


Read = tuple[Optional[str], Optional[list[GpuDevice]], SourceStatus]


class BoundedRead:
    """:func:`read_gpus` in a worker thread with a deadline; never blocks much longer.

    A read that overruns is abandoned (a daemon thread stuck in the driver cannot be
    stopped) and reported as a timed-out source; until it returns, later calls say so at
    once instead of starting another thread to hang beside it.
    """

    def __init__(self, read: Callable[[], Read] = read_gpus) -> None:
        self._read = read
        self._hung: Optional[tuple[threading.Thread, float]] = None  # a read that overran, since when

    def __call__(self, timeout_s: float = TIMEOUT_S) -> Read:
        if self._hung is not None:
            thread, since = self._hung
            if thread.is_alive():
                waited = time.monotonic() - since
                reason = f"timed out: an NVML call has not returned for {waited:.0f} s (hung driver?)"
                return None, None, SourceStatus(name="nvml", ok=False, reason=reason)
            self._hung = None
        box: list[Read] = []
        thread = errors.Worker(lambda: box.append(self._read()), "rayscope-nvml")
        started = time.monotonic()
        thread.start()
        thread.join(timeout_s)
        if box:
            return box[0]
        if thread.error is not None:  # a bug of ours: the source's failure, not a traceback
            return (
                None,
                None,
                SourceStatus(
                    name="nvml", ok=False, reason=f"failed: {type(thread.error).__name__}: {thread.error}"
                ),
            )
        self._hung = (thread, started)
        reason = f"timed out after {seconds(timeout_s)} s: an NVML call did not return (hung driver?)"
        return None, None, SourceStatus(name="nvml", ok=False, reason=reason)


read_gpus_within = BoundedRead()
"""This process's bounded NVML read: ``read_gpus_within(timeout_s)``."""
