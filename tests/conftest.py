"""Shared fixtures: the real Ray cluster (in its own process) and a way to run rayscope.

The cluster runs on 127.0.0.1 only, under its own short ``RAY_TMPDIR``, with
``RAY_AUTH_MODE`` set explicitly (a stray ``~/.ray/auth_token`` would turn token auth on
otherwise). Teardown kills what the session started, by pid, even when tests fail.
"""

import atexit
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest

from tests import fake_nvml
from tests.support.ports import refused_port, started_ports
from tests.waiting import eventually

pytest_plugins = [
    "tests.reliability_plugin",  # the `fault` fixture: RELIABILITY.md's rows
    "tests.support.fixtures",  # the fixtures more than one test module uses
]

REPO = Path(__file__).resolve().parent.parent
LIVECLUSTER = REPO / "tests" / "livecluster.py"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
START_TIMEOUT_S = 180.0
REPLY = "@@"


_NO_DRIVER: list[Path] = []


def no_driver_dir() -> Path:
    """One directory per session that hides any NVIDIA driver of this host (fake_nvml.no_driver)."""
    if not _NO_DRIVER:
        path = Path(tempfile.mkdtemp(prefix="rayscope-no-driver-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _NO_DRIVER.append(fake_nvml.no_driver(path).lib_dir)
    return _NO_DRIVER[0]


def base_env(**extra: str) -> dict[str, str]:
    """This environment minus anything that points rayscope or Ray at another cluster, on a
    host without an NVIDIA driver whatever this one has (tests that want a GPU put the fake
    NVML first on the loader's path)."""
    pointers = ("RAYSCOPE_", "RAY_AUTH", "RAY_ADDRESS")  # RAY_ADDRESS: Ray's own, read as --gcs
    env = {k: v for k, v in os.environ.items() if not k.startswith(pointers)}
    env.update(LOOPBACK_ENV)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(no_driver_dir()), env.get("LD_LIBRARY_PATH")]))
    env.update(extra)
    return env


def run_rayscope(
    *args: str,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 60.0,
    cwd: Path = REPO,
    prefix: Sequence[str] = (),
) -> "subprocess.CompletedProcess[str]":
    """``python -m rayscope ARGS`` as an operator runs it: its own process, real exit code
    (in ``cwd``; under another command, ``prefix``, such as ``unshare``)."""
    environment = dict(env) if env is not None else base_env(RAY_AUTH_MODE="disabled")
    return run_captured([*prefix, sys.executable, "-m", "rayscope", *args], environment, timeout, cwd)


def run_captured(
    argv: Sequence[str], env: Optional[Mapping[str, str]] = None, timeout: float = 60.0, cwd: Path = REPO
) -> "subprocess.CompletedProcess[str]":
    """``argv`` in its own process, its output captured as text and its exit code kept (never
    raised); ``env`` the child's whole environment (none: this process's)."""
    return subprocess.run(
        list(argv),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class LiveCluster:
    """A handle on ``tests/livecluster.py serve``: its state file and its command channel."""

    def __init__(
        self, root: Path, topology: str, auth_env: Mapping[str, str], options: Sequence[str] = ()
    ) -> None:
        self.root = root
        self.env = base_env(RAY_TMPDIR=str(root), **auth_env)
        self.log = open(root / "launcher.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(LIVECLUSTER),
                "serve",
                "--state",
                str(root / "state.json"),
                "--topology",
                topology,
                *options,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=self.env,
            text=True,
            cwd=REPO,
        )
        self._replies: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.state: dict[str, Any] = {}
        try:
            self._reply(START_TIMEOUT_S)
            self.state = json.loads((root / "state.json").read_text())
        except Exception:
            self.stop()
            raise

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(REPLY):
                self._replies.put(line[len(REPLY) :])

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                reply: dict[str, Any] = json.loads(self._replies.get(timeout=0.5))
                return reply
            except queue.Empty:
                if self.process.poll() is not None:
                    break
        log = (self.root / "launcher.log").read_text()[-3000:]
        raise RuntimeError(f"Ray test cluster did not answer (exit {self.process.poll()}):\n{log}")

    def request(self, timeout_s: float = 90.0, **request: Any) -> dict[str, Any]:
        """Send one command to the launcher (``op=actor|kill_actor|state``) and wait."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self._reply(timeout_s)
        if not reply.get("ok"):
            raise RuntimeError(f"launcher refused {request}: {reply.get('error')}")
        return reply

    @property
    def gcs_address(self) -> str:
        return str(self.state["gcs_address"])

    def node_id(self, name: str) -> str:
        return str(self.state["nodes"][name]["node_id"])

    def started_pids(self) -> list[int]:
        """Every process this cluster owns: the launcher, Ray's daemons, and every process
        whose command line names our private temp dir (Ray's workers do)."""
        pids = {self.process.pid, *self.state.get("pids", [])}
        marker = str(self.root)
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if any(marker in arg for arg in proc.info.get("cmdline") or []):
                pids.add(proc.info["pid"])
        pids.discard(os.getpid())
        return sorted(pids)

    def stop(self) -> None:
        """Graceful shutdown first, then SIGKILL by pid for anything left over."""
        leftovers = self.started_pids()
        if self.process.stdin and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        for pid in leftovers + self.started_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()
        self.log.close()


@contextlib.contextmanager
def running_cluster(topology: str) -> Iterator[LiveCluster]:
    """A live cluster of ``topology`` (auth off) for the block, then stopped and removed."""
    cluster = start_cluster(topology, {"RAY_AUTH_MODE": "disabled"})
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def start_cluster(topology: str, auth_env: Mapping[str, str], options: Sequence[str] = ()) -> LiveCluster:
    # Short path: Ray's Unix socket paths must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    return LiveCluster(root, topology, auth_env, options)


@contextlib.contextmanager
def running_dashboard_cluster(
    topology: str, nvml: fake_nvml.FakeNvml, scenarios: Mapping[str, str]
) -> Iterator[LiveCluster]:
    """A live cluster of ``topology`` with Ray's dashboard on (``ray[default]``), every
    raylet (and so its dashboard agent) on the fake NVML ``nvml``, node ``name`` reading the
    scenario text ``scenarios[name]`` (none: no GPU); ready once the dashboard lists every
    node's GPUs. Its address: ``state["dashboard_url"]``; scenarios can be rewritten under
    ``root / "nvml" / name`` (``fake_nvml.write_scenario``) while it runs."""
    root = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    (root / "nvml").mkdir()
    for name, text in scenarios.items():
        fake_nvml.write_scenario(root / "nvml" / name, text)
    env = {"RAY_AUTH_MODE": "disabled", "LD_LIBRARY_PATH": str(nvml.lib_dir)}
    try:  # a cluster that did not start has stopped itself: its directory goes all the same
        cluster = LiveCluster(root, topology, env, ["--dashboard", "--nvml-scenarios", str(root / "nvml")])
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def live_cluster() -> Iterator[LiveCluster]:
    """The seed's three nodes: Europa head (VRAM_MB 24576, 4 × 5120 MB booked), a deNBI T4
    worker (0.33 GPU booked), a CPU-only worker."""
    with running_cluster("seed") as cluster:
        yield cluster


BUILD_TIMEOUT_S = 900.0


def build_pyz(source: Path, out: Path) -> Path:
    """``build/pyz.py build`` of the sources at ``source``, as ``make pyz`` runs it."""
    done = subprocess.run(
        [sys.executable, str(source / "build" / "pyz.py"), "build", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out / "rayscope.pyz"


@pytest.fixture(scope="session")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's rayscope.pyz, built once per session (the zipapp's tests and the
    systemd units' live test run it)."""
    return build_pyz(REPO, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def rayscope_env(live_cluster: LiveCluster) -> dict[str, str]:
    """Environment for running rayscope against the live cluster."""
    return base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(live_cluster.root))


class Daemon:
    """``python -m rayscope ARGS`` left running (head or push agent), stopped by pid."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "a")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rayscope", *args],
            cwd=REPO,
            env=dict(env),
            stdout=self._log,
            stderr=self._log,
        )

    def log_text(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (the daemon must exit cleanly), SIGKILL if it does not; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout_s)
        self._log.close()
        return int(self.process.returncode)

    def kill(self) -> None:
        """SIGKILL: an agent that dies without a word."""
        self.process.kill()
        self.process.wait(timeout=15)
        self._log.close()


class HeadDaemon(Daemon):
    """A ``rayscope head`` on loopback ports the OS picks, with a way to query its HTTP side."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        extra: list[str],
        token_file: Optional[Path],
        listen_port: Optional[int] = None,
        http_port: Optional[int] = None,
    ) -> None:
        # Port 0 where none is given: the OS picks, and the start-up line names it (a port
        # probed free here could be taken by another process before the head binds it).
        self.listen_port, self.http_port = listen_port or 0, http_port or 0
        args = ["head", "--listen", f"127.0.0.1:{self.listen_port}", "--http", f"127.0.0.1:{self.http_port}"]
        args += ["--token-file", str(token_file)] if token_file else []
        self._log_start = log_path.stat().st_size if log_path.exists() else 0  # a log may be shared
        super().__init__(args + extra, env, log_path)
        self.token = token_file.read_text().strip() if token_file else ""
        self.wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def get(self, path: str, token: Optional[str] = None) -> tuple[int, bytes]:
        from tests.support import http_get

        bearer = self.token if token is None else token
        return http_get.get(self.url + path, {"Authorization": f"Bearer {bearer}"} if bearer else {})

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"head agent exited {self.process.returncode}:\n{self.log_text()}")
            if not (self.listen_port and self.http_port):
                bound = started_ports(self.log_text()[self._log_start :])
                if bound is None:
                    return False
                self.listen_port, self.http_port = bound
            return self.get("/healthz")[0] == 200

        eventually(
            answers, timeout_s, "the head agent answers /healthz", retry=(OSError,), detail=self.log_text
        )


def push_agent(
    listen_port: int,
    node_id: str,
    env: Mapping[str, str],
    log_path: Path,
    token_file: Path,
    interval_s: float = 1.0,
) -> Daemon:
    """``rayscope push`` for one Ray node (pinned: the test cluster runs its raylets on one host)."""
    args = ["push", "--head", f"127.0.0.1:{listen_port}", "--interval", str(interval_s)]
    return Daemon([*args, "--token-file", str(token_file), "--node-id", node_id], env, log_path)


def push_once_a_second(head: str, node_id: str, *extra: str) -> list[str]:
    """``rayscope push``'s arguments to ``head`` (HOST:PORT or a URL), a report a second as
    ``node_id``, then ``extra``."""
    return ["push", "--head", head, "--interval", "1", "--node-id", node_id, *extra]


def write_token(path: Path, token: str = "0123456789abcdef0123456789abcdef") -> Path:
    """A token file as a head and its agents take one: one line, mode 600 from its creation
    (a token file open to others is refused: SECURITY.md rule 5)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return path


@pytest.fixture(scope="session")
def wire_token(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_token(tmp_path_factory.mktemp("token") / "token")


@pytest.fixture(scope="session")
def head_daemon(tmp_path_factory: pytest.TempPathFactory, wire_token: Path) -> Iterator[HeadDaemon]:
    """A head agent with no reachable GCS (a closed port): the wire tests need no cluster."""
    logs = tmp_path_factory.mktemp("head")
    env = base_env(RAY_AUTH_MODE="disabled")
    head = HeadDaemon(
        env, logs / "head.log", ["--gcs", f"127.0.0.1:{refused_port()}", "--interval", "1"], wire_token
    )
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> fake_nvml.FakeNvml:
    """The fake ``libnvidia-ml.so.1``, built from C once per session (tests/fake_nvml)."""
    return fake_nvml.build(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture(scope="session")
def sleeper() -> Iterator[int]:
    """The pid of a process outside Ray (``sleep``) for scenarios to list as a GPU process."""
    proc = subprocess.Popen(["sleep", "3600"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def token(tmp_path: Path) -> Path:
    """A head's token file (mode 600), for the tests that run a head of their own."""
    return write_token(tmp_path / "token")


SLOW_FILES = frozenset(
    {
        "test_cli_messages.py",  # ~200 s: a fresh interpreter per message checked
        "test_pyz.py",  # ~190 s: builds the single file, runs it under every Python here
        "test_cron_output.py",  # ~90 s: 150 writers killed mid-write under a polling reader
        "test_fast_status.py",  # ~80 s: the fast path and the CLI, each in its own process
        "test_usage_memory.py",  # ~60 s: a full usage window at its memory bound
    }
)
"""The five files that took 72% of the suite's time without the live cluster (pytest
--durations, under load): marked ``slow`` so that ``make test-fast`` is an inner loop.
``make test`` (CI) runs them all."""


LIVE_FIXTURES = frozenset({"live_cluster", "rayscope_env", "reporting_fleet"})
"""The shared fixtures that start a Ray cluster: a test using one must be marked ``live``, so
that ``-m "not live"`` (``make test-fast``, ``make install-ends`` in venvs without ray) never
starts a cluster it cannot have."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = []
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if LIVE_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("live") is None:
            unmarked.append(item.nodeid)
    if unmarked:
        named = ", ".join(unmarked)
        raise pytest.UsageError(f"these tests start a Ray cluster but are not marked live: {named}")
