"""Node agents and the head agent on the real Ray test cluster.

One ``rayscope push`` per Ray node (pinned with ``--node-id``: the test cluster runs three
raylets on this one host) and one ``rayscope head``, all with a shared token, interval 1 s.
"""

import socket
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import HeadDaemon, LiveCluster, base_env, push_agent, run_rayscope
from tests.schemas import parsed
from tests.support.fleet import INTERVAL, NODES, Fleet
from tests.support.ports import LOOPBACK, refused_port
from tests.waiting import eventually

pytestmark = pytest.mark.live


@pytest.fixture
def fleet(reporting_fleet: Fleet) -> Fleet:
    """The module's fleet as every test may expect it, whatever ran before: each node's agent
    reporting and no stale report at the head. A test that kills or restarts a part puts it
    back; one that adds a node (the ghost) does it on a head of its own."""
    eventually(reporting_fleet.settled, timeout_s=6 * INTERVAL + 10, what="the fleet settled")
    return reporting_fleet


def test_every_node_reports_fresh_through_the_head(fleet: Fleet) -> None:
    doc = fleet.status()
    assert doc["view"] == "head"
    for name in NODES:
        node = doc["nodes"][fleet.cluster.node_id(name)]
        assert node["agent"] == "reporting" and node["stale"] is False
        assert node["report_age_s"] is not None and node["report_age_s"] < 3 * INTERVAL
        assert node["hostname"]  # the agent's host facts arrived
    head = doc["nodes"][fleet.cluster.node_id("head")]
    assert (head["used_vram_mb"], head["total_vram_mb"], head["used_gpu"]) == (20480, 24576, 0.04)


def test_node_lists_the_push_agents_running_on_its_host(fleet: Fleet) -> None:
    """``rayscope node`` names each node agent on this host by pid, with the head it pushes
    to. Control: a process that is rayscope but not ``push`` (this ``node`` itself) is not one."""
    from rayscope.sources.local_agents import parse_unit

    done = run_rayscope("node", "--json", env=fleet.env)
    assert done.returncode in (0, 1), done.stderr
    agents = {a["pid"]: a for a in parsed(done.stdout, "node")["agents"]}
    own_unit = parse_unit(Path("/proc/self/cgroup").read_text())  # the agents inherit it
    for name, daemon in fleet.agents.items():
        agent = agents.get(daemon.process.pid)
        assert agent is not None, (name, agents)
        assert agent["head"] == f"127.0.0.1:{fleet.head.listen_port}"
        assert agent["started_by"] == ("systemd" if own_unit else "manual")
    assert all(a["head"] for a in agents.values() if a["started_by"] != "ray")
    lines = run_rayscope("node", env=fleet.env).stdout
    assert f"push -> 127.0.0.1:{fleet.head.listen_port}" in lines


def test_head_lines_carry_no_marker_when_all_report(fleet: Fleet) -> None:
    done = fleet.run_status()
    assert done.returncode == 0, done.stderr
    assert "  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB  CPU: 8/8" in done.stdout
    assert "stale" not in done.stdout and "no agent" not in done.stdout


def test_rayscope_head_env_names_the_head(fleet: Fleet) -> None:
    env = {**fleet.env, "RAYSCOPE_HEAD": fleet.head.url, "RAYSCOPE_TOKEN_FILE": str(fleet.token_file)}
    done = run_rayscope("status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert parsed(done.stdout, "status")["view"] == "head"


def test_a_killed_agent_turns_stale_then_fresh_when_restarted(fleet: Fleet) -> None:
    fleet.agents["denbi"].kill()
    eventually(lambda: fleet.node("denbi")["stale"], timeout_s=6 * INTERVAL + 5, what="denbi stale")
    stale = fleet.node("denbi")
    assert stale["agent"] == "stale" and stale["report_age_s"] > 3 * INTERVAL
    done = fleet.run_status()
    t4 = [line for line in done.stdout.splitlines() if " T4 " in line]
    assert len(t4) == 1 and " stale " in t4[0] + " "
    assert done.returncode == 1  # partial: the agent was reporting and stopped
    assert done.stderr.startswith("rayscope: partial: stale report from 1 node(s): 127.0.0.1 (")
    fleet.agents["denbi"] = fleet.start_agent("denbi")
    eventually(lambda: fleet.node("denbi")["agent"] == "reporting", what="denbi fresh again")


def test_agents_reconnect_to_a_restarted_head_by_themselves(fleet: Fleet) -> None:
    fleet.restart_head()
    eventually(
        fleet.all_reporting,
        timeout_s=30,
        what="all agents back after a head restart",
    )
    assert all(agent.process.poll() is None for agent in fleet.agents.values())


def test_wrong_token_is_rejected_and_the_head_keeps_serving(fleet: Fleet, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not the shared secret")
    wrong.chmod(0o600)
    impostor = fleet.start_agent("impostor", token_file=wrong, node_id="baad" * 14)
    try:
        eventually(
            lambda: "rejected frame (bad token)" in fleet.head.log_text(), what="the head logs the bad MAC"
        )
        doc = fleet.status()
        assert "baad" * 14 not in doc["nodes"]
        assert all(doc["nodes"][fleet.cluster.node_id(n)]["agent"] == "reporting" for n in NODES)
    finally:
        impostor.stop()


def test_report_for_a_node_the_gcs_does_not_know_is_no_raylet(
    live_cluster: LiveCluster, tmp_path: Path, wire_token: Path
) -> None:
    """On a head of its own: the ghost's report, stale once it stops, would stay at a shared
    head for 20 intervals and make every later test's status partial."""
    ghost_id = "0ddba11" + "0" * 49
    fleet = Fleet(live_cluster, tmp_path, wire_token, nodes=())  # a head and the ghost's agent only
    try:
        fleet.agents["ghost"] = fleet.start_agent("ghost", node_id=ghost_id)

        def ghost_beside_a_scheduler_view() -> Optional[dict[str, Any]]:
            # "no raylet" needs the head's first GCS read, which a loaded machine takes seconds for
            document = fleet.status()
            if not any(s["name"] == "gcs" and s["ok"] for s in document["sources"]):
                return None
            return document["nodes"][ghost_id]  # type: ignore[no-any-return]

        ghost = eventually(ghost_beside_a_scheduler_view, what="the ghost node beside a scheduler view")
        assert ghost["in_scheduler"] is False
        done = fleet.run_status()
        assert any(line.endswith("no raylet") for line in done.stdout.splitlines())
        assert fleet.agents.pop("ghost").stop() == 0  # SIGTERM: a clean exit
    finally:
        fleet.stop()


def test_metrics_and_auth(fleet: Fleet) -> None:
    code, body = fleet.head.get("/metrics")
    assert code == 200
    text = body.decode()
    head_id = fleet.cluster.node_id("head")
    assert f'rayscope_vram_booked_bytes{{node_id="{head_id}",node_ip="127.0.0.1"}} {20480 * 1024**2}' in text
    assert f'rayscope_gpus_booked{{node_id="{head_id}",node_ip="127.0.0.1"}} 0.04' in text
    assert 'rayscope_source_up{source="gcs"} 1' in text
    assert "rayscope_report_age_seconds{" in text
    assert "rayscope_gpu_memory_used_bytes{" not in text.replace("# ", "")  # unknown: absent, not 0
    assert fleet.head.get("/metrics", token="wrong")[0] == 401
    assert fleet.head.get("/v1/status", token="wrong")[0] == 401
    assert fleet.head.get("/healthz", token="wrong")[0] == 200


def test_status_head_without_token_says_so(fleet: Fleet) -> None:
    done = run_rayscope("status", "--head", fleet.head.url, env=fleet.env)
    assert done.returncode == 2
    assert done.stderr == (
        f"rayscope: head agent at {fleet.head.url} requires a token: pass --token-file (the head's)\n"
    )


def test_unreachable_head_is_one_line_and_exit_2() -> None:
    url = f"http://127.0.0.1:{refused_port()}"
    done = run_rayscope("status", "--head", url)
    assert done.returncode == 2
    assert done.stderr == f"rayscope: head agent unreachable at {url} (connection refused)\n"


def test_non_loopback_without_token_is_refused(live_cluster: LiveCluster) -> None:
    done = run_rayscope("head", "--http", "0.0.0.0:7532", "--gcs", live_cluster.gcs_address)
    assert done.returncode == 2
    assert done.stderr.startswith("rayscope: refusing to listen on 0.0.0.0 without a token")
    assert len(done.stderr.splitlines()) == 1


def test_agent_started_before_its_head_connects_when_it_comes_up(
    live_cluster: LiveCluster, tmp_path: Path, wire_token: Path
) -> None:
    env = base_env(RAY_AUTH_MODE="disabled")
    # The agent needs its head's port before the head starts: a port the OS gave, held bound
    # (never listening: the agent is refused) and let go only just before the head binds it.
    held = socket.socket()
    held.bind((LOOPBACK, 0))
    listen = int(held.getsockname()[1])
    agent = push_agent(listen, live_cluster.node_id("cpu"), env, tmp_path / "push.log", wire_token)
    try:
        eventually(lambda: "unreachable" in agent.log_text(), what="the agent tries, fails, backs off")
        extra = ["--gcs", live_cluster.gcs_address, "--interval", "1"]
        held.close()
        head = HeadDaemon(env, tmp_path / "head.log", extra, wire_token, listen_port=listen)
        try:

            def reporting() -> bool:
                _, body = head.get("/v1/status")
                return bool(
                    parsed(body, "status")["nodes"][live_cluster.node_id("cpu")]["agent"] == "reporting"
                )

            eventually(reporting, timeout_s=20, what="the early agent reporting")
            log = agent.log_text()  # before the head stops: losing it again is a new state change
        finally:
            head.stop()
        assert log.count("unreachable") == 1  # one line per state change, not one per retry
        assert "connected to head" in log
    finally:
        held.close()  # idempotent: closed already unless the agent never tried
        assert agent.stop() == 0


def test_head_json_has_every_bioengine_key_plus_ours(fleet: Fleet) -> None:
    code, body = fleet.head.get("/v1/status")
    assert code == 200
    doc = parsed(body, "status")
    bioengine_node_keys = {
        "node_ip", "head", "total_cpu", "used_cpu", "total_gpu", "used_gpu", "total_gpu_memory",
        "used_gpu_memory", "total_memory", "used_memory", "total_object_store_memory",
        "used_object_store_memory", "accelerator_type", "slurm_job_id",
    }  # fmt: skip
    seed_pr_keys = {"total_vram_mb", "used_vram_mb"}
    ours = {"report_age_s", "stale", "alive", "gpus", "agent"}
    for node in doc["nodes"].values():
        assert bioengine_node_keys | seed_pr_keys | ours <= node.keys()
    assert {"total_cpu", "used_cpu", "total_gpu", "used_gpu"} | seed_pr_keys <= doc["cluster"].keys()
    assert {"schema", "generated_at", "sources", "view"} <= doc.keys() and doc["view"] == "head"
    # The head's in-process GCS client: its Ray and the cluster's (here the same release).
    versions = {s["name"]: s for s in doc["sources"]}["ray"]
    assert versions["detail"].startswith("cluster Ray 2.") and versions["reason"] == "", versions


def test_fit_reads_the_head_like_status(fleet: Fleet) -> None:
    """``fit --head``: the head's view, every node's agent report beside the booking (no
    NVIDIA driver here, so each agent's NVML reason is what the check reports)."""
    token = ["--token-file", str(fleet.token_file)]
    done = run_rayscope(
        "fit", "--gpu-memory-mb", "4096", "--json", "--head", fleet.head.url, *token, env=fleet.env
    )
    assert done.returncode == 0, done.stderr
    doc = parsed(done.stdout, "fit")
    assert doc["view"] == "head" and doc["fits"] is True and doc["fits_measured"] is None
    head = next(n for n in doc["nodes"] if n["node_id"] == fleet.cluster.node_id("head"))
    assert head["placed"] == 1 and head["measured"] == "unknown"
    assert "not found" in head["measured_reason"]  # the agent's own NVML reason, not "no agent"
