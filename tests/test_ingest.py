"""The report port in process: greeting, acks, deadlines, caps, pre-authentication budget,
throttled logs; and the push agent's trimming of a report too big for a frame."""

import logging
import re
import struct
import time
from typing import Any

import msgspec
import pytest

from rayscope.head.serve import ingest
from rayscope.net import wire
from rayscope.node.push import Pusher
from rayscope.schema.report import GpuDevice, GpuProcess, NodeReport, ProcessInfo
from rayscope.sinks.logs import LogThrottle
from tests.scenarios import SEED_REPORTS
from tests.support.ports import refused_port
from tests.support.report_port import TOKEN, Port, closed_by_head, connect, received


def a_payload(node_id: str = "ab" * 28) -> bytes:
    report = SEED_REPORTS[next(iter(SEED_REPORTS))].report
    return msgspec.msgpack.encode(msgspec.structs.replace(report, node_id=node_id))


def test_a_good_frame_is_acked_and_taken(port: Port) -> None:
    s = connect(port)
    challenge = wire.parse_greeting(received(s))
    sealer = wire.Sealer(TOKEN, challenge)
    s.send(sealer.seal(a_payload()) + sealer.seal(a_payload()))
    port.run(0.1)
    assert wire.AckReader().feed(received(s)) == [(2, None)]  # cumulative: one ack per batch
    assert port.state.reports_received == 2


def test_a_frame_dripped_byte_by_byte_is_dropped_a_deadline_after_its_first_byte(
    port: Port, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each byte arrives well within the deadline; the whole frame does not. Positive
    control: measure from ``_last_data`` (the old rule) and the drip lives for ever."""
    monkeypatch.setattr(ingest, "FRAME_DEADLINE_S", 0.6)
    s = connect(port)
    frame = wire.Sealer(TOKEN, wire.parse_greeting(received(s))).seal(a_payload())
    started = time.monotonic()
    closed_after = None
    for byte in frame[:40]:
        try:
            s.send(bytes((byte,)))
        except OSError:
            closed_after = time.monotonic() - started
            break
        port.run(0.1)
        if received(s) != b"<nothing>":  # the rejection, then EOF
            closed_after = time.monotonic() - started
            break
    assert closed_after is not None and closed_after < 2.0
    assert port.guard.counters.rejected == {wire.TIMEOUT: 1}


def test_a_stranger_cannot_make_the_head_buffer_a_body(port: Port) -> None:
    """v2: a header with a bad MAC is rejected on its 29 bytes; v1: a stranger's frame may
    announce at most 64 KiB. Positive control: cap v1 at MAX_FRAME_BYTES before auth."""
    s = connect(port)
    received(s)
    s.send(wire.HEADER.pack(wire.V2, 1, wire.MAX_PAYLOAD_BYTES) + b"\0" * wire.HEADER_TAG_BYTES)
    port.run(0.1)
    assert wire.AckReader().feed(received(s)) == [(0, wire.BAD_TOKEN)]  # no frame of its taken
    s1 = connect(port)
    received(s1)
    s1.send(struct.pack(">I", wire.MAX_FRAME_BYTES))
    port.run(0.1)
    assert received(s1) == b""  # closed: v1 has no rejection message
    assert port.guard.counters.rejected == {wire.BAD_TOKEN: 1, wire.TOO_BIG: 1}
    assert port.state.frames_rejected == 2


def test_version_1_frames_are_still_taken_and_counted(port: Port, caplog: pytest.LogCaptureFixture) -> None:
    s = connect(port)
    received(s)
    s.send(wire.seal_v1(a_payload(), TOKEN) * 2)
    port.run(0.1)
    assert port.state.reports_received == 2 and port.guard.counters.v1_frames == 2
    assert sum("not replay-safe" in r.message for r in caplog.records) == 1


def test_unauthenticated_connections_are_capped_per_address_and_in_total() -> None:
    """Past the caps the oldest unauthenticated connection goes; an agent that authenticated
    stays. Positive control: return early from ``ConnectionGuard.admit``."""
    port = Port(max_total=12, max_unauth_per_host=5)
    try:
        agent = connect(port, "127.0.0.1")
        sealer = wire.Sealer(TOKEN, wire.parse_greeting(received(agent)))
        agent.send(sealer.seal(a_payload()))
        port.run(0.05)
        strangers = [connect(port, "127.0.0.2") for _ in range(8)]
        assert port.guard.counters.evicted == 3  # 5 per address
        strangers += [connect(port, f"127.0.0.{3 + i % 3}") for i in range(12)]
        port.run(0.1)
        assert port.guard.counters.open == 12
        agent.send(sealer.seal(a_payload()))
        port.run(0.1)
        assert port.state.reports_received == 2  # never evicted
        assert sum(not closed_by_head(s) for s in strangers) == 11
    finally:
        port.close()


def test_the_log_throttle_says_one_line_per_kind_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = LogThrottle(logging.getLogger("t"), interval_s=0.2)
    with caplog.at_level(logging.WARNING):
        for i in range(1000):
            throttle.note("a", "event a %d", i)
            throttle.note("b", "event b %d", i)
        time.sleep(0.25)
        throttle.flush()
    lines = [re.sub(r"last [0-9.]+ s", "last T s", r.getMessage()) for r in caplog.records]
    # the repeats are told by the line they repeat, never by the kind's key ("a", "rejected:bad token")
    assert lines == [
        "event a 0",
        "event b 0",
        "999 more in the last T s like: event a 0",
        "999 more in the last T s like: event b 0",
    ]


def test_a_report_too_big_for_a_frame_loses_its_process_lists(caplog: pytest.LogCaptureFixture) -> None:
    many = [GpuProcess(pid=i, used_memory_bytes=1 << 20, kinds=["compute"]) for i in range(20_000)]
    report = NodeReport(
        node_id="ab" * 28,
        collected_at=1.0,
        gpus=[GpuDevice(index=0, name="big", processes=many)],
        processes=[ProcessInfo(pid=i, name="python" * 10, title="ray::Worker" * 5) for i in range(20_000)],
    )
    pusher = Pusher(("127.0.0.1", refused_port()), TOKEN, 1.0)
    with caplog.at_level(logging.WARNING):
        payload = pusher.encode(report)
        pusher.encode(report)
    sent: Any = msgspec.msgpack.decode(payload, type=NodeReport)
    assert len(payload) <= wire.MAX_PAYLOAD_BYTES
    assert sent.processes is None and sent.gpus[0].processes is None and sent.gpus[0].name == "big"
    assert sum("sent without its process lists" in r.message for r in caplog.records) == 1
