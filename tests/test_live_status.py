"""``rayscope status`` and ``node`` against the real three-node Ray cluster (no mocks of Ray).

Positive controls, as the seed did: each assertion names a number only the real
derivation produces. Neutering ``used_vram_mb`` (rollup) fails the Europa tests while the
deNBI test still passes; reading ``available`` as ``used`` turns 0.04 into 0.96 and fails
both; dropping the 1e-4 rounding fails on Ray's 0.040000000000000036.
"""

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveCluster, run_rayscope
from tests.schemas import parsed

pytestmark = pytest.mark.live


def status_json(env: dict[str, str], cluster: LiveCluster) -> dict[str, Any]:
    done = run_rayscope("status", "--json", "--gcs", cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = parsed(done.stdout, "status")
    return doc


def status_lines(env: dict[str, str], cluster: LiveCluster) -> list[str]:
    done = run_rayscope("status", "--gcs", cluster.gcs_address, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_europa_head_line_shows_the_booking(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    lines = status_lines(rayscope_env, live_cluster)
    heads = [line for line in lines if "[HEAD]" in line]
    # NVML is absent on this machine, so the measured memory is NA, never a made-up 0.
    assert heads == ["  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB  CPU: 8/8"]


def test_europa_json_has_all_three_gpu_numbers(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    doc = status_json(rayscope_env, live_cluster)
    head = doc["nodes"][live_cluster.node_id("head")]
    assert head["used_vram_mb"] == 20480
    assert head["total_vram_mb"] == 24576
    assert head["used_gpu"] == 0.04  # Ray hands back 0.040000000000000036
    assert head["total_gpu"] == 1
    # No NVML here: rayscope's figures are null, BioEngine's keys say "NA" (never null).
    assert head["total_gpu_memory_bytes"] is None and head["used_gpu_memory_bytes"] is None
    assert head["total_gpu_memory"] == "NA" and head["used_gpu_memory"] == "NA"
    assert head["head"] is True and head["accelerator_type"] == "G"


def test_denbi_line_has_the_fraction_and_no_booking(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    lines = status_lines(rayscope_env, live_cluster)
    t4 = [line for line in lines if " T4 " in line]
    assert t4 == ["  127.0.0.1 [worker] T4 GPU: 0.33/1 VRAM: NA/NA GB  CPU: 1/8"]
    node = status_json(rayscope_env, live_cluster)["nodes"][live_cluster.node_id("denbi")]
    assert node["used_gpu"] == 0.33
    assert node["used_vram_mb"] == 0 and node["total_vram_mb"] == 0


def test_cluster_block_sums_alive_nodes(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    doc = status_json(rayscope_env, live_cluster)
    cluster = doc["cluster"]
    assert (cluster["used_cpu"], cluster["total_cpu"]) == (9, 32)
    assert (cluster["used_gpu"], cluster["total_gpu"]) == (0.37, 2)
    assert (cluster["used_vram_mb"], cluster["total_vram_mb"]) == (20480, 24576)
    assert cluster["nodes_alive"] == 3
    lines = status_lines(rayscope_env, live_cluster)
    assert lines[0] == "Cluster: 9/32 CPUs, 0.37/2 GPUs, booked: 20480/24576 MB"
    assert "CPU-only nodes:" in lines and "  127.0.0.1 [worker] CPU: 0/16" in lines


def test_json_is_a_superset_of_bioengine_get_cluster_state(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    doc = status_json(rayscope_env, live_cluster)
    bioengine_node_keys = {
        "node_ip", "head", "total_cpu", "used_cpu", "total_gpu", "used_gpu", "total_gpu_memory",
        "used_gpu_memory", "total_vram_mb", "used_vram_mb", "total_memory", "used_memory",
        "total_object_store_memory", "used_object_store_memory", "accelerator_type", "slurm_job_id",
    }  # fmt: skip
    for node in doc["nodes"].values():
        assert bioengine_node_keys <= node.keys()
    assert {"total_cpu", "used_cpu", "total_gpu", "used_gpu", "total_vram_mb", "used_vram_mb"} <= doc[
        "cluster"
    ].keys()
    assert doc["view"] == "gcs" and doc["schema"] == 2
    assert {s["name"]: s["ok"] for s in doc["sources"]}["gcs"] is True


def test_without_gcs_flag_the_local_raylets_name_the_cluster(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    done = run_rayscope("status", "--json", env=rayscope_env)
    if done.returncode == 0:
        assert parsed(done.stdout, "status")["gcs_address"] == live_cluster.gcs_address
    else:  # another Ray cluster runs on this host too: then rayscope must say so, not guess
        assert done.returncode == 2
        assert "clusters run on this host" in done.stderr and live_cluster.gcs_address in done.stderr


def _parse_ray_status(text: str) -> dict[str, dict[str, tuple[float, float]]]:
    """``ray status -v`` per node: resource → (used, total), sizes converted to bytes."""
    units = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
    nodes: dict[str, dict[str, tuple[float, float]]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^Node: ([0-9a-f]+)", line)
        if header:
            current = nodes.setdefault(header.group(1), {})
            continue
        usage = re.match(r"^\s+([\d.e+-]+)([KMGT]?i?B)?/([\d.e+-]+)([KMGT]?i?B)? (\S+)$", line)
        if current is not None and usage:
            used = float(usage.group(1)) * units.get(usage.group(2) or "B", 1)
            total = float(usage.group(3)) * units.get(usage.group(4) or "B", 1)
            current[usage.group(5)] = (used, total)
    return nodes


def test_agrees_with_ray_status_on_every_number(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    """The Done-when check of the core issue, automated: `ray status -v` per node."""
    import subprocess

    ray_cli = str(Path(sys.executable).parent / "ray")
    done = subprocess.run(
        [ray_cli, "status", "-v", "--address", live_cluster.gcs_address],
        env=rayscope_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = _parse_ray_status(done.stdout)
    ours = status_json(rayscope_env, live_cluster)["nodes"]
    assert set(theirs) == set(ours)
    pairs = {"CPU": "cpu", "GPU": "gpu", "VRAM_MB": "vram_mb"}
    for node_id, node in ours.items():
        for resource, stem in pairs.items():
            used, total = theirs[node_id].get(resource, (0.0, 0.0))
            assert node[f"total_{stem}"] == round(total, 4), (node_id, resource)
            assert node[f"used_{stem}"] == round(used, 4), (node_id, resource)
        # ray status prints sizes with two decimals of GiB/MiB: agree to that precision.
        for resource in ("memory", "object_store_memory"):
            used, total = theirs[node_id][resource]
            assert abs(node[f"total_{resource}"] - total) <= 0.01 * 1024**3, (node_id, resource)
            assert abs(node[f"used_{resource}"] - used) <= 0.01 * 1024**3, (node_id, resource)


def test_node_command_shows_local_raylets_and_booking(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    done = run_rayscope("node", "--json", "--gcs", live_cluster.gcs_address, env=rayscope_env)
    assert done.returncode == 0, done.stderr
    diag = parsed(done.stdout, "node")
    ours = {live_cluster.node_id(n) for n in ("head", "denbi", "cpu")}
    assert ours <= {r["node_id"] for r in diag["raylets"]}
    head = next(r for r in diag["raylets"] if r["node_id"] == live_cluster.node_id("head"))
    assert head["is_head"] and head["static_resources"]["VRAM_MB"] == 24576
    assert head["gcs_address"] == live_cluster.gcs_address
    assert head["pid"] == live_cluster.state["nodes"]["head"]["raylet_pid"]
    assert diag["booking"][live_cluster.node_id("head")]["used_vram_mb"] == 20480
    sources = {s["name"]: s for s in diag["sources"]}
    assert sources["gcs"]["ok"] and sources["raylet"]["ok"] and sources["host"]["ok"]
    # No NVIDIA driver here: a status with the reason, not a crash.
    assert not sources["nvml"]["ok"] and "not found" in sources["nvml"]["reason"]
    assert diag["gpus"] is None

    human = run_rayscope("node", "--gcs", live_cluster.gcs_address, env=rayscope_env)
    assert human.returncode == 0
    assert f"Ray node 127.0.0.1 [HEAD] {live_cluster.node_id('head')}" in human.stdout
    assert "  scheduler: GPU: 0.04/1 booked: 20480/24576 MB  CPU: 8/8" in human.stdout.splitlines()


def test_an_actor_placed_during_the_session_shows_up(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    """The numbers are live: booking one more replica moves them, killing it moves them back."""
    before = status_json(rayscope_env, live_cluster)["nodes"][live_cluster.node_id("denbi")]
    live_cluster.request(
        op="actor", name="probe-0.25", node="denbi", options={"num_gpus": 0.25, "num_cpus": 0}
    )
    try:
        during = status_json(rayscope_env, live_cluster)["nodes"][live_cluster.node_id("denbi")]
    finally:
        live_cluster.request(op="kill_actor", name="probe-0.25")
    assert round(during["used_gpu"] - before["used_gpu"], 4) == 0.25


def test_sources_name_the_clusters_ray_and_the_readers(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    """The cluster's release comes from the GCS (its metadata), the reader's from the Python
    that read it; positive control: dropping the ``ray`` status from ``read_cluster`` fails."""
    import ray

    expected = f"cluster Ray {ray.__version__}, reader Ray {ray.__version__}"
    doc = status_json(rayscope_env, live_cluster)
    versions = {s["name"]: s for s in doc["sources"]}["ray"]
    assert versions == {"name": "ray", "ok": True, "reason": "", "detail": expected}
    done = run_rayscope("--verbose", "status", "--gcs", live_cluster.gcs_address, env=rayscope_env)
    assert done.returncode == 0 and f"  ray: ok, {expected}" in done.stderr.splitlines()
