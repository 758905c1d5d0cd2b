"""A dead node is shown once, as dead: apart from the live ones under ``--all``, counted in
one line of the default view, never also as a host-only agent line.

Before: the push agent of a node whose raylet was SIGKILLed switched to a host-only report
(``host:NAME``), so for the ~20 s Ray takes to mark the node dead the head showed the node's
stale line and ``vm [worker] VRAM: 7.6/64.0 GB  agent: manual, no raylet``; once it was
dead, the default view dropped it with no word, and ``--all`` listed it under ``CPU-only
nodes:`` as ``CPU: 0/0  dead`` (the GCS keeps no totals for a dead node).
"""

import logging
from typing import Optional

import pytest

from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.node import collect
from rayscope.node.push import Pusher
from rayscope.render.status import status_lines
from rayscope.schema.report import HostInfo, NodeReport, RayletInfo, SourceStatus
from rayscope.schema.status import ReceivedReport
from rayscope.sources import raylet
from tests.scenarios import NOW, SEED_VIEWS, gpu, view

WORKER = "5a" * 28
RAYLET = RayletInfo(pid=4242, node_id=WORKER, node_ip="10.0.0.9", gcs_address="172.17.0.3:6379")


def pusher_whose_raylet_dies(monkeypatch: pytest.MonkeyPatch) -> tuple[Pusher, list[RayletInfo]]:
    """An unpinned agent on a host with one raylet; empty the list and the raylet is gone."""
    here = [RAYLET]
    monkeypatch.setattr(raylet, "find_raylets", lambda: (list(here), SourceStatus(name="raylet", ok=True)))
    monkeypatch.setattr(raylet, "still_running", lambda info: info in here)

    def local_report(mine: Optional[RayletInfo], now: float, *_: object) -> NodeReport:
        host = HostInfo(hostname="vm", cpu_count=64)
        return NodeReport(
            node_id=mine.node_id if mine else "",
            collected_at=now,
            raylet=mine,
            host=host,
            gpus=[gpu(0, 7.6)],
        )

    monkeypatch.setattr(collect, "local_report", local_report)
    return Pusher(("127.0.0.1", 9), b"t" * 32, 1.0, clock=lambda: NOW), here


def head_key(report: NodeReport) -> str:
    """The key the head files a report under (``HeadState``): its node id, else its host."""
    return report.node_id or f"host:{report.host.hostname if report.host else '?'}"


def test_the_agent_of_a_node_whose_raylet_died_reports_that_node(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: ``report.node_id`` empty after the raylet died (a second, host-only node)."""
    pusher, here = pusher_whose_raylet_dies(monkeypatch)
    assert pusher.collect().node_id == WORKER
    here.clear()
    with caplog.at_level(logging.INFO, logger="rayscope.push"):
        gone = pusher.collect()
    assert gone.node_id == WORKER and gone.raylet is None
    assert f"the raylet of Ray node {WORKER} is gone: reporting that node without it" in caplog.text


def test_a_dead_node_is_one_line_counted_by_default_and_listed_apart_with_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pusher, here = pusher_whose_raylet_dies(monkeypatch)
    pusher.collect()
    here.clear()
    report = pusher.collect()
    reports = {head_key(report): ReceivedReport(report=report, received_at=NOW - 1.0)}
    for alive in (True, False):  # before Ray marks it dead, then after (its totals gone)
        worker = view(
            WORKER, "10.0.0.9", {"CPU": 64, "GPU": 2} if alive else {}, {} if alive else None, alive=alive
        )
        status = merge(
            scheduler_nodes([*SEED_VIEWS, worker]), reports, now=NOW, stale_after_s=15.0, view="head"
        )
        lines = status_lines(status)
        assert not any("no raylet" in line or line.startswith("  vm ") for line in lines), lines
        assert sum("10.0.0.9" in line for line in lines) == (1 if alive else 0), lines
        assert ("1 dead node: --all lists it" in lines) is not alive, lines
    every = status_lines(status, include_dead=True)
    dead = every.index("Dead nodes:")
    assert every[dead + 1] == f"  10.0.0.9 [worker] node {WORKER[:12]}  agent: manual, dead", every
    assert sum("10.0.0.9" in line for line in every) == 1 and "CPU: 0/0" not in "\n".join(every)


def test_two_dead_nodes_are_counted_as_them() -> None:
    views = [view(n * 28, f"10.0.0.{i}", {}, None, alive=False) for i, n in enumerate(("5a", "5b"), 20)]
    status = merge(scheduler_nodes([*SEED_VIEWS, *views]), {}, now=NOW, stale_after_s=15.0, view="gcs")
    lines = status_lines(status)
    assert "2 dead nodes: --all lists them" in lines and not any("10.0.0.2" in line for line in lines)
