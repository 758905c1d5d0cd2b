"""SECURITY.md, *Local trust*: shared libraries load from trusted paths only.

The exploit as it happens on a node: ``LD_LIBRARY_PATH=/usr/local/nvidia/lib64:`` (a trailing
colon, as ``ENV X=/a:$X`` leaves it, is an empty element: the working directory), root runs
``rayscope node`` or ``push`` from a world-writable directory, and uid 65534 has planted a
``libnvidia-ml.so.1`` there. pynvml loads the library by name, so the dynamic loader searched
the working directory before the system's cache, and the planted library's constructor ran as
root. The planted library here is the fake NVML with a constructor that writes a marker file.
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayscope.sources import libraries
from rayscope.sources.cuda import sample as cuda
from tests import fake_cuda
from tests import fake_nvml as fake
from tests.conftest import REPO, base_env, run_rayscope
from tests.reliability_plugin import FaultRecord
from tests.support.ports import refused_port

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting a file of another uid needs root")
PLANTED_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("loaded as root\n", f); fclose(f); }
}
"""


@pytest.fixture
def world_writable_dir() -> Iterator[Path]:
    """A directory uid 65534 owns and everyone can write (not sticky): where root runs from."""
    path = Path(tempfile.mkdtemp(prefix="rayscope-cwd-"))
    path.chmod(0o777)
    os.chown(path, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plant(directory: Path, name: str, source: Path, marker: Path, *libs: str) -> Path:
    """uid 65534's ``name`` in ``directory``: the fake built from ``source`` with a
    constructor that writes ``marker`` when any process loads it."""
    extra = directory.parent / f"planted-{os.getpid()}-{name}.c"
    extra.write_text(PLANTED_C)
    library = directory / name
    try:
        subprocess.run(
            [
                "cc",
                "-shared",
                "-fPIC",
                "-O1",
                f'-DMARKER="{marker}"',
                "-o",
                str(library),
                str(source),
                str(extra),
                *libs,
            ],
            check=True,
            timeout=120,
            capture_output=True,
        )
    finally:
        extra.unlink()
    os.chown(library, NOBODY, NOBODY)
    return library


def run_node_in(cwd: Path, library_path: str, scenario: Path) -> "subprocess.CompletedProcess[str]":
    env = base_env(RAY_AUTH_MODE="disabled", LD_LIBRARY_PATH=library_path)
    env[fake.SCENARIO_ENV] = str(scenario)
    env["PYTHONPATH"] = str(REPO)  # `-m rayscope` from another directory: this worktree's code
    return run_rayscope("node", "--gpus", "--gcs", f"127.0.0.1:{refused_port()}", env=env, cwd=cwd)


@needs_root
@pytest.mark.fault
def test_nvml_is_never_loaded_from_the_working_directory(
    world_writable_dir: Path, fake_nvml_lib: fake.FakeNvml, tmp_path: Path, fault: FaultRecord
) -> None:
    """uid 65534's ``libnvidia-ml.so.1`` in the directory root runs ``node`` from, reached
    through an empty or relative element of ``LD_LIBRARY_PATH``: never loaded (no marker),
    and a trusted library later on the path (the genuine fake, root's) is still found.
    Positive control: in ``nvml._init`` load ``ctypes.CDLL(LIBRARY)`` (by name, as pynvml
    does) instead of ``libraries.load(LIBRARY)`` and the marker appears (before the fix: all
    three cases wrote it)."""
    fault.expect(
        "root runs `node` from uid 65534's world-writable directory holding a planted"
        " libnvidia-ml.so.1, LD_LIBRARY_PATH with an empty or relative element (before: the"
        " planted library ran as root in all three cases)",
        "the planted library is never loaded; a trusted one later on the path still is; the NVML"
        " line names the element left out",
    )
    marker = tmp_path / "marker"
    plant(world_writable_dir, fake.LIBRARY, fake.SOURCE, marker)
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(
        "count 1\ndriver 550.54.15\n"
        + fake.gpu(0, "Trusted GPU", pci="00000000:01:00.0", total_gib=80, used_gib=1)
    )
    empty_trusted = tmp_path / "nvidia-lib64"  # as /usr/local/nvidia/lib64 without the library
    empty_trusted.mkdir()
    genuine = str(fake_nvml_lib.lib_dir)
    cases = {
        "trailing colon": f"{empty_trusted}:",  # the issue's: nothing trusted on the path holds it
        "leading colon": f":{genuine}",
        "relative element": f"{empty_trusted}:.:{genuine}",
    }
    for where, path in cases.items():
        result = run_node_in(world_writable_dir, path, scenario)
        assert result.returncode == 0, result.stderr
        assert not marker.exists(), f"{where}: the planted library ran as root: {result.stdout}"
        nvml_line = next(
            (line for line in result.stdout.splitlines() if line.startswith("  NVML:")), "NVML answered"
        )
        if where == "trailing colon":
            if "not found" in nvml_line:  # no driver in this host's cache: the refusal is named
                assert "refused the empty element of LD_LIBRARY_PATH (the working directory)" in nvml_line
        else:
            assert "Trusted GPU" in result.stdout, result.stdout
        shown = "Trusted GPU shown" if "Trusted GPU" in result.stdout else nvml_line.strip()
        named = path.replace(genuine, "$TRUSTED").replace(str(tmp_path), "$TMP")
        fault.observe(f"{where} ({named}): not loaded; {shown}")


@needs_root
def test_a_dependency_of_the_library_is_never_loaded_from_the_working_directory(
    world_writable_dir: Path, tmp_path: Path
) -> None:
    """The trusted NVML needs ``librayscopedep.so.1`` (as NVIDIA's needs ``libpthread.so.0``
    and ``librt.so.1``, which a process need not have loaded); uid 65534 plants one in the
    working directory. Loading NVML by its absolute path alone left the loader to search for
    the dependency by name, the empty element first: the planted one ran (the marker). Now
    the dependency is found the same way and loaded first. Positive control: skip the
    dependencies in ``libraries._load`` and the marker appears."""
    marker = tmp_path / "marker"
    trusted = tmp_path / "lib"
    trusted.mkdir()
    dep_c = tmp_path / "dep.c"
    dep_c.write_text("int rayscope_dep(void) { return 1; }\n")
    dep = "librayscopedep.so.1"
    compile_ = ["cc", "-shared", "-fPIC", "-O1"]
    subprocess.run(
        [*compile_, f"-Wl,-soname,{dep}", "-o", str(trusted / dep), str(dep_c)], check=True, timeout=120
    )
    subprocess.run(
        [
            *compile_,
            "-o",
            str(trusted / fake.LIBRARY),
            str(fake.SOURCE),
            "-Wl,--no-as-needed",
            f"-L{trusted}",
            f"-l:{dep}",
        ],
        check=True,
        timeout=120,
    )
    assert dep in libraries.needed(str(trusted / fake.LIBRARY))
    plant(world_writable_dir, dep, dep_c, marker, f"-Wl,-soname,{dep}")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rayscope.sources import libraries; print(libraries.load('libnvidia-ml.so.1')._name)",
        ],
        cwd=world_writable_dir,
        env={**base_env(), "PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": f":{trusted}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(trusted / fake.LIBRARY)
    assert not marker.exists(), "the planted dependency ran as root"


@needs_root
def test_a_library_directory_another_user_can_write_is_refused(
    world_writable_dir: Path, tmp_path: Path
) -> None:
    """An absolute element of ``LD_LIBRARY_PATH`` whose directory uid 65534 owns (or anyone
    can write) is no source: its library is refused by name, the next trusted one taken."""
    marker = tmp_path / "marker"
    plant(world_writable_dir, fake.LIBRARY, fake.SOURCE, marker)
    trusted = tmp_path / "lib"
    trusted.mkdir()
    shutil.copy(world_writable_dir / fake.LIBRARY, trusted / fake.LIBRARY)
    found = libraries.resolve(fake.LIBRARY, {"LD_LIBRARY_PATH": f"{world_writable_dir}:{trusted}"})
    assert found.path == str(trusted / fake.LIBRARY)
    assert found.refused == [f"{world_writable_dir} is owned by uid {NOBODY}, not by root or uid 0"]
    assert not found.clean
    assert libraries.child_search_path({"LD_LIBRARY_PATH": f"{world_writable_dir}::rel:{trusted}"}) == str(
        trusted
    )


def test_the_search_path_drops_empty_and_relative_elements(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    found = libraries.search_path({"LD_LIBRARY_PATH": f":{lib}:lib:./x:{tmp_path / 'missing'}:"})
    assert found.directories == [str(lib)]
    assert found.refused == [
        "the empty element of LD_LIBRARY_PATH (the working directory)",
        "the relative element lib of LD_LIBRARY_PATH",
        "the relative element ./x of LD_LIBRARY_PATH",
    ]
    assert libraries.search_path({}).refused == []
    assert libraries.search_path({"LD_LIBRARY_PATH": ""}).refused == []


def _cache(entries: list[tuple[int, str, str]]) -> bytes:
    """An ``ld.so.cache`` in glibc's format (``glibc-ld.so.cache1.1``) holding ``entries``."""
    strings = b""
    offsets = []
    header = 48 + 24 * len(entries)
    for _flags, key, value in entries:
        offsets.append((header + len(strings), header + len(strings) + len(key) + 1))
        strings += key.encode() + b"\0" + value.encode() + b"\0"
    body = b"glibc-ld.so.cache1.1" + struct.pack("=II", len(entries), len(strings)) + bytes(4) + bytes(16)
    for (flags, _k, _v), (key_at, value_at) in zip(entries, offsets):
        body += struct.pack("=iIIIQ", flags, key_at, value_at, 0, 0)
    return body + strings


def test_the_loader_cache_is_read_by_soname() -> None:
    data = _cache(
        [
            (0x303, "libz.so.1", "/lib/libz.so.1"),
            (0x303, "libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        ]
    )
    assert libraries.parse_loader_cache(data) == [
        ("libz.so.1", "/lib/libz.so.1"),
        ("libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
    ]
    assert libraries.parse_loader_cache(b"not a cache") == []
    assert libraries.parse_loader_cache(data[:60]) == []  # cut short: nothing, no exception
    with open("/etc/ld.so.cache", "rb") as f:  # this host's own cache: libc is in it
        assert any(name == "libc.so.6" for name, _path in libraries.parse_loader_cache(f.read()))


@needs_root
def test_the_cuda_child_gets_a_trusted_library_and_search_path(
    world_writable_dir: Path, tmp_path: Path
) -> None:
    """The CUDA sample's child loads ``libcuda.so.1`` by the absolute path this process
    resolved, and its ``LD_LIBRARY_PATH`` holds trusted absolute directories only (before:
    the variable was passed as it came, and the child loaded the library by name)."""
    marker = tmp_path / "marker"
    plant(world_writable_dir, cuda.LIBRARY, fake_cuda.SOURCE, marker, "-ldl")
    genuine = tmp_path / "cuda"
    genuine.mkdir()
    fake_cuda.build(genuine)
    environ = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": f"{world_writable_dir}::{genuine}"}
    sampler = cuda.CudaSampler(60, 10, environ=environ)
    sampler.sample(
        [cuda.CudaRequest(uuid="GPU-" + "0" * 32, compute_mode="default", free_bytes_readings=(1 << 40,))]
    )
    assert sampler.children_started == 1
    assert not marker.exists(), "the planted libcuda ran as root in the CUDA child"
    assert cuda.cuda_child_env(environ, {})["LD_LIBRARY_PATH"] == str(genuine)
    assert sampler.library_path() == str(genuine / cuda.LIBRARY)
