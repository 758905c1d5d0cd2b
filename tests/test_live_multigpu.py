"""Per-device truth on multi-GPU nodes, against a real Ray cluster.

Beside the seed's head, three fake-GPU raylets share this host's fake NVML (four A100s):
``quad`` (4 GPUs, no ``CUDA_VISIBLE_DEVICES``), ``pair_index`` (``CUDA_VISIBLE_DEVICES=1,3``,
``CUDA_DEVICE_ORDER=PCI_BUS_ID``) and ``pair_uuid`` (``CUDA_VISIBLE_DEVICES`` = the UUIDs of
GPU2 and GPU0). Ray places fractional actors itself; each actor reports
``ray.get_gpu_ids()`` from inside, which is the truth the per-device booking must equal.

Positive controls: taking Ray's GPU id as the NVML index (the old rule) fails the UUID
assertions on both pair nodes; splitting an actor's GPU evenly over the node (or judging fit
on node sums) fails the fragmentation test, which Ray itself confirms by leaving the
replica pending.
"""

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests import fake_nvml as fake
from tests.conftest import LiveCluster, base_env, run_rayscope, running_cluster
from tests.livecluster import FAKE_UUID
from tests.schemas import parsed

pytestmark = pytest.mark.live

A100 = "NVIDIA A100-SXM4-40GB"
# name -> (node, num_gpus, VRAM_MB); placed in this order, Ray picks the devices.
ACTORS: list[tuple[str, str, float, int]] = [
    ("quarter-a", "quad", 0.25, 10240),
    ("half", "quad", 0.5, 20480),
    ("whole", "quad", 1.0, 0),
    ("quarter-b", "quad", 0.25, 0),
    ("idx-half", "pair_index", 0.5, 0),
    ("idx-whole", "pair_index", 1.0, 0),
    ("uuid-a", "pair_uuid", 0.6, 0),
    ("uuid-b", "pair_uuid", 0.6, 0),
]
MULTI = ("quad", "pair_index", "pair_uuid")


def nvml_index(node: str, entry: str) -> int:
    """The fake NVML device an entry of ``ray.get_gpu_ids()`` names on this host."""
    if entry.startswith("GPU-"):
        return int(entry[4:12], 16)
    return int(entry)  # quad: all four, one model (PCI order); pair_index: PCI_BUS_ID


@pytest.fixture(scope="module")
def multigpu() -> Iterator[tuple[LiveCluster, dict[str, dict[str, Any]]]]:
    with running_cluster("multigpu") as cluster:
        placed = {}
        for name, node, gpu, vram in ACTORS:
            options: dict[str, Any] = {"num_gpus": gpu, "num_cpus": 0}
            if vram:
                options["resources"] = {"VRAM_MB": vram}
            placed[name] = {**cluster.request(op="actor", name=name, node=node, options=options), "gpu": gpu}
            placed[name]["vram"] = vram
        yield cluster, placed


def scenario(placed: dict[str, dict[str, Any]]) -> str:
    lines = fake.HEADER + "count 4\n"
    for i in range(4):
        lines += fake.gpu(i, A100, pci=f"00000000:{0x17 + 0x10 * i:02X}:00.0", total_gib=40, used_gib=2.0 + i)
    for actor in placed.values():
        for entry in actor["gpu_ids"]:
            lines += fake.process(f"gpu{nvml_index(actor['node'], entry)}", actor["pid"], 1.0)
    return lines


@pytest.fixture(scope="module")
def fake_env(
    multigpu: tuple[LiveCluster, dict[str, dict[str, Any]]], fake_nvml_lib: fake.FakeNvml
) -> dict[str, str]:
    cluster, placed = multigpu
    path = cluster.root / "fake-4gpu.txt"
    path.write_text(scenario(placed))
    return fake_nvml_lib.env(base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root)), path)


def test_per_device_booking_equals_what_each_actor_sees(
    multigpu: tuple[LiveCluster, dict[str, dict[str, Any]]], fake_env: dict[str, str]
) -> None:
    """Device by device: the actors rayscope puts on it, and how much of it each holds, are
    exactly the actors whose ``ray.get_gpu_ids()`` names it; its UUID is the one NVML gives
    the device that entry names (by index in PCI order, or by UUID)."""
    cluster, placed = multigpu
    done = run_rayscope(
        "status", "--json", "--gpus", "--gcs", cluster.gcs_address, "--timeout", "30", env=fake_env
    )
    assert done.returncode == 0, done.stderr
    doc = parsed(done.stdout, "status")
    for node in MULTI:
        placement = doc["nodes"][cluster.node_id(node)]["placement"]
        ours = {d["visible_id"]: (d["uuid"], d["actors"], d["booked_vram_mb"]) for d in placement["devices"]}
        truth: dict[str, tuple[str, dict[str, float], float]] = {}
        entries = [str(i) for i in range(4)] if node == "quad" else list(ours)
        for entry in entries:
            truth[entry] = (FAKE_UUID.format(nvml_index(node, entry)), {}, 0.0)
        for actor in placed.values():
            if actor["node"] != node:
                continue
            for entry in actor["gpu_ids"]:
                uuid, holders, vram = truth[entry]
                holders[actor["actor_id"]] = min(1.0, actor["gpu"])
                truth[entry] = (uuid, holders, vram + actor["vram"] / len(actor["gpu_ids"]))
        assert ours == truth, node
        assert placement["unplaced_gpu"] == 0.0
    by_uuid = doc["nodes"][cluster.node_id("pair_uuid")]["placement"]["devices"]
    assert [d["visible_id"] for d in by_uuid] == [FAKE_UUID.format(2), FAKE_UUID.format(0)]


def test_fit_refuses_what_no_single_device_holds_and_ray_agrees(
    multigpu: tuple[LiveCluster, dict[str, dict[str, Any]]], fake_env: dict[str, str]
) -> None:
    """pair_uuid holds 0.6 on each of its two devices: 0.8 free by the node sum, 0.4 on any
    one device. A 0.5 replica: rayscope says no, and Ray leaves it pending; a 0.4 replica:
    rayscope says yes, and Ray starts it."""
    cluster, _ = multigpu
    doc_node = cluster.node_id("pair_uuid")
    status = parsed(
        run_rayscope(
            "status", "--json", "--gcs", cluster.gcs_address, "--timeout", "30", env=fake_env
        ).stdout,
        "status",
    )
    assert status["nodes"][doc_node]["used_gpu"] == pytest.approx(1.2)
    pin = {"accelerator_type:V100": 0.001}

    def fit(gpu: float) -> "subprocess.CompletedProcess[str]":
        shape = json.dumps({"GPU": gpu, **pin})
        return run_rayscope(
            "fit", "--shape", shape, "--gcs", cluster.gcs_address, "--timeout", "30", env=fake_env
        )

    no = fit(0.5)
    assert no.returncode == 1, no.stdout + no.stderr
    assert "fits 0, gets 0 (GPU per device: no device has 0.5 GPU free)" in no.stdout, no.stdout
    yes = fit(0.4)
    assert yes.returncode == 0, yes.stdout + yes.stderr
    pending = cluster.request(
        op="try_actor",
        name="frag-0.5",
        node="pair_uuid",
        options={"num_gpus": 0.5, "num_cpus": 0, "resources": pin},
    )
    assert (pending["started"], pending["gcs_state"]) == (False, "PENDING_CREATION")
    started = cluster.request(
        op="try_actor",
        name="frag-0.4",
        node="pair_uuid",
        options={"num_gpus": 0.4, "num_cpus": 0, "resources": pin},
        wait_s=60.0,
    )
    assert started["started"]


def test_status_shows_the_full_device_under_its_node(
    multigpu: tuple[LiveCluster, dict[str, dict[str, Any]]], fake_env: dict[str, str]
) -> None:
    """quad is 2.00/4 booked by the sum; the device holding the whole-GPU actor is 1.00: its
    own line under quad's node line, in the words of ``--gpus``, naming its NVML UUID."""
    cluster, placed = multigpu
    done = run_rayscope("status", "--gpus", "--gcs", cluster.gcs_address, "--timeout", "30", env=fake_env)
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # docs/multi-gpu.md's example (pytest -s shows it)
    lines = done.stdout.splitlines()
    quad = lines.index(
        "  127.0.0.1 [worker] A100 GPU: 2.00/4 booked: 30720/163840 MB  VRAM: NA/NA GB  CPU: 0/4"
    )
    whole = nvml_index("quad", placed["whole"]["gpu_ids"][0])
    under = []
    for line in lines[quad + 1 :]:
        if not line.startswith("    GPU"):
            break
        under.append(line)
    mine = [
        line
        for line in under
        if line.startswith(f"    GPU{whole} {FAKE_UUID.format(whole)}  booked 1.00 GPU")
    ]
    assert len(mine) == 1 and mine[0].endswith("fuller than the node sum"), under
    assert f"GPUs of 127.0.0.1 [worker] {cluster.node_id('quad')[:12]}:" in lines
