"""GPUs as the NVIDIA driver reports them, through NVML (the real ``pynvml`` binding).

Owns pynvml: every ``NVMLError`` becomes data. A missing library or driver becomes the
source's status with a reason; one failed field of one GPU becomes ``None`` plus an entry
in that GPU's ``errors``; one lost GPU degrades its own row only. NVML is initialised once
per process and shut down at exit.

Command line equivalent: ``nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,
utilization.gpu,driver_version --format=csv``.
"""

import atexit
import contextlib
import threading
from typing import Any, Callable, Optional, TypeVar

import pynvml

from agent.model import GpuDevice, SourceStatus

T = TypeVar("T")

_lock = threading.Lock()
_init_error: Optional[str] = None
_initialised = False

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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shutdown() -> None:
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


def ensure_init() -> Optional[str]:
    """Initialise NVML once per process; the reason it failed, or ``None``."""
    global _initialised, _init_error
    with _lock:
        if not _initialised:
            _initialised = True
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                _init_error = reason_for(err)
            except OSError as err:  # a library that exists but cannot load
                _init_error = f"NVML library failed to load: {err}"
            else:
                atexit.register(_shutdown)
        return _init_error


def _field(errors: dict[str, str], name: str, read: Callable[[], T]) -> Optional[T]:
    """One field of one GPU: its value, or ``None`` with the reason kept in ``errors``."""
    try:
        return read()
    except pynvml.NVMLError as err:
        errors[name] = _text(err)
        return None


def _memory(handle: Any, errors: dict[str, str]) -> tuple[Optional[int], Optional[int], Optional[int]]:
    """(total, used, API version): v2 counts reserved memory apart (drivers ≥ 510), v1 where
    the driver or library lacks v2."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return int(info.total), int(info.used), 2
    except pynvml.NVMLError:
        pass
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), 1
    except pynvml.NVMLError as err:
        errors["memory"] = _text(err)
        return None, None, None


def read_device(index: int) -> GpuDevice:
    """One GPU; a GPU NVML cannot reach is a row with only its index and the reason."""
    errors: dict[str, str] = {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as err:
        return GpuDevice(index=index, errors={"device": _text(err)})
    total, used, version = _memory(handle, errors)
    util = _field(errors, "utilization_gpu_pct", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    return GpuDevice(
        index=index,
        name=_field(errors, "name", lambda: _text(pynvml.nvmlDeviceGetName(handle))),
        uuid=_field(errors, "uuid", lambda: _text(pynvml.nvmlDeviceGetUUID(handle))),
        memory_total_bytes=total,
        memory_used_bytes=used,
        memory_info_version=version,
        utilization_gpu_pct=None if util is None else int(util),
        errors=errors,
    )


def read_gpus() -> tuple[Optional[str], Optional[list[GpuDevice]], SourceStatus]:
    """(driver version, GPUs, status). GPUs are ``None`` when NVML did not answer."""
    failure = ensure_init()
    if failure is not None:
        return None, None, SourceStatus(name="nvml", ok=False, reason=failure)
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return None, None, SourceStatus(name="nvml", ok=False, reason=reason_for(err))
    driver = _field({}, "driver", lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
    gpus = [read_device(i) for i in range(count)]
    versions = sorted({g.memory_info_version for g in gpus if g.memory_info_version})
    detail = f"{count} GPU(s)" + (f", memory info v{'/v'.join(map(str, versions))}" if versions else "")
    return driver, gpus, SourceStatus(name="nvml", ok=True, detail=detail)
