"""Figures not to be believed are not shown as measured, from every source (Ray's dashboard,
a node agent's report, this host's NVML): a GPU node the dashboard lists with no GPU, a GPU
whose used memory is above its total or that has no memory at all; and one node's bad field
never blanks another node.

Before (measured on 8b32fdd): a dashboard agent without NVML (``gpus: []``) on a node Ray
counts 1 GPU on read ``VRAM: 0.0/0.0 GB`` from ``ray-dashboard`` with no reason (``NA``
without the dashboard); used above total was shown from the dashboard (``8388608.0/0.0 GB``)
and from a report (``VRAM: 20.0/16.0 GB``); one ``NaN`` in an unread field of one node made
the whole summary unreadable: every node lost its figure. Positive control: make
``memory.not_a_figure`` return ``""`` and the cases of used above total and of no memory fail
again.
"""

import json

import pytest

from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.render.status import status_lines
from rayscope.schema.dashboard import DashboardGpu, DashboardNode
from rayscope.schema.report import GpuDevice
from rayscope.schema.status import ClusterStatus
from rayscope.sources import dashboard
from tests import scenarios
from tests.scenarios import NOW, T4, dashboard_read, dashboard_status, report
from tests.support.dashboard import answer, node

GIB = 1024**3


def line_of(status: ClusterStatus, ip: str) -> str:
    """The node's own line (the note under ``VRAM: NA`` names the node too, with its reason)."""
    [line] = [line for line in status_lines(status) if line.startswith(f"  {ip} [")]
    return line


def t4_from_dashboard(*gpus: DashboardGpu) -> ClusterStatus:
    entry = DashboardNode(node_id=T4, node_ip="10.0.0.5", measured_at=NOW - 3.4, gpus=list(gpus))
    return dashboard_status(dashboard_read(extra={T4: entry}))


def dashboard_gpu(total_bytes: int, used_bytes: int) -> DashboardGpu:
    return DashboardGpu(
        index=0, uuid="GPU-t4", name="Tesla T4", memory_total_bytes=total_bytes, memory_used_bytes=used_bytes
    )


# --- (a) a GPU node the dashboard lists without a GPU ---------------------------------------------


def test_a_gpu_node_the_dashboard_lists_no_gpu_on_is_not_measured() -> None:
    status = t4_from_dashboard()  # the T4 worker counts 1 GPU in Ray; its dashboard agent has no NVML
    worker = status.nodes[T4]
    assert worker.used_gpu_memory_bytes is None and worker.used_gpu_memory_source is None
    assert worker.used_gpu_memory == "NA"
    assert worker.used_gpu_memory_reason.endswith(
        "Ray dashboard: it lists no GPU on this node, which Ray counts 1 GPU on"
        " (its agent there reads no NVML)"
    )
    assert "VRAM: 0.0/0.0 GB" not in line_of(status, "10.0.0.5")
    assert "NA" in line_of(status, "10.0.0.5")


def test_a_cpu_node_the_dashboard_lists_no_gpu_on_keeps_its_zero() -> None:
    cpu = dashboard_status().nodes[scenarios.CPU]
    assert (cpu.total_gpu_memory_bytes, cpu.used_gpu_memory_bytes) == (0, 0)


# --- (b) used above total, no memory: from every source -----------------------------------------


@pytest.mark.parametrize(
    ("total", "used", "why"),
    [
        (0, 8 * 2**50, "no memory: a total of 0 MB is no GPU's, not a measurement"),
        (15 * GIB, 16 * GIB, "used 16.0 GB above its total 15.0 GB: not a measurement"),
        (0, 0, "no memory: a total of 0 MB is no GPU's, not a measurement"),
    ],
)
def test_the_dashboards_gpu_above_its_total_or_without_memory_is_not_measured(
    total: int, used: int, why: str
) -> None:
    status = t4_from_dashboard(dashboard_gpu(total, used))
    worker = status.nodes[T4]
    assert worker.used_gpu_memory_bytes is None and worker.used_gpu_memory == "NA"
    [gpu] = worker.gpus or []
    assert gpu.memory_used_bytes is None and why in str(gpu.memory_used_reason)
    assert why in worker.used_gpu_memory_reason
    assert "8388608.0/0.0" not in line_of(status, "10.0.0.5")
    assert "16.0/15.0" not in line_of(status, "10.0.0.5")
    assert status.cluster.used_gpu_memory_bytes is None or status.cluster.gpu_nodes_measured < 2


def reported(gpu: GpuDevice) -> ClusterStatus:
    return merge(
        scheduler_nodes(scenarios.SEED_VIEWS),
        {T4: report(T4, [gpu], "10.0.0.5")},
        now=NOW,
        stale_after_s=15.0,
        view="gcs",
    )


@pytest.mark.parametrize("settled_by_the_agent", [False, True])
def test_a_reports_gpu_above_its_total_is_not_measured(settled_by_the_agent: bool) -> None:
    """A node agent's report (NVML's figure as the agent sent it, or as it settled it)."""
    from rayscope.core.gpu.trust import settle_on_agent

    gpu = scenarios.gpu(0, 20.0, "Tesla T4")  # 20 GiB used of an RTX 3090's 24
    gpu = GpuDevice(**{**{f: getattr(gpu, f) for f in gpu.__struct_fields__}, "memory_total_bytes": 16 * GIB})
    if settled_by_the_agent:
        gpu = settle_on_agent(GpuDevice(**{**{f: getattr(gpu, f) for f in gpu.__struct_fields__},
                                   "nvml_memory_used_bytes": 20 * GIB}))  # fmt: skip
    worker = reported(gpu).nodes[T4]
    assert worker.used_gpu_memory_bytes is None and worker.used_gpu_memory == "NA"
    assert "used 20.0 GB above its total 16.0 GB: not a measurement" in worker.used_gpu_memory_reason
    assert "20.0/16" not in line_of(reported(gpu), "10.0.0.5")


def test_a_sound_report_is_measured_as_before() -> None:
    worker = reported(scenarios.gpu(0, 5.8, "Tesla T4")).nodes[T4]
    assert worker.used_gpu_memory_bytes == int(5.8 * GIB) and worker.used_gpu_memory_source == "nvml"


# --- (c) one node's bad field never blanks another ----------------------------------------------


def test_a_nan_in_one_nodes_unread_field_blanks_no_other_node() -> None:
    """Ray's dashboard writes its summary with Python's json.dumps, which writes NaN."""
    good = node(T4)
    odd = {**node("cd" * 28), "loadAvg": [[float("nan"), 0.5], [float("inf")]]}
    body = answer(good, odd)
    assert b"NaN" in body and b"Infinity" in body
    nodes, status = dashboard.parse_summary(200, body, "http://h:8265", "2.60.0")
    assert status.ok and set(nodes) == {T4, "cd" * 28}, status


def test_a_nan_in_a_read_field_leaves_that_node_out_and_counted() -> None:
    bad = node("cd" * 28, memoryUsed=float("nan"))
    body = answer(node(T4), bad)
    nodes, status = dashboard.parse_summary(200, body, "http://h:8265", "2.60.0")
    assert status.ok and set(nodes) == {T4}
    assert "1 node(s) refused" in status.detail


def test_a_nan_as_now_is_no_time() -> None:
    body = json.dumps({"result": True, "data": {"summary": [{**node(T4), "now": float("nan")}]}}).encode()
    nodes, status = dashboard.parse_summary(200, body, "http://h:8265", "2.60.0")
    assert status.ok and nodes[T4].measured_at is None
