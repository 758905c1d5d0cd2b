"""The head's side: what a node that holds the token, or a stranger on the HTTP
port, can no longer do. Each test exploits the hole the old code left open, with the
project's own wire module (:mod:`rayscope.net.wire`) against the head's real report protocol.

Before the fixes (in brackets in SECURITY.md): a second connection replaced a live node's
report; a report at the bounds decoded to ~20 MiB; eviction at the cap scanned every node
under the lock; ages followed the wall clock; a clean stop looked like a crash.
"""

import logging
import re
import time
import tracemalloc
from email.message import Message
from typing import Any

import msgspec
import pytest

from rayscope.core.validate import ReportError
from rayscope.head.serve.routes import Request, Routes
from rayscope.head.store import reports as report_table
from rayscope.head.store.state import HeadState
from rayscope.net import wire
from rayscope.schema import report as schema
from rayscope.schema.report import (
    GpuDevice,
    GpuProcess,
    HostInfo,
    NodeReport,
    SourceStatus,
)
from rayscope.schema.status import RayNode
from rayscope.sinks.logs import LogThrottle
from tests.conftest import REPO
from tests.support.largest_report import largest_report
from tests.support.report_port import Agent, Port, closed_by_head

NODE = "ab" * 28
GIB = 1024**3
SECURITY = (REPO / "SECURITY.md").read_text()


def a_report(node_id: str = NODE, used_gib: int = 1, hostname: str = "gpu-1") -> NodeReport:
    return NodeReport(
        node_id=node_id,
        collected_at=1.0,
        host=HostInfo(hostname=hostname),
        gpus=[GpuDevice(index=0, memory_total_bytes=24 * GIB, memory_used_bytes=used_gib * GIB)],
    )


def used_on(port: Port, key: str) -> Any:
    node = port.state.status(time.monotonic()).nodes.get(key)
    return None if node is None else node.used_gpu_memory_bytes


def rejected(port: Port, reason: str) -> int:
    return port.guard.counters.rejected.get(reason, 0)


def test_a_node_belongs_to_the_connection_that_reported_it_first(port: Port) -> None:
    """A token holder's second connection claims a live node with made-up numbers. Before:
    it replaced them (99 GiB in every view, and ``fit`` decided on them). Now: refused
    (``claimed``), counted, the connection closed, the owner's numbers kept; once the owner
    is gone, the node may be reported by whoever reports it next (an agent restarting)."""
    owner, claimant = Agent(port), Agent(port)
    assert owner.report(a_report(used_gib=1)) == [(1, None)]
    before = rejected(port, wire.CLAIMED)
    assert claimant.report(a_report(used_gib=99)) == [(1, wire.CLAIMED)]
    assert rejected(port, wire.CLAIMED) - before == 1
    assert closed_by_head(claimant.sock)
    assert used_on(port, NODE) == GIB
    owner.sock.close()
    port.run(0.1)
    restarted = Agent(port)
    assert restarted.report(a_report(used_gib=2)) == [(1, None)]
    assert used_on(port, NODE) == 2 * GIB


def test_a_host_without_a_raylet_belongs_to_one_connection_too(port: Port) -> None:
    """An empty node id with a host name (a login node) was replaced the same way."""
    owner, claimant = Agent(port), Agent(port)
    assert owner.report(a_report(node_id="", used_gib=1, hostname="login-1")) == [(1, None)]
    assert claimant.report(a_report(node_id="", used_gib=99, hostname="login-1")) == [(1, wire.CLAIMED)]
    assert used_on(port, "host:login-1") == GIB


def test_a_report_must_come_from_the_address_the_scheduler_has_for_its_node() -> None:
    """Off loopback, a report for a node the scheduler has at 10.0.0.5 from 10.0.0.66 is
    refused (``wrong peer``); the node's own address (IPv4-mapped too) is taken."""
    state = HeadState(1.0, None)
    state.set_view([RayNode(node_id=NODE, node_ip="10.0.0.5")], SourceStatus(name="gcs", ok=True))
    payload = msgspec.msgpack.encode(a_report())
    with pytest.raises(ReportError) as refused:
        state.ingest(payload, 1.0, conn="agent-1", peer="10.0.0.66")
    assert refused.value.reason == wire.WRONG_PEER
    state.ingest(payload, 1.0, conn="agent-2", peer="::ffff:10.0.0.5")
    state.ingest(payload, 2.0, conn="agent-2", peer="10.0.0.5")
    assert state.status(2.0).nodes[NODE].agent == "reporting"


def test_a_clean_stop_drops_the_node_at_once_and_a_crash_leaves_it_to_go_stale(port: Port) -> None:
    """Before: an agent stopped on purpose left its node stale for good (status exit 1 until
    the head restarted). Now the agent's goodbye (an empty frame) drops the node's report."""
    clean, crashed = Agent(port), Agent(port)
    clean.report(a_report(node_id="c" * 56))
    crashed.report(a_report(node_id="d" * 56))
    assert clean.send(wire.GOODBYE) == [(2, None)]
    crashed.sock.close()
    port.run(0.1)
    nodes = port.state.status(time.monotonic()).nodes
    assert "c" * 56 not in nodes
    assert "d" * 56 in nodes


def the_largest_report() -> NodeReport:
    """A report at every bound at once: the most a token holder can make the head hold."""
    return largest_report(NODE)


def test_a_report_at_every_bound_decodes_within_the_stated_memory() -> None:
    """The head's memory per node is bounded by what it holds, not by the frame. Before: a
    1 MB report (64 GPUs, 16 MIG devices each, 150 processes each) decoded to ~20 MiB and 40
    node ids took the head from 33 MiB to 909 MiB. Now that report is refused, and the
    largest one accepted costs at most ``MAX_REPORT_DECODED_BYTES`` once decoded."""
    state = HeadState(1.0, None)
    attack = NodeReport(
        node_id=NODE,
        collected_at=1.0,
        gpus=[
            GpuDevice(
                index=g,
                mig_devices=[
                    GpuDevice(index=m, parent_index=g, processes=[GpuProcess(pid=p) for p in range(150)])
                    for m in range(16)
                ],
            )
            for g in range(64)
        ],
    )
    with pytest.raises(ReportError):
        state.ingest(msgspec.msgpack.encode(attack), 1.0)
    largest = msgspec.msgpack.encode(the_largest_report())
    assert len(largest) <= wire.MAX_PAYLOAD_BYTES
    decoder = msgspec.msgpack.Decoder(NodeReport)
    tracemalloc.start()
    try:
        held = decoder.decode(largest)
        cost, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cost <= schema.MAX_REPORT_DECODED_BYTES, cost
    state.ingest(largest, 1.0)  # and it is accepted
    assert held.node_id == NODE


def over_a_sum_bound(what: str) -> NodeReport:
    """A report inside every per-list bound that breaks one summed over the report."""
    report = a_report()
    if what == "devices":  # 17 GPUs of 8 devices each: 136 > 128
        report.gpus = [
            GpuDevice(index=i, mig_devices=[GpuDevice(index=m) for m in range(7)]) for i in range(17)
        ]
    elif what == "processes":  # 5 GPUs of 256 processes: 1280 > 1024
        report.gpus = [
            GpuDevice(index=i, processes=[GpuProcess(pid=p) for p in range(256)]) for i in range(5)
        ]
    else:  # 70 strings of 4,000 characters: 280,000 > 262,144
        report.sources = [SourceStatus(name="s", ok=False, reason="r" * 4000) for _ in range(70)]
    return report


@pytest.mark.parametrize("what", ["devices", "processes", "characters"])
def test_a_report_over_a_sum_bound_is_refused(what: str) -> None:
    """Bounds the types cannot say: devices, processes and characters summed over a report."""
    report = over_a_sum_bound(what)
    with pytest.raises(ReportError, match=what if what != "devices" else "MIG devices"):
        HeadState(1.0, None).ingest(msgspec.msgpack.encode(report), 1.0)


class NoScan(dict):  # type: ignore[type-arg]
    """A report table that fails any walk over it: eviction must not walk."""

    def __iter__(self) -> Any:
        raise AssertionError("the report table was scanned")

    def items(self) -> Any:
        raise AssertionError("the report table was scanned")

    def values(self) -> Any:
        raise AssertionError("the report table was scanned")


def test_eviction_at_the_cap_never_walks_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every new node at the cap scanned all 16,384 reports for the oldest unknown
    one, under the lock (a token holder sending new ids stalled the event loop for seconds).
    Now the oldest unknown node is the first of an ordered index: O(1)."""
    monkeypatch.setattr(report_table, "MAX_UNKNOWN_HELD", 50)
    state = HeadState(1.0, None)
    for i in range(50):
        state.ingest(msgspec.msgpack.encode(a_report(node_id=f"{i:056x}")), float(i))
    table = state._table
    table.reports = NoScan(table.reports)
    for i in range(50, 60):
        state.ingest(msgspec.msgpack.encode(a_report(node_id=f"{i:056x}")), float(i))
    assert len(table.reports) == 50
    assert f"{9:056x}" not in table.reports and f"{10:056x}" in table.reports


def test_the_unknown_node_cap_is_securitys_256_at_its_real_value() -> None:
    """The cap SECURITY.md states, unpatched (the test above patches it for speed): 257
    made-up ids hold 256, the oldest evicted, and the node the scheduler knows stays. Before:
    the code held 1,024 while SECURITY.md said 256, and every test patched the cap, so 1,200
    made-up ids of the largest report took a head from 85 MiB to 2.4 GiB unnoticed."""
    stated = re.search(r"of which at most (\d+) for\s+nodes the scheduler does not know", SECURITY)
    assert stated is not None
    assert report_table.MAX_UNKNOWN_HELD == int(stated.group(1)) == 256
    state = HeadState(1.0, None)
    known = "f" * 56
    state.set_view([RayNode(node_id=known, node_ip="10.0.0.1")], SourceStatus(name="gcs", ok=True))
    state.ingest(msgspec.msgpack.encode(a_report(node_id=known)), 0.0)
    made_up = [f"{i:056x}" for i in range(257)]
    for i, node_id in enumerate(made_up):
        state.ingest(msgspec.msgpack.encode(a_report(node_id=node_id)), 1.0 + i)
    held = set(state._table.reports)
    assert len(held) == 257 and known in held
    assert held - {known} == set(made_up[1:])  # the 257th evicted the oldest made-up id


def test_ages_follow_the_heads_monotonic_clock_not_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall clock stepped back kept a dead agent "reporting" for the step; stepped forward,
    every node went stale at once. Now: ages on the monotonic clock, walls only shown."""
    state = HeadState(1.0, None)
    routes = Routes(state, (), LogThrottle(logging.getLogger("t")))
    state.take(msgspec.msgpack.encode(a_report()), time.monotonic(), "agent-1", "127.0.0.1")
    get = Request("GET", "/v1/status", Message())

    def agent_of_the_node() -> str:
        document = msgspec.json.decode(routes.answer(get).body)
        return str(document["nodes"][NODE]["agent"])

    real_time, real_monotonic = time.time, time.monotonic
    monkeypatch.setattr(time, "time", lambda: real_time() + 86_400)  # a day forward
    assert agent_of_the_node() == "reporting"
    monkeypatch.setattr(time, "time", lambda: real_time() - 86_400)  # a day back
    assert agent_of_the_node() == "reporting"
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + 60)  # a minute of silence
    assert agent_of_the_node() == "stale"


def test_the_pollers_forgetting_uses_the_clock_the_reports_were_stamped_with() -> None:
    """The poller forgets by the same monotonic clock the report port stamps reports with: a
    fresh report survives a round with no scheduler view, a 21-interval-old one does not.
    Positive control: give ``forget_gone`` the wall clock and the fresh report is forgotten."""
    from rayscope.head.poll.poller import poll_once

    state = HeadState(1.0, None)
    state.take(msgspec.msgpack.encode(a_report()), time.monotonic(), "agent-1", "127.0.0.1")
    state.take(
        msgspec.msgpack.encode(a_report(node_id="e" * 56)), time.monotonic() - 21, "agent-2", "127.0.0.1"
    )
    poll_once(state, None)
    assert set(state.status(time.monotonic()).nodes) == {NODE}
