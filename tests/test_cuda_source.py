"""The CUDA sampler (agent/rayscope/sources/cuda/sample.py) against a fake ``libcuda.so.1`` (tests/fake_cuda):
its child finds the fake through ``LD_LIBRARY_PATH``, as it finds the real driver.

The fake logs every ``cuInit`` and context retain, so "never sampled" is asserted on the log,
not on the sampler's word. Its figures differ from the fake NVML's for the same GPU.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rayscope.sources.cuda import read as cuda_read
from rayscope.sources.cuda.sample import (
    DEFAULT_CONTEXT_COST_BYTES,
    CudaRequest,
    CudaSampler,
    cuda_child_env,
    refusal,
)
from tests import fake_cuda
from tests import fake_nvml as nvml
from tests.conftest import base_env, run_captured

GIB = 1024**3
MIB = 1024**2
UUID0, UUID1 = nvml.uuid(0), nvml.uuid(1)
PCI0, PCI1 = "00000000:01:00.0", "00000000:02:00.0"  # NVML's form
ROOMY = (20 * GIB,)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def cuda_lib(tmp_path_factory: pytest.TempPathFactory) -> fake_cuda.FakeCuda:
    return fake_cuda.build(tmp_path_factory.mktemp("fake-cuda"))


def sampler(
    lib: fake_cuda.FakeCuda,
    tmp_path: Path,
    scenario: str,
    *,
    clock: Clock | None = None,
    min_interval_s: float = 60.0,
    timeout_s: float = 10.0,
) -> tuple[CudaSampler, Path]:
    path = tmp_path / "cuda-scenario.txt"
    path.write_text(scenario)
    log = tmp_path / "cuda.log"
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(lib.lib_dir)}
    return (
        CudaSampler(
            min_interval_s,
            timeout_s,
            clock or Clock(),
            environ=environ,
            extra_env=lib.env(path, log),
        ),
        log,
    )


def request(uuid: str, **fields: object) -> CudaRequest:
    base: dict[str, object] = {"compute_mode": "default", "free_bytes_readings": ROOMY}
    return CudaRequest(uuid=uuid, **{**base, **fields})  # type: ignore[arg-type]


def two_gpus() -> str:
    return fake_cuda.two_gpus_reordered((UUID0, UUID1), ("0000:01:00.0", "0000:02:00.0"))


# --- the vGPU guest: CUDA's figure, not NVML's phantom ---------------------------------


def test_a_vgpu_guest_reads_cudas_figure(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    """NVML's phantom says 14.5 of 16 GiB used (1.5 GiB free, still room for a context); CUDA
    says 15.2 GiB free. The sample carries CUDA's, how it was matched, and its age."""
    nvml_free = int((16 - nvml.PHANTOM_USED_GIB) * GIB)
    cuda, log = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0))
    [sample] = cuda.sample([request(UUID0, free_bytes_readings=(nvml_free,))]).values()
    assert (sample.free_bytes, sample.total_bytes) == (fake_cuda.VGPU_FREE_BYTES, fake_cuda.VGPU_TOTAL_BYTES)
    assert sample.free_bytes != nvml_free  # not vacuous: the two sources differ
    assert (sample.matched_by, sample.cuda_index, sample.cuda_driver_version) == ("uuid", 0, 12040)
    assert sample.reason == "" and sample.age_s == 0.0 and sample.sampled_at == 1000.0
    assert sample.duration_s is not None and 0 < sample.duration_s < 10
    [(event, pid, *_), *rest] = fake_cuda.events(log)
    assert event == "init" and int(pid) != os.getpid()  # the context lived in a child, not here
    assert [e[0] for e in rest] == ["retain", "meminfo", "release"]


def test_this_process_never_loads_libcuda(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    cuda, _ = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0))
    cuda.sample([request(UUID0)])
    assert "libcuda" not in Path("/proc/self/maps").read_text()


# --- mapping CUDA's devices to NVML's --------------------------------------------------


def test_devices_are_matched_by_uuid_not_index(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    """CUDA lists the GPUs in the other order (its ordinal 0 is NVML's GPU1): each UUID gets
    its own device's figure. Matching by index would swap 23 and 11 GiB."""
    cuda, log = sampler(cuda_lib, tmp_path, two_gpus())
    got = cuda.sample([request(UUID0), request(UUID1)])
    assert (got[UUID0].free_bytes, got[UUID0].cuda_index) == (11 * GIB, 1)
    assert (got[UUID1].free_bytes, got[UUID1].cuda_index) == (23 * GIB, 0)
    assert fake_cuda.retained(log) == [1, 0]  # one child, both GPUs: requests' order


def test_only_the_gpus_asked_are_sampled(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    cuda, log = sampler(cuda_lib, tmp_path, two_gpus())
    assert list(cuda.sample([request(UUID1)])) == [UUID1]
    assert fake_cuda.retained(log) == [0]


def test_pci_bus_id_is_the_fallback_when_cuda_gives_no_uuid(
    cuda_lib: fake_cuda.FakeCuda, tmp_path: Path
) -> None:
    """A CUDA device whose UUID cannot be read is matched by NVML's PCI bus id (other form);
    a request whose UUID and bus id CUDA does not know is not sampled at all (not index 0)."""
    cuda, log = sampler(cuda_lib, tmp_path, two_gpus() + "dev1.error.uuid 801\n")
    stranger = nvml.uuid(7)
    got = cuda.sample([request(UUID0, pci_bus_id=PCI0), request(stranger, pci_bus_id="00000000:09:00.0")])
    assert (got[UUID0].free_bytes, got[UUID0].matched_by) == (11 * GIB, "pci_bus_id")
    assert got[stranger].free_bytes is None
    assert got[stranger].reason == "CUDA: no CUDA device with this UUID or PCI bus id (2 seen)"
    assert fake_cuda.retained(log) == [1]


def test_match_devices_rules() -> None:
    devices: list[dict[str, Any]] = [
        {"index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "pci_bus_id": "0000:01:00.0"},
        {"index": 1, "uuid": None, "pci_bus_id": "0000:02:00.0"},
        {"index": 2, "uuid": None, "pci_bus_id": "0000:03:00.0"},
        {"index": 3, "uuid": None, "pci_bus_id": "0000:03:00.0"},
    ]
    requests: list[dict[str, Any]] = [
        {"uuid": "MIG-AAAAAAAA-0000-0000-0000-000000000000", "pci_bus_id": None},  # prefix and case
        {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000", "pci_bus_id": "00000000:02:00.0"},
        {"uuid": "GPU-cccccccc-0000-0000-0000-000000000000", "pci_bus_id": "00000000:03:00.0"},
        {"uuid": "GPU-dddddddd-0000-0000-0000-000000000000", "pci_bus_id": "00000000:01:00.0"},
        {"uuid": "GPU-eeeeeeee-0000-0000-0000-000000000000", "pci_bus_id": None},
    ]
    matched = cuda_read.match_devices(requests, devices)
    assert list(matched.values()) == [
        (0, "uuid"),
        (1, "pci_bus_id"),
        (None, "PCI bus id shared by 2 CUDA devices and no UUID match"),
        (None, "CUDA device 0 has this PCI bus id but another UUID"),
        (None, "no CUDA device with this UUID or PCI bus id (4 seen)"),
    ]
    assert (
        cuda_read.normalise_pci("00000000:3B:00.0")
        == cuda_read.normalise_pci("0000:3b:00.0")
        == (0, 0x3B, 0, 0)
    )
    assert cuda_read.uuid_text(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


# --- how often -------------------------------------------------------------------------


def test_at_most_once_per_interval(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    """Within the interval the last sample comes back with its age and no child runs; at the
    interval a new one is taken."""
    clock = Clock()
    cuda, log = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0), clock=clock, min_interval_s=60)
    cuda.sample([request(UUID0)])
    clock.now += 59.5
    again = cuda.sample([request(UUID0)])[UUID0]
    assert (again.free_bytes, again.age_s, again.reason) == (fake_cuda.VGPU_FREE_BYTES, 59.5, "")
    assert fake_cuda.retained(log) == [0] and cuda.children_started == 1
    clock.now += 0.5
    fresh = cuda.sample([request(UUID0)])[UUID0]
    assert fresh.age_s == 0.0 and fresh.sampled_at == 1060.0
    assert fake_cuda.retained(log) == [0, 0] and cuda.children_started == 2


def test_a_failed_attempt_also_waits_for_the_interval(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    """A driver that fails is not asked again every cycle; the earlier figure is kept, with
    its age, beside the latest failure."""
    clock = Clock()
    cuda, _ = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0), clock=clock, min_interval_s=60)
    cuda.sample([request(UUID0)])
    (tmp_path / "cuda-scenario.txt").write_text(fake_cuda.vgpu_guest(UUID0) + "dev0.error.retain 2\n")
    clock.now += 60
    failed = cuda.sample([request(UUID0)])[UUID0]
    assert failed.reason == "CUDA: cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY"
    assert (failed.free_bytes, failed.age_s) == (fake_cuda.VGPU_FREE_BYTES, 60.0)
    clock.now += 30
    assert cuda.sample([request(UUID0)])[UUID0].reason == failed.reason
    assert cuda.children_started == 2


# --- when never --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["exclusive_process", "exclusive_thread", "prohibited", None, "unknown"])
def test_never_in_a_compute_mode_that_locks_others_out(
    cuda_lib: fake_cuda.FakeCuda, tmp_path: Path, mode: str | None
) -> None:
    """Exclusive process (MPS servers run so), exclusive thread, prohibited, or not known:
    no child starts, no cuInit, no context (the fake's log stays empty)."""
    cuda, log = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0))
    sample = cuda.sample([request(UUID0, compute_mode=mode)])[UUID0]
    assert sample.free_bytes is None and sample.reason.startswith("not sampled: compute mode ")
    assert fake_cuda.events(log) == [] and cuda.children_started == 0


def test_never_when_any_reading_leaves_no_room_for_a_context(
    cuda_lib: fake_cuda.FakeCuda, tmp_path: Path
) -> None:
    """One reading of 100 MiB free among roomier ones: the smallest counts. Positive control:
    the same GPU with only the roomy reading is sampled."""
    cuda, log = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0))
    tight = cuda.sample([request(UUID0, free_bytes_readings=(20 * GIB, 100 * MIB))])[UUID0]
    assert tight.reason == "not sampled: 100 MiB free, below the 1024 MiB a CUDA context takes"
    assert fake_cuda.events(log) == []
    assert cuda.sample([request(UUID0)])[UUID0].free_bytes == fake_cuda.VGPU_FREE_BYTES


def test_never_without_a_free_reading() -> None:
    why = refusal(CudaRequest(uuid=UUID0, compute_mode="default"), DEFAULT_CONTEXT_COST_BYTES)
    assert why == "not sampled: no free-memory reading to show room for a CUDA context"
    ok = CudaRequest(uuid=UUID0, compute_mode="default", free_bytes_readings=(DEFAULT_CONTEXT_COST_BYTES,))
    assert refusal(ok, DEFAULT_CONTEXT_COST_BYTES) is None  # exactly the cost: room enough


def test_a_refused_gpu_does_not_hold_up_the_others(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    cuda, log = sampler(cuda_lib, tmp_path, two_gpus())
    got = cuda.sample([request(UUID0, compute_mode="exclusive_process"), request(UUID1)])
    assert got[UUID0].free_bytes is None and got[UUID1].free_bytes == 23 * GIB
    assert fake_cuda.retained(log) == [0]  # CUDA's 0 is NVML's GPU1


# --- deadlines and failures -------------------------------------------------------------


def test_a_hung_cuinit_is_killed_at_the_deadline(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    cuda, log = sampler(cuda_lib, tmp_path, "hang 60\n" + fake_cuda.vgpu_guest(UUID0), timeout_s=2.0)
    started = time.monotonic()
    sample = cuda.sample([request(UUID0)])[UUID0]
    assert time.monotonic() - started < 8
    assert sample.reason == "CUDA sample timed out after 2 s (hung driver?): killed"
    [(event, pid)] = fake_cuda.events(log)
    assert event == "init" and not Path(f"/proc/{pid}").exists()  # killed and reaped


def test_a_hang_while_holding_a_context_is_killed(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    """Killed with its context held (retained, never released): the context dies with the
    child; the next sample, an interval later, starts afresh."""
    clock = Clock()
    scenario = "hang_meminfo 60\n" + fake_cuda.vgpu_guest(UUID0)
    cuda, log = sampler(cuda_lib, tmp_path, scenario, clock=clock, timeout_s=2.0)
    assert cuda.sample([request(UUID0)])[UUID0].reason.startswith("CUDA sample timed out after 2 s")
    assert [e[0] for e in fake_cuda.events(log)] == ["init", "retain", "meminfo"]
    (tmp_path / "cuda-scenario.txt").write_text(fake_cuda.vgpu_guest(UUID0))
    clock.now += 60
    assert cuda.sample([request(UUID0)])[UUID0].free_bytes == fake_cuda.VGPU_FREE_BYTES


def test_cuinit_failing_is_a_reason(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    cuda, _ = sampler(cuda_lib, tmp_path, "init 100\n" + fake_cuda.vgpu_guest(UUID0))
    assert cuda.sample([request(UUID0)])[UUID0].reason == "CUDA: cuInit: CUDA_ERROR_NO_DEVICE"


def test_no_cuda_library_is_a_reason(tmp_path: Path) -> None:
    """An empty ``libcuda.so.1`` first on the loader path: the search stops there, as on a
    host without the driver, whatever this host has."""
    empty = tmp_path / "no-cuda"
    empty.mkdir()
    (empty / fake_cuda.LIBRARY).write_bytes(b"")
    cuda = CudaSampler(60, 10, Clock(), environ={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(empty)})
    reason = cuda.sample([request(UUID0)])[UUID0].reason
    assert reason.startswith(f"CUDA: CUDA driver library ({empty / fake_cuda.LIBRARY}) not loadable:")


def test_the_childs_environment_is_cut(tmp_path: Path) -> None:
    """Ray's and the loader path's trusted elements pass (empty and relative ones do not:
    tests/test_library_trust.py); CUDA_VISIBLE_DEVICES (which would hide or renumber
    devices), PYTHON* and LD_PRELOAD do not; the caller's extra names are added."""
    environ = {
        "PATH": "/usr/bin",
        "RAY_TMPDIR": "/tmp/r",
        "LD_LIBRARY_PATH": f"{tmp_path}::lib",
        "LD_PRELOAD": "/tmp/evil.so",
        "PYTHONPATH": "/tmp",
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
    }
    assert cuda_child_env(environ, {"X": "1"}) == {
        "PATH": "/usr/bin",
        "RAY_TMPDIR": "/tmp/r",
        "LD_LIBRARY_PATH": str(tmp_path),
        "X": "1",
    }


# --- NVML's reading and CUDA's together, as the node agent will wire them -----------------

WIRED = """
import json, sys
import pynvml
from rayscope.sources.cuda import sample as cuda
from rayscope.core.gpu.trust import memory_used_reliable
from rayscope.sources.nvml import modes as nvml_modes

pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
errors = {}
mode = nvml_modes.virtualization_mode(handle, errors)
reliable, _ = memory_used_reliable(mode)
info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
uuid = pynvml.nvmlDeviceGetUUID(handle)
asked = cuda.CudaRequest(
    uuid=uuid,
    pci_bus_id=pynvml.nvmlDeviceGetPciInfo(handle).busId,
    compute_mode=nvml_modes.compute_mode(handle, errors),
    free_bytes_readings=(int(info.free),),
)
sampler = cuda.CudaSampler(60, 10, environ={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": sys.argv[1]},
                           extra_env=json.loads(sys.argv[2]))
got = sampler.sample([asked])[uuid]
print(json.dumps({"mode": mode, "reliable": reliable, "nvml_used": int(info.used),
                  "cuda_free": got.free_bytes, "reason": got.reason}))
"""


@pytest.mark.parametrize("scenario", ["vgpu_guest", "mps"])
def test_nvml_modes_decide_and_cuda_measures(
    fake_nvml_lib: nvml.FakeNvml, cuda_lib: fake_cuda.FakeCuda, tmp_path: Path, scenario: str
) -> None:
    """On the vGPU guest NVML's used figure is flagged unreliable and CUDA's free figure is
    read instead; on the MPS server (exclusive process) nothing is sampled: no cuInit."""
    nvml_path = tmp_path / "nvml.txt"
    nvml_path.write_text(nvml.vgpu_guest() if scenario == "vgpu_guest" else nvml.mps(1, (2, 3)))
    cuda_path, log = tmp_path / "cuda.txt", tmp_path / "cuda.log"
    cuda_path.write_text(fake_cuda.vgpu_guest(UUID0))
    done = run_captured(
        [sys.executable, "-c", WIRED, str(cuda_lib.lib_dir), json.dumps(cuda_lib.env(cuda_path, log))],
        env=fake_nvml_lib.env(base_env(), nvml_path),
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    if scenario == "vgpu_guest":
        assert (got["mode"], got["reliable"]) == ("vgpu_guest", False)
        assert got["nvml_used"] == int(nvml.PHANTOM_USED_GIB * GIB)
        assert (got["cuda_free"], got["reason"]) == (fake_cuda.VGPU_FREE_BYTES, "")
    else:
        assert (got["mode"], got["reliable"], got["cuda_free"]) == ("none", True, None)
        assert (
            got["reason"]
            == "not sampled: compute mode exclusive_process (a CUDA context could lock others out)"
        )
        assert fake_cuda.events(log) == []


def test_no_second_child_beside_one_that_would_not_die(cuda_lib: fake_cuda.FakeCuda, tmp_path: Path) -> None:
    """A killed child stuck in the driver (uninterruptible sleep: SIGKILL waits) is kept; no
    other starts until it has gone. The stuck child is stood in for by a live ``sleep``."""
    cuda, log = sampler(cuda_lib, tmp_path, fake_cuda.vgpu_guest(UUID0), min_interval_s=0)
    stuck = subprocess.Popen(["sleep", "60"], text=True)
    cuda._hung = stuck
    try:
        sample = cuda.sample([request(UUID0)])[UUID0]
        assert sample.reason == f"previous CUDA sample (pid {stuck.pid}) has not exited (hung driver?)"
        assert cuda.children_started == 0 and fake_cuda.events(log) == []
    finally:
        stuck.kill()
        stuck.wait(timeout=10)
    assert cuda.sample([request(UUID0)])[UUID0].free_bytes == fake_cuda.VGPU_FREE_BYTES
    assert cuda.children_started == 1
