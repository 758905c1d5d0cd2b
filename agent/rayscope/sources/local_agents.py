"""rayscope node agents running on this host, found by their processes (``rayscope node``).

Two kinds: a ``push`` command (``rayscope push``, ``python rayscope.pyz push``, ``python -m
agent push``), and a Ray worker titled :data:`PROCESS_TITLE`
(placed by ``head --agents ray``). Anyone can name a process so: each entry shows its user,
and nothing of it is trusted beyond being shown (every string goes through ``printable``).
A ``push`` whose cgroup is a systemd ``.service`` unit counts as started by systemd.
"""

import os
from collections.abc import Sequence
from typing import Optional

import psutil

from rayscope.schema.node import AgentProcess
from rayscope.schema.report import STARTED_BY_RAY, SourceStatus
from rayscope.sources.procs import parse_title
from rayscope.sources.raylet import NOT_RUNNING

PROCESS_TITLE = "ray::RayscopeAgent"
"""What Ray titles the worker of ``rayscope.node.placed_agents.RayscopeAgent`` (``ray::<class>``)."""
MAX_ARG_CHARS = 256
"""A ``--head`` value longer than this is cut: it is only shown."""

MODULE_NAMES = ("rayscope", "agent")
"""``python -m NAME push``: ``agent`` was the package's name before 0.x; kept for one release so
an agent started by an older install is still listed."""


def _push_arguments(argv: Sequence[str]) -> Optional[list[str]]:
    """The arguments after ``push`` when ``argv`` runs rayscope's push command; else ``None``.

    rayscope is the program (``rayscope push``), or the script or module a Python runs
    (``python3 rayscope.pyz push``, ``python -m rayscope push``, and for one release the old
    module name, ``python -m rayscope push``): an editor open on ``rayscope.pyz`` is not an agent."""
    python = bool(argv) and os.path.basename(argv[0]).startswith("python")
    for i, word in enumerate(argv):
        if i > 0 and not (python and all(w.startswith("-") for w in argv[1:i] if w not in MODULE_NAMES)):
            return None
        base = os.path.basename(word)
        module = word in MODULE_NAMES and i > 1 and argv[i - 1] == "-m"
        if base == "rayscope" or (base.startswith("rayscope") and base.endswith(".pyz")) or module:
            rest = list(argv[i + 1 :])
            return rest[1:] if rest[:1] == ["push"] else None
    return None


def _option(arguments: Sequence[str], name: str) -> Optional[str]:
    for i, word in enumerate(arguments):
        if word == name and i + 1 < len(arguments):
            return arguments[i + 1][:MAX_ARG_CHARS]
        if word.startswith(name + "="):
            return word[len(name) + 1 :][:MAX_ARG_CHARS]
    return None


def parse_unit(cgroup: str) -> Optional[str]:
    """The systemd service a process runs in, from ``/proc/PID/cgroup``; ``None`` if none."""
    for line in cgroup.splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith(".service"):
                return part[:MAX_ARG_CHARS]
    return None


def parse_agent(argv: Sequence[str], pid: int, user: str, cgroup: str = "") -> Optional[AgentProcess]:
    """The agent ``argv`` (a process's command line) runs, if it is one."""
    if parse_title(argv) == PROCESS_TITLE:
        return AgentProcess(pid=pid, user=user, started_by=STARTED_BY_RAY)
    arguments = _push_arguments(argv)
    if arguments is None:
        return None
    unit = parse_unit(cgroup)
    return AgentProcess(
        pid=pid,
        user=user,
        started_by="systemd" if unit else "manual",
        head=_option(arguments, "--head"),
        unit=unit,
    )


def _cgroup(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return ""


def find_agents() -> tuple[list[AgentProcess], SourceStatus]:
    """Every rayscope node agent on this host, by pid; this process excluded."""
    agents: list[AgentProcess] = []
    denied = 0
    for proc in psutil.process_iter(["pid", "cmdline", "username", "status"]):
        if proc.pid == os.getpid() or proc.info.get("status") in NOT_RUNNING:
            continue
        argv = proc.info.get("cmdline")
        if argv is None:  # psutil gives None when the command line is not readable
            denied += 1
            continue
        user = proc.info.get("username") or ""
        agent = parse_agent(argv, proc.pid, user)
        if agent is not None and agent.started_by != STARTED_BY_RAY:  # read the cgroup of agents only
            agent = parse_agent(argv, proc.pid, user, _cgroup(proc.pid))
        if agent is not None:
            agents.append(agent)
    agents.sort(key=lambda a: a.pid)
    detail = f"{len(agents)} agent(s)" + (f"; {denied} process(es) not readable" if denied else "")
    return agents, SourceStatus(name="agents", ok=True, detail=detail)
