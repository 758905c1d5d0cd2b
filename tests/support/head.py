"""A real ``rayscope head`` process on loopback ports the OS picks, for the live tests of its two ports."""

import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from tests.conftest import REPO, Daemon, base_env
from tests.support.ports import HEAD_ON_PORT_0, refused_port, wait_started
from tests.waiting import eventually

NODE = "ab" * 28


ENV = base_env(RAY_AUTH_MODE="disabled")


class Head(Daemon):
    """``rayscope head`` on loopback ports the OS picks (read from its start-up line),
    optionally with TLS and a file limit."""

    def __init__(
        self,
        log_path: Path,
        token_file: Path,
        interval_s: float = 1.0,
        extra: tuple[str, ...] = (),
        nofile: Optional[int] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self.ssl_context = ssl_context
        args = ["head", *HEAD_ON_PORT_0, "--gcs", f"127.0.0.1:{refused_port()}"]
        args += ["--interval", str(interval_s), "--token-file", str(token_file), *extra]
        self.token = token_file.read_text().strip()
        self.args, self.log_path = args, log_path
        log_start = log_path.stat().st_size if log_path.exists() else 0  # a log may be shared
        self._log = open(log_path, "a")  # noqa: SIM115 - closed in stop()
        limit = ["prlimit", f"--nofile={nofile}:{nofile}", "--"] if nofile else []  # soft and hard
        self.process = subprocess.Popen(
            [*limit, sys.executable, "-m", "rayscope", *args],
            cwd=REPO,
            env=ENV,
            stdout=self._log,
            stderr=self._log,
        )
        self.listen_port, self.http_port = wait_started(lambda: self.log_text()[log_start:], self.process)

        def answers() -> bool:
            assert self.process.poll() is None, self.log_text()
            return self.get("/healthz", timeout_s=2)[0] == 200

        eventually(answers, 30, "the head answers /healthz", retry=(OSError,))

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        import http.client

        conn: http.client.HTTPConnection
        if self.ssl_context is not None:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.http_port, timeout=timeout_s, context=self.ssl_context
            )
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout_s)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {self.token}"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def health(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.get("/healthz")[1])
        return doc

    def agent_state(self, node_id: str = NODE) -> str:
        """``reporting``, ``stale``, or ``absent``."""
        nodes = json.loads(self.get("/v1/status?all=1")[1]).get("nodes", {})
        return str(nodes[node_id]["agent"]) if node_id in nodes else "absent"
