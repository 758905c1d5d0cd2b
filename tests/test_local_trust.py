"""Rule 1 of SECURITY.md: nothing local runs unless root or the user running rayscope owns it.

Exploits as they happen on a shared node where rayscope runs as root: a process named
``raylet`` started by another uid (``setpriv``) whose command line names "its Python", a
module planted in the working directory, variables planted in the environment.
"""

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.schema.report import RayletInfo
from agent.sources import gcs, raylet, trust

NOBODY = 65534
NODE_ID = "ee" * 28
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another uid needs root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can enter (as /tmp/x would be), owned by the test's user."""
    path = Path(tempfile.mkdtemp(prefix="rayscope-trust-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_gcs() -> Iterator[str]:
    """A listening port that never answers: enough for the port check to pass."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"127.0.0.1:{server.getsockname()[1]}"


def _marker_script(path: Path, marker: Path, owner: int) -> None:
    path.write_text(f'#!/bin/sh\necho ran > {marker}\necho \'{{"ok": false, "error": "planted"}}\'\n')
    path.chmod(0o755)
    os.chown(path, owner, owner)


@needs_root
def test_a_raylet_of_another_user_cannot_make_root_run_its_python(
    shared_dir: Path, fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: uid 65534 starts a process named ``raylet`` whose worker command names a
    Python it owns; root's rayscope, run by a Python without ray, would run it as root.
    Positive control: drop the ``trust.raylet_python_refusal`` call in ``raylet.find_raylets``
    and the planted program runs (the marker file appears)."""
    planted = shared_dir / "evil"
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    python = planted / "python"
    marker = shared_dir / "ran-as-root"
    _marker_script(python, marker, NOBODY)
    fake_raylet = shared_dir / "raylet"
    shutil.copy("/bin/sh", fake_raylet)
    fake_raylet.chmod(0o755)
    argv = [
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        str(fake_raylet), "-c", "sleep 120; :",
        f"--node_id={NODE_ID}", "--node_ip_address=127.0.0.1", f"--gcs_address={fake_gcs}",
        f"--python_worker_command={python} -u worker.py",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        found: list[RayletInfo] = []
        while time.monotonic() < deadline and not found:
            raylets, status = raylet.find_raylets()
            found = [r for r in raylets if r.node_id == NODE_ID]
            time.sleep(0.1)
        assert found, "the planted raylet never showed up"
        monkeypatch.setattr(gcs, "ray_importable", lambda: False)
        from agent import collect

        with pytest.raises(AgentError):
            collect.embedded_status(fake_gcs, 2.0)
        assert not marker.exists(), "root ran a program another user planted"
        assert found[0].python_executable is None
        assert f"refused {python}" in status.reason and f"pid {proc.pid}" in status.reason
    finally:
        proc.kill()
        proc.wait(10)


def test_the_gcs_child_runs_isolated(
    shared_dir: Path, fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child runs with ``-I``, in ``/``, with only the variables Ray needs.
    Positive control: pass ``env=None`` or drop ``cwd="/"`` in ``gcs._run_child``."""
    record = shared_dir / "record"
    python = shared_dir / "python"
    python.write_text(
        f'#!/bin/sh\n{{ pwd; echo "ARGS $1"; env; }} > {record}\necho \'{{"ok": false, "error": "x"}}\'\n'
    )
    python.chmod(0o755)
    monkeypatch.setenv("RAYSCOPE_CANARY", "planted")
    monkeypatch.setenv("PYTHONPATH", str(shared_dir))
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent.so")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/etc/ray-token")
    monkeypatch.chdir(shared_dir)
    gcs.read_cluster(fake_gcs, 2.0, str(python))
    lines = record.read_text().splitlines()
    assert lines[0] == "/"
    assert lines[1] == "ARGS -I"
    env = dict(line.split("=", 1) for line in lines[2:] if "=" in line)
    assert "RAYSCOPE_CANARY" not in env and "PYTHONPATH" not in env and "LD_PRELOAD" not in env
    assert env["RAY_AUTH_TOKEN_PATH"] == "/etc/ray-token"
    assert env["PATH"] == os.environ["PATH"]


def test_a_module_planted_in_the_working_directory_is_not_imported(
    shared_dir: Path, fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``json.py`` in the directory rayscope is started from: the GCS child imports json.
    Positive control: run the child without ``-I`` and with the caller's cwd."""
    marker = shared_dir / "imported"
    (shared_dir / "json.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.chdir(shared_dir)
    gcs.read_cluster(fake_gcs, 2.0, sys.executable)
    assert not marker.exists(), "the GCS child imported a module from the working directory"


ME = 1000


def _stat(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, uid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("uid", "mode", "refused"),
    [
        (0, stat.S_IFREG | 0o755, None),
        (ME, stat.S_IFREG | 0o700, None),
        (1001, stat.S_IFREG | 0o755, "owned by uid 1001"),
        (0, stat.S_IFREG | 0o775, "writable by group or others"),
        (ME, stat.S_IFREG | 0o757, "writable by group or others"),
        (0, stat.S_IFDIR | 0o1777, None),  # /tmp: sticky, nobody replaces another's file
        (0, stat.S_IFDIR | 0o777, "writable by group or others"),
    ],
)
def test_file_owner_and_mode(uid: int, mode: int, refused: str | None) -> None:
    reason = trust.file_refusal("/x", _stat(uid, mode), ME)
    assert reason is None if refused is None else refused in (reason or "")


def test_a_process_must_be_run_by_root_or_me() -> None:
    assert trust.process_refusal(7, [0, 0], ME) is None
    assert trust.process_refusal(7, [ME, ME], ME) is None
    assert "pid 7 runs as uid 1001" in (trust.process_refusal(7, [ME, 1001], ME) or "")


@needs_root
def test_every_hop_of_a_symlinked_interpreter_is_checked(shared_dir: Path) -> None:
    """A venv's ``bin/python`` is a symlink: the link, its target and both directories count."""
    target_dir = shared_dir / "real"
    target_dir.mkdir(mode=0o755)
    target = target_dir / "python3"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o755)
    link = shared_dir / "python"
    link.symlink_to(target)
    me = os.geteuid()
    assert trust.interpreter_refusal(str(link), me) is None
    os.chown(target, NOBODY, NOBODY)
    assert f"{target} is owned by uid {NOBODY}" in (trust.interpreter_refusal(str(link), me) or "")
    os.chown(target, me, me)
    target_dir.chmod(0o777)
    assert f"{target_dir} is writable by group or others" in (trust.interpreter_refusal(str(link), me) or "")
    assert "not an absolute path" in (trust.interpreter_refusal("python3", me) or "")
    assert "cannot stat" in (trust.interpreter_refusal(str(shared_dir / "none"), me) or "")


def test_a_child_under_this_python_still_finds_what_this_process_imports(
    shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-I`` drops ``PYTHONPATH`` and the user site, where ray may be installed: the child
    appends the directories this process found it in (after its own, never shadowing the
    standard library); a directory others can write is not passed on. Positive control: make
    ``trust.with_import_path`` return the source unchanged."""
    package = shared_dir / "rayscope_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("WHERE = 'probe'\n")
    monkeypatch.syspath_prepend(str(shared_dir))
    paths = trust.parent_import_path("rayscope_probe_pkg")
    assert paths == [str(shared_dir)]
    program = trust.with_import_path(
        "import rayscope_probe_pkg, json; print(rayscope_probe_pkg.WHERE)", paths
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", program],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.stdout == "probe\n", done.stderr
    assert trust.parent_import_path("no_such_module_anywhere") == []
    shared_dir.chmod(0o777)
    assert trust.parent_import_path("rayscope_probe_pkg") == []
