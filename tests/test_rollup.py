"""The pure rollup: BioEngine's derivation (used = total - available, clamped, rounded to
1e-4), extended with VRAM_MB, merged with node reports.

Positive control: each test names a number only the correct derivation gives. Replacing
``used_vram_mb`` by 0 in ``_scheduler_numbers`` fails the Europa test while the deNBI test
still passes; summing dead nodes fails ``test_dead_nodes_are_not_summed``.
"""

import math
from typing import Optional

import pytest

from rayscope.core.gpu.memory import MeasuredMemory, bioengine_memory, measured_memory
from rayscope.core.rollup import (
    accelerator_type,
    merge,
    ray_accelerator,
    scheduler_nodes,
    slurm_job_id,
    used_amount,
)
from rayscope.schema.report import GpuDevice
from rayscope.schema.status import RayNode
from tests.scenarios import (
    CPU,
    DEAD,
    EUROPA,
    NOW,
    SEED_REPORTS,
    SEED_VIEWS,
    T4,
    UNKNOWN,
    mixed_status,
    recorded_gcs_nodes,
    report,
    seed_status,
)


def test_used_is_total_minus_available_rounded_to_rays_unit() -> None:
    assert 1 - 0.96 == 0.040000000000000036  # what the GCS really hands back
    assert used_amount(1.0, 0.96) == 0.04
    assert used_amount(1.0, 1.2) == 0.0  # clamped: never negative


def test_recorded_gcs_europa_and_denbi() -> None:
    """The live cluster's recorded GCS answer (Ray 2.60.0), through the rollup."""
    status = merge(scheduler_nodes(recorded_gcs_nodes()), {}, now=NOW, stale_after_s=math.inf, view="gcs")
    by_role = {(n.head, n.total_gpu > 0): n for n in status.nodes.values()}
    europa = by_role[(True, True)]
    assert (europa.used_vram_mb, europa.total_vram_mb, europa.used_gpu) == (20480, 24576, 0.04)
    assert europa.used_cpu == 8  # no "CPU" key in available when all are booked
    denbi = by_role[(False, True)]
    assert (denbi.used_gpu, denbi.used_vram_mb, denbi.total_vram_mb) == (0.33, 0, 0)
    assert denbi.accelerator_type == "T4"
    assert status.cluster.used_gpu == 0.37 and status.cluster.used_vram_mb == 20480


def test_accelerator_token_uses_removeprefix_not_lstrip() -> None:
    # lstrip("accelerator_type:") strips a *set* of characters: a token starting with any of
    # "acelorty_p:" loses its head ("ecc" would vanish); uppercase tokens happen to survive.
    assert accelerator_type(["CPU", "accelerator_type:A10G"]) == "A10G"
    assert accelerator_type(["accelerator_type:ecc"]) == "ecc"
    assert accelerator_type(["accelerator_type:tpu-v4"]) == "tpu-v4"
    assert accelerator_type(["CPU"]) is None
    assert slurm_job_id(["slurm_job_id:8812"]) == "8812"


def test_cluster_sums_alive_nodes_only() -> None:
    status = mixed_status()
    assert status.cluster.nodes_alive == 4 and status.cluster.nodes_dead == 1
    assert status.cluster.total_cpu == 8 + 8 + 16 + 4  # the dead node's 4 CPUs are not summed


def test_dead_nodes_are_not_summed() -> None:
    dead = RayNode(node_id=DEAD, node_ip="10.0.0.9", alive=False, total={"CPU": 64, "GPU": 8}, available=None)
    status = merge(scheduler_nodes([*SEED_VIEWS, dead]), {}, now=NOW, stale_after_s=15, view="gcs")
    assert status.cluster.total_gpu == 2 and status.cluster.total_cpu == 32
    assert status.nodes[DEAD].used_gpu == 0 and not status.nodes[DEAD].alive


def test_stale_report_is_kept_on_the_node_but_not_summed() -> None:
    status = mixed_status()
    t4 = status.nodes[T4]
    assert t4.stale and t4.agent == "stale" and t4.report_age_s == 42.0
    # A stale report's total and NVML's raw used stay (capacity does not change, the raw
    # figure has report_age_s); its used is not a figure to trust: null, and "NA" in
    # BioEngine's key, as BioEngine says for a sample older than 30 s.
    assert t4.total_gpu_memory_bytes == 24 * 1024**3 and t4.total_gpu_memory == 24 * 1024**3
    assert t4.nvml_memory_used_bytes is not None
    assert (t4.used_gpu_memory_bytes, t4.used_gpu_memory, t4.used_gpu_memory_reason) == (
        None,
        "NA",
        "stale report",
    )
    assert t4.used_gpu_memory_source is None and t4.used_gpu_memory_age_s is None
    # Nothing is in rayscope's sums: the T4's report is stale, Europa lost a GPU (its total
    # is unknown, not one GPU's), the other nodes are unmeasured.
    europa = status.nodes[EUROPA]
    assert europa.used_gpu_memory_bytes is None and europa.gpus_unmeasured == 1
    assert (europa.total_gpu_memory, europa.used_gpu_memory) == ("NA", "NA")
    assert europa.used_gpu_memory_reason == "1 GPU(s) not measured"
    assert status.cluster.used_gpu_memory_bytes is None and status.cluster.total_gpu_memory_bytes is None
    assert status.cluster.gpu_nodes_measured == 0 and status.cluster.gpu_nodes == 3
    # BioEngine's sums add the numbers there are: the stale T4's total, the CPU node's 0s.
    assert (status.cluster.total_gpu_memory, status.cluster.used_gpu_memory) == (24 * 1024**3, 0)


def test_fresh_reports_are_summed() -> None:
    status = seed_status()
    assert status.cluster.total_gpu_memory_bytes == status.cluster.total_gpu_memory == 2 * 24 * 1024**3
    europa = status.nodes[EUROPA]
    assert europa.used_gpu_memory_bytes == europa.used_gpu_memory == europa.nvml_memory_used_bytes
    assert (europa.used_gpu_memory_source, europa.used_gpu_memory_age_s, europa.used_gpu_memory_reason) == (
        "nvml",
        2.0,  # NVML's figure is read at collection: its age is the report's
        "",
    )
    assert status.nodes[EUROPA].agent == "reporting" and status.nodes[EUROPA].report_age_s == 2.0


def test_report_for_unknown_node_is_not_in_scheduler() -> None:
    node = mixed_status().nodes[UNKNOWN]
    assert not node.in_scheduler and node.total_cpu == 0 and node.node_ip == "10.0.0.12"


def test_cpu_only_node_without_report_has_unknown_gpu_memory() -> None:
    """Unknown is null in rayscope's keys, never a made-up 0; BioEngine's keys say what
    BioEngine says: 0 bytes and accelerator "NA" on a node without GPU, "NA" on a GPU node."""
    status = merge(scheduler_nodes(SEED_VIEWS), {}, now=NOW, stale_after_s=15, view="head")
    cpu, europa = status.nodes[CPU], status.nodes[EUROPA]
    assert cpu.total_gpu_memory_bytes is None and cpu.used_gpu_memory_bytes is None
    assert cpu.used_gpu_memory_reason == "no agent"
    assert (cpu.total_gpu_memory, cpu.used_gpu_memory, cpu.accelerator_type) == (0, 0, "NA")
    assert ray_accelerator(cpu) is None
    assert europa.total_gpu_memory_bytes is None  # a GPU node nobody measured
    assert (europa.total_gpu_memory, europa.used_gpu_memory, europa.accelerator_type) == ("NA", "NA", "G")
    assert ray_accelerator(europa) == "G"


def test_measured_memory_distinguishes_unknown_from_none() -> None:
    assert measured_memory(None) == MeasuredMemory(None, None, None, None, None, "NVML did not answer", 0)
    assert measured_memory([]) == MeasuredMemory(0, 0, 0, "nvml", 0.0, "", 0)
    lost = GpuDevice(index=0, errors={"device": "GPU is lost"})
    assert measured_memory([lost]) == MeasuredMemory(None, None, None, None, None, "1 GPU(s) not measured", 1)
    ok = GpuDevice(index=1, memory_total_bytes=10, memory_used_bytes=4)
    assert measured_memory([ok]) == MeasuredMemory(10, 4, 4, "nvml", 0.0, "", 0)
    # not 10: GPUs are missing from it
    assert measured_memory([lost, ok, lost]) == MeasuredMemory(
        None, None, None, None, None, "2 GPU(s) not measured", 2
    )
    # NVML gave the total but not the used figure: the capacity is known, the use is not
    no_used = GpuDevice(index=2, memory_total_bytes=10, errors={"memory_used": "Unknown Error"})
    assert measured_memory([ok, no_used]) == MeasuredMemory(
        20, None, None, None, None, "1 GPU(s) not measured", 1
    )


def test_bioengine_memory_follows_get_cluster_state() -> None:
    """0 on a node without GPU whatever NVML sees; else bytes or "NA", never null."""
    assert bioengine_memory(0.0, 24, 3) == (0, 0)
    assert bioengine_memory(0.0, None, None) == (0, 0)
    assert bioengine_memory(1.0, 24, 3) == (24, 3)
    assert bioengine_memory(1.0, 24, None) == (24, "NA")
    assert bioengine_memory(2.0, None, None) == ("NA", "NA")


def test_order_is_head_then_ip_numerically_then_id() -> None:
    ips = [n.node_ip for n in mixed_status().nodes.values()]
    assert ips == ["172.17.0.3", "10.0.0.5", "10.0.0.7", "10.0.0.9", "10.0.0.11", "10.0.0.12"]


def test_local_report_is_never_stale() -> None:
    local = report(EUROPA, [], "172.17.0.3", age_s=3600)
    local.local = True
    status = merge(scheduler_nodes(SEED_VIEWS), {EUROPA: local}, now=NOW, stale_after_s=15, view="gcs")
    assert status.nodes[EUROPA].agent == "local" and not status.nodes[EUROPA].stale
    assert SEED_REPORTS[EUROPA].local is False


def test_of_two_accelerator_tokens_the_first_by_name_whatever_the_gcs_order() -> None:
    """A node declaring ``accelerator_type:G`` where Ray also detected its GPU (the tests'
    fake NVML): the GCS lists the two in no fixed order, the line named either (seen live)."""
    names = ["accelerator_type:G", "accelerator_type:GeForce-RTX-3090"]
    assert accelerator_type(names) == accelerator_type(names[::-1]) == "G"


@pytest.mark.parametrize(
    ("detected", "tokens", "shown"),
    [
        ("GeForce-RTX-4090", ["accelerator_type:GeForce-RTX-4090", "accelerator_type:RTX4090"], "RTX4090"),
        ("GeForce-RTX-3090", ["accelerator_type:G", "accelerator_type:GeForce-RTX-3090"], "G"),
        ("A100", ["accelerator_type:A100"], "A100"),
        (None, ["accelerator_type:RTX4090", "accelerator_type:GeForce-RTX-4090"], "GeForce-RTX-4090"),
    ],
)
def test_a_declared_token_is_shown_over_the_one_ray_detected(
    detected: Optional[str], tokens: list[str], shown: str
) -> None:
    """Ray 2.58+ names an RTX 4090 ``GeForce-RTX-4090`` (2.55: ``G``) and labels the node with
    it (``ray.io/accelerator-type``); a token the operator declared beside it is what the apps
    ask for, and what every line shows, in either GCS order. Without the label (before 2.49)
    nothing tells them apart: the first by name."""
    labels = {"ray.io/node-id": "ab" * 28, **({"ray.io/accelerator-type": detected} if detected else {})}
    for names in (tokens, tokens[::-1]):
        view = RayNode(
            node_id="ab" * 28,
            node_ip="10.0.0.9",
            total={"GPU": 1.0, **dict.fromkeys(names, 1.0)},
            labels=labels,
        )
        status = merge(scheduler_nodes([view]), {}, now=NOW, stale_after_s=15, view="gcs")
        assert status.nodes["ab" * 28].accelerator_type == shown
        assert accelerator_type(names, labels) == shown
