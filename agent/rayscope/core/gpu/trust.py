"""The GPU trust rule: which used-memory figure rayscope believes, and why not.

One module, explicit cases. NVML's figure is believed where the GPU's virtualization mode
makes it the device's own (:func:`memory_used_reliable`, a table); on a vGPU guest a fresh CUDA
sample stands in for it; a GPU Ray's dashboard measured has no mode and is judged by its name
(:func:`named_vgpu`); a figure that is no measurement (no memory, or more used than there is:
:func:`not_a_figure`) is none, from every source. The node agent writes its verdict into its
report (:func:`settle_on_agent`); the head and the CLI judge a report with :func:`gpu_used` and
read a judged one with :func:`settled_used`. Which of a report and the dashboard a node shows
is :mod:`rayscope.core.gpu.precedence`'s rule, not this one.
"""

import re
from typing import NamedTuple, Optional

from msgspec.structs import replace

from rayscope.schema.dashboard import DASHBOARD_SOURCE
from rayscope.schema.report import UNSET, GpuDevice, known
from rayscope.units import size

_RELIABILITY: dict[Optional[str], tuple[bool, str]] = {
    "none": (True, "bare metal: NVML's used memory is the device's own"),
    "passthrough": (
        True,
        "pass-through: the VM owns the whole GPU and its driver reads the device as on bare metal",
    ),
    "vgpu_guest": (
        False,
        "vGPU guest: NVML's used memory comes from the vGPU manager, not the device, and can be"
        " stale or phantom (an idle A40-16C slice reads ~14.5 GiB used); only CUDA's cuMemGetInfo"
        " measures it",
    ),
    "host_vgpu": (
        True,
        "vGPU host: the physical GPU's figure; each running guest's whole vGPU framebuffer counts"
        " as used, and the guests' processes are not listed",
    ),
    "host_vsga": (
        True,
        "vSGA host: the physical GPU's figure; memory the guests' shared graphics use counts as"
        " used, and their processes are not listed",
    ),
    None: (True, "virtualization mode not reported by this driver: read as bare metal"),
}


def memory_used_reliable(virtualization_mode: Optional[str]) -> tuple[bool, str]:
    """Whether NVML's used memory for a GPU of this virtualization mode may be shown as
    measured, and the reason an operator reads.

    Reliable on bare metal and pass-through (the guest's driver owns the device). Not on a
    vGPU guest: there NVML asks the vGPU manager through the hypervisor instead of the
    device's allocator, and on time-sliced C-series profiles it latches stale or phantom
    values (BioEngine 0.16.1). Reliable on the hypervisor hosts (``host_vgpu``,
    ``host_vsga``): that driver reads its own allocator for the physical GPU; the figure is
    real but includes memory carved out for the guests, which the reason says. A driver that
    does not report the mode (``None``) predates vGPU's reporting and is read as before.
    A mode this rayscope has no name for (``unknown``, or any other string) is not
    reliable: nothing is guessed about it.
    """
    return _RELIABILITY.get(
        virtualization_mode,
        (False, "virtualization mode unknown to this rayscope (a newer driver): not trusted as measured"),
    )


NOT_TRUSTED = "NVML used not trusted"
"""The words every reason and line uses where NVML's used figure is not the device's."""

VGPU_PROFILE = re.compile(r"-(?:[0-9]+-)?[0-9]+[ABCQ]$")
"""The end of the name NVML gives a vGPU guest's device: its vGPU type, the board then the
framebuffer in GB and the series letter (``GRID P40-2B``, ``GRID V100-8Q``, ``NVIDIA
A40-16C``; MIG-backed ``NVIDIA A100-3-20C``). No bare-metal board name ends so
(``Tesla V100-SXM2-16GB`` ends in ``GB``)."""


def named_vgpu(name: Optional[str]) -> str:
    """For a GPU whose virtualization mode is not known (Ray's dashboard does not carry it):
    ``""`` when its name is a bare-metal board's; else the reason its NVML used figure is not
    trusted, judged by the vGPU type in its name (:data:`VGPU_PROFILE`). A guest whose type
    name lacks the suffix is not caught: only an agent on the node reads the mode."""
    if name is None or not VGPU_PROFILE.search(name):
        return ""
    return f"vGPU profile in the name ({name}): {NOT_TRUSTED}"


def untrusted_label(virtualization_mode: Optional[str], name: Optional[str] = None) -> str:
    """``vGPU`` (a vGPU guest, or a GPU named as one: :func:`named_vgpu`) or ``unknown
    device``: what the status line says NVML's used figure is not trusted on."""
    vgpu = virtualization_mode == "vgpu_guest" or (virtualization_mode is None and named_vgpu(name))
    return "vGPU" if vgpu else "unknown device"


_TRUSTED_MODES = frozenset(mode for mode, (trusted, _) in _RELIABILITY.items() if trusted)


def nvml_trusted(gpu: GpuDevice) -> bool:
    """Whether NVML's figures for ``gpu`` (its used memory, its processes' memory) are the
    device's own (:func:`memory_used_reliable` of its virtualization mode; a dashboard's GPU
    without a mode: unless named as a vGPU, :func:`named_vgpu`). Every line of every GPU
    node asks it: a set lookup."""
    mode = gpu.virtualization_mode
    if mode is UNSET:
        return NOT_TRUSTED not in (known(gpu.memory_used_reason) or "")
    return mode in _TRUSTED_MODES


def _untrusted_reason(virtualization_mode: Optional[str]) -> str:
    kind = "vGPU guest" if virtualization_mode == "vgpu_guest" else "virtualization mode unknown"
    return f"{kind}: {NOT_TRUSTED}"


class GpuUsed(NamedTuple):
    """One GPU's used memory as the rollup judges it."""

    used_bytes: Optional[int]
    """The figure rayscope trusts (``GpuDevice.memory_used_bytes``); ``None``: none."""
    source: Optional[str]
    """``nvml``, ``cuda`` or ``ray-dashboard``; ``None`` with ``used_bytes``."""
    age_s: Optional[float]
    """Age of the figure when the report was collected (0 for NVML, read then; a dashboard
    figure's age when the rollup took it)."""
    reason: str
    """Why ``used_bytes`` is ``None`` although NVML answered; ``""`` otherwise."""
    nvml_used_bytes: Optional[int]
    """NVML's raw used figure, trusted or not."""


def not_a_figure(total_bytes: Optional[int], used_bytes: int) -> str:
    """Why a GPU's used figure, from any source (an agent's NVML or CUDA, this host's NVML,
    Ray's dashboard), is no measurement: the GPU has no memory, or more is used than it has;
    ``""`` when it may be one (or the total is unknown)."""
    if total_bytes is None:
        return ""
    if total_bytes == 0:
        return "no memory: a total of 0 MB is no GPU's, not a measurement"
    if used_bytes > total_bytes:
        return f"used {size(used_bytes)} above its total {size(total_bytes)}: not a measurement"
    return ""


def gpu_used(gpu: GpuDevice) -> GpuUsed:
    """One GPU's trusted used figure (none where :func:`not_a_figure` says it is no
    measurement), its source, age and reason, and NVML's raw figure."""
    verdict = _judged(gpu)
    why = "" if verdict.used_bytes is None else not_a_figure(gpu.memory_total_bytes, verdict.used_bytes)
    return GpuUsed(None, None, None, why, verdict.nvml_used_bytes) if why else verdict


def _judged(gpu: GpuDevice) -> GpuUsed:
    """One GPU's trusted used figure, its source, age and reason, and NVML's raw figure.

    The one place the report's per-GPU trust enters the rollup. A ``cuda`` figure is the
    agent's fresh sample (:func:`settle_on_agent` judged its age), a ``ray-dashboard`` one Ray's
    dashboard's (``rayscope.core.gpu.precedence`` judged it); NVML's is trusted only where
    :func:`memory_used_reliable` says so for the GPU's virtualization mode, whatever the report
    claims. A report of an agent older than the mode fields carries NVML's figure in
    ``memory_used_bytes`` and no mode: read as NVML's, at age 0.
    """
    used, source = gpu.memory_used_bytes, known(gpu.memory_used_source)
    raw, reason = known(gpu.nvml_memory_used_bytes), known(gpu.memory_used_reason) or ""
    if source is None and raw is None and not reason:
        raw, source = used, "nvml"  # an agent older than the mode fields: memory_used_bytes is NVML's own
    mode = known(gpu.virtualization_mode)
    reliable = memory_used_reliable(mode)[0]
    age = known(gpu.memory_used_age_s) or 0.0
    if not reliable and source == "cuda" and used is not None:
        return GpuUsed(used, "cuda", age, "", raw)  # a fresh CUDA sample stands in for NVML's
    if reliable and mode is None and source == DASHBOARD_SOURCE and used is not None:
        return GpuUsed(used, DASHBOARD_SOURCE, age, "", raw)  # the dashboard's: precedence judged it
    if not reliable:  # every such reason says so (rayscope.core.gpu.settled reads it)
        why = reason if NOT_TRUSTED in reason else "; ".join(filter(None, (_untrusted_reason(mode), reason)))
        return GpuUsed(None, None, None, why, raw)
    if used is not None and source == "nvml":
        return GpuUsed(used, "nvml", 0.0, "", raw)
    # No figure on a trusted device: a reason saying "not trusted" of a reported mode is no verdict.
    return GpuUsed(None, None, None, "" if mode is not None and NOT_TRUSTED in reason else reason, raw)


def settled_used(gpu: GpuDevice) -> GpuUsed:
    """A settled GPU's used figure as its fields say it (``rayscope.core.gpu.settled`` wrote
    :func:`gpu_used`'s verdict there): no rule, a reading. A figure without a source is
    NVML's, at age 0 (an agent older than the mode fields sent it so)."""
    used, source = gpu.memory_used_bytes, known(gpu.memory_used_source)
    raw, reason = known(gpu.nvml_memory_used_bytes), known(gpu.memory_used_reason) or ""
    if used is None or (source is None and (raw is not None or reason)):
        return GpuUsed(None, None, None, reason, raw)
    if source is None:
        return GpuUsed(used, "nvml", 0.0, "", used)
    return GpuUsed(used, source, known(gpu.memory_used_age_s) or 0.0, "", raw)


class CudaFigure(NamedTuple):
    """A GPU's latest CUDA sample as the node agent has it (``rayscope.sources.cuda.sample``)."""

    used_bytes: Optional[int]
    """``cuMemGetInfo_v2``'s total − free (the sampler's own context included); ``None``: none."""
    age_s: Optional[float]
    """Its age now; ``None`` without a figure."""
    reason: str
    """Why the latest attempt gave none (``""`` when it did)."""


CUDA_OFF = "no CUDA sample: RAYSCOPE_CUDA_SAMPLE_S not set on the agent"
"""Why a GPU whose NVML figure is not trusted has none: nobody asked for CUDA samples."""


def _cuda_why(cuda: Optional[CudaFigure], max_age_s: float) -> str:
    if cuda is None:
        return CUDA_OFF
    if cuda.used_bytes is not None and cuda.age_s is not None:
        stale = f"CUDA sample {cuda.age_s:.0f}s old (fresh for {max_age_s:.0f}s)"
        return f"{stale}; {cuda.reason}" if cuda.reason else stale
    return f"CUDA: {cuda.reason or 'no sample'}"


def settle_on_agent(
    gpu: GpuDevice,
    cuda: Optional[CudaFigure] = None,
    max_age_s: float = 0.0,
    parent_mode: Optional[str] = None,
) -> GpuDevice:
    """``gpu`` as NVML read it (``nvml_memory_used_bytes`` set), with the used figure the agent
    trusts written into ``memory_used_bytes`` and its source, age and reason: NVML's where
    :func:`memory_used_reliable` says so; else CUDA's while ``cuda`` is at most ``max_age_s``
    old; else ``None`` and why. A MIG instance is judged by its GPU's mode (``parent_mode``)
    and never sampled."""
    raw = known(gpu.nvml_memory_used_bytes)
    mode = known(gpu.virtualization_mode) if parent_mode is None else parent_mode
    migs = [settle_on_agent(m, None, max_age_s, mode or "none") for m in gpu.mig_devices]
    if memory_used_reliable(mode)[0]:
        known_raw = raw is not None
        return replace(
            gpu,
            memory_used_bytes=raw,
            memory_used_source="nvml" if known_raw else UNSET,
            memory_used_age_s=0.0 if known_raw else UNSET,
            memory_used_reason=UNSET,
            mig_devices=migs,
        )
    fresh = cuda is not None and cuda.age_s is not None and cuda.age_s <= max_age_s
    if cuda is not None and fresh and cuda.used_bytes is not None and cuda.age_s is not None:
        return replace(
            gpu,
            memory_used_bytes=cuda.used_bytes,
            memory_used_source="cuda",
            memory_used_age_s=round(cuda.age_s, 1),
            memory_used_reason=UNSET,
            mig_devices=migs,
        )
    why = "CUDA samples whole GPUs only" if parent_mode is not None else _cuda_why(cuda, max_age_s)
    return replace(
        gpu,
        memory_used_bytes=None,
        memory_used_source=UNSET,
        memory_used_age_s=UNSET,
        memory_used_reason=f"{_untrusted_reason(mode)}; {why}",
        mig_devices=migs,
    )
