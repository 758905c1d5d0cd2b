"""The node agent's CUDA samples: which GPUs to ask CUDA about, and each GPU's trusted used
figure from NVML's reading and CUDA's.

Off unless asked: ``RAYSCOPE_CUDA_SAMPLE_S`` in the node agent's environment (``rayscope
push``, or the head's Ray-placed agents) is the seconds between two samples of one GPU. Even
then only GPUs whose NVML used figure is not trusted (a vGPU guest,
:func:`rayscope.core.gpu.trust.memory_used_reliable`) are sampled, and never one the sampler refuses
(exclusive or prohibited compute mode, less free memory by any reading than a context costs:
:func:`rayscope.sources.cuda.sample.refusal`). A sample replaces NVML's figure while it is at most
:data:`FRESH_INTERVALS` sampling intervals old (:func:`rayscope.core.gpu.trust.settle_on_agent`).
"""

import math
from collections.abc import Mapping, Sequence
from typing import Optional

from rayscope.core.gpu.trust import CudaFigure, nvml_trusted, settle_on_agent
from rayscope.errors import EXIT_USAGE, AgentError
from rayscope.schema.report import GpuDevice, SourceStatus, known
from rayscope.sources.cuda.sample import CudaRequest, CudaSample, CudaSampler
from rayscope.units import parse_amount

INTERVAL_ENV = "RAYSCOPE_CUDA_SAMPLE_S"
MIN_INTERVAL_S = 10.0
"""The shortest interval taken: each sample creates a CUDA context (device memory, a GPU
process for its life); more often than this is not a conservative cadence."""
FRESH_INTERVALS = 2.0
"""A sample stands in for NVML's figure while at most this many intervals old: one failed or
refused attempt in between keeps the figure, a second one drops it."""


def interval_from_env(environ: Mapping[str, str]) -> Optional[float]:
    """The sampling interval asked for, or ``None`` (off: unset, empty, ``0`` or ``off``); a
    value that is no duration of at least :data:`MIN_INTERVAL_S` is an :class:`AgentError`."""
    text = environ.get(INTERVAL_ENV, "").strip()
    if text in ("", "0", "off"):
        return None
    try:
        value = parse_amount(text, INTERVAL_ENV)
    except ValueError:
        value = math.nan
    if not MIN_INTERVAL_S <= value <= 86_400:
        raise AgentError(
            f"{INTERVAL_ENV}={text!r}: seconds between CUDA samples, {MIN_INTERVAL_S:g} to 86400"
            " (or 0 / off)",
            EXIT_USAGE,
        )
    return value


class CudaSamples:
    """The agent's sampler and what it last read per GPU (its free figure is a reading too)."""

    def __init__(self, sampler: CudaSampler) -> None:
        self.sampler = sampler
        self.max_age_s = FRESH_INTERVALS * sampler.min_interval_s
        self._free: dict[str, int] = {}  # uuid -> CUDA's latest free bytes

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Optional["CudaSamples"]:
        interval = interval_from_env(environ)
        return None if interval is None else cls(CudaSampler(min_interval_s=interval, environ=environ))

    def request(self, gpu: GpuDevice) -> Optional[CudaRequest]:
        """What to ask about ``gpu``; ``None``: its NVML figure is trusted, or it has no UUID."""
        if nvml_trusted(gpu) or not gpu.uuid:
            return None
        readings = [self._free[gpu.uuid]] if gpu.uuid in self._free else []
        raw = known(gpu.nvml_memory_used_bytes)
        if gpu.memory_total_bytes is not None and raw is not None:
            readings.append(max(0, gpu.memory_total_bytes - raw - (gpu.memory_reserved_bytes or 0)))
        return CudaRequest(
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            compute_mode=known(gpu.compute_mode),
            free_bytes_readings=tuple(readings),
        )

    def sample(self, gpus: Sequence[GpuDevice]) -> tuple[dict[str, CudaFigure], Optional[SourceStatus]]:
        """The latest figure per UUID of every GPU that needs one, and the ``cuda`` source's
        status (``None`` when no GPU needs one)."""
        requests = [r for r in map(self.request, gpus) if r is not None]
        if not requests:
            return {}, None
        samples = self.sampler.sample(requests)
        figures = {uuid: self._figure(uuid, s) for uuid, s in samples.items()}
        failed = [f.reason for f in figures.values() if f.used_bytes is None]
        took = [s.duration_s for s in samples.values() if s.duration_s is not None]
        detail = f"{len(requests)} GPU(s), every {self.sampler.min_interval_s:g} s"
        detail += f", last sample {max(took) * 1000:.0f} ms" if took else ""
        status = SourceStatus(name="cuda", ok=not failed, reason=failed[0] if failed else "", detail=detail)
        return figures, status

    def _figure(self, uuid: str, sample: CudaSample) -> CudaFigure:
        if sample.free_bytes is None or sample.total_bytes is None:
            return CudaFigure(None, None, sample.reason)
        self._free[uuid] = sample.free_bytes
        return CudaFigure(max(0, sample.total_bytes - sample.free_bytes), sample.age_s, sample.reason)


def settle_on_agent_all(
    gpus: Optional[Sequence[GpuDevice]], samples: Optional[CudaSamples]
) -> tuple[Optional[list[GpuDevice]], list[SourceStatus]]:
    """Every GPU with its trusted used figure written in (:func:`rayscope.core.gpu.trust.settle_on_agent`),
    sampling CUDA first where ``samples`` is on; the ``cuda`` source's status, if it ran."""
    if gpus is None:
        return None, []
    if samples is None:
        return [settle_on_agent(g) for g in gpus], []
    figures, status = samples.sample(gpus)
    unmatched = CudaFigure(None, None, "no UUID to match a CUDA device by")
    settled = [settle_on_agent(g, figures.get(g.uuid or "", unmatched), samples.max_age_s) for g in gpus]
    return settled, [status] if status is not None else []
