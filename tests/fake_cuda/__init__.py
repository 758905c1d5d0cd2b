"""A fake ``libcuda.so.1`` (the CUDA driver API) for rayscope's CUDA sampler.

``fake_cuda.c`` is built with the machine's ``cc``; the sampler's child finds it through
``LD_LIBRARY_PATH`` (it does ``CDLL("libcuda.so.1")``) and answers from the scenario file
named by ``RAYSCOPE_FAKE_CUDA_SCENARIO``, else from ``scenario.txt`` beside the library
(:meth:`FakeCuda.beside`; format: the comment at the top of ``fake_cuda.c``).
Every ``cuInit``, context retain, memory read and release is logged to the file named by
``RAYSCOPE_FAKE_CUDA_LOG``, so a test can assert that a GPU was never sampled.

Its numbers are chosen to differ from the fake NVML's for the same GPU, so a test can tell
which source a figure came from.
"""

import shutil
from pathlib import Path

from tests import debian_deps
from tests.support import cbuild

SOURCE = Path(__file__).resolve().with_name("fake_cuda.c")
LIBRARY = "libcuda.so.1"
SCENARIO_ENV = "RAYSCOPE_FAKE_CUDA_SCENARIO"
LOG_ENV = "RAYSCOPE_FAKE_CUDA_LOG"
GIB = 1024**3


class FakeCuda:
    """The built library's directory, and the variables that point its loader at a scenario."""

    def __init__(self, lib_dir: Path) -> None:
        self.lib_dir = lib_dir

    def env(self, scenario: Path, log: Path) -> dict[str, str]:
        """The fake's own variables (scenario and log): the sampler's ``extra_env``."""
        return {SCENARIO_ENV: str(scenario), LOG_ENV: str(log)}

    def beside(self, scenario: str) -> Path:
        """Make ``scenario`` the library's own (``scenario.txt`` beside it, read when no
        variable names one: a node agent's sampler passes none to its child); the log path,
        ``cuda.log`` beside it."""
        (self.lib_dir / "scenario.txt").write_text(scenario)
        return self.lib_dir / "cuda.log"


def build(lib_dir: Path) -> FakeCuda:
    """Compile ``fake_cuda.c`` into ``lib_dir/libcuda.so.1`` (warnings are errors)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError(f"the fake CUDA library cannot be built: {debian_deps.why_missing('cc')}")
    lib_dir.mkdir(parents=True, exist_ok=True)
    # dladdr: in libc itself only from glibc 2.34
    cbuild.shared_library(cc, SOURCE, lib_dir / LIBRARY, libraries=["-ldl"])
    return FakeCuda(lib_dir)


def events(log: Path) -> list[tuple[str, ...]]:
    """The log's lines as ``(event, pid[, device])``; none when nothing was logged."""
    if not log.exists():
        return []
    return [tuple(line.split()) for line in log.read_text().splitlines() if line]


def retained(log: Path) -> list[int]:
    """The CUDA device ordinals a primary context was created on, in order."""
    return [int(e[2]) for e in events(log) if e[0] == "retain"]


def device(index: int, uuid: str, pci: str, free_bytes: int, total_bytes: int) -> str:
    """The scenario lines of one CUDA device (``pci`` in CUDA's form, ``0000:01:00.0``)."""
    return f"dev{index}.uuid {uuid}\ndev{index}.pci {pci}\ndev{index}.memory {free_bytes} {total_bytes}\n"


HEADER = "driver 12040\n"

VGPU_FREE_BYTES = int(15.2 * GIB)
"""What CUDA says is free on the idle A40-16C slice of ``tests.fake_nvml.vgpu_guest`` (NVML
there claims 14.5 GiB used): the sampler's own context, about 0.8 GiB on that slice, is all
that is in use."""
VGPU_TOTAL_BYTES = 16 * GIB


def vgpu_guest(uuid: str) -> str:
    """The CUDA view of ``tests.fake_nvml.vgpu_guest`` (pass its GPU's NVML UUID)."""
    return HEADER + "count 1\n" + device(0, uuid, "0000:02:00.0", VGPU_FREE_BYTES, VGPU_TOTAL_BYTES)


def two_gpus_reordered(nvml_uuids: tuple[str, str], nvml_pcis: tuple[str, str]) -> str:
    """Two devices in the opposite order to NVML's (CUDA ordinal 0 is NVML's GPU1), each with
    a free figure of its own: a sampler that maps by index reads the wrong GPU."""
    (u0, u1), (p0, p1) = nvml_uuids, nvml_pcis
    return (
        HEADER + "count 2\n" + device(0, u1, p1, 23 * GIB, 24 * GIB) + device(1, u0, p0, 11 * GIB, 24 * GIB)
    )
