"""``status --gpus`` / ``node --gpus`` against the real Ray cluster: real actors, the real GCS
actor table, the real process tree and Ray's session logs; only the driver is the fake NVML,
which lists the actors' own pids as GPU processes.

Positive control (run by hand): with the over-booking rule neutered in attribution.py this
test fails on the over-booker's line; every actor's line carries its own actor id, so a pid
attributed to the wrong actor fails it too.
"""

from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from tests import fake_nvml as fake
from tests.conftest import HeadDaemon, LiveCluster, push_agent, run_rayscope
from tests.schemas import parsed
from tests.waiting import eventually

pytestmark = pytest.mark.live

# GiB each actor's pid holds on the one fake RTX 3090 of this host.
MEASURED_GIB = {
    "federated-unet-0": 4.0,
    "federated-unet-1": 4.2,
    "federated-unet-2": 4.5,
    "federated-unet-3": 5.0,  # exactly its 5120 MB: at the booking, not over it
    "over-booker": 2.5,  # booked 2048 MB
    "denbi-app": 1.5,  # booked 0.33 GPU of 24 GiB
}
SLEEPER_GIB = 1.2
DEVICE_USED_GIB = 22.9


def scenario(pids: dict[str, int], sleeper: int) -> str:
    measured = {pids[name]: gib for name, gib in MEASURED_GIB.items()}
    return fake.rtx_3090_scenario(DEVICE_USED_GIB, {**measured, sleeper: SLEEPER_GIB})


@pytest.fixture
def over_booker(live_cluster: LiveCluster) -> Any:
    """One more replica on Europa booking 2048 MB, removed again after the test."""
    placed = live_cluster.request(
        op="actor",
        name="over-booker",
        node="head",
        options={"num_gpus": 0.01, "num_cpus": 0, "resources": {"VRAM_MB": 2048}},
    )
    try:
        yield placed
    finally:
        live_cluster.request(op="kill_actor", name="over-booker")


class FakeGpu(NamedTuple):
    """The environment that makes rayscope see the fake GPU, and who is on it."""

    env: dict[str, str]
    actors: dict[str, dict[str, Any]]
    sleeper: int


@pytest.fixture
def fake_gpu(
    live_cluster: LiveCluster,
    rayscope_env: dict[str, str],
    fake_nvml_lib: fake.FakeNvml,
    sleeper: int,
    over_booker: dict[str, Any],
) -> FakeGpu:
    actors = {a["name"]: a for a in [*live_cluster.state["actors"], over_booker]}
    path = live_cluster.root / "fake-gpu-scenario.txt"
    path.write_text(scenario({name: a["pid"] for name, a in actors.items()}, sleeper))
    return FakeGpu(fake_nvml_lib.env(rayscope_env, path), actors, sleeper)


def test_gpu_memory_is_attributed_to_the_actors_that_hold_it(
    live_cluster: LiveCluster, fake_gpu: FakeGpu
) -> None:
    env, actors, sleeper = fake_gpu
    head_id, denbi_id = live_cluster.node_id("head"), live_cluster.node_id("denbi")

    done = run_rayscope("status", "--gpus", "--gcs", live_cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # docs/gpus.md's example (pytest -s shows it)
    lines = done.stdout.splitlines()

    def label(name: str) -> str:
        return f"{name}#{actors[name]['actor_id'][:4]}"

    start = lines.index(f"GPUs of 127.0.0.1 [HEAD] {head_id[:12]}:")
    assert lines[start : start + 12] == [
        f"GPUs of 127.0.0.1 [HEAD] {head_id[:12]}:",
        "  GPU0 NVIDIA GeForce RTX 3090  booked 22528 MB + 0.33 GPU by 6 actors  used 22.9 GB  util 87%",
        f"    {label('denbi-app')} booked 0.33 GPU used 1.5 GB",
        f"    {label('federated-unet-0')} booked 5120 MB used 4.0 GB",
        f"    {label('federated-unet-1')} booked 5120 MB used 4.2 GB",
        f"    {label('federated-unet-2')} booked 5120 MB used 4.5 GB",
        f"    {label('federated-unet-3')} booked 5120 MB used 5.0 GB",
        f"    {label('over-booker')} booked 2048 MB used 2.5 GB  over booking",
        f"    pid {sleeper} sleep booked nothing used 1.2 GB  unbooked",
        "",
        f"GPUs of 127.0.0.1 [worker] {denbi_id[:12]}:",
        "  NA: no NVML report for this node",
    ]
    assert "  127.0.0.1 [HEAD] G GPU: 0.05/1 booked: 22528/24576 MB  VRAM: 22.9/24.0 GB  CPU: 8/8" in lines

    doc = parsed(
        run_rayscope("status", "--json", "--gpus", "--gcs", live_cluster.gcs_address, env=env).stdout,
        "status",
    )
    head = doc["nodes"][head_id]
    assert head["attribution"]["actors_read"] and head["attribution"]["processes_mapped"]
    users = {u["actor_id"] or u["pids"][0]: u for u in head["gpus"][0]["attribution"]["users"]}
    for name, gib in MEASURED_GIB.items():
        user = users[actors[name]["actor_id"]]
        assert user["kind"] == "actor" and user["name"] == name
        assert user["pids"] == [actors[name]["pid"]]
        assert user["used_memory_bytes"] == int(gib * fake.GIB)
        assert user["flags"] == (["over_booking"] if name == "over-booker" else []), name
    assert users[actors["over-booker"]["actor_id"]]["booked_vram_mb"] == 2048
    assert users[actors["denbi-app"]["actor_id"]]["booked_gpu"] == 0.33
    assert users[sleeper]["flags"] == ["unbooked"] and users[sleeper]["kind"] == "process"
    assert {s["name"]: s["ok"] for s in doc["sources"]}["gcs_actors"] is True

    node = run_rayscope("node", "--gpus", "--gcs", live_cluster.gcs_address, env=env)
    assert node.returncode == 0, node.stderr
    assert f"    {label('over-booker')} booked 2048 MB used 2.5 GB  over booking" in node.stdout.splitlines()


def test_the_head_agent_attributes_the_agents_reports(
    live_cluster: LiveCluster, fake_gpu: FakeGpu, tmp_path: Path, wire_token: Path
) -> None:
    """The same attribution through `push` agents and a `head` (`status --head --gpus`): the
    agents report the fake GPU's processes, the head reads the actor table once per interval."""
    env, actors, sleeper = fake_gpu
    head = HeadDaemon(
        env, tmp_path / "head.log", ["--gcs", live_cluster.gcs_address, "--interval", "1"], wire_token
    )
    agents = [
        push_agent(
            head.listen_port, live_cluster.node_id(name), env, tmp_path / f"push-{name}.log", wire_token
        )
        for name in ("head", "denbi", "cpu")
    ]
    try:
        label = f"over-booker#{actors['over-booker']['actor_id'][:4]}"
        over = f"    {label} booked 2048 MB used 2.5 GB  over booking"

        def attributed() -> Optional[list[str]]:
            done = run_rayscope(
                "status", "--gpus", "--head", head.url, "--token-file", str(wire_token), env=env
            )
            lines = done.stdout.splitlines()
            # All three agents reported: the three raylets of this host report its one GPU.
            return (
                lines
                if over in lines and any(line.endswith("shared with 2 other nodes") for line in lines)
                else None
            )

        lines = eventually(attributed, 30, f"the head attributes {over!r}", 0.5, detail=head.log_text)
        start = lines.index(f"GPUs of 127.0.0.1 [HEAD] {live_cluster.node_id('head')[:12]}:")
        assert lines[start + 1] == (  # said so on the GPU
            "  GPU0 NVIDIA GeForce RTX 3090  booked 22528 MB + 0.33 GPU by 6 actors  used 22.9 GB  util 87%"
            "  shared with 2 other nodes"
        )
        assert f"    pid {sleeper} sleep booked nothing used 1.2 GB  unbooked" in lines[start : start + 10]
        assert (  # a push agent started by hand: the head's view says so
            "  127.0.0.1 [HEAD] G GPU: 0.05/1 booked: 22528/24576 MB  VRAM: 22.9/24.0 GB  CPU: 8/8"
            "  agent: manual" in lines
        )
    finally:
        for agent in agents:
            agent.stop()
        head.stop()
