"""A live fleet on the test cluster: ``rayscope head`` and one ``rayscope push`` per Ray node."""

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from tests.conftest import Daemon, HeadDaemon, LiveCluster, base_env, push_agent, run_rayscope
from tests.schemas import parsed
from tests.waiting import eventually

INTERVAL = 1.0


NODES = ("head", "denbi", "cpu")


class Fleet:
    """The head agent and one node agent per Ray node."""

    def __init__(
        self, cluster: LiveCluster, logs: Path, token_file: Path, nodes: tuple[str, ...] = NODES
    ) -> None:
        self.cluster, self.logs, self.token_file = cluster, logs, token_file
        self.env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
        self.head = self.start_head()
        self.agents = {name: self.start_agent(name) for name in nodes}

    def start_head(self, listen_port: Optional[int] = None, http_port: Optional[int] = None) -> HeadDaemon:
        extra = ["--gcs", self.cluster.gcs_address, "--interval", str(INTERVAL)]
        return HeadDaemon(self.env, self.logs / "head.log", extra, self.token_file, listen_port, http_port)

    def restart_head(self) -> None:
        """Stop the head and start a new one on the same ports (agents keep their address)."""
        assert self.head.stop() == 0  # SIGTERM: a clean exit
        self.head = self.start_head(self.head.listen_port, self.head.http_port)

    def start_agent(
        self, name: str, token_file: Optional[Path] = None, node_id: Optional[str] = None
    ) -> Daemon:
        node_id = node_id or self.cluster.node_id(name)
        log = self.logs / f"push-{name}.log"
        return push_agent(
            self.head.listen_port, node_id, self.env, log, token_file or self.token_file, INTERVAL
        )

    def run_status(self, *args: str) -> "subprocess.CompletedProcess[str]":
        """``rayscope status --head URL --token-file F ARGS``."""
        token = ["--token-file", str(self.token_file)]
        return run_rayscope("status", "--head", self.head.url, *token, *args, env=self.env)

    def status(self) -> dict[str, Any]:
        done = self.run_status("--json", "--all")
        if done.returncode == 2 and "no data" in done.stderr:  # the head has neither view nor report yet
            raise KeyError("no data yet")
        assert done.returncode in (0, 1), done.stderr  # 1 = partial: a stale agent, still a document
        doc: dict[str, Any] = parsed(done.stdout, "status")
        return doc

    def node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.status()["nodes"][self.cluster.node_id(name)]
        return node

    def all_reporting(self) -> bool:
        """Every node's agent fresh, and the head's scheduler view read (reports can arrive
        before the head's first GCS read, and then nodes show as not in the scheduler)."""
        return all(self.node(n)["agent"] == "reporting" and self.node(n)["in_scheduler"] for n in NODES)

    def settled(self) -> bool:
        """:meth:`all_reporting`, and no report at the head is stale (a test left none)."""
        return self.all_reporting() and not any(n["stale"] for n in self.status()["nodes"].values())

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.head.stop()


@contextlib.contextmanager
def running_fleet(cluster: LiveCluster, logs: Path, token_file: Path) -> Iterator[Fleet]:
    """A fleet on ``cluster`` once every agent reports; stopped afterwards."""
    fleet = Fleet(cluster, logs, token_file)
    try:
        eventually(fleet.all_reporting, what="all agents reporting")
        yield fleet
    finally:
        fleet.stop()
