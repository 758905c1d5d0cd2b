"""The pure parts of placing agents through Ray: the reconcile plan, names, how an agent says
it was started, and the CLI's refusals. The live behaviour: tests/test_live_ray_agents.py."""

from pathlib import Path

import msgspec

from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.node.placed_agents import agent_name, node_of, plan, shipped_modules
from rayscope.node.push import started_by
from rayscope.render.status import node_line
from rayscope.schema.report import NodeReport
from rayscope.schema.status import NodeStatus, RayNode, ReceivedReport
from tests.conftest import run_rayscope
from tests.support.ports import refused_port
from tests.tools.bench_agents import BEGIN, END, keep_marked, write_section


def test_a_new_node_gets_an_agent() -> None:
    step = plan(alive={"a", "b"}, existing={"a"}, placed={"a"}, waiting=set())
    assert (step.place, step.replace, step.forget, step.adopt_none) == (["b"], [], [], [])


def test_a_vanished_agent_on_a_live_node_is_replaced() -> None:
    step = plan(alive={"a", "b"}, existing={"a"}, placed={"a", "b"}, waiting=set())
    assert (step.place, step.replace, step.forget) == ([], ["b"], [])


def test_a_dead_nodes_agent_is_forgotten_not_replaced() -> None:
    """Whether the GCS still lists its actor (dying) or not, a node that left is only forgotten."""
    for existing in ({"a"}, {"a", "gone"}):
        step = plan(alive={"a"}, existing=existing, placed={"a", "gone"}, waiting=set())
        assert (step.place, step.replace, step.forget, step.adopt_none) == ([], [], ["gone"], [])


def test_an_earlier_heads_agents_are_replaced_not_adopted() -> None:
    """Their token or head address may differ from this head's."""
    step = plan(alive={"a"}, existing={"a"}, placed=set(), waiting=set())
    assert (step.place, step.adopt_none) == ([], ["a"])


def test_a_node_waiting_out_a_failed_start_is_not_placed_again_yet() -> None:
    step = plan(alive={"a", "b"}, existing={"a"}, placed={"a"}, waiting={"b"})
    assert step.place == []


def test_names_round_trip_and_other_names_are_not_agents() -> None:
    assert node_of(agent_name("abc123")) == "abc123"
    assert node_of("SERVE_PROXY_ACTOR-abc123") is None


def test_the_shipped_modules_are_the_package_and_its_libraries() -> None:
    """``py_modules``: package directories (``rayscope``, ``msgspec``, ``psutil``) and the one
    file of ``pynvml``; no site-packages directory as a whole."""
    names = sorted(path.rstrip("/").rsplit("/", 1)[1] for path in shipped_modules())
    assert names == ["msgspec", "psutil", "pynvml.py", "rayscope"]


def test_started_by_reads_systemds_mark() -> None:
    assert started_by({"INVOCATION_ID": "0f3c"}) == "systemd"
    assert started_by({}) == "manual"


def test_an_old_report_without_started_by_still_decodes() -> None:
    old = msgspec.msgpack.encode({"schema": 1, "node_id": "n1", "collected_at": 1.0})
    assert msgspec.msgpack.decode(old, type=NodeReport).started_by == ""


def _head_status_line(report_started_by: str) -> str:
    view = RayNode(node_id="n1", node_ip="10.0.0.5", total={"CPU": 8.0}, available={"CPU": 8.0})
    report = NodeReport(node_id="n1", collected_at=100.0, started_by=report_started_by)
    status = merge(
        scheduler_nodes([view]),
        {"n1": ReceivedReport(report=report, received_at=100.0)},
        now=101.0,
        stale_after_s=15.0,
        view="head",
        gcs_address=None,
        sources=[],
    )
    node: NodeStatus = status.nodes["n1"]
    assert node.agent_started_by == report_started_by
    return node_line(node, view="head")


def test_status_says_how_each_node_is_covered() -> None:
    assert _head_status_line("ray") == "10.0.0.5 [worker] CPU: 0/8  agent: ray"
    assert _head_status_line("systemd") == "10.0.0.5 [worker] CPU: 0/8  agent: systemd"
    assert _head_status_line("") == "10.0.0.5 [worker] CPU: 0/8"  # an agent older than the field
    assert _head_status_line("x" * 4000) == "10.0.0.5 [worker] CPU: 0/8  agent: other"  # a report's own word


def test_remove_without_agents_ray_is_one_line_exit_2() -> None:
    done = run_rayscope("head", "--remove", "--gcs", f"127.0.0.1:{refused_port()}")
    assert (done.returncode, done.stderr) == (2, "rayscope: --remove goes with --agents ray\n")


def test_an_unknown_agents_mode_is_refused() -> None:
    done = run_rayscope("head", "--agents", "kubernetes")
    assert done.returncode == 2 and "kubernetes" in done.stderr and "Traceback" not in done.stderr


def test_bench_agents_section_is_replaced_in_place_and_kept_by_make_bench(tmp_path: Path) -> None:
    """``make bench-agents`` rewrites only its own section; ``make bench`` (which rewrites
    BENCHMARKS.md) appends what ``keep_marked`` returns, so the section survives it."""
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n| a | b |\n")
    write_section(path, "first\n")
    write_section(path, "second\n")
    text = path.read_text()
    assert text.count(BEGIN) == 1 and "second" in text and "first" not in text
    assert text.startswith("# Benchmarks\n\n| a | b |\n")
    assert keep_marked(path) == f"{BEGIN}\nsecond\n{END}\n"
    assert keep_marked(tmp_path / "absent.md") == ""


def test_rayscope_node_looks_for_the_title_ray_gives_the_agents_worker() -> None:
    """Ray titles an actor's worker ``ray::<class name>``: renaming the class must rename the title."""
    from rayscope.node.placed_agents import RayscopeAgent
    from rayscope.sources.local_agents import PROCESS_TITLE

    assert f"ray::{RayscopeAgent.__name__}" == PROCESS_TITLE


class _BrokenCluster:
    """Ray's calls failing as they do when the GCS went away mid-reconcile."""

    connected = True

    def connect(self) -> None:
        return None

    def named_actors(self) -> list[str]:
        raise ConnectionError("GCS at 127.0.0.1:6379 is gone")


def test_a_failed_reconcile_is_a_source_status_of_the_head() -> None:
    """Positive control: drop ``more_sources`` from ``HeadState.status`` and the status no
    longer says why no agent is placed."""
    from typing import Any, cast

    from rayscope.head.store.state import HeadState
    from rayscope.node.placed_agents import RayAgents

    agents = RayAgents("127.0.0.1:6379", ("10.0.0.1", 7531), b"t", 5.0, cluster=cast(Any, _BrokenCluster()))
    state = HeadState(5.0, "127.0.0.1:6379")
    state.more_sources.append(agents.status)
    assert [s.name for s in state.status(0.0).sources if s.name == "ray_agents"] == ["ray_agents"]
    assert agents.status().ok
    agents.reconcile(["a"])
    (source,) = [s for s in state.status(0.0).sources if s.name == "ray_agents"]
    assert not source.ok and "GCS at 127.0.0.1:6379 is gone" in source.reason
