"""NVML through the real pynvml binding and a fake ``libnvidia-ml.so.1``: named scenarios,
each asserting the exact lines ``rayscope node --gpus`` prints for them.

The scenarios run without a Ray cluster (``--gcs`` names a closed port), so bookings read
``NA``; the live attribution test (test_live_gpus.py) adds the actor table.
"""

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import fake_nvml as fake
from tests.conftest import base_env, run_rayscope
from tests.schemas import parsed
from tests.support.ports import refused_port

NO_DRIVER = "  NVML: NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this node"
MISMATCH = (
    "  NVML: driver/library version mismatch: libnvidia-ml differs from the loaded kernel driver"
    " (reload the nvidia module or reboot after a driver update)"
)
CONTAINER = (
    "  PROCS: not mapped to Ray: rayscope runs in its own pid namespace (a container) and NVML"
    " reports the host's pids (run rayscope on the host, or the container with --pid=host)"
)


def run_node(
    lib: fake.FakeNvml, scenario: str, tmp_path: Path, *args: str, prefix: tuple[str, ...] = ()
) -> "subprocess.CompletedProcess[str]":
    path = tmp_path / "scenario.txt"
    path.write_text(scenario)
    env = lib.env(base_env(RAY_AUTH_MODE="disabled"), path)
    command = ["node", "--gpus", "--gcs", f"127.0.0.1:{refused_port()}", *args]
    return run_rayscope(*command, env=env, prefix=prefix)


def gpu_block(stdout: str) -> list[str]:
    """From ``GPUs:`` up to the host line, then the notes of sources that did not answer
    about GPUs (the raylet and GCS lines depend on what else runs on this host)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPUs:"))
    end = next(i for i, line in enumerate(lines) if line.startswith("Host "))
    notes = [line for line in lines[end:] if line.startswith(("  NVML:", "  PROCS:"))]
    return lines[start:end] + notes


def node_gpu_lines(lib: fake.FakeNvml, scenario: str, tmp_path: Path) -> list[str]:
    done = run_node(lib, scenario, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return gpu_block(done.stdout)


def test_no_driver(tmp_path: Path) -> None:
    """No loadable libnvidia-ml.so.1 (hidden even on a host that has a driver): the source's
    status says so."""
    env = fake.no_driver(tmp_path / "no-driver").env(base_env(RAY_AUTH_MODE="disabled"), tmp_path / "unused")
    done = run_rayscope("node", "--gpus", "--gcs", f"127.0.0.1:{refused_port()}", env=env)
    assert done.returncode == 0, done.stderr
    assert gpu_block(done.stdout) == ["GPUs: NA", NO_DRIVER]


def test_zero_gpus(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    assert node_gpu_lines(fake_nvml_lib, fake.zero_gpus(), tmp_path) == ["GPUs: 0 (driver 550.54.14)"]


def test_two_gpus_with_processes(fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path) -> None:
    """A process outside Ray is ``unbooked``; a pid this host does not know is ``not mapped``;
    a pid in both the compute and the graphics list counts once."""
    assert node_gpu_lines(fake_nvml_lib, fake.two_gpus(sleeper), tmp_path) == [
        "GPUs: 2 (driver 550.54.14)",
        "  GPU0 NVIDIA GeForce RTX 3090  booked NA  used 7.0 GB  util 87%",
        "    bus 00000000:01:00.0  temp 61 C  power 245/350 W  memory 7.0/24.0 GB, 0.3 GB reserved (v2)",
        f"    pid {fake.NO_SUCH_PID} booked NA used 0.5 GB  not mapped",
        f"    pid {sleeper} sleep booked nothing used 1.2 GB  unbooked",
        "  GPU1 NVIDIA GeForce RTX 3090  booked NA  used 0.0 GB  util 0%",
        "    bus 00000000:02:00.0  temp 61 C  power 21/350 W  memory 0.0/24.0 GB, 0.3 GB reserved (v2)",
        "  all GPUs: booked NA  actors use NA GB  unbooked 1.2 GB  not mapped 0.5 GB",
    ]


def test_two_gpus_json_carries_processes_and_attribution(
    fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path
) -> None:
    done = run_node(fake_nvml_lib, fake.two_gpus(sleeper), tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    diag: dict[str, Any] = parsed(done.stdout, "node")
    gpu0 = diag["gpus"][0]
    assert gpu0["uuid"] == "GPU-00000000-5f1c-4d3e-9a7b-000000000000"
    assert gpu0["pci_bus_id"] == "00000000:01:00.0"
    assert gpu0["memory_reserved_bytes"] == int(0.3 * fake.GIB) and gpu0["memory_info_version"] == 2
    assert (gpu0["temperature_c"], gpu0["power_draw_mw"], gpu0["power_limit_mw"]) == (61, 245_000, 350_000)
    assert gpu0["mig_enabled"] is False and gpu0["errors"] == {}
    by_pid = {p["pid"]: p for p in gpu0["processes"]}
    assert by_pid[sleeper] == {
        "pid": sleeper,
        "used_memory_bytes": int(1.2 * fake.GIB),
        "kinds": ["compute", "graphics"],
        "gpu_instance_id": None,
        "compute_instance_id": None,
    }
    users = {tuple(u["pids"]): u for u in gpu0["attribution"]["users"]}
    assert users[(sleeper,)]["flags"] == ["unbooked"] and users[(sleeper,)]["kind"] == "process"
    assert users[(fake.NO_SUCH_PID,)]["flags"] == ["not_mapped"]
    assert gpu0["attribution"]["unbooked_bytes"] == int(1.2 * fake.GIB)
    assert gpu0["attribution"]["booked_vram_mb"] is None  # the actor table was not read
    assert diag["attribution"]["actors_read"] is False and diag["attribution"]["processes_mapped"] is True
    mine = next(p for p in diag["processes"] if p["pid"] == sleeper)
    assert mine["name"] == "sleep" and mine["worker_pid"] is None
    sources = {s["name"]: s for s in diag["sources"]}
    assert sources["nvml"] == {
        "name": "nvml",
        "ok": True,
        "reason": "",
        "detail": "2 GPU(s), memory info v2, process list v3",
    }
    assert sources["procs"]["ok"]


@pytest.fixture(scope="module")
def r470_nvml(tmp_path_factory: pytest.TempPathFactory) -> fake.FakeNvml:
    """The fake built as an R470 driver's library: no ``_v3`` process lists, no memory v2."""
    return fake.build(tmp_path_factory.mktemp("fake-nvml-r470"), era="r470")


def test_an_r470_driver_lists_the_same_processes_through_v2(
    fake_nvml_lib: fake.FakeNvml, r470_nvml: fake.FakeNvml, sleeper: int, tmp_path: Path
) -> None:
    """The same GPUs and processes under a current and an R470-era library: processes and
    attribution come out the same; the call version that answered is named (3, then 2).
    Positive control: calling only pynvml's default (``_v3``) leaves R470's lists empty
    (``processes`` null, a Function Not Found error on every GPU)."""
    docs = []
    for lib in (fake_nvml_lib, r470_nvml):
        done = run_node(lib, fake.two_gpus(sleeper), tmp_path, "--json")
        assert done.returncode == 0, done.stderr
        docs.append(parsed(done.stdout, "node"))
    current, old = docs
    for new_gpu, old_gpu in zip(current["gpus"], old["gpus"]):
        assert old_gpu["processes"] == new_gpu["processes"]
        assert old_gpu["attribution"] == new_gpu["attribution"]
        assert "compute_processes" not in old_gpu["errors"]
    assert [g["process_list_version"] for g in current["gpus"]] == [3, 3]
    assert [g["process_list_version"] for g in old["gpus"]] == [2, 2]
    assert [g["memory_info_version"] for g in old["gpus"]] == [1, 1]  # R470 has no memory v2 either
    assert current["gpus"][0]["processes"]  # not vacuous: the sleeper and a stranger are listed
    old_nvml = next(s for s in old["sources"] if s["name"] == "nvml")
    assert old_nvml["detail"] == "2 GPU(s), memory info v1, process list v2"


def test_plain_node_keeps_its_one_line_per_gpu(
    fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path
) -> None:
    path = tmp_path / "scenario.txt"
    path.write_text(fake.two_gpus(sleeper))
    env = fake_nvml_lib.env(base_env(RAY_AUTH_MODE="disabled"), path)
    done = run_rayscope("node", "--gcs", f"127.0.0.1:{refused_port()}", env=env)
    assert gpu_block(done.stdout) == [
        "GPUs: 2 (driver 550.54.14)",
        "  GPU0 NVIDIA GeForce RTX 3090  used 7.0/24.0 GB  util 87%",
        "  GPU1 NVIDIA GeForce RTX 3090  used 0.0/24.0 GB  util 0%",
    ]


def test_one_gpu_lost(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    """The lost GPU degrades its own row only, flagged unhealthy: fallen off the bus."""
    assert node_gpu_lines(fake_nvml_lib, fake.gpu_lost(), tmp_path) == [
        "GPUs: 2 (driver 550.54.14)",
        "  GPU0 NVIDIA GeForce RTX 3090  booked NA  used 5.8 GB  util 87%",
        "    bus 00000000:01:00.0  temp 61 C  power 245/350 W  memory 5.8/24.0 GB, 0.3 GB reserved (v2)",
        "  GPU1 NA  booked NA  used NA GB  util NA  unhealthy  (device: GPU is lost)",
        "    health: fallen off the bus",
        "  all GPUs: booked NA  actors use NA GB  unbooked 0.0 GB",
    ]


def test_memory_v2_not_supported_falls_back_to_v1(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    """Pre-510 drivers: v1 answers, reserved memory is part of used and not reported apart."""
    assert node_gpu_lines(fake_nvml_lib, fake.memory_v1(), tmp_path) == [
        "GPUs: 1 (driver 470.256.02)",
        "  GPU0 Tesla V100-SXM2-16GB  booked NA  used 5.8 GB  util 87%",
        "    bus 00000000:3B:00.0  temp 61 C  power 245/350 W  memory 5.8/16.0 GB (v1)",
    ]


def test_a_field_not_supported_degrades_that_field(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    assert node_gpu_lines(fake_nvml_lib, fake.field_not_supported(), tmp_path) == [
        "GPUs: 1 (driver 550.54.14)",
        "  GPU0 Tesla T4  booked NA  used 1.0 GB  util NA"
        "  (power_draw_mw: Not Supported; utilization_gpu_pct: Not Supported)",
        "    bus 00000000:00:1E.0  temp 61 C  power NA/70 W  memory 1.0/15.0 GB, 0.3 GB reserved (v2)",
    ]


def test_mig_instances_are_devices_of_their_own(
    fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path
) -> None:
    assert node_gpu_lines(fake_nvml_lib, fake.mig(sleeper), tmp_path) == [
        "GPUs: 1 (driver 550.54.14)",
        "  GPU0 NVIDIA A100-SXM4-40GB  MIG on  booked NA  used 4.2 GB  util NA"
        "  (utilization_gpu_pct: Not Supported)",
        "    bus 00000000:07:00.0  temp 61 C  power 245/350 W  memory 4.2/40.0 GB, 0.3 GB reserved (v2)",
        "    GPU0/MIG0 NVIDIA A100-SXM4-40GB MIG 3g.20gb  booked NA  used 4.0 GB  util NA"
        "  (utilization_gpu_pct: Not Supported)",
        "      GI 1 CI 0  memory 4.0/19.5 GB, 0.0 GB reserved (v2)",
        f"      pid {sleeper} sleep booked nothing used 3.5 GB  unbooked",
        "    GPU0/MIG1 NVIDIA A100-SXM4-40GB MIG 3g.20gb  booked NA  used 0.0 GB  util NA"
        "  (utilization_gpu_pct: Not Supported)",
        "      GI 2 CI 0  memory 0.0/19.5 GB, 0.0 GB reserved (v2)",
    ]


def test_driver_library_mismatch(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    assert node_gpu_lines(fake_nvml_lib, fake.mismatch(), tmp_path) == ["GPUs: NA", MISMATCH]


def _can_unshare() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    done = subprocess.run(
        [unshare, "-r", "-p", "-f", "--mount-proc", "true"], capture_output=True, timeout=30, check=False
    )
    return done.returncode == 0


def test_in_a_container_host_pids_are_not_mapped(
    fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path
) -> None:
    """rayscope in its own pid namespace (as in a container), NVML reporting host pids: the
    pids are listed as not mapped and the status says why, instead of a wrong mapping."""
    if not _can_unshare():
        pytest.skip("this kernel or sandbox does not allow a pid namespace (unshare -r -p)")
    done = run_node(
        fake_nvml_lib,
        fake.two_gpus(sleeper),
        tmp_path,
        prefix=("unshare", "-r", "-p", "-f", "--mount-proc"),
    )
    assert done.returncode == 0, done.stderr
    assert gpu_block(done.stdout) == [
        "GPUs: 2 (driver 550.54.14)",
        "  GPU0 NVIDIA GeForce RTX 3090  booked NA  used 7.0 GB  util 87%",
        "    bus 00000000:01:00.0  temp 61 C  power 245/350 W  memory 7.0/24.0 GB, 0.3 GB reserved (v2)",
        f"    pid {sleeper} booked NA used 1.2 GB  not mapped",
        f"    pid {fake.NO_SUCH_PID} booked NA used 0.5 GB  not mapped",
        "  GPU1 NVIDIA GeForce RTX 3090  booked NA  used 0.0 GB  util 0%",
        "    bus 00000000:02:00.0  temp 61 C  power 21/350 W  memory 0.0/24.0 GB, 0.3 GB reserved (v2)",
        "  all GPUs: booked NA  actors use NA GB  unbooked NA GB  not mapped 1.7 GB",
        CONTAINER,
    ]


def test_gpu_health_scenarios(fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path) -> None:
    """XID events, ECC, a pending row remap, throttling, a lost GPU: one ``unhealthy`` flag
    on each such device's line and a ``health:`` line saying why; the healthy GPU has none.
    A field NVML does not support is absent (``null``), a supported 0 is 0. Positive
    control: reading ECC as 0 when unsupported fails the GPU2 assertions."""
    lines = node_gpu_lines(fake_nvml_lib, fake.four_gpus_health(sleeper), tmp_path)
    assert lines[1] == "  GPU0 NVIDIA A100-SXM4-40GB  booked NA  used 2.0 GB  util 87%"
    assert lines[2].startswith("    bus 00000000:17:00.0") and not lines[3].startswith("    health:")
    gpu1 = lines.index("  GPU1 NVIDIA A100-SXM4-40GB  booked NA  used 2.0 GB  util 87%  unhealthy")
    assert lines[gpu1 + 2] == (
        "    health: XID 79 (2 since start); 3 uncorrected ECC errors; row remap pending (reset the GPU)"
    )
    gpu2 = lines.index("  GPU2 NVIDIA A100-SXM4-40GB  booked NA  used 2.0 GB  util 87%  unhealthy")
    assert lines[gpu2 + 2] == "    health: throttled: hw_slowdown, hw_thermal"
    assert "  GPU3 NA  booked NA  used NA GB  util NA  unhealthy  (device: GPU is lost)" in lines
    assert "    health: fallen off the bus" in lines

    done = run_node(fake_nvml_lib, fake.four_gpus_health(sleeper), tmp_path, "--json")
    health = [g["health"] for g in parsed(done.stdout, "node")["gpus"]]
    assert health[0]["ecc_uncorrected_volatile"] == 0 and health[0]["xid_errors"] == 0
    assert (health[1]["xid_errors"], health[1]["last_xid"], health[1]["remapped_rows_pending"]) == (
        2,
        79,
        True,
    )
    assert health[2]["ecc_uncorrected_volatile"] is None and health[2]["retired_pages_pending"] is None
    assert health[2]["clock_throttle_reasons"] == 0x48
    assert health[3]["lost"] is True
