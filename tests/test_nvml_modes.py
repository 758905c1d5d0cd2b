"""Virtualization mode, compute mode and MPS clients through the real pynvml binding and the
fake ``libnvidia-ml.so.1``, in a subprocess whose loader path names the fake.

Also the fake's re-reading of a scenario that changes while a process reads it,
and :func:`rayscope.core.gpu.trust.memory_used_reliable` (the trust rule, in core) for every mode.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rayscope.core.gpu.trust import memory_used_reliable
from rayscope.sources.nvml.modes import UNKNOWN
from tests import fake_nvml as fake
from tests.conftest import REPO, base_env

READ = """
import json, sys
import pynvml
from rayscope.sources.nvml import devices as nvml
from rayscope.sources.nvml import modes as nvml_modes

pynvml.nvmlInit()
def read():
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        errors = {}
        mps, version = nvml_modes.mps_processes(handle, errors)
        merged = None if mps is None else nvml.merge_processes(mps, [])
        gpus.append({
            "virtualization_mode": nvml_modes.virtualization_mode(handle, errors),
            "compute_mode": nvml_modes.compute_mode(handle, errors),
            "mps": None if merged is None else [[p.pid, p.used_memory_bytes] for p in merged],
            "mps_version": version,
            "used": int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
            "errors": errors,
        })
    return gpus
print(json.dumps(read()), flush=True)
for _ in sys.stdin:  # each line asks for another read of the same process
    print(json.dumps(read()), flush=True)
"""


def read_modes(lib: fake.FakeNvml, scenario: str, tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "scenario.txt"
    path.write_text(scenario)
    done = subprocess.run(
        [sys.executable, "-c", READ],
        cwd=REPO,
        env=lib.env(base_env(), path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    gpus: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[0])
    return gpus


@pytest.fixture(scope="module")
def no_modes_nvml(tmp_path_factory: pytest.TempPathFactory) -> fake.FakeNvml:
    """The fake without the three entry points (Function Not Found)."""
    return fake.build(tmp_path_factory.mktemp("fake-nvml-no-modes"), era="no_modes")


@pytest.fixture(scope="module")
def r470_nvml(tmp_path_factory: pytest.TempPathFactory) -> fake.FakeNvml:
    return fake.build(tmp_path_factory.mktemp("fake-nvml-r470-modes"), era="r470")


def test_vgpu_guest(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    """The A40-16C slice: a vGPU guest whose NVML claims 14.5 GiB used with no process;
    its used memory is not reliable, and the reason says why."""
    [gpu] = read_modes(fake_nvml_lib, fake.vgpu_guest(), tmp_path)
    assert gpu == {
        "virtualization_mode": "vgpu_guest",
        "compute_mode": "default",
        "mps": [],
        "mps_version": 3,
        "used": int(fake.PHANTOM_USED_GIB * fake.GIB),
        "errors": {},
    }
    reliable, reason = memory_used_reliable(gpu["virtualization_mode"])
    assert reliable is False
    assert reason.startswith("vGPU guest: NVML's used memory comes from the vGPU manager")


@pytest.mark.parametrize(
    ("scenario", "mode"),
    [
        (fake.passthrough, "passthrough"),
        (lambda pid: fake.host_vgpu(), "host_vgpu"),
        (
            lambda pid: (
                fake.HEADER
                + "count 1\n"
                + fake.gpu(0, fake.A100, pci="00000000:07:00.0", total_gib=40, used_gib=1, virtualization=4)
            ),
            "host_vsga",
        ),
        (
            lambda pid: (
                fake.HEADER
                + "count 1\n"
                + fake.gpu(0, fake.A100, pci="00000000:07:00.0", total_gib=40, used_gib=1, virtualization=0)
            ),
            "none",
        ),
    ],
    ids=["passthrough", "host_vgpu", "host_vsga", "bare_metal"],
)
def test_each_virtualization_mode_by_name(
    fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path, scenario: Any, mode: str
) -> None:
    [gpu] = read_modes(fake_nvml_lib, scenario(sleeper), tmp_path)
    assert gpu["virtualization_mode"] == mode and gpu["errors"] == {}
    assert memory_used_reliable(mode)[0] is True


def test_mps_clients_are_listed_for_attribution(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    """Under MPS the compute list shows the server; the clients (Ray actors' pids here) come
    from the MPS list, each with its own memory, in the shape merge_processes takes."""
    server, clients = 4_100_001, (4_100_002, 4_100_003)
    [gpu] = read_modes(fake_nvml_lib, fake.mps(server, clients), tmp_path)
    assert gpu["compute_mode"] == "exclusive_process"
    assert gpu["mps"] == [[clients[0], 3 * fake.GIB], [clients[1], 2 * fake.GIB]]
    assert gpu["mps_version"] == 3 and gpu["errors"] == {}


def test_an_r470_library_lists_mps_clients_through_v2(r470_nvml: fake.FakeNvml, tmp_path: Path) -> None:
    """No ``_v3`` MPS list on an R470 library: the ``_v2`` call answers the same clients."""
    [gpu] = read_modes(r470_nvml, fake.mps(4_100_001, (4_100_002, 4_100_003)), tmp_path)
    assert [pid for pid, _ in gpu["mps"]] == [4_100_002, 4_100_003]
    assert gpu["mps_version"] == 2 and gpu["errors"] == {}


def test_a_scenario_written_before_the_modes_leaves_them_absent(
    fake_nvml_lib: fake.FakeNvml, sleeper: int, tmp_path: Path
) -> None:
    """A driver answering Not Supported: mode and compute mode absent (``None``), quietly,
    not guessed as bare metal or default; the MPS list answers empty, as without MPS."""
    gpus = read_modes(fake_nvml_lib, fake.two_gpus(sleeper), tmp_path)
    for gpu in gpus:
        assert (gpu["virtualization_mode"], gpu["compute_mode"], gpu["mps"]) == (None, None, [])
        assert gpu["errors"] == {}


def test_not_supported_is_absent_without_an_error(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    [gpu] = read_modes(fake_nvml_lib, fake.modes_not_supported(), tmp_path)
    assert (gpu["virtualization_mode"], gpu["compute_mode"], gpu["mps"], gpu["mps_version"]) == (
        None,
        None,
        None,
        None,
    )
    assert gpu["errors"] == {}


def test_missing_entry_points_are_absent_without_an_error(
    no_modes_nvml: fake.FakeNvml, tmp_path: Path
) -> None:
    """A library without the symbols at all (pynvml: Function Not Found): absent, quiet.
    Positive control: the same scenario on the current library reads every field."""
    [gpu] = read_modes(no_modes_nvml, fake.mps(4_100_001, (4_100_002, 4_100_003)), tmp_path)
    assert (gpu["virtualization_mode"], gpu["compute_mode"], gpu["mps"]) == (None, None, None)
    assert gpu["errors"] == {}


def test_a_failed_read_is_absent_with_its_reason(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    [gpu] = read_modes(fake_nvml_lib, fake.modes_failing(), tmp_path)
    assert (gpu["virtualization_mode"], gpu["compute_mode"], gpu["mps"]) == (None, None, None)
    assert gpu["errors"] == {
        "virtualization_mode": "Unknown Error",
        "compute_mode": "Unknown Error",
        "mps_processes": "Unknown Error",
    }


def test_a_code_newer_than_rayscope_is_unknown_not_raw(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    """A mode code this rayscope has no name for: the bounded ``unknown``, the code in
    ``errors``, and not reliable (nothing guessed about a device kind it does not know)."""
    scenario = (
        fake.HEADER
        + "count 1\n"
        + fake.gpu(
            0, fake.A100, pci="00000000:07:00.0", total_gib=40, used_gib=1, virtualization=7, compute_mode=9
        )
    )
    [gpu] = read_modes(fake_nvml_lib, scenario, tmp_path)
    assert (gpu["virtualization_mode"], gpu["compute_mode"]) == (UNKNOWN, UNKNOWN)
    assert gpu["errors"] == {
        "virtualization_mode": "unknown value 7 (driver newer than this rayscope)",
        "compute_mode": "unknown value 9 (driver newer than this rayscope)",
    }
    assert memory_used_reliable(UNKNOWN)[0] is False


def test_memory_used_reliable_for_every_mode() -> None:
    """Bare metal, pass-through, the hypervisor hosts and an old driver (mode not reported)
    keep NVML's figure; a vGPU guest does not. Each has a reason an operator can read."""
    expected = {
        "none": True,
        "passthrough": True,
        "vgpu_guest": False,
        "host_vgpu": True,
        "host_vsga": True,
        None: True,
        "unknown": False,
    }
    for mode, reliable in expected.items():
        ok, reason = memory_used_reliable(mode)
        assert ok is reliable, mode
        assert reason and "\n" not in reason
    assert "framebuffer" in memory_used_reliable("host_vgpu")[1]


def test_the_fake_rereads_a_changed_scenario(fake_nvml_lib: fake.FakeNvml, tmp_path: Path) -> None:
    """One process, the scenario swapped under it between reads: the next read sees the new
    memory and the new MPS clients (a replica's memory rising and falling)."""
    path = tmp_path / "scenario.txt"
    clients = (4_100_002, 4_100_003)
    path.write_text(fake.mps(4_100_001, clients))
    reader = subprocess.Popen(
        [sys.executable, "-c", READ],
        cwd=REPO,
        env=fake_nvml_lib.env(base_env(), path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdin is not None and reader.stdout is not None
    try:
        first = json.loads(reader.stdout.readline())[0]
        rising = fake.mps(4_100_001, clients).replace(
            f"gpu0.mps {clients[0]} {3 * fake.GIB}", f"gpu0.mps {clients[0]} {9 * fake.GIB}"
        )
        rising = rising.replace(f"{6 * fake.GIB} ", f"{12 * fake.GIB} ", 1)
        fake.write_scenario(path, rising)
        reader.stdin.write("\n")
        reader.stdin.flush()
        second = json.loads(reader.stdout.readline())[0]
        fake.write_scenario(path, fake.mps(4_100_001, (clients[1], 4_100_004)))
        reader.stdin.write("\n")
        reader.stdin.flush()
        third = json.loads(reader.stdout.readline())[0]
    finally:
        reader.kill()
        reader.communicate(timeout=30)
    assert first["mps"][0] == [clients[0], 3 * fake.GIB]
    assert second["mps"][0] == [clients[0], 9 * fake.GIB]
    assert second["used"] > first["used"]
    assert [pid for pid, _ in third["mps"]] == [clients[1], 4_100_004]
