"""``rayscope usage`` on the seed cluster: real actors, the real actor table and process
tree, push agents reporting every second to a head, and a fake NVML whose per-process
figures change over time (the fake re-reads its scenario when the file is replaced).

Each replica is given four figures, one phase after another; ``usage --json`` must name the
highest of them as its peak to the byte, and the suggestion must follow the rule (peak +
10%, rounded up to 256 MiB). The head is then restarted on its ``--usage-state`` file and
still knows every peak.

Positive control (run by hand): make ``SlotRing.add`` keep the latest sample instead of
the largest and every peak here but the last phase's fails; fold only the newest pending
report per node (``reports[-1:]`` in ``UsageStore.fold``) and the one-phase spikes go
missing whenever an interval held two reports.
"""

import functools
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import fake_nvml as fake
from tests.conftest import HeadDaemon, LiveCluster, push_agent, run_rayscope
from tests.schemas import parsed
from tests.support.promtool import lint
from tests.waiting import eventually

pytestmark = pytest.mark.live

MIB = 1024**2
PHASE_S = 3.0
"""How long each phase's figures stand: three reports of a 1 s agent, whatever its jitter."""
CELLPOSE = "ServeReplica:cellpose:CellposeModel"
# GiB each replica's pid holds, phase by phase. The seed's federated-unet books 5120 MB a
# replica and never holds more than 2.6 GiB; one cellpose replica spikes past its 2048 MB.
PHASES = {
    "federated-unet-0": [2.0, 2.6, 2.2, 1.8],
    "federated-unet-1": [1.0, 1.1, 2.4, 1.2],
    "federated-unet-2": [2.1, 2.5, 2.3, 2.2],
    "federated-unet-3": [1.9, 2.0, 2.1, 2.55],  # its peak in the last phase
    "cellpose-0": [1.0, 1.25, 1.5, 1.0],
    "cellpose-1": [0.8, 1.0, 2.3, 1.7],  # 2355 MB of a 2048 MB booking: an OOM risk
    "denbi-app": [1.5, 3.0, 2.0, 1.0],  # on the deNBI T4, booked as 0.33 GPU
}
T4_UUID = "GPU-000000d4-5f1c-4d3e-9a7b-000000000000"


def suggested(peak_bytes: int, headroom_pct: float = 10) -> int:
    return math.ceil(peak_bytes * (1 + headroom_pct / 100) / (256 * MIB)) * 256


def figure(gib: float) -> int:
    return int(gib * fake.GIB)  # what the fake's scenario line says, to the byte


def europa(pids: dict[str, int], phase: int) -> str:
    lines = fake.HEADER + "count 1\n"
    lines += fake.gpu(0, fake.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=20.0)
    return lines + "".join(
        fake.process("gpu0", pids[name], gibs[phase]) for name, gibs in PHASES.items() if name != "denbi-app"
    )


def denbi(pids: dict[str, int], phase: int) -> str:
    t4 = fake.gpu(0, "Tesla T4", pci="00000000:00:1E.0", total_gib=16, used_gib=3.0)
    t4 = t4.replace(fake.uuid(0), T4_UUID)  # another GPU than Europa's, on this one host
    return (
        fake.HEADER + "count 1\n" + t4 + fake.process("gpu0", pids["denbi-app"], PHASES["denbi-app"][phase])
    )


@pytest.fixture
def cellpose(live_cluster: LiveCluster) -> Iterator[dict[str, dict[str, Any]]]:
    """Two replicas of a Serve-style deployment (a BioEngine app) booking 2048 MB each:
    the rest of Europa's VRAM_MB. Removed again after the test."""
    placed = {
        name: live_cluster.request(
            op="actor",
            name=name,
            node="head",
            class_name=CELLPOSE,
            options={"num_gpus": 0.01, "num_cpus": 0, "resources": {"VRAM_MB": 2048}},
        )
        for name in ("cellpose-0", "cellpose-1")
    }
    try:
        yield placed
    finally:
        for name in placed:
            live_cluster.request(op="kill_actor", name=name)


def usage_json(head: HeadDaemon, env: dict[str, str], token: Path) -> dict[str, Any]:
    done = run_rayscope("usage", "--json", "--head", head.url, "--token-file", str(token), env=env)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = parsed(done.stdout, "usage")  # schema/usage.schema.json
    return document


def test_usage_names_each_replica_s_highest_figure_and_the_booking_to_ask_for(
    live_cluster: LiveCluster,
    rayscope_env: dict[str, str],
    fake_nvml_lib: fake.FakeNvml,
    cellpose: dict[str, dict[str, Any]],
    tmp_path: Path,
    wire_token: Path,
) -> None:
    actors = {a["name"]: a for a in live_cluster.state["actors"]} | cellpose
    pids = {name: a["pid"] for name, a in actors.items()}
    scenarios = {"head": tmp_path / "europa.txt", "denbi": tmp_path / "denbi.txt"}
    render = {"head": europa, "denbi": denbi}
    for node, path in scenarios.items():
        fake.write_scenario(path, render[node](pids, 0))
    state_file = tmp_path / "usage-state.json"
    head_args = ["--gcs", live_cluster.gcs_address, "--interval", "1", "--usage-state", str(state_file)]
    head = HeadDaemon(rayscope_env, tmp_path / "head.log", head_args, wire_token)
    agents = [
        push_agent(
            head.listen_port,
            live_cluster.node_id(node),
            fake_nvml_lib.env(rayscope_env, path),
            tmp_path / f"push-{node}.log",
            wire_token,
        )
        for node, path in scenarios.items()
    ]
    try:
        deadline = time.monotonic() + 30  # the agents' first reports, attributed
        while len(usage_json(head, rayscope_env, wire_token)["actors"]) < len(PHASES):
            assert time.monotonic() < deadline, head.log_text()
            time.sleep(0.5)

        def peaks_through(phase: int) -> bool:
            """Each actor's peak is its highest figure of phases 0..``phase``: they were sampled."""
            rows = {a["actor_id"]: a for a in usage_json(head, rayscope_env, wire_token)["actors"]}
            return all(
                rows.get(actors[name]["actor_id"], {}).get("peak_used_bytes")
                == figure(max(gibs[: phase + 1]))
                for name, gibs in PHASES.items()
            )

        for phase in range(4):
            if phase:
                for node, path in scenarios.items():
                    fake.write_scenario(path, render[node](pids, phase))
            time.sleep(PHASE_S)  # the phase's figures stand this long (the workload's shape, not a wait)
            what = f"phase {phase}'s highest figures in the head's usage"
            eventually(functools.partial(peaks_through, phase), 30, what, every_s=0.5)
        doc = usage_json(head, rayscope_env, wire_token)
        text = run_rayscope("usage", "--head", head.url, "--token-file", str(wire_token), env=rayscope_env)
        metrics = head.get("/metrics")
        page = head.get("/")  # the bearer token opens the page too
    finally:
        for agent in agents:
            agent.stop()
        assert head.stop() == 0, head.log_text()
    print(text.stdout)  # the lines the closing note and docs/usage.md quote (pytest -s)
    assert text.returncode == 0, text.stderr

    by_id = {a["actor_id"]: a for a in doc["actors"]}
    rows = {name: by_id[a["actor_id"]] for name, a in actors.items() if a["actor_id"] in by_id}
    assert set(rows) == set(PHASES) and len(doc["actors"]) == len(PHASES)
    for name, gibs in PHASES.items():
        row, peak = rows[name], figure(max(gibs))
        assert row["peak_used_bytes"] == peak, name  # exactly the highest figure it was given
        assert figure(min(gibs)) <= row["p95_used_bytes"] <= peak, name
        assert row["suggested_vram_mb"] == suggested(peak), name
        assert row["samples"] >= len(gibs) and row["window_s"] > 0, name
        assert row["pid"] == pids[name] and row["node_id"] == live_cluster.node_id(actors[name]["node"])
        assert {"actor_id", "class_name", "booked_vram_mb", "booked_gpu"} <= set(row)
    assert rows["cellpose-1"]["oom_risk"] and not rows["cellpose-0"]["oom_risk"]
    assert rows["denbi-app"]["devices"] == [T4_UUID]
    assert rows["denbi-app"]["booked_mb"] == pytest.approx(0.33 * 16 * 1024, abs=0.1)
    assert rows["cellpose-0"]["app"] == "cellpose/CellposeModel" == rows["cellpose-1"]["app"]

    apps = {a["app"]: a for a in doc["apps"]}
    unet = apps["federated-unet"]
    assert (unet["replicas"], unet["booked_mb"], unet["peak_used_bytes"]) == (4, 5120, figure(2.6))
    assert (unet["suggested_vram_mb"], unet["frees_mb"], unet["oom_risk"]) == (3072, 4 * 2048, False)
    app = apps["cellpose/CellposeModel"]
    assert (app["replicas"], app["booked_mb"], app["peak_used_bytes"]) == (2, 2048, figure(2.3))
    assert (app["suggested_vram_mb"], app["frees_mb"], app["oom_risk"]) == (2816, -2 * 768, True)
    denbi_app = apps["denbi-app"]  # a named actor without a number: its name (its class before)
    assert (denbi_app["suggested_vram_mb"], denbi_app["frees_mb"]) == (
        3584,
        pytest.approx(5406.7 - 3584, abs=0.1),
    )
    assert doc["frees_mb"] == pytest.approx(8192 + 1822.7, abs=0.1)
    assert doc["actors_read"] and doc["headroom_pct"] == 10 and doc["window_s"] == 3600

    lines = text.stdout.splitlines()
    assert re.fullmatch(
        r"Usage over the last 1 h, headroom 10% \(the head knows \d+ s of it, since .* UTC\):", lines[0]
    )
    expected = [
        r"federated-unet  4 replicas  booked 5120 MB  peak 2662 MB  p95 \d+ MB  \d+ samples"
        r"  suggest 3072 MB \(frees 8192 MB\)",
        r"cellpose/CellposeModel  2 replicas  booked 2048 MB  peak 2355 MB  p95 \d+ MB  \d+ samples"
        r"  suggest 2816 MB \(needs 1536 MB more\)  OOM risk: peak 2355 MB over 2048 MB booked",
        r"Re-booking at the suggestions frees 10015 MB cluster-wide\.",
    ]
    for pattern in expected:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, text.stdout)

    assert page[0] == 200
    cells = dict(re.findall(r'<div class="gpu" data-app="([^"]+)">(.*?)</div></div>', page[1].decode()))
    assert "suggest 3072 MB (frees 8192 MB)" in cells["federated-unet"]  # beside the app's bar
    assert "OOM risk: peak 2355 MB over 2048 MB booked" in cells["cellpose/CellposeModel"]

    assert metrics[0] == 200
    body = metrics[1].decode()
    assert f'rayscope_app_gpu_memory_peak_bytes{{app="cellpose/CellposeModel"}} {figure(2.3)}' in body
    assert all(a["actor_id"] not in body for a in actors.values())
    done = lint(body)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")

    # A restart on the state file (written at the SIGTERM above) keeps every peak.
    again = HeadDaemon(rayscope_env, tmp_path / "head-again.log", head_args, wire_token)
    try:
        restored = usage_json(again, rayscope_env, wire_token)
    finally:
        assert again.stop() == 0, again.log_text()
    assert restored["restored_from"] == str(state_file)
    assert {a["actor_id"]: a["peak_used_bytes"] for a in restored["actors"]} == {
        a["actor_id"]: a["peak_used_bytes"] for a in doc["actors"]
    }
    assert restored["known_since"] == pytest.approx(doc["known_since"], abs=1e-3)
