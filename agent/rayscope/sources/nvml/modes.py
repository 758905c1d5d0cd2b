"""What kind of device NVML talks to: virtualization mode, compute mode, MPS clients.

Reads through the real ``pynvml`` binding, one GPU handle at a time, in the convention of
:mod:`rayscope.sources.nvml.devices`: a read that fails becomes ``None`` plus the reason in that GPU's
``errors`` dict; a driver that does not have the query (Not Supported, Function Not Found,
or a pynvml too old to name it) leaves the field absent (``None``) with no error, never a
guess. Values are bounded strings, never NVML's raw codes.

Why it matters: on an NVIDIA vGPU guest, NVML's ``memory used`` is what the vGPU
manager hands the guest, not a measurement. BioEngine found an idle A40-16C time-sliced slice
reporting about 14.5 GiB used of 16 GiB (a fixed phantom offset; the total stays right).
This source only reports the mode; whether NVML's used figure may be shown as measured in
that mode is the pure trust rule's to say
(:func:`rayscope.core.gpu.trust.memory_used_reliable`, which the agent and the head apply).

Command line equivalent: ``nvidia-smi -q`` (``GPU Virtualization Mode``, ``Compute Mode``)
and ``nvidia-smi --query-compute-apps`` on an MPS server (the clients appear in the MPS list).
"""

from typing import Any, Optional

import pynvml

from rayscope.sources.nvml.calls import ABSENT, newest_list, query
from rayscope.sources.nvml.calls import text as _text

__all__ = [
    "COMPUTE_MODES",
    "UNKNOWN",
    "VIRTUALIZATION_MODES",
    "compute_mode",
    "mps_processes",
    "virtualization_mode",
]

VIRTUALIZATION_MODES: dict[int, str] = {
    pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE: "none",
    pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH: "passthrough",
    pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU: "vgpu_guest",
    pynvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU: "host_vgpu",
    pynvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA: "host_vsga",
}
"""NVML's ``nvmlGpuVirtualizationMode_t`` → the name rayscope reports. ``none`` is bare
metal; ``vgpu_guest`` a VM on a vGPU (NVML's ``VGPU``); ``host_vgpu``/``host_vsga`` the
hypervisor host serving vGPU or vSGA guests."""

COMPUTE_MODES: dict[int, str] = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}
"""NVML's ``nvmlComputeMode_t`` → the name rayscope reports. ``exclusive_process``: one
process (or one MPS server) may hold a context; ``prohibited``: none may. ``exclusive_thread``
is gone from current drivers but still a value."""

UNKNOWN = "unknown"
"""A mode NVML reported with a code this rayscope has no name for."""

MPS_LIST_VERSIONS = (3, 2)
"""The MPS process-list calls, newest first (same struct as the compute list; ``_v3`` on
drivers >= 510, ``_v2`` before)."""


def _named(errors: dict[str, str], name: str, code: Optional[int], names: dict[int, str]) -> Optional[str]:
    """A code read from NVML as its bounded name. A code this rayscope does not know (a newer
    driver's) is :data:`UNKNOWN`, the code kept in ``errors``: the driver said something, so
    it is not absent, and it is never passed on raw."""
    if code is None:
        return None
    known = names.get(int(code))
    if known is None:
        errors[name] = f"unknown value {int(code)} (driver newer than this rayscope)"
        return UNKNOWN
    return known


def virtualization_mode(handle: Any, errors: dict[str, str]) -> Optional[str]:
    """``none``, ``passthrough``, ``vgpu_guest``, ``host_vgpu``, ``host_vsga`` (or
    :data:`UNKNOWN`), from
    ``nvmlDeviceGetVirtualizationMode``; ``None`` when the driver does not say (error, if
    any, under ``errors["virtualization_mode"]``)."""
    code = query(
        errors,
        "virtualization_mode",
        lambda: int(pynvml.nvmlDeviceGetVirtualizationMode(handle)),
        quiet=ABSENT,
    )
    return _named(errors, "virtualization_mode", code, VIRTUALIZATION_MODES)


def compute_mode(handle: Any, errors: dict[str, str]) -> Optional[str]:
    """``default``, ``exclusive_thread``, ``prohibited``, ``exclusive_process`` (or
    :data:`UNKNOWN`), from
    ``nvmlDeviceGetComputeMode``; ``None`` when the driver does not say (error, if any, under
    ``errors["compute_mode"]``)."""
    code = query(errors, "compute_mode", lambda: int(pynvml.nvmlDeviceGetComputeMode(handle)), quiet=ABSENT)
    return _named(errors, "compute_mode", code, COMPUTE_MODES)


def mps_processes(handle: Any, errors: dict[str, str]) -> tuple[Optional[list[Any]], Optional[int]]:
    """The MPS clients on this GPU (``nvmlDeviceGetMPSComputeRunningProcesses_v3``, ``_v2`` on
    older drivers) and the call version that answered.

    Entries are pynvml's (``pid``, ``usedGpuMemory`` (``None`` when not available),
    ``gpuInstanceId``, ``computeInstanceId``), the same shape as the compute list's, so
    :func:`rayscope.sources.nvml.devices.merge_processes` takes them. ``[]``: the call answered and no
    MPS client runs (the answer on every GPU without MPS). ``(None, None)``: the driver has no
    such call or it is Not Supported (quiet), or it failed (``errors["mps_processes"]``).
    """
    try:
        return newest_list(handle, "nvmlDeviceGetMPSComputeRunningProcesses", MPS_LIST_VERSIONS)
    except pynvml.NVMLError as err:
        if err.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
            errors["mps_processes"] = _text(err)
        return None, None
