"""Ray's dashboard on a live cluster: the demo's two raylets with the dashboard on,
each raylet (and so its dashboard agent) on the fake NVML with a scenario of its own, read the
way ``status`` will read it: the address from the GCS child's answer, then the one GET.

Needs ``ray[default]`` in the test venv (the dashboard's aiohttp and the rest).

Positive control: start the cluster without ``--nvml-scenarios`` (``scenarios={}``) and every
node reads ``gpus == []``: :func:`test_every_node_reads_its_own_gpus_from_the_dashboard` fails.
"""

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from rayscope.sources import dashboard
from rayscope.sources.gcs import child as gcs_child
from rayscope.units import MIB
from tests import fake_nvml
from tests.conftest import (
    HeadDaemon,
    LiveCluster,
    base_env,
    push_agent,
    run_rayscope,
    running_dashboard_cluster,
)
from tests.support.bioengine import assert_keeps_the_contract
from tests.support.dashboard import FakeDashboard, hangs, http
from tests.waiting import eventually

pytestmark = pytest.mark.live

T4 = "Tesla T4"
T4_UUID_OF = 2  # another device than the head's two RTX 3090s (uuid(0), uuid(1))


def denbi_scenario(pid: int) -> str:
    """deNBI's T4: 3 GiB used (+0.3 reserved), one process of 2 GiB."""
    return (
        fake_nvml.HEADER
        + "count 1\n"
        + fake_nvml.gpu(0, T4, pci="00000000:00:1E.0", total_gib=15, used_gib=3.0, uuid_of=T4_UUID_OF)
        + fake_nvml.process("gpu0", pid, 2.0)
    )


def app_scenario(sleeper: int, app_pid: int) -> str:
    """deNBI's T4 with its app at work: 3 GiB used (+0.3 reserved), the app (deNBI's actor,
    pid ``app_pid``) holding 1.5 GiB, a process outside Ray 0.5 GiB."""
    return (
        fake_nvml.HEADER
        + "count 1\n"
        + fake_nvml.gpu(0, T4, pci="00000000:00:1E.0", total_gib=15, used_gib=3.0, uuid_of=T4_UUID_OF)
        + fake_nvml.process("gpu0", app_pid, 1.5)
        + fake_nvml.process("gpu0", sleeper, 0.5)
    )


def wait_listed(cluster: LiveCluster, pid: int, timeout_s: float = 120.0) -> None:
    """Until the dashboard lists ``pid`` on a GPU (its agents sample every 5 s)."""
    address, _ = dashboard.choose_address(None, {}, cluster.state["dashboard_url"], "")
    assert address is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes, _ = dashboard.read_nodes(address, 10.0, "2.60.0", {})
        if any(p.pid == pid for n in nodes.values() for g in n.gpus or () for p in g.processes):
            return
        time.sleep(0.5)
    raise AssertionError(f"the dashboard never listed pid {pid}")


@pytest.fixture(scope="module")
def dashboard_cluster(fake_nvml_lib: fake_nvml.FakeNvml, sleeper: int) -> Iterator[LiveCluster]:
    """The demo's two raylets on the fake NVML, the head's two RTX 3090s, deNBI's T4 held by
    deNBI's app (its actor's pid, known once it runs) and by a process outside Ray."""
    scenarios = {"head": fake_nvml.two_gpus(sleeper), "denbi": denbi_scenario(sleeper)}
    with running_dashboard_cluster("demo", fake_nvml_lib, scenarios) as cluster:
        app = next(a["pid"] for a in cluster.state["actors"] if a["name"] == "denbi-app")
        fake_nvml.write_scenario(cluster.root / "nvml" / "denbi", app_scenario(sleeper, app))
        wait_listed(cluster, app)
        yield cluster


@pytest.fixture(scope="module")
def child_answer(dashboard_cluster: LiveCluster) -> dict[str, Any]:
    """The GCS child's answer, as ``status`` runs it."""
    answer: list[Any] = []
    gcs_child.read_cluster(dashboard_cluster.gcs_address, 60.0, sys.executable, _answer=answer)
    assert answer, "the GCS child gave no answer"
    return dict(answer[0])


def test_the_gcs_child_names_the_dashboard_the_cluster_published(
    dashboard_cluster: LiveCluster, child_answer: dict[str, Any]
) -> None:
    assert child_answer["dashboard_url"] == dashboard_cluster.state["dashboard_url"]
    assert child_answer["dashboard_url_error"] == ""


def test_every_node_reads_its_own_gpus_from_the_dashboard(
    dashboard_cluster: LiveCluster, child_answer: dict[str, Any], sleeper: int
) -> None:
    address, why = dashboard.choose_address(None, {}, child_answer["dashboard_url"], "")
    assert address is not None, why
    before = time.time()
    version = child_answer["cluster_ray_version"]
    nodes, status = dashboard.read_nodes(address, 30.0, version, {})
    assert status.ok, status.reason
    head, denbi = nodes[dashboard_cluster.node_id("head")], nodes[dashboard_cluster.node_id("denbi")]
    assert head.gpus is not None and denbi.gpus is not None
    assert [(g.name, g.memory_used_bytes, g.memory_total_bytes) for g in head.gpus] == [
        (fake_nvml.RTX_3090, 7475 * MIB, 24576 * MIB),
        (fake_nvml.RTX_3090, 307 * MIB, 24576 * MIB),
    ]
    assert [(g.name, g.memory_used_bytes, g.memory_total_bytes) for g in denbi.gpus] == [
        (T4, 3379 * MIB, 15360 * MIB)
    ]
    app = next(a["pid"] for a in dashboard_cluster.state["actors"] if a["name"] == "denbi-app")
    assert sorted((p.pid, p.used_memory_bytes) for p in denbi.gpus[0].processes) == sorted(
        [(app, 1536 * MIB), (sleeper, 512 * MIB)]
    )
    assert denbi.gpus[0].processes_believed is dashboard.believes_processes(version)
    for node in (head, denbi):
        assert node.measured_at is not None and before - 60 < node.measured_at <= time.time() + 1
        assert node.node_ip == "127.0.0.1"


# --- status, --gpus, fit and the head on this cluster, no rayscope agent  -----

RTX_PAIR = "VRAM: 7.6/48.0 GB"
"""The head's two RTX 3090s as the dashboard reads them: 7475 + 307 MiB of 2 × 24 GiB."""
T4_LINE = "VRAM: 3.3/15.0 GB"
"""deNBI's T4: 3.0 GiB used + 0.3 reserved (NVML's v1 used, what the dashboard reads)."""


def env_for(cluster: LiveCluster, **extra: str) -> dict[str, str]:
    """rayscope's environment: no NVIDIA driver on this host (every GPU node then needs the
    dashboard), unless ``extra`` puts the fake NVML first."""
    return base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root), **extra)


def node_lines(text: str) -> dict[str, str]:
    lines = [line.strip() for line in text.splitlines() if line.startswith("  127.0.0.1 ")]
    return {
        "head": next(x for x in lines if "[HEAD]" in x),
        "denbi": next(x for x in lines if "[worker]" in x),
    }


def test_status_reads_every_gpu_node_from_the_dashboard(dashboard_cluster: LiveCluster) -> None:
    """No agent, no NVML on this host: both GPU nodes measured, from the dashboard, said so.
    Before (phase 1, 9e3bf8c): ``VRAM: NA/NA GB`` on both."""
    env = env_for(dashboard_cluster)
    done = run_rayscope("status", "--gcs", dashboard_cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    shown = node_lines(done.stdout)
    assert RTX_PAIR in shown["head"] and T4_LINE in shown["denbi"]
    assert "VRAM: NA on" not in done.stdout and "DASHBOARD" not in done.stdout
    done = run_rayscope("-v", "status", "--json", "--gcs", dashboard_cluster.gcs_address, env=env)
    doc = json.loads(done.stdout)
    assert_keeps_the_contract(doc)
    for name, total_mib, used_mib in (("head", 2 * 24576, 7475 + 307), ("denbi", 15360, 3379)):
        node = doc["nodes"][dashboard_cluster.node_id(name)]
        assert node["used_gpu_memory_source"] == node["gpus_source"] == "ray-dashboard"
        assert (node["total_gpu_memory"], node["used_gpu_memory"]) == (total_mib * MIB, used_mib * MIB)
        assert 0 <= node["used_gpu_memory_age_s"] < 60
    said = [s for s in doc["sources"] if s["name"] == "dashboard"]
    assert said and said[0]["ok"] and "address from GCS" in said[0]["detail"]
    assert "dashboard: ok, http://" in done.stderr  # --verbose names it


def test_this_hosts_nvml_wins_and_the_worker_is_the_dashboards(
    dashboard_cluster: LiveCluster, fake_nvml_lib: fake_nvml.FakeNvml
) -> None:
    """Mixed: the head measured here (its scenario under this host's NVML: the v2 figure,
    7.0 GiB without the reserved memory), the worker by the dashboard."""
    scenario = str(dashboard_cluster.root / "nvml" / "head")
    env = env_for(
        dashboard_cluster, LD_LIBRARY_PATH=str(fake_nvml_lib.lib_dir), RAYSCOPE_FAKE_NVML_SCENARIO=scenario
    )
    done = run_rayscope("status", "--json", "--gcs", dashboard_cluster.gcs_address, env=env)
    doc = json.loads(done.stdout)
    head, denbi = (doc["nodes"][dashboard_cluster.node_id(n)] for n in ("head", "denbi"))
    assert (head["used_gpu_memory_source"], head["used_gpu_memory"]) == ("nvml", int(7.0 * 1024**3))
    assert "gpus_source" not in head
    assert denbi["used_gpu_memory_source"] == "ray-dashboard"


def test_gpus_names_the_actor_behind_the_dashboards_pid(dashboard_cluster: LiveCluster, sleeper: int) -> None:
    env = env_for(dashboard_cluster)
    done = run_rayscope("status", "--gpus", "--gcs", dashboard_cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    block = done.stdout.split(f"{dashboard_cluster.node_id('denbi')[:12]}:", 1)[1]
    assert "measured by Ray's dashboard agent" in block
    assert "GPU0 Tesla T4  booked 0.33 GPU by 1 actor  used 3.3 GB (Ray dashboard," in block
    assert "denbi-app#" in block and "booked 0.33 GPU used 1.5 GB" in block
    assert f"pid {sleeper} booked unknown used 0.5 GB  not mapped" in block
    # Both raylets run on this host, each measured on devices of its own: neither's actors
    # are listed on the other's GPUs (the demo listed all five on both).
    head = done.stdout.split(f"{dashboard_cluster.node_id('head')[:12]}:", 1)[1].split("GPUs of", 1)[0]
    assert "federated-unet" not in block and "denbi-app" not in head, done.stdout


def test_node_gpus_lists_only_the_raylets_measured_on_its_devices(
    dashboard_cluster: LiveCluster, fake_nvml_lib: fake_nvml.FakeNvml
) -> None:
    """``node --gpus`` on the host of both raylets, reading the head's devices: the head's
    four replicas on its GPU0, deNBI's app (measured by the dashboard on a T4 of its own)
    on none of them, as ``status --gpus`` groups them. Before: every local raylet's actors
    on this host's GPU0, ``booked 20480 MB + 0.33 GPU by 5 actors``."""
    scenario = str(dashboard_cluster.root / "nvml" / "head")
    env = env_for(
        dashboard_cluster, LD_LIBRARY_PATH=str(fake_nvml_lib.lib_dir), RAYSCOPE_FAKE_NVML_SCENARIO=scenario
    )
    done = run_rayscope("node", "--gpus", "--gcs", dashboard_cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    gpu0 = next(line for line in done.stdout.splitlines() if line.strip().startswith("GPU0 "))
    assert "booked 20480 MB by 4 actors" in gpu0, done.stdout
    assert "denbi-app" not in done.stdout and done.stdout.count("federated-unet-") == 4, done.stdout
    denbi = dashboard_cluster.node_id("denbi")[:12]
    assert f"not on these GPUs: Ray node 127.0.0.1 [worker] {denbi} (measured on other devices" in done.stdout


def test_fit_checks_the_dashboards_free_memory(dashboard_cluster: LiveCluster) -> None:
    env = env_for(dashboard_cluster)
    done = run_rayscope(
        "fit", "--gpu-memory-mb", "4096", "--sizing", "fraction", "--replicas", "2", "--json",
        "--gcs", dashboard_cluster.gcs_address, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fits = {n["node_id"]: n for n in json.loads(done.stdout)["nodes"]}
    denbi = fits[dashboard_cluster.node_id("denbi")]
    assert denbi["placed"] == 1 and denbi["measured"] == "ok"
    assert [(g["source"], g["free_bytes"]) for g in denbi["gpus"]] == [
        ("ray-dashboard", (15360 - 3379) * MIB)
    ]


def test_none_reads_no_dashboard(dashboard_cluster: LiveCluster) -> None:
    env = env_for(dashboard_cluster)
    done = run_rayscope(
        "-v", "status", "--dashboard", "none", "--gcs", dashboard_cluster.gcs_address, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "VRAM: NA/NA GB" in node_lines(done.stdout)["denbi"] and "DASHBOARD" not in done.stdout
    assert "dashboard: ok, not read (--dashboard none)" in done.stderr


HOSTILE = {
    "hangs": (hangs, "did not answer in time (timeout"),
    "500": (lambda conn, _r: conn.sendall(http(500, b"Internal Server Error")), "answered HTTP 500"),
    "garbage": (lambda conn, _r: conn.sendall(http(200, b"<html>proxy</html>")), "answered no node summary"),
    "wants a token": (
        lambda conn, _r: conn.sendall(http(401, b"Unauthorized: Missing authentication token")),
        "requires a token: set RAY_AUTH_TOKEN",
    ),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_dashboard_that_fails_is_todays_output_plus_one_line(
    dashboard_cluster: LiveCluster, kind: str
) -> None:
    """The lines as without a dashboard (``--dashboard none``), plus one naming the fix; the
    exit code as before; a hanging one costs no more than the command's deadline."""
    serve, said = HOSTILE[kind]
    server = FakeDashboard(serve)
    try:
        env = env_for(dashboard_cluster)
        gcs = ["--gcs", dashboard_cluster.gcs_address, "--timeout", "4"]
        before = run_rayscope("status", "--dashboard", "none", *gcs, env=env)
        started = time.monotonic()
        done = run_rayscope("status", "--dashboard", server.url, *gcs, env=env)
        took = time.monotonic() - started
    finally:
        server.close()
    assert done.returncode == before.returncode == 0, done.stderr
    extra = [line for line in done.stdout.splitlines() if line not in before.stdout.splitlines()]
    assert len(extra) == 1 and extra[0].startswith("DASHBOARD: ") and said in extra[0], extra
    assert "rayscope node agent" in extra[0]
    assert took < 4 + 3.0, took  # the GCS read and the GET share the 4 s


# --- the head: its page, /metrics, /v1/status and fit --head --------------------------------


@pytest.fixture(scope="module")
def head_agent(
    dashboard_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory, wire_token: Path
) -> Iterator[HeadDaemon]:
    logs = tmp_path_factory.mktemp("dashboard-head")
    env = env_for(dashboard_cluster)
    head = HeadDaemon(
        env, logs / "head.log", ["--gcs", dashboard_cluster.gcs_address, "--interval", "1"], wire_token
    )
    try:
        yield head
    finally:
        head.stop()


def served(head: HeadDaemon) -> dict[str, Any]:
    code, body = head.get("/v1/status?all=1")
    assert code == 200
    return dict(json.loads(body))


def test_the_head_serves_the_dashboards_figures_for_nodes_without_an_agent(
    dashboard_cluster: LiveCluster, head_agent: HeadDaemon, wire_token: Path
) -> None:
    denbi_id, head_id = dashboard_cluster.node_id("denbi"), dashboard_cluster.node_id("head")

    def measured() -> Optional[dict[str, Any]]:
        doc = served(head_agent)
        ok = all(doc["nodes"][n]["used_gpu_memory_source"] == "ray-dashboard" for n in (denbi_id, head_id))
        return doc if ok else None

    doc = eventually(measured, 60, "the head's status with the dashboard's figures")
    assert_keeps_the_contract(doc)
    assert doc["nodes"][denbi_id]["used_gpu_memory"] == 3379 * MIB
    code, metrics = head_agent.get("/metrics")
    assert code == 200
    assert f'rayscope_gpu_memory_used_bytes{{node_id="{denbi_id}"' in metrics.decode()
    code, page = head_agent.get("/")
    assert code == 200 and b"(Ray dashboard, " in page
    text = run_rayscope(
        "fit", "--gpu-memory-mb", "4096", "--sizing", "fraction", "--replicas", "2", "--json",
        "--head", head_agent.url,
        "--token-file", str(wire_token), env=env_for(dashboard_cluster),
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    fits = {n["node_id"]: n for n in json.loads(text.stdout)["nodes"]}
    assert [g["source"] for g in fits[denbi_id]["gpus"]] == ["ray-dashboard"]


def test_an_agents_figure_wins_and_the_other_node_stays_the_dashboards(
    dashboard_cluster: LiveCluster,
    head_agent: HeadDaemon,
    fake_nvml_lib: fake_nvml.FakeNvml,
    wire_token: Path,
    tmp_path: Path,
) -> None:
    head_id, denbi_id = dashboard_cluster.node_id("head"), dashboard_cluster.node_id("denbi")
    env = env_for(
        dashboard_cluster,
        LD_LIBRARY_PATH=str(fake_nvml_lib.lib_dir),
        RAYSCOPE_FAKE_NVML_SCENARIO=str(dashboard_cluster.root / "nvml" / "head"),
    )
    agent = push_agent(head_agent.listen_port, head_id, env, tmp_path / "push.log", wire_token)
    try:

        def mixed() -> Optional[dict[str, Any]]:
            doc = served(head_agent)
            return doc if doc["nodes"][head_id]["agent"] == "reporting" else None

        doc = eventually(mixed, 60, "the head node's agent reporting")
        assert doc["nodes"][head_id]["used_gpu_memory_source"] == "nvml"
        assert doc["nodes"][head_id]["used_gpu_memory"] == int(7.0 * 1024**3)
        assert doc["nodes"][denbi_id]["used_gpu_memory_source"] == "ray-dashboard"
    finally:
        agent.stop()


def test_a_dead_actor_s_leaked_memory_is_named_and_counted(
    dashboard_cluster: LiveCluster, sleeper: int
) -> None:
    """An actor on deNBI dies while the dashboard still lists its pid on the T4 (a worker
    stuck in the driver; here the fake NVML keeps listing it): ``status --gpus`` names it as
    the actor it was, booked nothing, ``actor dead, unbooked``, from the GCS's table of dead
    actors. Before: ``pid N booked NA used 2.0 GB  not mapped``. The T4's scenario is
    restored (and listed again) afterwards, for the tests after this one."""
    path = dashboard_cluster.root / "nvml" / "denbi"
    restored = path.read_text()
    placed = dashboard_cluster.request(
        op="actor", name="leaky-0", node="denbi", options={"num_gpus": 0.1, "num_cpus": 0}
    )
    pid = int(placed["pid"])
    fake_nvml.write_scenario(path, restored + fake_nvml.process("gpu0", pid, 2.0))
    alive = True
    try:
        wait_listed(dashboard_cluster, pid)
        dashboard_cluster.request(op="kill_actor", name="leaky-0")
        alive = False

        def named() -> Optional[str]:
            done = run_rayscope(
                "status", "--gpus", "--gcs", dashboard_cluster.gcs_address, env=env_for(dashboard_cluster)
            )
            return done.stdout if "leaky-0#" in done.stdout else None

        text = eventually(named, 60, "the dead actor named")
        line = next(x.strip() for x in text.splitlines() if "leaky-0#" in x)
        assert line.endswith("booked nothing used 2.0 GB  actor dead, unbooked"), text
        assert f"pid {pid} " not in text, text
    finally:
        fake_nvml.write_scenario(path, restored)
        if alive:
            dashboard_cluster.request(op="kill_actor", name="leaky-0")
