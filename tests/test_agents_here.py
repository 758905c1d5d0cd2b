"""``rayscope node`` lists the rayscope node agents running on its host (recorded command
lines here; a live push agent in tests/test_live_head.py, Ray-placed ones in
tests/test_live_ray_agents.py)."""

from typing import Optional

import pytest

from rayscope.render.node import node_lines
from rayscope.schema.node import AgentProcess, NodeDiagnostics
from rayscope.sources.local_agents import PROCESS_TITLE, parse_agent, parse_unit

SERVICE_V2 = "0::/system.slice/rayscope-agent.service\n"
SERVICE_V1 = (
    "12:pids:/system.slice/rayscope-agent.service\n1:name=systemd:/system.slice/rayscope-agent.service\n"
)
SESSION = "0::/user.slice/user-0.slice/session-3.scope\n"


PYZ = ["/usr/bin/python3", "/opt/rayscope.pyz", "push", "--head", "10.0.0.1:7000"]
SCRIPT = ["/usr/local/bin/rayscope", "push", "--head=10.0.0.1:7000", "--interval", "5"]
SHEBANG = ["/usr/bin/python3", "/usr/local/bin/rayscope", "push", "--head", "h:1"]
MODULE = ["/venv/bin/python", "-I", "-m", "rayscope", "push", "--head", "127.0.0.1:9"]
RAY_WORKER = [PROCESS_TITLE + " " * 40]  # Ray pads the title it writes over argv


@pytest.mark.parametrize(
    ("argv", "cgroup", "started_by", "head"),
    [
        (PYZ, SESSION, "manual", "10.0.0.1:7000"),
        (SCRIPT, SERVICE_V2, "systemd", "10.0.0.1:7000"),
        (SHEBANG, SERVICE_V1, "systemd", "h:1"),
        (MODULE, "", "manual", "127.0.0.1:9"),
        (RAY_WORKER, SERVICE_V2, "ray", None),
    ],
)
def test_an_agent_is_known_by_its_command_line(
    argv: list[str], cgroup: str, started_by: str, head: Optional[str]
) -> None:
    agent = parse_agent(argv, 4242, "root", cgroup)
    assert agent is not None
    assert (agent.pid, agent.user, agent.started_by, agent.head) == (
        4242,
        "root",
        started_by,
        head,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/local/bin/rayscope", "status", "--head", "10.0.0.1:7000"],
        ["/usr/bin/python3", "-m", "rayscope", "node"],
        ["vim", "rayscope.pyz", "push"],
        ["/usr/bin/python3", "train.py", "rayscope.pyz", "push"],
        ["ray::NodeAgent"],
        ["ray::IDLE"],
        [],
    ],
)
def test_other_processes_are_not_agents(argv: list[str]) -> None:
    assert parse_agent(argv, 1, "bob") is None


def test_the_systemd_unit_is_read_from_the_cgroup() -> None:
    assert parse_unit(SERVICE_V2) == parse_unit(SERVICE_V1) == "rayscope-agent.service"
    assert parse_unit(SESSION) is None and parse_unit("0::/\n") is None


def test_node_lines_name_each_agent_and_strip_what_a_user_typed() -> None:
    """Any user can start a process that looks like an agent: its user is shown and its
    ``--head`` cannot put an escape sequence on the operator's terminal."""
    agents = [
        AgentProcess(
            pid=10, user="root", started_by="systemd", head="10.0.0.1:7000", unit="rayscope.service"
        ),
        AgentProcess(pid=11, user="ray", started_by="ray"),
        AgentProcess(pid=12, user="mallory", started_by="manual", head="\x1b]0;owned\x07\x1b[2J"),
    ]
    lines = node_lines(NodeDiagnostics(generated_at=0.0, agents=agents))
    assert "Agents: pid 10 push -> 10.0.0.1:7000 (systemd rayscope.service, user root)" in lines
    assert "        pid 11 placed by Ray (head --agents ray, user ray)" in lines
    assert "        pid 12 push -> ]0;owned[2J (manual, user mallory)" in lines
    assert "Agents: none running here" in node_lines(NodeDiagnostics(generated_at=0.0, agents=[]))
    assert not any(line.startswith("Agents") for line in node_lines(NodeDiagnostics(generated_at=0.0)))
