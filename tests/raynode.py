"""A one-node Ray cluster of its own (``ray start --head --block``) for tests that break it:
kill its GCS, restart it on the same port. The shared session cluster (conftest) is never
touched. Every process is found from the ``ray start`` process's tree and stopped by pid.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from tests.conftest import REPO
from tests.support.ports import free_port_for_ray

RAY = Path(REPO) / ".venv" / "bin" / "ray"
SHORT_HEALTH_CHECKS = {
    # A raylet that lost its GCS gives up after 5 s instead of 60 s; health checks every 0.5 s.
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "2",
}


class RayHead:
    """``ray start --head --block`` on 127.0.0.1:``port`` with 1 CPU and no dashboard
    (``extra``: more of ``ray start``'s options, e.g. ``--labels``)."""

    def __init__(self, port: int, env: Mapping[str, str], log_path: Path, extra: Sequence[str] = ()) -> None:
        self.port = port
        self.root = tempfile.mkdtemp(prefix="rs11-", dir="/tmp")  # short: Unix socket paths
        self._log = open(log_path, "a")  # noqa: SIM115 - closed in stop()
        args = [
            str(RAY),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={self.root}",
            "--num-cpus=1",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            # Ray's own ports, numbers in every supported release (free_port_for_ray says why)
            f"--dashboard-agent-listen-port={free_port_for_ray()}",
            f"--dashboard-agent-grpc-port={free_port_for_ray()}",
            f"--runtime-env-agent-port={free_port_for_ray()}",
            f"--metrics-export-port={free_port_for_ray()}",
            *extra,
        ]
        self.process = subprocess.Popen(
            args,
            cwd=self.root,
            env={**env, **SHORT_HEALTH_CHECKS, "RAY_TMPDIR": self.root},
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )
        self._seen: dict[int, float] = {}  # pid -> create time: a reused pid is not ours

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def processes(self) -> list[psutil.Process]:
        """``ray start`` and everything under it now (remembered, so that orphans are found)."""
        try:
            root = psutil.Process(self.process.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            found = []
        for proc in found:
            with contextlib.suppress(psutil.Error):
                self._seen.setdefault(proc.pid, proc.create_time())
        return found

    def pid_of(self, name: str, timeout_s: float = 120.0) -> int:
        """The pid of the named Ray process (``gcs_server``, ``raylet``) once it runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited {self.process.returncode} (see its log)")
            for proc in self.processes():
                try:
                    if proc.name() == name:
                        return int(proc.pid)
                except psutil.Error:
                    continue
            time.sleep(0.2)
        raise TimeoutError(f"no {name} under ray start after {timeout_s:g} s")

    def kill_gcs(self) -> int:
        pid = self.pid_of("gcs_server")
        self.processes()
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGKILL every process of this cluster, leaves first (by pid), then wait for the
        ``ray start`` process."""
        self.processes()
        for pid, created in sorted(self._seen.items(), reverse=True):
            if pid == self.process.pid:
                continue
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == created:
                    proc.kill()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=timeout_s)
        self._log.close()  # idempotent: stop() may run twice
        shutil.rmtree(self.root, ignore_errors=True)

    def wait_exit(self, timeout_s: float = 90.0) -> int:
        """``ray start --block`` ends when one of its processes died (after killing the rest)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        self.stop()  # whatever it left behind (and its log)
        return int(self.process.returncode)
