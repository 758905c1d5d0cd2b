"""Device-wide free and total GPU memory as CUDA reports it (``cuMemGetInfo_v2``).

The reliable figure where NVML's is not (a vGPU guest, :mod:`rayscope.sources.nvml.modes`).
Reading it costs something NVML's does not: ``cuMemGetInfo`` needs a CUDA context on the
device, and a context holds device memory (a primary context is typically some hundreds of
MiB on recent GPUs) and makes its process a GPU user while it lives. So:

* the read runs in a short-lived child process (:mod:`rayscope.sources.cuda.read`), which
  creates the context, reads, releases it and exits; the agent itself never loads libcuda.
  The child is isolated as the GCS read's is (``python -I``, working directory ``/``, the
  environment of :func:`rayscope.sources.trust.child_env`), plus the trusted elements of
  ``LD_LIBRARY_PATH`` (as where the driver is mounted under /usr/local/nvidia); it loads
  ``libcuda.so.1`` by the absolute path this process resolved from trusted directories only
  (:mod:`rayscope.sources.libraries`); no ``CUDA_VISIBLE_DEVICES``: it sees every device and
  picks the asked ones by UUID;
* it is killed at a deadline; a child the kernel cannot kill (stuck in the driver) is
  remembered, and no other starts while it lives;
* :class:`CudaSampler` samples only the GPUs asked for, each at most once per
  ``min_interval_s``, and never one whose free memory (by any reading the caller has) is
  below the cost of a context, nor one whose compute mode lets a context lock out other
  processes (exclusive process or thread) or forbids it (prohibited), nor one whose compute
  mode is unknown.

The free figure is CUDA's while the sampler's own context lives: it is lower than the free
memory without the sampler by that context's size. Failures are data (a reason), never raised.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Callable, Optional

import msgspec

from rayscope.net import peer_json
from rayscope.schema.report import Amount, Count
from rayscope.sources import libraries, trust
from rayscope.sources.cuda import read as cuda_read
from rayscope.units import MIB, seconds

LIBRARY = "libcuda.so.1"
DEFAULT_CONTEXT_COST_BYTES = 1024 * MIB
"""What one CUDA primary context is taken to cost in device memory until it is measured on
the GPU at hand (``python -m tests.tools.measure_cuda_context``). Published figures for a primary
context with no modules run from ~107 MiB (RTX 4060 Ti) to ~555 MiB (RTX PRO 6000 Blackwell)
and grow with the SM count; 1 GiB leaves a margin for the largest GPUs. It only decides
whether a GPU is sampled at all: a GPU with less free than this is skipped."""
DEFAULT_MIN_INTERVAL_S = 60.0
DEFAULT_TIMEOUT_S = 10.0
"""A child's whole life: interpreter start (~30 ms), cuInit (up to seconds on a large node
without persistence mode), one context per asked GPU."""
KILL_WAIT_S = 1.0
"""How long a killed child is waited for before it is remembered as hung."""
MAX_REASON = 200

SAMPLING_REFUSED = ("exclusive_process", "exclusive_thread", "prohibited")
"""Compute modes a sample is never taken in: an exclusive mode lets our context lock out the
process that should own the GPU while it lives (a replica starting then fails); prohibited
forbids contexts."""


class CudaRequest(msgspec.Struct, kw_only=True, frozen=True):
    """One GPU to sample, as the caller knows it from NVML."""

    uuid: str
    """NVML's UUID (``GPU-...``, or ``MIG-...`` for a MIG instance): the key of the answer."""
    pci_bus_id: Optional[str] = None
    """NVML's PCI bus id: matched only when CUDA does not answer with the UUID."""
    compute_mode: Optional[str] = None
    """:func:`rayscope.sources.nvml.modes.compute_mode`'s reading; ``None``: unknown (refused)."""
    free_bytes_readings: tuple[int, ...] = ()
    """Every free-memory figure the caller has for this GPU (NVML's total − used − reserved,
    a fresh CUDA sample's ...). The smallest must leave room for a context; none: refused."""


class CudaSample(msgspec.Struct, kw_only=True, gc=False):
    """The latest CUDA reading of one GPU, and why the latest attempt gave none, if it did not.

    The figures are those of the last successful read (kept while later attempts fail or are
    refused); ``age_s`` says how old they are, and a consumer uses them only while fresh.
    """

    uuid: str
    """NVML's UUID of the GPU (the request's)."""
    free_bytes: Optional[Count] = None
    """``cuMemGetInfo_v2``'s free bytes, device-wide, while the sampler's own context lived
    (so lower by that context's size than without it)."""
    total_bytes: Optional[Count] = None
    """``cuMemGetInfo_v2``'s total bytes."""
    sampled_at: Optional[Amount] = None
    """When the child that read the figures started, on the sampler's clock (monotonic,
    local to this host: never compared across hosts)."""
    age_s: Optional[Amount] = None
    """Seconds since ``sampled_at`` when :meth:`CudaSampler.sample` returned."""
    duration_s: Optional[Amount] = None
    """Wall time of the child that read the figures: start to exit."""
    cuda_driver_version: Optional[Count] = None
    """``cuDriverGetVersion``: 12040 is CUDA 12.4."""
    cuda_index: Optional[Count] = None
    """CUDA's ordinal of the device (CUDA's order, not NVML's: for diagnostics only)."""
    matched_by: Optional[str] = None
    """``uuid`` or ``pci_bus_id``: how the CUDA device was matched to NVML's."""
    reason: str = ""
    """Why the latest attempt gave no figure (refused, failed, timed out, not due yet after a
    failure); ``""`` when it did."""


def refusal(request: CudaRequest, context_cost_bytes: int) -> Optional[str]:
    """Why ``request``'s GPU must not be sampled now, in the operator's words; ``None``: it may."""
    if request.compute_mode in SAMPLING_REFUSED:
        return f"not sampled: compute mode {request.compute_mode} (a CUDA context could lock others out)"
    if request.compute_mode != "default":
        return "not sampled: compute mode unknown (a CUDA context could lock others out)"
    if not request.free_bytes_readings:
        return "not sampled: no free-memory reading to show room for a CUDA context"
    free = min(request.free_bytes_readings)
    if free < context_cost_bytes:
        return (
            f"not sampled: {free / MIB:.0f} MiB free, below the {context_cost_bytes / MIB:.0f} MiB"
            " a CUDA context takes"
        )
    return None


def cuda_child_env(environ: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: :func:`trust.child_env`'s names, ``LD_LIBRARY_PATH`` cut to
    its trusted elements (:func:`libraries.child_search_path`: where ``libcuda.so.1`` and its
    own dependencies may live, as in containers that mount the driver under
    /usr/local/nvidia; never an empty, relative or another user's element), then ``extra``
    as given by the caller. No ``CUDA_*`` (``CUDA_VISIBLE_DEVICES`` would hide or renumber
    devices)."""
    env = trust.child_env(environ)
    search = libraries.child_search_path(environ)
    if search:
        env["LD_LIBRARY_PATH"] = search
    env.update(extra)
    return env


class _ChildSample(msgspec.Struct):
    free_bytes: Optional[Count] = None
    total_bytes: Optional[Count] = None
    cuda_index: Optional[Count] = None
    matched_by: Optional[str] = None
    error: Optional[str] = None


class _ChildAnswer(msgspec.Struct):
    ok: bool
    error: str = ""
    driver_version: Optional[Count] = None
    samples: dict[str, _ChildSample] = {}


_ANSWER = peer_json.Decoder(_ChildAnswer)
"""The child's stdout: a process under a driver that may misbehave (nesting bounded)."""


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


class CudaSampler:
    """Takes CUDA samples in a child process, at most once per ``min_interval_s`` per GPU.

    ``clock`` (monotonic seconds) times the interval and the ages; the child's deadline is
    wall time (``timeout_s``). Not thread-safe: one caller (the node agent's collect loop).
    """

    def __init__(
        self,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        context_cost_bytes: int = DEFAULT_CONTEXT_COST_BYTES,
        python: Optional[str] = None,
        library: str = LIBRARY,
        environ: Optional[Mapping[str, str]] = None,
        extra_env: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.context_cost_bytes = context_cost_bytes
        self.python = python or sys.executable
        self.library = library
        self.environ = os.environ if environ is None else environ
        self.extra_env = dict(extra_env or {})
        self._last: dict[str, CudaSample] = {}  # uuid -> latest outcome (figures of the last success)
        self._attempted_at: dict[str, float] = {}  # uuid -> clock of the last child that read it
        self._attempt_reason: dict[str, str] = {}  # uuid -> that child's failure ("" on success)
        self._hung: Optional[subprocess.Popen[str]] = None
        self.children_started = 0
        """How many children this sampler has started (each one created contexts)."""

    def sample(self, requests: Sequence[CudaRequest]) -> dict[str, CudaSample]:
        """The latest sample of each requested GPU, by NVML UUID, with its age; a child runs
        for those that are due and not refused. Never raises."""
        now = self.clock()
        due: list[CudaRequest] = []
        for request in requests:
            why = refusal(request, self.context_cost_bytes)
            if why is not None:
                self._note(request.uuid, why)
                continue
            last_at = self._attempted_at.get(request.uuid)
            if last_at is None or now - last_at >= self.min_interval_s:
                due.append(request)
            else:  # not due: the last child's outcome stands (not a refusal since)
                self._note(request.uuid, self._attempt_reason.get(request.uuid, ""))
        if due:
            self._run(due, now)
        answer = {}
        returned_at = self.clock()
        for request in requests:
            last = self._last.get(request.uuid) or CudaSample(uuid=request.uuid, reason="not sampled yet")
            age = None if last.sampled_at is None else max(0.0, returned_at - last.sampled_at)
            answer[request.uuid] = msgspec.structs.replace(last, age_s=age)
        return answer

    def library_path(self) -> str:
        """The library the child loads: its trusted absolute path in the loader's order
        (:func:`libraries.resolve` over this sampler's environment), else the name as given
        (the child's own search then reaches only trusted directories and ``/``)."""
        return libraries.resolve(self.library, self.environ).path or self.library

    def _note(self, uuid: str, reason: str) -> None:
        """Keep the last figures, replace the reason."""
        last = self._last.get(uuid) or CudaSample(uuid=uuid)
        self._last[uuid] = msgspec.structs.replace(last, reason=_short(reason))

    def _failed(self, uuid: str, reason: str) -> None:
        self._attempt_reason[uuid] = _short(reason)
        self._note(uuid, reason)

    def _run(self, due: list[CudaRequest], now: float) -> None:
        if self._hung is not None:
            if self._hung.poll() is None:
                for request in due:
                    self._note(
                        request.uuid,
                        f"previous CUDA sample (pid {self._hung.pid}) has not exited (hung driver?)",
                    )
                return
            self._hung = None
        for request in due:
            self._attempted_at[request.uuid] = now
        started = time.monotonic()
        answer, failure = self._child(due)
        duration = time.monotonic() - started
        if answer is None:
            for request in due:
                self._failed(request.uuid, failure)
            return
        for request in due:
            got = answer.samples.get(request.uuid)
            if got is None or got.error is not None or got.free_bytes is None or got.total_bytes is None:
                why = got.error if got is not None and got.error else "no answer for this GPU"
                self._failed(request.uuid, f"CUDA: {why}")
                continue
            self._attempt_reason[request.uuid] = ""
            self._last[request.uuid] = CudaSample(
                uuid=request.uuid,
                free_bytes=got.free_bytes,
                total_bytes=got.total_bytes,
                sampled_at=now,
                duration_s=duration,
                cuda_driver_version=answer.driver_version,
                cuda_index=got.cuda_index,
                matched_by=got.matched_by,
            )

    def _child(self, due: list[CudaRequest]) -> tuple[Optional[_ChildAnswer], str]:
        """Run one child over ``due``: (its answer, "") or (None, why not)."""
        wanted = [{"uuid": r.uuid, "pci_bus_id": r.pci_bus_id} for r in due]
        source = cuda_read.__loader__.get_source(cuda_read.__name__)  # type: ignore[union-attr]
        try:
            child = subprocess.Popen(  # isolated (SECURITY.md rule 1): -I, cwd /, a cut environment
                [self.python, "-I", "-c", source, self.library_path(), json.dumps(wanted)],
                cwd="/",
                env=cuda_child_env(self.environ, self.extra_env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as err:
            return None, f"cannot run {self.python} for the CUDA sample: {err.strerror}"
        self.children_started += 1
        try:
            stdout, stderr = child.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            try:
                child.communicate(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                self._hung = child
            return None, f"CUDA sample timed out after {seconds(self.timeout_s)} s (hung driver?): killed"
        try:
            answer = _ANSWER.decode(stdout)
        except peer_json.PeerJsonError:
            said = stderr.strip().splitlines()
            return None, _short(
                f"CUDA sample failed: {said[-1] if said else f'exit code {child.returncode}'}"
            )
        if not answer.ok:
            return None, _short(f"CUDA: {answer.error}")
        return answer, ""
