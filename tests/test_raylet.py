"""The raylet parser, fed command lines recorded from real raylets (Ray 2.60.0 and 2.33.0)."""

from rayscope.schema.report import RayletInfo
from rayscope.sources.raylet import parse_labels, parse_raylet_cmdline, parse_resource_list, pick_raylet
from tests.scenarios import recorded_raylet_argv


def test_recorded_head_raylet() -> None:
    info = parse_raylet_cmdline(recorded_raylet_argv("head"), pid=4471)
    assert info is not None
    assert info.pid == 4471 and info.is_head
    assert info.node_id == "c481e6c5575beacd35643d7b17dc49272c7b5b3ea35bec702556c8d2"
    assert info.node_ip == "127.0.0.1"
    assert info.gcs_address == "127.0.0.1:36943"
    assert info.static_resources["VRAM_MB"] == 24576
    assert info.static_resources["GPU"] == 1 and info.static_resources["CPU"] == 8
    assert info.static_resources["accelerator_type:G"] == 1
    assert info.session_dir is not None and info.session_dir.endswith(
        "session_2026-11-30_16-32-29_614287_4402"
    )
    assert info.python_executable == "/work/main/.venv/bin/python"
    assert info.labels == {}


def test_recorded_worker_raylet_is_not_head() -> None:
    info = parse_raylet_cmdline(recorded_raylet_argv("denbi"))
    assert info is not None and not info.is_head
    assert "VRAM_MB" not in info.static_resources
    assert info.static_resources["accelerator_type:T4"] == 1


def test_not_a_raylet() -> None:
    assert parse_raylet_cmdline([]) is None
    assert parse_raylet_cmdline(["/usr/bin/python3", "--node_id=abc"]) is None
    assert parse_raylet_cmdline(["/opt/ray/raylet", "--head"]) is None  # no node id: not usable


def test_resource_list_skips_bad_pairs() -> None:
    assert parse_resource_list("VRAM_MB,24576,CPU,8") == {"VRAM_MB": 24576.0, "CPU": 8.0}
    assert parse_resource_list("CPU,eight,GPU,1,dangling") == {"GPU": 1.0}
    assert parse_resource_list("") == {}


def test_labels_json_and_legacy_pairs() -> None:
    assert parse_labels('{"ray.io/accelerator-type": "G", "zone": "a"}') == {
        "ray.io/accelerator-type": "G",
        "zone": "a",
    }
    assert parse_labels("zone=a,rack=7") == {"zone": "a", "rack": "7"}
    assert parse_labels("") == {}


def test_pick_raylet_by_id_prefix_or_head_first() -> None:
    head = RayletInfo(pid=1, node_id="aaaa11", node_ip="10.0.0.1", is_head=True)
    worker = RayletInfo(pid=2, node_id="bbbb22", node_ip="10.0.0.1")
    assert pick_raylet([head, worker], None) is head
    assert pick_raylet([head, worker], "bbbb") is worker
    assert pick_raylet([head, worker], "cccc") is None
    assert pick_raylet([], None) is None


def test_recorded_ray_2_33_head_raylet() -> None:
    """Ray 2.33's raylet carries the same flags (``--labels=`` empty): one parser for all."""
    info = parse_raylet_cmdline(recorded_raylet_argv("head_ray233"))
    assert info is not None and info.is_head
    assert info.node_id == "86b49a6f551e997e26e133d0b2f297a4ccd286f43a3d52fb60a65bd8"
    assert info.gcs_address == "127.0.0.1:62305"
    assert info.static_resources["VRAM_MB"] == 24576 and info.static_resources["GPU"] == 1
    assert info.python_executable == "/root/.cache/rayscope-compat/ray-2.33.0-py3.9/bin/python"
    assert info.labels == {}
