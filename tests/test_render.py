"""Rendering: the exact status lines of docs/architecture.md, golden outputs, and each marker's reason."""

import json

import msgspec
import pytest

from rayscope.render.fmt import booking, gib
from rayscope.render.node import node_json, node_lines
from rayscope.render.status import node_line, status_json, status_lines
from rayscope.schema.status import NodeStatus
from tests.golden import check_golden
from tests.scenarios import CPU, EUROPA, T4, mixed_status, seed_node_diagnostics, seed_status

DESIGN_EXAMPLE = """\
Cluster: 16/32 CPUs, 1.03/2 GPUs, booked: 20480/24576 MB

GPU nodes:
  172.17.0.3 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: 5.8/24.0 GB  CPU: 8/8
  10.0.0.5 [worker] T4 GPU: 0.99/1 VRAM: 5.8/24.0 GB  CPU: 6/8

CPU-only nodes:
  10.0.0.7 [worker] CPU: 2/16
"""


def test_status_lines_are_exactly_the_design_example() -> None:
    """Written out here, not in a golden file: `make golden` must not be able to move it."""
    assert "\n".join(status_lines(seed_status())) + "\n" == DESIGN_EXAMPLE


def test_golden_status_outputs() -> None:
    check_golden("status_seed.txt", "\n".join(status_lines(seed_status())) + "\n")
    check_golden("status_seed.json", status_json(seed_status()) + "\n")
    check_golden("status_mixed.txt", "\n".join(status_lines(mixed_status())) + "\n")
    check_golden("status_mixed_all.txt", "\n".join(status_lines(mixed_status(), include_dead=True)) + "\n")
    check_golden("status_mixed.json", status_json(mixed_status(), include_dead=True) + "\n")


def test_golden_node_outputs() -> None:
    check_golden("node_seed.txt", "\n".join(node_lines(seed_node_diagnostics())) + "\n")
    check_golden("node_seed.json", node_json(seed_node_diagnostics()) + "\n")


def line_for(node_id: str) -> str:
    status = mixed_status()
    return node_line(status.nodes[node_id], status.view)


def test_stale_report_is_marked_with_its_age() -> None:
    assert line_for(T4).endswith("  stale 42s")


def test_node_without_agent_is_marked_and_its_memory_unknown() -> None:
    line = line_for("0a" * 28)
    assert "VRAM: NA/NA GB" in line and line.endswith("  no agent")
    assert "A100 GPU: 0.50/2" in line


def test_report_for_a_node_the_scheduler_does_not_know() -> None:
    assert line_for("99" * 28).endswith("  no raylet")


def test_dead_nodes_hidden_unless_all() -> None:
    status = mixed_status()
    assert not any("10.0.0.9" in line for line in status_lines(status))
    dead = [line for line in status_lines(status, include_dead=True) if "10.0.0.9" in line]
    assert len(dead) == 1 and dead[0].endswith("  dead")
    assert "de" * 28 not in json.loads(status_json(status))["nodes"]


def test_no_booking_segment_without_vram_mb() -> None:
    status = seed_status()
    assert "booked:" not in node_line(status.nodes[T4])
    assert "booked: 20480/24576 MB  VRAM" in node_line(status.nodes[EUROPA])


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        (0.040000000000000036, "GPU: 0.04/1"),
        (0.005, "GPU: 0.01/1"),
        (0.0, "GPU: 0.00/1"),
        (0.995, "GPU: 0.99/1"),
    ],
)
def test_gpu_fraction_has_two_decimals(used: float, expected: str) -> None:
    node = msgspec.structs.replace(seed_status().nodes[T4], used_gpu=used)
    assert booking(node) == expected


def test_unknown_numbers_render_as_na_never_zero() -> None:
    node: NodeStatus = msgspec.structs.replace(seed_status().nodes[EUROPA], used_gpu_memory_bytes=None)
    assert "VRAM: NA/24.0 GB" in node_line(node)
    assert gib(0) == "0.0" and gib(None) == "NA"


def test_cpu_only_line_has_no_gpu_words() -> None:
    assert node_line(seed_status().nodes[CPU]) == "10.0.0.7 [worker] CPU: 2/16"


def test_json_numbers_stay_numbers() -> None:
    doc = json.loads(status_json(mixed_status(), include_dead=True))
    for node in doc["nodes"].values():
        assert node["total_gpu_memory"] == "NA" or isinstance(node["total_gpu_memory"], int)
        assert node["total_gpu_memory_bytes"] is None or isinstance(node["total_gpu_memory_bytes"], int)
    assert doc["nodes"][CPU]["slurm_job_id"] == "8812"


@pytest.mark.parametrize(
    ("used", "expected"),
    [(0.5, "CPU: 0.50/16"), (2.0, "CPU: 2/16"), (2.00001, "CPU: 2/16"), (0.25, "CPU: 0.25/16")],
)
def test_cpus_booked_in_fractions_do_not_show_as_zero(used: float, expected: str) -> None:
    """Half a CPU booked is ``0.50``, not ``0`` (the old ``.0f``); whole CPUs keep the seed's
    format, within Ray's 1e-4 fixed point."""
    node = msgspec.structs.replace(seed_status().nodes[CPU], used_cpu=used)
    assert node_line(node) == f"10.0.0.7 [worker] {expected}"
