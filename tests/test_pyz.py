"""The built zipapp, run as an operator runs it: ``python3 rayscope.pyz ...`` with a
Python that has none of rayscope's dependencies (a venv made ``--without-pip``, ``-I``),
with every CPython found on this machine, against the live Ray cluster.

The pyz is built once per session (``build/pyz.py build``, as ``make pyz`` does: the ``pyz``
fixture of tests/conftest.py, which the systemd units' live test shares).
"""

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest

from rayscope import __version__
from rayscope.sources.raylet import find_raylets
from tests.conftest import REPO, LiveCluster, base_env, build_pyz
from tests.support.ports import HEAD_ON_PORT_0, refused_port, wait_started
from tests.waiting import eventually

RUN_TIMEOUT_S = 120.0
MAX_SIZE_BYTES = 10 * 1024 * 1024
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
SUPPORTED = ("3.9", "3.10", "3.11", "3.12", "3.13")


def _find_pythons() -> dict[str, str]:
    """build/bench.py's discovery: one CPython per minor version (pyenv's, PATH's)."""
    spec = importlib.util.spec_from_file_location("rayscope_bench", REPO / "build" / "bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    found: dict[str, str] = bench.find_pythons()
    return found


PYTHONS = _find_pythons()


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


HEAD_LINE = "  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB  CPU: 8/8"


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python3 -m venv --without-pip``: an interpreter with nothing installed."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=RUN_TIMEOUT_S
    )
    return venv


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the runs that do not test the cache itself: one unpacking per session."""
    return tmp_path_factory.mktemp("cache")


def user_env(cache: Optional[Path], **extra: str) -> dict[str, str]:
    """An operator's environment: nothing of the test's Python leaks in."""
    env = base_env(RAY_AUTH_MODE="disabled")
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "XDG_CACHE_HOME"):
        env.pop(name, None)
    env.update(extra)
    if cache is not None:
        env["RAYSCOPE_CACHE"] = str(cache)
    return env


def run(command: Sequence[str], env: Mapping[str, str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        list(command), env=dict(env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_info(pyz: Path) -> dict[str, Any]:
    with zipfile.ZipFile(pyz) as zf:
        info: dict[str, Any] = json.loads(zf.read("_rayscope_build.json"))
    return info


# ---------------------------------------------------------------------------- the file


def test_one_file_under_10_mb_with_its_checksum(pyz: Path) -> None:
    assert pyz.stat().st_size <= MAX_SIZE_BYTES
    checksum = pyz.with_name("rayscope.pyz.sha256").read_text()
    assert checksum == f"{sha256(pyz)}  rayscope.pyz\n"  # `sha256sum -c` reads it
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_the_readme_states_the_size_of_the_built_file(pyz: Path) -> None:
    """The README's "(4.2 MiB)" is the file this build makes (before: 4.2 MB, written by hand)."""
    said = re.search(r"builds `dist/rayscope.pyz` \(([0-9.]+) MiB\)", (REPO / "README.md").read_text())
    assert said is not None, "README.md: `make pyz` builds `dist/rayscope.pyz` (N.N MiB)"
    assert said.group(1) == f"{pyz.stat().st_size / 2**20:.1f}"


def test_bundles_native_libraries_for_every_python_and_machine_and_never_ray(pyz: Path) -> None:
    info = build_info(pyz)
    assert info["version"] == __version__ and info["pythons"] == list(SUPPORTED)
    with zipfile.ZipFile(pyz) as zf:
        names = set(zf.namelist())
        assert not any(n.startswith("site-packages/ray/") for n in names)
        assert zf.read("__main__.py") == (REPO / "build" / "zipmain.py").read_bytes()
        for machine, elf_machine in ELF_MACHINE.items():
            psutil_ext = f"site-packages/_arch/{machine}/psutil/_psutil_linux.abi3.so"
            for version in SUPPORTED:
                cp = version.replace(".", "")
                msgspec_ext = f"site-packages/msgspec/_core.cpython-{cp}-{machine}-linux-gnu.so"
                assert f".cpython-{cp}-{machine}-linux-gnu.so" in info["extension_suffixes"]
                for ext in (msgspec_ext, psutil_ext):
                    header = zf.read(ext)[:20]
                    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == elf_machine


def test_two_clean_builds_are_byte_identical(pyz: Path, tmp_path: Path) -> None:
    """A second build from a copy of the sources elsewhere, with its own wheel downloads."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "agent", source / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    (source / "build").mkdir()
    for name in ("pyz.py", "launcher.py", "zipmain.py", "pyz-lock.txt"):
        shutil.copy(REPO / "build" / name, source / "build" / name)
    again = build_pyz(source, tmp_path / "dist")
    assert sha256(again) == sha256(pyz)


# ---------------------------------------------------------------------------- as operators run it


def test_help_in_a_venv_without_pip_or_any_package(pyz: Path, bare_venv: Path, shared_cache: Path) -> None:
    python = str(bare_venv / "bin" / "python3")
    env = user_env(shared_cache)
    assert run([python, "-c", "import msgspec"], env).returncode != 0  # control: nothing installed
    for isolated in ([], ["-I"]):
        done = run([python, *isolated, str(pyz), "--help"], env)
        assert done.returncode == 0, done.stderr
        assert "VRAM_MB" in done.stdout and "status" in done.stdout and "node" in done.stdout
    done = run([python, "-I", str(pyz), "--version"], env)
    assert done.stdout == f"rayscope {__version__}\n"


def test_node_json_without_nvml_reports_it_as_a_source(
    pyz: Path, bare_venv: Path, shared_cache: Path
) -> None:
    done = run([str(bare_venv / "bin" / "python3"), "-I", str(pyz), "node", "--json"], user_env(shared_cache))
    assert done.returncode == 0, done.stderr
    diag = json.loads(done.stdout)
    sources = {s["name"]: s for s in diag["sources"]}
    assert sources["nvml"]["ok"] is False and "NVML" in sources["nvml"]["reason"]
    assert sources["host"]["ok"] is True and diag["host"]["cpu_count"] >= 1
    assert diag["gpus"] is None


@pytest.mark.parametrize("version", [v for v in PYTHONS if v.rsplit(".", 1)[0] in SUPPORTED])
def test_every_supported_python_runs_node_json_from_the_same_file(
    pyz: Path, shared_cache: Path, version: str
) -> None:
    done = run([PYTHONS[version], "-I", str(pyz), "node", "--json"], user_env(shared_cache))
    assert done.returncode == 0, done.stderr
    diag = json.loads(done.stdout)
    assert {"raylet", "nvml", "host"} <= {s["name"] for s in diag["sources"]}
    # Every Struct's decoder, built from the unpacked build: an annotation this Python cannot
    # resolve (``list["X"]`` on 3.9/3.10) only fails when a head or client first decodes one.
    site_packages = shared_cache / build_info(pyz)["build_id"][:16] / "site-packages"
    program = (
        "import os, sys; sys.path[:0] = [sys.argv[1], f'{sys.argv[1]}/_arch/{os.uname().machine}']\n"
        "import importlib, pkgutil, msgspec, rayscope.schema as s\n"
        "names = [f'rayscope.schema.{i.name}' for i in pkgutil.iter_modules(s.__path__)]\n"
        "found = [t for n in names for t in vars(importlib.import_module(n)).values()]\n"
        "structs = {t for t in found if isinstance(t, type) and issubclass(t, msgspec.Struct)}\n"
        "for t in structs: msgspec.json.Decoder(t); msgspec.msgpack.Decoder(t)\n"
        "print(len(structs))"
    )
    done = run([PYTHONS[version], "-I", "-c", program, str(site_packages)], user_env(shared_cache))
    assert done.returncode == 0 and int(done.stdout) >= 10, done.stderr


def test_pythons_older_than_3_9_get_one_line(pyz: Path, shared_cache: Path) -> None:
    """Every older CPython found here (this image has 3.6-3.8); ``python -m rayscope`` too."""
    old = {v: p for v, p in PYTHONS.items() if version_key(v) < (3, 9)}
    assert old, "no Python older than 3.9 on this machine (test_pyz_launcher covers the guard alone)"
    for version, python in old.items():
        for command in ([python, str(pyz), "status"], [python, "-m", "rayscope", "--help"]):
            done = subprocess.run(
                command,
                cwd=REPO / "agent",  # the source root: `-m rayscope` finds the package there
                env=user_env(shared_cache),
                check=False,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
            )
            expected = f"rayscope needs Python 3.9+, this is {version}\n"
            assert (done.returncode, done.stdout, done.stderr) == (2, "", expected)  # before: 1


# ---------------------------------------------------------------------------- the live cluster


def ray_node_python(address: str) -> str:
    """The Ray node's own Python, as the local raylet of the test cluster names it."""
    raylets, _ = find_raylets()
    pythons = {r.python_executable for r in raylets if r.gcs_address == address}
    assert len(pythons) == 1 and None not in pythons, pythons
    return str(pythons.pop())


@pytest.mark.live
def test_status_under_a_python3_without_ray_reads_the_gcs_via_the_ray_nodes_python(
    pyz: Path, bare_venv: Path, shared_cache: Path, live_cluster: LiveCluster
) -> None:
    """The Ray cluster runs from a venv with ray; ``python3`` on PATH is another one."""
    address = live_cluster.gcs_address
    env = user_env(shared_cache, PATH=f"{bare_venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("python3", path=env["PATH"]) == str(bare_venv / "bin" / "python3")
    ray_python = ray_node_python(address)
    done = run(["python3", "-I", str(pyz), "--verbose", "status", "--json", "--gcs", address], env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    gcs = next(s for s in doc["sources"] if s["name"] == "gcs")
    assert gcs == {"name": "gcs", "ok": True, "reason": "", "detail": f"{address} via {ray_python}"}
    assert f"  gcs: ok, {address} via {ray_python}" in done.stderr.splitlines()
    head = doc["nodes"][live_cluster.node_id("head")]
    assert (head["used_vram_mb"], head["total_vram_mb"], head["used_gpu"]) == (20480, 24576, 0.04)
    lines = run(["python3", "-I", str(pyz), "status", "--gcs", address], env)
    assert lines.returncode == 0 and HEAD_LINE in lines.stdout.splitlines()


@pytest.mark.live
def test_status_from_the_newest_python_found(
    pyz: Path, shared_cache: Path, live_cluster: LiveCluster
) -> None:
    newest = max(PYTHONS, key=lambda v: tuple(int(x) for x in v.split(".")))
    done = run(
        [PYTHONS[newest], "-I", str(pyz), "status", "--gcs", live_cluster.gcs_address], user_env(shared_cache)
    )
    assert done.returncode == 0, done.stderr
    assert HEAD_LINE in done.stdout.splitlines()


class PyzDaemon:
    """``PYTHON -I rayscope.pyz ARGS`` left running (a head or push agent), stopped by pid."""

    def __init__(self, python: str, pyz: Path, args: list[str], env: Mapping[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [python, "-I", str(pyz), *args], env=dict(env), stdout=out, stderr=out
            )

    def stop(self) -> int:
        """SIGTERM (the agents exit cleanly on it), SIGKILL if that does not do."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        return int(self.process.returncode)


@pytest.mark.live
def test_agents_from_the_zipapp_on_the_oldest_python(
    pyz: Path, shared_cache: Path, live_cluster: LiveCluster, tmp_path: Path
) -> None:
    """The systemd units' commands: ``head`` under the Ray environment's Python (it keeps a
    GCS client in process), ``push`` and ``status --head`` under the oldest CPython here."""
    oldest = PYTHONS[min((v for v in PYTHONS if v.rsplit(".", 1)[0] in SUPPORTED), key=version_key)]
    env = user_env(shared_cache)
    head_args = ["head", "--gcs", live_cluster.gcs_address, "--interval", "1", *HEAD_ON_PORT_0]
    head = PyzDaemon(sys.executable, pyz, head_args, env, tmp_path / "head.log")
    try:
        listen, http = wait_started(head.log.read_text, head.process, timeout_s=60)
    except BaseException:
        head.stop()
        raise
    push_args = [
        "push",
        "--head",
        f"127.0.0.1:{listen}",
        "--interval",
        "1",
        "--node-id",
        live_cluster.node_id("head"),
    ]
    push = PyzDaemon(oldest, pyz, push_args, env, tmp_path / "push.log")
    try:

        def reporting() -> Optional[dict[str, Any]]:
            done = run(
                [oldest, "-I", str(pyz), "status", "--json", "--head", f"http://127.0.0.1:{http}"], env
            )
            assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
            if done.returncode != 0:
                return None
            node: dict[str, Any] = json.loads(done.stdout)["nodes"].get(live_cluster.node_id("head"), {})
            return node if node.get("agent") == "reporting" else None

        def logs() -> str:
            return f"{head.log.read_text()}\n{push.log.read_text()}"

        node = eventually(reporting, 30, "the head node reporting through the pyz agents", 0.5, detail=logs)
        assert (node["used_vram_mb"], node["total_vram_mb"], node["used_gpu"]) == (20480, 24576, 0.04)
    finally:
        assert (push.stop(), head.stop()) == (0, 0)


# ---------------------------------------------------------------------------- the cache


def builds_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def test_eight_copies_started_at_once_unpack_once(pyz: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    command = [sys.executable, "-I", str(pyz), "--version"]
    procs = [
        subprocess.Popen(
            command, env=user_env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    results = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, results
    assert all(out == f"rayscope {__version__}\n" and err == "" for out, err in results)
    build_id = build_info(pyz)["build_id"][:16]
    assert builds_in(cache) == [build_id]  # no .tmp, no second copy
    assert (cache / build_id / "site-packages" / "rayscope" / "cli" / "app.py").is_file()


def test_default_cache_is_under_xdg_cache_home(pyz: Path, tmp_path: Path) -> None:
    env = user_env(None, XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"))
    assert run([sys.executable, "-I", str(pyz), "--version"], env).returncode == 0
    assert builds_in(tmp_path / "xdg" / "rayscope") == [build_info(pyz)["build_id"][:16]]
    del env["XDG_CACHE_HOME"]
    assert run([sys.executable, "-I", str(pyz), "--version"], env).returncode == 0
    assert builds_in(tmp_path / "home" / ".cache" / "rayscope") == [build_info(pyz)["build_id"][:16]]


@pytest.fixture
def old_build_in_use(tmp_path: Path) -> Iterator[Path]:
    """An older build that a long-running rayscope (here: this test) still holds."""
    build = tmp_path / "cache" / "1111111111111111"
    (build / "site-packages").mkdir(parents=True)
    (build / ".in-use").touch()
    fd = os.open(build / ".in-use", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    yield build
    os.close(fd)


def test_old_builds_are_pruned_unless_in_use(pyz: Path, tmp_path: Path, old_build_in_use: Path) -> None:
    cache = old_build_in_use.parent
    unused = cache / "0000000000000000"
    (unused / "site-packages").mkdir(parents=True)
    (unused / ".in-use").touch()
    assert run([sys.executable, "-I", str(pyz), "--version"], user_env(cache)).returncode == 0
    assert builds_in(cache) == sorted([old_build_in_use.name, build_info(pyz)["build_id"][:16]])


def in_private_mount(options: str, mountpoint: Path, command: Sequence[str], env: Mapping[str, str]) -> Any:
    """Run ``command`` with a tmpfs mounted at ``mountpoint`` (``-o options``) in a mount
    namespace of its own: the host's mounts are left as they are."""
    script = 'mount -t tmpfs -o "$1" rayscope-test "$2" && shift 2 && exec "$@"'
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                options, str(mountpoint), *command], env)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("ro", "cannot create its cache {root} (Read-only file system)"),
        # Unpacking would work there; loading msgspec's extension would not.
        ("noexec", "its cache {root} is on a filesystem mounted noexec, where native libraries cannot load"),
    ],
)
def test_unusable_home_says_which_variable_to_set(
    pyz: Path, tmp_path: Path, options: str, expected: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    command = [sys.executable, "-I", str(pyz), "--help"]
    done = in_private_mount(options, home, command, user_env(None, HOME=str(home)))
    assert done.returncode == 2 and done.stdout == ""  # before: 1, which status' table calls partial
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("rayscope: " + expected.format(root=home / ".cache" / "rayscope"))
    assert "set RAYSCOPE_CACHE to a writable directory" in done.stderr
    # ... and doing what it says works.
    remedy = user_env(tmp_path / "elsewhere", HOME=str(home))
    done = in_private_mount(options, home, command, remedy)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------- head agent stop


def _connected_agents(log: Path) -> int:
    return log.read_text().count(" reports node ") if log.exists() else 0


@pytest.mark.parametrize("version", [v for v in PYTHONS if v.rsplit(".", 1)[0] in ("3.9", "3.13")])
def test_head_stops_within_5_s_of_sigterm_with_agents_connected(
    pyz: Path, shared_cache: Path, tmp_path: Path, version: str
) -> None:
    """From Python 3.12.1 an asyncio server's ``wait_closed()`` waits for every client, and
    node agents never hang up: the head must close their connections itself.

    Positive control: without the loop that closes the agents' connections in
    ``Head.serve``, the 3.13 head was still running 10 s after SIGTERM (3.9: 0.7 s).
    The same check runs with Ray installed for the interpreter in ``make compat``."""
    python, env = PYTHONS[version], user_env(shared_cache)
    head_log = tmp_path / "head.log"
    no_gcs = f"127.0.0.1:{refused_port()}"  # no GCS needed for this
    head_args = ["head", "--gcs", no_gcs, *HEAD_ON_PORT_0]
    with open(head_log, "w") as out:
        head = subprocess.Popen(
            [python, "-I", str(pyz), *head_args, "--interval", "1"], env=env, stdout=out, stderr=out
        )
    try:
        listen = wait_started(head_log.read_text, head, timeout_s=60).listen
    except BaseException:
        head.kill()
        head.wait(timeout=15)
        raise
    push_args = ["push", "--head", f"127.0.0.1:{listen}", "--interval", "1"]
    agents = [  # two nodes: a node belongs to one agent's connection
        subprocess.Popen([python, "-I", str(pyz), *push_args, "--node-id", f"{i:056x}"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(2)
    ]  # fmt: skip
    try:

        def connected() -> bool:
            assert head.poll() is None, head_log.read_text()
            return _connected_agents(head_log) == 2

        eventually(connected, 60, "both agents connected", 0.2, detail=head_log.read_text)
        started = time.monotonic()
        head.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=30)
        took = time.monotonic() - started
        assert head.returncode == 0 and took < 5.0, (head.returncode, took, head_log.read_text())
        assert all(a.poll() is None for a in agents)  # the agents were still connected
    finally:
        for process in [head, *agents]:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=15)
