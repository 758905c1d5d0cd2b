"""Node agents placed through Ray (``rayscope head --agents ray``) on a real Ray cluster.

A cluster of its own (head + deNBI worker, ``ray.cluster_utils.Cluster`` on 127.0.0.1), since
these tests add, remove and kill nodes and actors. Every test starts its own head agent with a
short interval and stops it at the end; the fixture checks that the stop left no rayscope actor
in the GCS.
"""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayscope.node.placed_agents import RETRY_AFTER_INTERVALS
from tests.conftest import HeadDaemon, LiveCluster, base_env, run_rayscope, running_cluster
from tests.reliability_plugin import FaultRecord
from tests.schemas import parsed
from tests.support.ports import ANY_PORT
from tests.waiting import eventually, timed

pytestmark = pytest.mark.live

INTERVAL = 1.5
NAMESPACE = "rayscope"
WORKER_START_S = 20.0
"""Slack for Ray to start the actor's worker process on a loaded 2-core machine (runtime
environment set-up, ``import ray``); the intervals are what the tests hold the head to."""
EXTRA_NODE = {"num_cpus": 2, "num_gpus": 0}
RESOURCE_KEYS = (
    "total_cpu", "used_cpu", "total_gpu", "used_gpu", "total_vram_mb", "used_vram_mb",
    "total_memory", "used_memory", "total_object_store_memory", "used_object_store_memory",
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[LiveCluster]:
    with running_cluster("demo") as live:
        yield live


def rayscope_actors(cluster: LiveCluster) -> list[str]:
    names = cluster.request(op="named_actors")["actors"]
    return sorted(a["name"] for a in names if a["namespace"] == NAMESPACE)


class RayHead:
    """``rayscope head --agents ray`` against the module's cluster."""

    def __init__(self, cluster: LiveCluster, logs: Path, token_file: Path) -> None:
        self.cluster, self.token_file = cluster, token_file
        self.env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
        extra = ["--gcs", cluster.gcs_address, "--interval", str(INTERVAL), "--agents", "ray"]
        self.daemon = HeadDaemon(self.env, logs / "head.log", extra, token_file)

    def status(self) -> dict[str, Any]:
        code, body = self.daemon.get("/v1/status?all=1")
        assert code == 200, body
        doc: dict[str, Any] = parsed(body, "status")
        return doc

    def node(self, node_id: str) -> dict[str, Any]:
        node: dict[str, Any] = self.status()["nodes"][node_id]
        return node

    def fresh_since(self, node_id: str, since: float) -> bool:
        """A report from ``node_id``'s Ray-placed agent received after ``since`` (wall clock)."""
        node = self.node(node_id)
        received = time.time() - (node["report_age_s"] if node["report_age_s"] is not None else 1e9)
        return bool(node["agent"] == "reporting" and node["agent_started_by"] == "ray" and received > since)

    def wait_all_reporting(self) -> None:
        """Until every alive node reports through its Ray-placed agent."""
        eventually(
            lambda: all(self.fresh_since(n, 0) for n in alive_ids(self.cluster)),
            timeout_s=2 * INTERVAL + WORKER_START_S,
            what="every node reporting through a Ray-placed agent",
        )

    def health(self) -> dict[str, Any]:
        code, body = self.daemon.get("/healthz")
        assert code == 200
        health: dict[str, Any] = json.loads(body)
        return health


def add_node(cluster: LiveCluster, name: str) -> dict[str, Any]:
    """``add_node``, tried again when Ray gives up on the raylet after its fixed 30 s (this
    machine is shared and can be that slow); a raylet that never registered holds nothing."""
    for attempt in range(3):
        try:
            return cluster.request(op="add_node", name=name, args=EXTRA_NODE)
        except RuntimeError as err:
            if attempt == 2 or "timed out during startup" not in str(err):
                raise
    raise AssertionError("unreachable")


def alive_ids(cluster: LiveCluster) -> list[str]:
    return [cluster.node_id(n) for n in cluster.state["nodes"]]


@pytest.fixture
def ray_head(cluster: LiveCluster, tmp_path: Path, wire_token: Path) -> Iterator[RayHead]:
    assert rayscope_actors(cluster) == [], "an earlier test left agents behind"
    head = RayHead(cluster, tmp_path, wire_token)
    try:
        head.wait_all_reporting()
        yield head
    finally:
        code = head.daemon.stop(timeout_s=60)
        log = head.daemon.log_text()
        assert code == 0, log
        assert rayscope_actors(cluster) == [], log  # the shutdown removed every agent it placed


def test_every_node_reports_through_a_ray_placed_agent(cluster: LiveCluster, ray_head: RayHead) -> None:
    """Control: place no agent (``--agents none``) and no node reports (``no agent``)."""
    assert rayscope_actors(cluster) == sorted(f"rayscope-agent:{n}" for n in alive_ids(cluster))
    eventually(lambda: ray_head.health()["agents_running"] == 2, timeout_s=10, what="/healthz: 2 running")
    health = ray_head.health()
    assert (health["agents_placed"], health["agents_starting"], health["agents_failing"]) == (2, 0, 0)
    done = run_rayscope(
        "status", "--head", ray_head.daemon.url, "--token-file", str(ray_head.token_file), env=ray_head.env
    )
    assert done.returncode == 0, done.stderr
    node_lines = [line for line in done.stdout.splitlines() if line.startswith("  127.0.0.1")]
    assert len(node_lines) == 2 and all(line.endswith("agent: ray") for line in node_lines), done.stdout
    # ``rayscope node`` on this host (both raylets run here) finds both agents' workers.
    node = run_rayscope("node", "--json", env=ray_head.env)
    placed = [a for a in parsed(node.stdout, "node")["agents"] or [] if a["started_by"] == "ray"]
    assert len(placed) == 2, node.stdout[-2000:]


def test_agents_book_nothing(cluster: LiveCluster, tmp_path: Path, wire_token: Path) -> None:
    """The scheduler's per-node sums with the agents running equal those without them, plus
    two markers booked after the agents run. Raylets send their availability to the GCS
    asynchronously, so sums read too early would match whatever the agents booked; the GCS
    showing the markers (``place`` waits until it does) proves its view is no older than the
    agents. Control: give the agent a booking (``memory=64 * 2**20`` in ``ray_actors``'s
    options) and ``used_memory`` differs on every node (with ``num_cpus=1``, Ray's default
    for an actor's placement, the seed's full head could not place its agent at all)."""
    env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))

    def sums() -> dict[str, dict[str, float]]:
        done = run_rayscope("status", "--json", "--gcs", cluster.gcs_address, "--timeout", "30", env=env)
        assert done.returncode == 0, done.stderr
        doc = parsed(done.stdout, "status")
        nodes = {nid: {k: node[k] for k in RESOURCE_KEYS} for nid, node in doc["nodes"].items()}
        return {"cluster": {k: doc["cluster"][k] for k in RESOURCE_KEYS}, **nodes}

    without = sums()
    markers = {  # what each node has free: the seed books all of the head's CPUs
        "marker-head": ("head", {"num_cpus": 0, "resources": {"VRAM_MB": 1024}}, "used_vram_mb", 1024),
        "marker-denbi": ("denbi", {"num_cpus": 1}, "used_cpu", 1),
    }
    expected = {key: dict(values) for key, values in without.items()}
    placed: list[str] = []
    head = RayHead(cluster, tmp_path, wire_token)
    try:
        head.wait_all_reporting()
        assert len(rayscope_actors(cluster)) == 2
        for name, (node, options, key, amount) in markers.items():
            cluster.request(op="actor", name=name, node=node, options=options)
            placed.append(name)
            for where in (cluster.node_id(node), "cluster"):
                expected[where][key] += amount
        assert sums() == expected
    finally:
        for name in placed:
            cluster.request(op="kill_actor", name=name)
        assert head.daemon.stop(timeout_s=60) == 0


def test_an_added_node_reports_within_two_intervals(cluster: LiveCluster, ray_head: RayHead) -> None:
    """Control: reconcile only at start (drop the per-interval call in ``poll_gcs``) and the
    new node never gets an agent."""
    added = add_node(cluster, "extra")
    t0 = time.time()
    try:
        _, placed = timed(
            lambda: f"rayscope-agent:{added['node_id']}" in rayscope_actors(cluster),
            timeout_s=2 * INTERVAL + 5,
            what="an agent placed on the new node",
        )
        assert placed <= INTERVAL + 2  # one reconcile after the GCS listed it, plus a GCS read
        eventually(
            lambda: ray_head.fresh_since(added["node_id"], t0),
            timeout_s=2 * INTERVAL + WORKER_START_S,
            what="the new node reporting",
        )
    finally:
        cluster.request(op="remove_node", name="extra")


def test_a_removed_node_loses_its_agent_with_one_log_line(cluster: LiveCluster, ray_head: RayHead) -> None:
    """Control: forget nothing in ``plan`` and the agent stays counted as placed for ever
    (and the log line never comes)."""
    added = add_node(cluster, "leaving")
    node_id = added["node_id"]
    try:
        eventually(
            lambda: ray_head.fresh_since(node_id, 0),
            timeout_s=2 * INTERVAL + WORKER_START_S,
            what="the extra node reporting",
        )
    finally:
        cluster.request(op="remove_node", name="leaving")
    eventually(
        lambda: (
            f"rayscope-agent:{node_id}" not in rayscope_actors(cluster)
            and ray_head.health()["agents_placed"] == 2
        ),
        timeout_s=4 * INTERVAL + 10,
        what="the removed node's agent gone",
    )
    time.sleep(3 * INTERVAL)  # a storm would show up in the next intervals
    lines = [line for line in ray_head.daemon.log_text().splitlines() if node_id in line]
    left = [line for line in lines if "left the cluster" in line]
    assert len(left) == 1, lines
    assert not [line for line in lines if "WARNING" in line or "cannot" in line], lines
    assert ray_head.health()["agents_failing"] == 0


def test_a_killed_agent_is_replaced_within_two_intervals(cluster: LiveCluster, ray_head: RayHead) -> None:
    """Control: leave ``Plan.replace`` empty and the node goes stale, never fresh again."""
    node_id = cluster.node_id("denbi")
    cluster.request(op="kill_named", name=f"rayscope-agent:{node_id}", namespace=NAMESPACE)
    killed_at = time.time()
    _, placed = timed(
        lambda: (
            f"rayscope-agent:{node_id}" in rayscope_actors(cluster)
            and "is gone (crashed or killed)" in ray_head.daemon.log_text()
        ),
        timeout_s=2 * INTERVAL + 5,
        what="a new agent placed",
    )
    assert placed <= 2 * INTERVAL + 2
    eventually(
        lambda: ray_head.fresh_since(node_id, killed_at),
        timeout_s=2 * INTERVAL + WORKER_START_S,
        what="a report from the new agent",
    )


def test_remove_clears_agents_a_killed_head_left(
    cluster: LiveCluster, tmp_path: Path, wire_token: Path
) -> None:
    """A head that died by SIGKILL cannot remove its agents; ``--remove`` does.
    Control: make ``remove_all`` kill nothing and the GCS still lists two agents."""
    head = RayHead(cluster, tmp_path, wire_token)
    # Running, not only named: a name is registered as soon as the head asks for the actor,
    # and an agent whose worker was still starting when its head died under load never ran
    # (CI: one of the two gone right after the kill, its name left for the next tests).
    head.wait_all_reporting()
    head.daemon.kill()
    assert len(rayscope_actors(cluster)) == 2  # detached: they outlive their head
    env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
    done = run_rayscope(  # --remove binds nothing: --listen is never listened on
        "head", "--agents", "ray", "--remove", "--gcs", cluster.gcs_address, "--listen", ANY_PORT,
        env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "removed 2 agent(s) placed through Ray\n"
    assert rayscope_actors(cluster) == []


def test_the_token_travels_in_no_actor_table_entry_and_no_log(
    cluster: LiveCluster, ray_head: RayHead
) -> None:
    """The head's token is in no GCS actor table entry (what ``ray list actors --detail`` and
    the dashboard show, dead entries included) and in no log file of the Ray session or the
    head. Control: pass the token to the actor's constructor, or in ``env_vars``, and it
    shows in the creation task spec of the actor table."""
    token = ray_head.token_file.read_text().strip().encode()
    entries = [bytes.fromhex(h) for h in cluster.request(op="actor_table_hex")["actors"]]
    ours = [e for e in entries if b"rayscope-agent:" in e]
    assert len(ours) >= 2  # the agents are in the table: the search looks at the right place
    assert all(token not in e and token.hex().encode() not in e for e in entries)
    logs = [p for p in cluster.root.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000]
    assert any("worker" in p.name for p in logs)
    leaked = [str(p) for p in logs if token in p.read_bytes()]
    assert leaked == []
    assert token.decode() not in ray_head.daemon.log_text()


def test_the_agent_is_no_gpu_user(cluster: LiveCluster, ray_head: RayHead) -> None:
    """On a GPU node (deNBI, a T4) the agent books no GPU and sees no CUDA device, so no CUDA
    library in its process can open a context: it never appears among NVML's processes, the
    only way a process can be listed as ``unbooked``. Control: drop ``NO_GPU_ENV`` from the
    placement and ``CUDA_VISIBLE_DEVICES`` is unset (Ray 2.60 sets it only for GPU bookings)."""
    node_id = cluster.node_id("denbi")
    probe = cluster.request(op="probe_named", name=f"rayscope-agent:{node_id}", namespace=NAMESPACE)["probe"]
    assert probe["node_id"] == node_id
    assert probe["pushing"] is True
    assert probe["gpu_ids"] == []
    assert probe["cuda_visible_devices"] == ""
    maps = Path(f"/proc/{probe['pid']}/maps").read_text()
    assert "libcuda" not in maps and "libcudart" not in maps


@pytest.mark.fault
def test_an_agent_name_someone_keeps_re_creating_is_named_in_healthz_and_status(
    cluster: LiveCluster, tmp_path: Path, wire_token: Path, fault: FaultRecord
) -> None:
    """A Ray user's loop holds ``rayscope-agent:<deNBI>`` in namespace ``rayscope`` with an
    actor of its own and creates it again whenever it is gone. The head
    removes it once, then says so: ``/healthz`` counts it (``agents_name_held``), ``status``
    names it (``RAY_AGENTS: agent name held by another actor``), and the other node's agent
    runs. Before: the head removed the user's actor at every interval (the loop created it
    8 times in 17 s), never placed its own, and ``/healthz`` said nothing was failing.
    Control: forget what ``_remove_others`` removed and the count stays 0 while the loop
    creates its actor again at every interval."""
    fault.expect(
        "a Ray user's loop re-creates rayscope-agent:<node> in namespace rayscope whenever it is gone"
        " (before: the head removed it 10 times in 17 s, /healthz and status said nothing)",
        "/healthz counts it (agents_name_held) within 4 intervals, status names it, the other node's"
        " agent runs, the head removes the user's actor once per retry delay, not every interval",
    )
    name = f"rayscope-agent:{cluster.node_id('denbi')}"
    cluster.request(op="squat", name=name, namespace=NAMESPACE, node="denbi")
    started = time.monotonic()
    head = RayHead(cluster, tmp_path, wire_token)
    created = 0
    try:
        _, took = timed(
            lambda: head.health().get("agents_name_held") == 1,
            timeout_s=4 * INTERVAL + 10,
            what="/healthz counting the held agent name",
        )
        fault.observe(f"agents_name_held 1 after {took:.1f} s")
        eventually(
            lambda: head.fresh_since(cluster.node_id("head"), 0),
            timeout_s=2 * INTERVAL + WORKER_START_S,
            what="the head node reporting through its agent",
        )
        time.sleep(3 * INTERVAL)  # a fight over the name would show in the next intervals
        health = head.health()
        assert (health["agents_name_held"], health["agents_running"]) == (1, 1), health
        done = run_rayscope(
            "status", "--head", head.daemon.url, "--token-file", str(head.token_file), env=head.env
        )
        said = done.stdout + done.stderr
        assert f"RAY_AGENTS: agent name held by another actor on 1 node(s) ({name})" in said, said
        fault.observe("status: RAY_AGENTS: agent name held by another actor on 1 node(s); 1 agent running")
    finally:
        created = cluster.request(op="unsquat", name=name, namespace=NAMESPACE)["created"]
        elapsed = time.monotonic() - started
        code = head.daemon.stop(timeout_s=60)
        fault.observe(f"in {elapsed:.0f} s the user's loop created its actor {created} time(s)")
        assert code == 0, head.daemon.log_text()
    # Each removal by the head is followed by the loop's next creation: removed once, then
    # once per retry delay, not at every interval.
    assert 2 <= created <= 2 + elapsed // (RETRY_AFTER_INTERVALS * INTERVAL)
    assert rayscope_actors(cluster) == []
