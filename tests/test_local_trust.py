"""Rule 1 of SECURITY.md: nothing local runs unless root or the user running rayscope owns it.

Exploits as they happen on a shared node where rayscope runs as root: a process named
``raylet`` started by another uid (``setpriv``) whose command line names "its Python", a
module planted in the working directory, variables planted in the environment.
"""

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

from rayscope.errors import AgentError
from rayscope.schema.report import RayletInfo, SourceStatus
from rayscope.sources import raylet, trust
from rayscope.sources.gcs import address as gcs_address
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import reader as gcs
from tests.conftest import base_env, run_captured
from tests.support import dirs, fake_server
from tests.waiting import eventually

NOBODY = 65534
NODE_ID = "ee" * 28
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another uid needs root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can enter (as /tmp/x would be), owned by the test's user."""
    with dirs.open_dir("rayscope-trust-", 0o755) as path:
        yield path


def _marker_script(path: Path, marker: Path, owner: int) -> None:
    path.write_text(f'#!/bin/sh\necho ran > {marker}\necho \'{{"ok": false, "error": "planted"}}\'\n')
    path.chmod(0o755)
    os.chown(path, owner, owner)


@needs_root
def test_a_raylet_of_root_cannot_make_root_run_another_users_python(
    shared_dir: Path, fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: a raylet that root runs (a trusted process) whose worker command names a
    Python uid 65534 owns (planted in a directory of theirs); root's rayscope, run by a
    Python without ray, would run it as root. (A raylet uid 65534 runs is refused as a
    whole: ``test_a_raylet_of_another_user_gives_no_node_id_session_or_python``.)
    Positive control: drop the ``trust.raylet_python_refusal`` call in ``raylet._read_raylet``
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
        str(fake_raylet), "-c", "sleep 120; :",
        f"--node_id={NODE_ID}", "--node_ip_address=127.0.0.1", f"--gcs_address={fake_gcs}",
        f"--python_worker_command={python} -u worker.py",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def listed() -> Optional[tuple[list[RayletInfo], SourceStatus]]:
            raylets, status = raylet.find_raylets()
            found = [r for r in raylets if r.node_id == NODE_ID]
            return (found, status) if found else None

        found, status = eventually(listed, 20, "the raylet listed")
        monkeypatch.setattr(gcs, "ray_importable", lambda: False)
        from rayscope.node import collect

        with pytest.raises(AgentError):
            collect.embedded_status(fake_gcs, 2.0)
        assert not marker.exists(), "root ran a program another user planted"
        assert found[0].python_executable is None
        assert f"refused {python}" in status.reason and f"pid {proc.pid}" in status.reason
        assert f"{python} is owned by uid {NOBODY}" in status.reason
    finally:
        proc.kill()
        proc.wait(10)


def test_the_gcs_child_runs_isolated(
    shared_dir: Path, fake_gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child runs with ``-I``, in ``/``, with only the variables Ray needs.
    Positive control: pass ``env=None`` or drop ``cwd="/"`` in ``gcs_prestart.spawn``."""
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
    gcs_child.read_cluster(fake_gcs, 2.0, str(python))
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
    gcs_child.read_cluster(fake_gcs, 2.0, sys.executable)
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


# --- where the GCS address comes from -------------------------------------------

ROOTS_TOKEN = "secret-of-root-4f1c"


class Listener(fake_server.FakeServer):
    """What an attacker runs: a port on 127.0.0.1 that records every connection and the bytes
    sent on it (it answers HTTP/2 SETTINGS, so a gRPC client goes on to send its headers:
    Ray's sends ``authorization: Bearer <token>`` there, as plain HPACK literals)."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self._lock = threading.Lock()
        super().__init__(self._record)

    def _record(self, conn: socket.socket) -> None:
        with self._lock:
            self.received.append(b"")
            slot = len(self.received) - 1
        conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS, empty
        while chunk := conn.recv(65536):
            with self._lock:
                self.received[slot] += chunk
            conn.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")  # SETTINGS ACK

    def heard(self) -> list[bytes]:
        """The bytes heard on each connection taken, in the order they came."""
        with self._lock:
            return list(self.received)


@pytest.fixture
def listener() -> Iterator[Listener]:
    with Listener() as server:
        yield server


@pytest.fixture
def fake_raylet(shared_dir: Path) -> Path:
    """An executable named ``raylet`` anyone may run (``/bin/sh``: it sleeps, as told)."""
    path = shared_dir / "raylet"
    shutil.copy("/bin/sh", path)
    path.chmod(0o755)
    return path


START_AS_NOBODY = (
    'setpriv --reuid=65534 --regid=65534 --clear-groups "$RAYLET" -c "sleep 60; :" "$@" &\n'
    'i=0; while [ "$(cat /proc/$!/comm 2>/dev/null)" != raylet ] && [ $i -lt 400 ]; do\n'
    "  sleep 0.05; i=$((i+1))\n"
    "done\n"
)
"""Start uid 65534's ``raylet`` with the arguments given (``$RAYLET`` is the program) and
wait until it has replaced setpriv (its ``comm`` is ``raylet``)."""


def _in_own_pid_namespace(
    script: str, env: dict[str, str], *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """``sh -c script sh args...`` as root in a pid namespace of its own (``/proc`` mounted
    for it): its processes are the only ones rayscope sees, so the raylets of clusters
    running on this machine for other tests do not count; all of them die with it."""
    unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    return run_captured([*unshare, "sh", "-c", script, "sh", *args], env, timeout_s)


def _status_env(shared_dir: Path, **extra: str) -> dict[str, str]:
    """root's environment for ``status``: a Ray token, no address, no raylet of this host's
    clusters, an empty Ray temp dir unless told otherwise."""
    empty = shared_dir / "empty-tmp"
    empty.mkdir(exist_ok=True)
    return base_env(RAY_AUTH_TOKEN=ROOTS_TOKEN, RAY_TMPDIR=str(empty), **extra)


def _leaks(listener: Listener) -> tuple[int, bool]:
    """(connections the attacker's port took, whether root's token came with one)."""
    time.sleep(0.5)  # let the last bytes land
    seen = listener.heard()
    return len(seen), any(b"authorization" in c and f"Bearer {ROOTS_TOKEN}".encode() in c for c in seen)


@needs_root
def test_a_raylet_of_another_user_is_no_source_of_the_gcs_address(
    shared_dir: Path, fake_raylet: Path, listener: Listener
) -> None:
    """The attack: uid 65534 starts a sleeping process named ``raylet`` whose command line
    names the attacker's port as the GCS; root runs ``status`` (no ``--gcs``) with a Ray token.
    Before: rayscope connected there twice (the port check, then the GCS child) and the
    child sent ``authorization: Bearer <root's token>``. Now the raylet is refused, nothing
    connects, and the one line says why and names ``--gcs``."""
    script = START_AS_NOBODY + f"{sys.executable} -m rayscope status --timeout 5\n"
    done = _in_own_pid_namespace(
        script,
        {**_status_env(shared_dir), "RAYLET": str(fake_raylet)},
        f"--node_id={NODE_ID}",
        "--node_ip_address=127.0.0.1",
        f"--gcs-address=127.0.0.1:{listener.port}",
        "--head",
    )
    connections, token_sent = _leaks(listener)
    assert (connections, token_sent) == (0, False), f"root sent its token: {done.stderr}"
    assert done.returncode == 2 and done.stdout == ""
    assert re.fullmatch(
        r"rayscope: no GCS address: pass --gcs HOST:PORT or set RAYSCOPE_GCS \(refused raylet pid (\d+):"
        rf" pid \1 runs as uid {NOBODY}, not as root or uid 0; no ray_current_cluster file in \S+\)\n",
        done.stderr,
    ), done.stderr


@needs_root
@pytest.mark.parametrize(
    "planted", ["file-of-nobody", "root-file-in-dir-of-nobody", "file-writable-by-others"]
)
def test_an_address_file_another_user_could_write_is_no_source_of_the_gcs_address(
    shared_dir: Path, listener: Listener, planted: str
) -> None:
    """The attack: under a world-writable ``TMPDIR`` (``/tmp``), uid 65534 creates ``ray/``
    and writes ``ray_current_cluster`` naming its port. Before: root's ``status`` connected
    and sent its token. Now the file counts only when root (or the user running rayscope)
    owns it and every directory above it, and nobody else can write it."""
    tmp = shared_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    ray_dir = tmp / "ray"
    ray_dir.mkdir(mode=0o755)
    address_file = ray_dir / "ray_current_cluster"
    address_file.write_text(f"127.0.0.1:{listener.port}\n")
    address_file.chmod(0o644)
    if planted == "file-of-nobody":
        os.chown(address_file, NOBODY, NOBODY)
        why = f"{address_file} is owned by uid {NOBODY}, not by root or uid 0"
    elif planted == "root-file-in-dir-of-nobody":
        os.chown(ray_dir, NOBODY, NOBODY)
        why = f"{ray_dir} is owned by uid {NOBODY}, not by root or uid 0"
    else:
        address_file.chmod(0o666)
        why = f"{address_file} is writable by group or others"
    env = {k: v for k, v in _status_env(shared_dir).items() if k != "RAY_TMPDIR"}
    done = _in_own_pid_namespace(
        f"{sys.executable} -m rayscope status --timeout 5\n", {**env, "TMPDIR": str(tmp)}
    )
    connections, token_sent = _leaks(listener)
    assert (connections, token_sent) == (0, False), f"root sent its token: {done.stderr}"
    assert done.returncode == 2
    assert done.stderr == (
        "rayscope: no GCS address: pass --gcs HOST:PORT or set RAYSCOPE_GCS (no raylet process on"
        f" this host; refused {address_file}: {why})\n"
    )


@needs_root
def test_an_address_file_of_root_is_still_read(shared_dir: Path) -> None:
    """The trusted case stays: root's file in root's directories under a sticky ``/tmp``,
    through a symlink of root's too; a FIFO there is refused at once, not waited on."""
    tmp = shared_dir / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    real = shared_dir / "real-ray"
    real.mkdir(mode=0o755)
    (real / "ray_current_cluster").write_text("10.0.0.9:6379\n")
    (tmp / "ray").symlink_to(real)
    assert gcs_address.address_from_file({"TMPDIR": str(tmp)}) == ("10.0.0.9:6379", "")
    (real / "ray_current_cluster").unlink()
    os.mkfifo(real / "ray_current_cluster", 0o644)
    address, why = gcs_address.address_from_file({"TMPDIR": str(tmp)})
    named = tmp / "ray" / "ray_current_cluster"
    assert address is None and why == f"refused {named}: {real / 'ray_current_cluster'} is not a regular file"


RAYLETS_AS_SEEN = """
import json
from rayscope.node.push import Pusher
from rayscope.sources import raylet
raylets, status = raylet.find_raylets()
pusher = Pusher(("127.0.0.1", 9), b"", 5.0)
print(json.dumps({"node_ids": [r.node_id for r in raylets], "reason": status.reason,
                  "push_reports_for": pusher.collect().node_id}))
"""


@needs_root
def test_a_raylet_of_another_user_gives_no_node_id_session_or_python(
    shared_dir: Path, fake_raylet: Path
) -> None:
    """Everything rayscope takes from a raylet follows the same rule: uid 65534's
    ``raylet --head --node_id=X`` is not listed at all, so the node agent does not report
    for X, and no consumer of the list (the GCS address, the Ray node's Python, the CUDA
    mapping, the session directory) sees it. Before: root's ``push`` reported as node X."""
    script = START_AS_NOBODY + f"{sys.executable} -c '{RAYLETS_AS_SEEN}'\n"
    done = _in_own_pid_namespace(
        script,
        {**base_env(), "RAYLET": str(fake_raylet)},
        f"--node_id={NODE_ID}",
        "--head",
        f"--session_dir={shared_dir}",
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["node_ids"] == [] and seen["push_reports_for"] == ""
    assert f"runs as uid {NOBODY}, not as root or uid 0" in seen["reason"]


SESSION_READ = """
import json, sys
from rayscope.sources import procs
infos, _ = procs.read_processes([int(sys.argv[1])], procs.HOST_PID_NAMESPACE)  # the pid namespace of the test
print(json.dumps({"node_id": infos[0].node_id, "job_id": infos[0].job_id}))
"""


@needs_root
def test_the_session_logs_of_a_raylet_of_another_user_are_not_read(
    shared_dir: Path, fake_raylet: Path
) -> None:
    """A GPU process of uid 65534 under its own ``raylet`` whose ``--session_dir`` holds a
    FIFO named like a prestarted worker's log. Before: root's ``procs`` read (NVML lists the
    process) opened it and waited for ever. Now that raylet is not a raylet to rayscope."""
    session = shared_dir / "session"
    (session / "logs").mkdir(parents=True)
    script = (
        START_AS_NOBODY + 'sleeper=""; i=0; while [ -z "$sleeper" ] && [ $i -lt 200 ]; do'
        " sleeper=$(tr -d ' ' < /proc/$!/task/$!/children); sleep 0.05; i=$((i+1)); done\n"
        f'mkfifo "{session}/logs/worker-{"ab" * 28}-ffffffff-$sleeper.out"\n'
        f'chown -R {NOBODY} "{session}"\n'
        f"timeout 10 {sys.executable} -c '{SESSION_READ}' $sleeper || echo \"blocked: exit $?\"\n"
    )
    done = _in_own_pid_namespace(
        script,
        {**base_env(), "RAYLET": str(fake_raylet)},
        f"--node_id={NODE_ID}",
        f"--session_dir={session}",
    )
    assert done.returncode == 0 and done.stdout.startswith("{"), done.stdout + done.stderr
    assert json.loads(done.stdout) == {"node_id": None, "job_id": None}, done.stdout + done.stderr
