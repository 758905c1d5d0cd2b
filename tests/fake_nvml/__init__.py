"""A fake ``libnvidia-ml.so.1`` for the real pynvml binding, and its named scenarios.

``fake_nvml.c`` is built with the machine's ``cc`` (once per test session, see the
``fake_nvml`` fixture); rayscope runs in a subprocess with ``LD_LIBRARY_PATH`` pointing at it
(pynvml does ``CDLL("libnvidia-ml.so.1")``) and ``RAYSCOPE_FAKE_NVML_SCENARIO`` naming a
scenario file (format: the comment at the top of ``fake_nvml.c``).
"""

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from tests import debian_deps
from tests.support import cbuild

SOURCE = Path(__file__).resolve().with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
SCENARIO_ENV = "RAYSCOPE_FAKE_NVML_SCENARIO"
GIB = 1024**3
NO_SUCH_PID = 4_194_999
"""Above Linux's largest pid_max (2**22): never a live process."""


class FakeNvml:
    """The built library's directory, and a way to point a process at a scenario."""

    def __init__(self, lib_dir: Path) -> None:
        self.lib_dir = lib_dir

    def env(self, base: Mapping[str, str], scenario: Path) -> dict[str, str]:
        return {**base, "LD_LIBRARY_PATH": str(self.lib_dir), SCENARIO_ENV: str(scenario)}


def no_driver(lib_dir: Path) -> FakeNvml:
    """A host without an NVIDIA driver, even on one that has it: an empty
    ``libnvidia-ml.so.1`` first on the loader's path stops the search there ("file too
    short"), so the system's library is never reached and pynvml reports it not found."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    (lib_dir / LIBRARY).write_bytes(b"")
    return FakeNvml(lib_dir)


ERAS = {"current": [], "r470": ["-DDRIVER_R470"], "no_modes": ["-DNO_MODES"]}
"""Driver eras the fake is built for, with the symbols each era's library exports (see the
comment at the top of ``fake_nvml.c``). ``no_modes``: a current library without the
virtualization mode, compute mode and MPS list entry points (Function Not Found)."""


def write_scenario(path: Path, text: str) -> None:
    """Write ``text`` as the scenario at ``path`` so a process already reading it sees the
    new one at its next NVML call: a new file renamed over the old (a new inode, which the
    fake notices even within one mtime tick; a reader never sees half a file)."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def build(lib_dir: Path, era: str = "current") -> FakeNvml:
    """Compile ``fake_nvml.c`` into ``lib_dir/libnvidia-ml.so.1`` as a driver of ``era``
    exports it (warnings are errors)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError(f"the fake NVML library cannot be built: {debian_deps.why_missing('cc')}")
    cbuild.shared_library(cc, SOURCE, lib_dir / LIBRARY, ERAS[era])
    return FakeNvml(lib_dir)


def gpu(
    index: int,
    name: str,
    *,
    pci: str,
    total_gib: float,
    used_gib: float,
    reserved_gib: float = 0.3,
    util: int = 87,
    temperature_c: int = 61,
    power_mw: int = 245_000,
    power_limit_mw: int = 350_000,
    prefix: str = "",
    virtualization: Optional[int] = None,
    compute_mode: Optional[int] = None,
    uuid_of: Optional[int] = None,
) -> str:
    """The scenario lines of one healthy GPU (``prefix``: ``gpu0.mig1`` for a MIG instance).

    ``uuid_of``: the device's UUID is :func:`uuid` of this number instead of ``index``'s: a
    GPU of another node than one with the same index (a UUID names one device in the world).

    ``virtualization`` and ``compute_mode`` are NVML's codes (:data:`VIRT_NONE` ...,
    :data:`COMPUTE_DEFAULT` ...); ``None`` leaves the line out: the driver answers Not
    Supported, as every scenario written before the fake knew them does.
    """
    p = prefix or f"gpu{index}"
    memory = f"{int(total_gib * GIB)} {int(used_gib * GIB)} {int(reserved_gib * GIB)}"
    lines = [
        f"{p}.name {name}",
        f"{p}.uuid {uuid(index if uuid_of is None else uuid_of)}",
        f"{p}.pci {pci}",
        f"{p}.memory {memory}",
        f"{p}.util {util} 40",
        f"{p}.temperature {temperature_c}",
        f"{p}.power {power_mw}",
        f"{p}.power_limit {power_limit_mw}",
    ]
    if virtualization is not None:
        lines.append(f"{p}.virtualization {virtualization}")
    if compute_mode is not None:
        lines.append(f"{p}.compute_mode {compute_mode}")
    return "\n".join(lines) + "\n"


def uuid(index: int) -> str:
    """The UUID :func:`gpu` gives GPU ``index`` (NVML's form)."""
    return f"GPU-{index:08x}-5f1c-4d3e-9a7b-000000000000"


def process(device: str, pid: int, used_gib: float, kind: str = "compute") -> str:
    """One process line: ``kind`` is ``compute``, ``graphics`` or ``mps`` (an MPS client)."""
    return f"{device}.{kind} {pid} {int(used_gib * GIB)}\n"


def process_utilization(device: str, pid: int, sm_pct: int, memory_bus_pct: int) -> str:
    """One ``nvmlDeviceGetProcessesUtilizationInfo`` sample (driver 550+): the process's SM
    and memory-bus busy percentages (the bus's share of time, not of memory)."""
    return f"{device}.proc_util {pid} {sm_pct} {memory_bus_pct}\n"


# NVML's nvmlGpuVirtualizationMode_t and nvmlComputeMode_t codes.
VIRT_NONE, VIRT_PASSTHROUGH, VIRT_VGPU, VIRT_HOST_VGPU, VIRT_HOST_VSGA = 0, 1, 2, 3, 4
COMPUTE_DEFAULT, COMPUTE_EXCLUSIVE_THREAD, COMPUTE_PROHIBITED, COMPUTE_EXCLUSIVE_PROCESS = 0, 1, 2, 3


RTX_3090 = "NVIDIA GeForce RTX 3090"
HEADER = "driver 550.54.14\n"


def two_gpus(sleeper_pid: int) -> str:
    """Two RTX 3090s; GPU0 held by a process outside Ray (compute and graphics) and by a pid
    this host does not know; GPU1 idle."""
    return (
        HEADER
        + "count 2\n"
        + gpu(0, RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=7.0)
        + process("gpu0", sleeper_pid, 1.2)
        + process("gpu0", sleeper_pid, 1.0, kind="graphics")
        + process("gpu0", NO_SUCH_PID, 0.5)
        + gpu(1, RTX_3090, pci="00000000:02:00.0", total_gib=24, used_gib=0.0, util=0, power_mw=21_000)
    )


def zero_gpus() -> str:
    return HEADER + "count 0\n"


def gpu_lost() -> str:
    """Two GPUs, the second fallen off the bus (NVML_ERROR_GPU_IS_LOST = 15)."""
    return (
        HEADER
        + "count 2\n"
        + gpu(0, RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=5.8)
        + "gpu1.error.handle 15\n"
    )


def memory_v1() -> str:
    """A driver older than 510: no memory info v2 (NVML_ERROR_FUNCTION_NOT_FOUND = 13)."""
    return (
        "driver 470.256.02\ncount 1\n"
        + gpu(0, "Tesla V100-SXM2-16GB", pci="00000000:3B:00.0", total_gib=16, used_gib=5.5)
        + "gpu0.error.memory_v2 13\n"
    )


def field_not_supported() -> str:
    """A T4 in a VM that does not report utilization or power draw (NOT_SUPPORTED = 3)."""
    return (
        HEADER
        + "count 1\n"
        + gpu(0, "Tesla T4", pci="00000000:00:1E.0", total_gib=15, used_gib=1.0, power_limit_mw=70_000)
        + "gpu0.error.util 3\ngpu0.error.power 3\n"
    )


def mig(sleeper_pid: int) -> str:
    """An A100 in MIG mode with two instances; a process on the first. Utilization is not
    reported for MIG (NOT_SUPPORTED), neither on the GPU nor on its instances."""
    a100 = "NVIDIA A100-SXM4-40GB"
    instance = f"{a100} MIG 3g.20gb"
    return (
        HEADER
        + "count 1\n"
        + gpu(0, a100, pci="00000000:07:00.0", total_gib=40, used_gib=4.2)
        + "gpu0.mig 1\ngpu0.error.util 3\n"
        + gpu(0, instance, pci="", total_gib=19.5, used_gib=4.0, reserved_gib=0.0, prefix="gpu0.mig0")
        + "gpu0.mig0.gi 1\ngpu0.mig0.ci 0\ngpu0.mig0.error.util 3\n"
        + process("gpu0.mig0", sleeper_pid, 3.5)
        + gpu(0, instance, pci="", total_gib=19.5, used_gib=0.0, reserved_gib=0.0, prefix="gpu0.mig1")
        + "gpu0.mig1.gi 2\ngpu0.mig1.ci 0\ngpu0.mig1.error.util 3\n"
    )


def mismatch() -> str:
    """The library updated, the kernel module not reloaded (NVML_ERROR_LIB_RM_VERSION_MISMATCH)."""
    return "init 18\n"


A100 = "NVIDIA A100-SXM4-40GB"


def four_gpus_health(sleeper_pid: int) -> str:
    """Four A100s with UUIDs and PCI ids: GPU0 healthy (ECC and row remapping read, all 0);
    GPU1 with two XID events (79 last), 3 uncorrected ECC errors and a row remap pending;
    GPU2 clock-throttled (HW slowdown + HW thermal, 0x48) with no ECC support; GPU3 fallen
    off the bus."""
    lines = HEADER + "count 4\n"
    for i in range(3):
        lines += gpu(i, A100, pci=f"00000000:{0x17 + 0x10 * i:02X}:00.0", total_gib=40, used_gib=2.0)
    lines += "gpu0.ecc_uncorrected 0\ngpu0.remapped 0 0 0 0\ngpu0.retired_pending 0\ngpu0.throttle 0x1\n"
    lines += process("gpu0", sleeper_pid, 1.0)
    lines += "gpu1.ecc_uncorrected 3\ngpu1.remapped 0 3 1 0\ngpu1.xid 48\ngpu1.xid 79\ngpu1.throttle 0x0\n"
    lines += "gpu2.throttle 0x48\n"
    return lines + "gpu3.error.handle 15\n"


# --- virtual and shared GPUs ----------------------------------------------------

A40_16C = "NVIDIA A40-16C"
PHANTOM_USED_GIB = 14.5


def vgpu_guest() -> str:
    """An idle A40-16C vGPU slice in a VM (NVIDIA vGPU C-series time-slicing, as BioEngine
    found at KTH): NVML's used memory is a phantom 14.5 of 16 GiB, no process listed, total
    right. Compute mode default."""
    return (
        "driver 550.54.15\ncount 1\n"
        + gpu(
            0,
            A40_16C,
            pci="00000000:02:00.0",
            total_gib=16,
            used_gib=PHANTOM_USED_GIB,
            reserved_gib=0.0,
            util=0,
            power_mw=0,
            virtualization=VIRT_VGPU,
            compute_mode=COMPUTE_DEFAULT,
        )
        + "gpu0.error.power 3\ngpu0.error.temperature 3\n"
    )


def passthrough(sleeper_pid: int) -> str:
    """A whole A100 passed through to a VM: NVML reads it as on bare metal (one process)."""
    return (
        HEADER
        + "count 1\n"
        + gpu(
            0,
            A100,
            pci="00000000:00:05.0",
            total_gib=40,
            used_gib=6.0,
            virtualization=VIRT_PASSTHROUGH,
            compute_mode=COMPUTE_DEFAULT,
        )
        + process("gpu0", sleeper_pid, 5.5)
    )


def host_vgpu() -> str:
    """A hypervisor host whose A40 serves vGPU guests: NVML sees the physical GPU, each running
    VM's framebuffer counted as used (two 16C guests: 32 GiB), no guest process listed."""
    return "driver 550.54.16\ncount 1\n" + gpu(
        0,
        "NVIDIA A40",
        pci="00000000:41:00.0",
        total_gib=48,
        used_gib=32.0,
        virtualization=VIRT_HOST_VGPU,
        compute_mode=COMPUTE_DEFAULT,
    )


def mps(server_pid: int, client_pids: tuple[int, int]) -> str:
    """An MPS server on an RTX 3090 in exclusive-process mode (as NVIDIA's MPS guide sets it
    up), with two clients (Ray actors' pids, given by the test): the compute list shows the
    server, the MPS list the clients with their own memory."""
    first, second = client_pids
    return (
        HEADER
        + "count 1\n"
        + gpu(
            0,
            RTX_3090,
            pci="00000000:01:00.0",
            total_gib=24,
            used_gib=6.0,
            virtualization=VIRT_NONE,
            compute_mode=COMPUTE_EXCLUSIVE_PROCESS,
        )
        + process("gpu0", server_pid, 0.4)
        + process("gpu0", first, 3.0, kind="mps")
        + process("gpu0", second, 2.0, kind="mps")
    )


def modes_not_supported() -> str:
    """A driver that answers Not Supported for virtualization mode, compute mode and the MPS
    list (the entry points exist): each field absent, none guessed."""
    return rtx_3090_scenario(1.0, {}) + "gpu0.error.mps 3\n"


def modes_failing() -> str:
    """Each of the three reads fails with Unknown Error (999): absent, with the reason kept."""
    return (
        rtx_3090_scenario(1.0, {})
        + "gpu0.error.virtualization 999\ngpu0.error.compute_mode 999\ngpu0.error.mps 999\n"
    )


def rtx_3090_scenario(used_gib: float, processes: Mapping[int, float]) -> str:
    """One RTX 3090 of 24 GiB, ``used_gib`` of it used, holding ``processes`` (pid: GiB) in order."""
    lines = HEADER + "count 1\n"
    lines += gpu(0, RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=used_gib)
    for pid, gib in processes.items():
        lines += process("gpu0", pid, gib)
    return lines
