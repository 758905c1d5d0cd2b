"""``rayscope fit`` against the real three-node Ray cluster (no mocks of Ray).

Europa (the head) has 4 × 5120 MB booked of 24576 VRAM_MB and all 8 CPUs booked; deNBI (a
T4, no VRAM_MB) has 0.33 GPU booked; the third node has CPUs only. The driver's view comes
from the fake ``libnvidia-ml.so.1`` (tests/fake_nvml) where a test needs one. Positive control:
``test_fit_yes_is_what_ray_does`` places the replica fit said fits as a real actor, and then
fit says the next one does not.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from tests import fake_nvml as fake
from tests.conftest import LiveCluster, run_rayscope

pytestmark = pytest.mark.live


def fit(env: dict[str, str], cluster: LiveCluster, *args: str) -> tuple[int, str, str]:
    done = run_rayscope("fit", *args, "--gcs", cluster.gcs_address, env=env)
    return done.returncode, done.stdout, done.stderr


def fit_json(env: dict[str, str], cluster: LiveCluster, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = fit(env, cluster, *args, "--json")
    assert out, err
    doc: dict[str, Any] = json.loads(out)
    return code, doc


def placed(doc: dict[str, Any], cluster: LiveCluster) -> dict[str, int]:
    names = {cluster.node_id(name): name for name in ("head", "denbi", "cpu")}
    return {names[n["node_id"]]: n["placed"] for n in doc["nodes"]}


def test_europa_fits_no_fifth_5120_replica(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    code, out, _ = fit(rayscope_env, live_cluster, "--gpu-memory-mb", "5120")
    assert code == 1
    head = live_cluster.node_id("head")[:8]
    assert out.splitlines()[:5] == [
        'Shape: {"GPU": 0.01, "VRAM_MB": 5120} per replica (VRAM_MB booking: a node advertises VRAM_MB)',
        "Fits: no, 0/1 replica(s) placed by booking",
        "",
        "Nodes:",
        f"  127.0.0.1 [HEAD] G {head}: fits 0, gets 0 (VRAM_MB: 4096 MB free, needs 5120 MB)",
    ]
    denbi = live_cluster.node_id("denbi")[:8]
    assert f"  127.0.0.1 [worker] T4 {denbi}: fits 0, gets 0 (no VRAM_MB)" in out.splitlines()


def test_europa_fits_a_4096_replica(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    code, doc = fit_json(rayscope_env, live_cluster, "--gpu-memory-mb", "4096")
    assert code == 0 and doc["fits"] is True and doc["fits_booking"] is True
    assert doc["shape"] == {"GPU": 0.01, "VRAM_MB": 4096}
    assert placed(doc, live_cluster) == {"head": 1, "denbi": 0, "cpu": 0}
    # No NVIDIA driver here and no head agent: the driver's view is unknown, and said to be.
    assert doc["fits_measured"] is None
    head = next(n for n in doc["nodes"] if n["node_id"] == live_cluster.node_id("head"))
    assert head["measured"] == "unknown" and "not found" in head["measured_reason"]


def test_europas_cpus_are_all_booked(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    """The same 4096 MB replica asking for a CPU: the four replicas hold Europa's 8 CPUs."""
    code, out, _ = fit(rayscope_env, live_cluster, "--gpu-memory-mb", "4096", "--num-cpus", "1")
    assert code == 1
    assert f"[HEAD] G {live_cluster.node_id('head')[:8]}: fits 0, gets 0 (CPU: 0 free, needs 1)" in out


def test_fit_yes_is_what_ray_does(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    options = {"num_gpus": 0.01, "num_cpus": 0, "resources": {"VRAM_MB": 4096}}
    assert fit(rayscope_env, live_cluster, "--gpu-memory-mb", "4096")[0] == 0
    live_cluster.request(op="actor", name="fit-probe-4096", node="head", options=options)
    try:
        code, out, _ = fit(rayscope_env, live_cluster, "--gpu-memory-mb", "4096")
        assert code == 1 and "(VRAM_MB: 0 MB free, needs 4096 MB)" in out
    finally:
        live_cluster.request(op="kill_actor", name="fit-probe-4096")


def test_fraction_path_cannot_guess_the_t4s_size(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    """No NVML, no VRAM_MB on deNBI: the smallest GPU is unknown, so "could not tell"."""
    code, out, err = fit(rayscope_env, live_cluster, "--gpu-memory-mb", "8192", "--sizing", "fraction")
    assert (code, out) == (2, "")
    assert err == (
        "rayscope: could not tell: the GPU memory size of 1 GPU node(s) is unknown"
        " (no NVML measurement, no VRAM_MB): pass --gpu-total-mb\n"
    )


def test_fraction_path_decides_on_the_node_without_vram_mb(
    live_cluster: LiveCluster, rayscope_env: dict[str, str]
) -> None:
    """8192 of a 16384 MB GPU is 0.5: deNBI (0.67 free) takes one, Europa (0.96 free) one;
    the replicas spread over the two nodes, and a third does not fit."""
    args = ["--gpu-memory-mb", "8192", "--sizing", "fraction", "--gpu-total-mb", "16384"]
    code, doc = fit_json(rayscope_env, live_cluster, *args, "--replicas", "2")
    assert code == 0 and doc["shape"] == {"GPU": 0.5} and doc["sizing"] == "fraction"
    assert placed(doc, live_cluster) == {"head": 1, "denbi": 1, "cpu": 0}
    denbi = next(n for n in doc["nodes"] if n["node_id"] == live_cluster.node_id("denbi"))
    assert (denbi["capacity"], denbi["limited_by"], denbi["available"]) == (1, "GPU", {"GPU": 0.67})
    code, doc = fit_json(rayscope_env, live_cluster, *args, "--replicas", "3")
    assert code == 1 and doc["placed"] == 2 and doc["fits"] is False


def test_raw_shape(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    code, doc = fit_json(rayscope_env, live_cluster, "--shape", '{"GPU": 0.3, "accelerator_type:T4": 0.001}')
    assert code == 0
    t4 = next(n for n in doc["nodes"] if n["node_id"] == live_cluster.node_id("denbi"))
    assert (t4["capacity"], t4["placed"]) == (2, 1)  # 0.67 free / 0.3
    assert placed(doc, live_cluster)["head"] == 0  # Europa is a "G", not a T4


def test_refused_and_bad_usage(live_cluster: LiveCluster, rayscope_env: dict[str, str]) -> None:
    code, out, _ = fit(
        rayscope_env,
        live_cluster,
        "--gpu-memory-mb",
        "18200",  # 1.1108 of the GPU rounds to 1.11: over BioEngine's 1.1 (18100 rounds to 1.1, booked)
        "--sizing",
        "fraction",
        "--gpu-total-mb",
        "16384",
    )
    assert code == 1
    assert (
        "Fits: no, refused: 18200 MiB is 1.11 of the smallest GPU (16384 MiB, --gpu-total-mb),"
        " over the 1.1 BioEngine allows" in out
    )
    code, _, err = fit(rayscope_env, live_cluster, "--shape", '{"TPU": 1}')
    assert code == 2 and "unknown resource 'TPU'" in err and "Traceback" not in err


def test_booking_fits_but_measured_memory_does_not(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], fake_nvml_lib: fake.FakeNvml, tmp_path: Path
) -> None:
    """The fake NVML on this host (the Europa head's): an RTX 3090 with 22.8 of 24 GB in use.
    VRAM_MB still has 4096 MB free, so the booking fits; the memory does not."""
    scenario = tmp_path / "nearly-full-3090.txt"
    scenario.write_text(
        fake.HEADER
        + "count 1\n"
        + fake.gpu(0, fake.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=22.8)
    )
    env = fake_nvml_lib.env(rayscope_env, scenario)
    code, out, err = fit(env, live_cluster, "--gpu-memory-mb", "4096")
    assert code == 1, err
    lines = out.splitlines()
    assert lines[1] == "Fits: no, 1/1 replica(s) placed by booking, not by measured memory"
    assert (
        "    fits by booking, not by measured memory: GPU0 has 1.2 GB free (needs 4.0 GB per replica)"
        in lines
    )
    code, doc = fit_json(env, live_cluster, "--gpu-memory-mb", "1024")
    assert code == 0 and doc["fits_booking"] is True and doc["fits_measured"] is True
    head = next(n for n in doc["nodes"] if n["node_id"] == live_cluster.node_id("head"))
    assert head["measured"] == "ok" and head["gpus"][0]["free_bytes"] == int(24 * fake.GIB) - int(
        22.8 * fake.GIB
    )
