"""Frames, Structs on the wire, and a head that survives whatever a peer sends it."""

import contextlib
import socket
import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayscope.core.validate import ReportError
from rayscope.head.store.state import HeadState
from rayscope.net import wire
from rayscope.schema.node import NodeDiagnostics
from rayscope.schema.report import REPORT_SCHEMA, NodeReport, RayletInfo, SourceStatus
from rayscope.schema.status import ClusterStatus, RayNode
from tests.scenarios import SEED_REPORTS, mixed_status, seed_node_diagnostics
from tests.waiting import eventually

DATA = Path(__file__).resolve().parent / "data"
TOKEN = b"0123456789abcdef0123456789abcdef"


def a_report() -> NodeReport:
    return SEED_REPORTS[next(iter(SEED_REPORTS))].report


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (a_report(), NodeReport),
        (mixed_status(), ClusterStatus),
        (seed_node_diagnostics(), NodeDiagnostics),
        (RayletInfo(pid=1, node_id="ab", node_ip="10.0.0.1", labels={"zone": "a"}), RayletInfo),
    ],
)
def test_every_struct_round_trips_msgpack_and_json(value: Any, kind: type) -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=kind) == value
    assert msgspec.json.decode(msgspec.json.encode(value), type=kind) == value


def test_recorded_schema_1_report_still_decodes() -> None:
    """Encoded by the first release's model (before ``interval_s`` existed)."""
    report = msgspec.msgpack.decode((DATA / "node_report_schema1.msgpack").read_bytes(), type=NodeReport)
    assert report.schema == 1 and report.interval_s is None
    assert report.gpus is not None and report.gpus[0].memory_used_bytes == 6227702579
    assert report.raylet is not None and report.raylet.static_resources["VRAM_MB"] == 24576


def test_seal_and_open() -> None:
    frame = wire.seal_v1(b"payload", TOKEN)
    length = wire.body_length(frame[:4])
    assert length == len(frame) - 4
    assert wire.open_body(frame[4:], TOKEN) == b"payload"


def test_wrong_token_is_a_bad_mac() -> None:
    frame = wire.seal_v1(b"payload", TOKEN)
    with pytest.raises(wire.FrameError, match="bad MAC"):
        wire.open_body(frame[4:], b"another token")


def test_oversized_header_is_refused_before_the_body() -> None:
    with pytest.raises(wire.FrameError, match="exceeds"):
        wire.body_length(struct.pack(">I", wire.MAX_FRAME_BYTES + 1))
    with pytest.raises(wire.FrameError, match="shorter than its MAC"):
        wire.body_length(struct.pack(">I", 3))


def test_newer_schema_is_rejected() -> None:
    state = HeadState(5.0, None)
    newer = msgspec.structs.replace(a_report(), schema=REPORT_SCHEMA + 1)
    with pytest.raises(ReportError, match="newer"):
        state.ingest(msgspec.msgpack.encode(newer), 0.0)


def test_head_forgets_a_gone_node_but_keeps_known_ones() -> None:
    """A report for a node the scheduler does not know is dropped after 20 intervals of
    silence; a scheduler node's report is kept (it shows stale, which is the point)."""
    state = HeadState(1.0, None)
    known, gone = a_report(), msgspec.structs.replace(a_report(), node_id="9" * 56)
    state.set_view([RayNode(node_id=known.node_id, node_ip="10.0.0.1")], SourceStatus(name="gcs", ok=True))
    for report in (known, gone):
        state.ingest(msgspec.msgpack.encode(report), received_at=100.0)
    assert state.forget_gone(now=110.0) == []  # 10 intervals: not yet
    assert state.forget_gone(now=130.0) == ["9" * 56]
    assert set(state.status(130.0).nodes) == {known.node_id}


def test_head_forgets_old_reports_even_without_a_scheduler_view() -> None:
    """Without a scheduler view, a made-up node id was never forgotten (the old
    test here asserted exactly that). Now every report older than the horizon goes, by the
    head's clock; a fresh one stays."""
    state = HeadState(1.0, None)
    old, fresh = a_report(), msgspec.structs.replace(a_report(), node_id="f" * 56)
    state.ingest(msgspec.msgpack.encode(old), received_at=100.0)
    state.ingest(msgspec.msgpack.encode(fresh), received_at=990.0)
    assert state.forget_gone(now=1000.0) == [old.node_id]
    assert set(state.status(1000.0).nodes) == {fresh.node_id}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_garbage_payloads_never_escape_as_anything_but_report_error(payload: bytes) -> None:
    state = HeadState(5.0, None)
    with contextlib.suppress(ReportError):
        state.ingest(payload, 0.0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.binary(min_size=1, max_size=64), st.data())
def test_a_sealed_frame_opens_and_any_flipped_bit_is_refused(
    payload: bytes, token: bytes, data: st.DataObject
) -> None:
    """Positive control: a MAC that skipped part of the body would accept some flipped bit."""
    body = wire.seal_v1(payload, token)[wire.LENGTH.size :]
    assert wire.open_body(body, token) == payload
    bit = data.draw(st.integers(min_value=0, max_value=len(body) * 8 - 1))
    flipped = bytearray(body)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(wire.FrameError):
        wire.open_body(bytes(flipped), token)


# A live head process, fed hostile frames over TCP: it must drop them and keep serving.


def _send(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        try:
            while s.recv(4096):  # the head closes the connection after a bad frame
                pass
        except OSError:
            pass


def _frames() -> st.SearchStrategy[bytes]:
    good = wire.seal_v1(msgspec.msgpack.encode(a_report()), TOKEN)
    return st.one_of(
        st.binary(max_size=512),  # garbage
        st.integers(min_value=1, max_value=len(good) - 1).map(lambda n: good[:n]),  # truncated
        st.just(struct.pack(">I", wire.MAX_FRAME_BYTES + 1) + b"x" * 64),  # oversized
        st.just(wire.seal_v1(msgspec.msgpack.encode(a_report()), b"wrong token")),  # wrong MAC
        st.binary(max_size=256).map(lambda b: wire.seal_v1(b, TOKEN)),  # authentic garbage
    )


@pytest.mark.live
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=_frames())
def test_hostile_frames_do_not_kill_the_head(head_daemon: Any, frame: bytes) -> None:
    _send(head_daemon.listen_port, frame)
    assert head_daemon.process.poll() is None
    code, body = head_daemon.get("/healthz")
    # The head's own health (its GCS is a closed port: "ok" says no scheduler view, rule 9).
    assert code == 200 and msgspec.json.decode(body)["gcs_poller"]["ok"] is True


@pytest.mark.live
def test_after_hostile_frames_a_good_report_is_still_taken(head_daemon: Any) -> None:
    """Sets up its own hostile frames: it must not lean on the test above having run. The
    head is the session's, other modules move its counters too: each is checked as what this
    test's own frames moved it by (one wrong token, one truncated frame, one good report)."""
    counted = ("frames_rejected", "rejected_bad_token", "rejected_bad_frame", "reports_received")

    def counters() -> dict[str, int]:
        health = msgspec.json.decode(head_daemon.get("/healthz")[1])
        return {name: int(health.get(name, 0)) for name in counted}

    before = counters()
    _send(head_daemon.listen_port, wire.seal_v1(msgspec.msgpack.encode(a_report()), b"wrong token"))
    _send(head_daemon.listen_port, b"\x00\x00\x00\x40" + b"x" * 10)
    report = msgspec.structs.replace(a_report(), node_id="f00d" * 14)
    with socket.create_connection(("127.0.0.1", head_daemon.listen_port), timeout=5) as s:
        s.sendall(wire.seal_v1(msgspec.msgpack.encode(report), TOKEN))
        eventually(
            lambda: "f00d" * 14 in msgspec.json.decode(head_daemon.get("/v1/status?all=1")[1])["nodes"],
            10,
            "the head shows the good report",
        )
    assert "rejected frame" in head_daemon.log_text() and "truncated frame" in head_daemon.log_text()
    expected = {"frames_rejected": 2, "rejected_bad_token": 1, "rejected_bad_frame": 1, "reports_received": 1}

    def moved() -> dict[str, int]:
        return {name: count - before[name] for name, count in counters().items()}

    eventually(lambda: moved() == expected, 10, f"/healthz moved by {expected}")


# Version 2: challenge, sequence numbers, acknowledgements ----------------------------------


def test_v2_frames_round_trip_in_order() -> None:
    challenge = wire.new_challenge()
    sealer, opener = wire.Sealer(TOKEN, challenge), wire.Opener(TOKEN, challenge)
    for payload in (b"one", b"", b"x" * 5000):
        frame = sealer.seal(payload)
        seq, length = opener.open_header(frame[: wire.V2_HEADER_BYTES])
        assert length == len(payload) and seq == sealer.seq
        assert opener.open_body(frame[wire.V2_HEADER_BYTES :], seq) == payload


def test_a_recorded_frame_is_useless_on_another_connection() -> None:
    """Positive control: drop the challenge from the MAC (``_Keyed`` keyed without it) and
    the frame opens on the new connection."""
    frame = wire.Sealer(TOKEN, wire.new_challenge()).seal(b"report")
    with pytest.raises(wire.FrameError) as caught:
        wire.Opener(TOKEN, wire.new_challenge()).open_header(frame[: wire.V2_HEADER_BYTES])
    assert caught.value.reason == wire.BAD_TOKEN


def test_a_frame_resent_on_its_own_connection_is_a_replay() -> None:
    """Positive control: drop the ``seq <= last_seq`` check in ``Opener.open_header``."""
    challenge = wire.new_challenge()
    sealer, opener = wire.Sealer(TOKEN, challenge), wire.Opener(TOKEN, challenge)
    first, second = sealer.seal(b"a"), sealer.seal(b"b")
    for frame in (first, second):
        seq, _ = opener.open_header(frame[: wire.V2_HEADER_BYTES])
        opener.open_body(frame[wire.V2_HEADER_BYTES :], seq)
    with pytest.raises(wire.FrameError) as caught:
        opener.open_header(first[: wire.V2_HEADER_BYTES])
    assert caught.value.reason == wire.REPLAYED


def test_the_header_is_authenticated_before_any_body_byte() -> None:
    """A stranger's header announcing the largest payload is refused from its 29 bytes."""
    challenge = wire.new_challenge()
    forged = wire.HEADER.pack(wire.V2, 1, wire.MAX_PAYLOAD_BYTES) + b"\0" * wire.HEADER_TAG_BYTES
    with pytest.raises(wire.FrameError) as caught:
        wire.Opener(TOKEN, challenge).open_header(forged)
    assert caught.value.reason == wire.BAD_TOKEN
    too_big = wire.Sealer(TOKEN, challenge)
    with pytest.raises(wire.FrameError, match="exceeds"):
        too_big.seal(b"x" * (wire.MAX_PAYLOAD_BYTES + 1))


def test_a_changed_payload_fails_the_frame_mac() -> None:
    challenge = wire.new_challenge()
    frame = bytearray(wire.Sealer(TOKEN, challenge).seal(b"payload"))
    frame[wire.V2_HEADER_BYTES] ^= 1
    opener = wire.Opener(TOKEN, challenge)
    seq, _ = opener.open_header(bytes(frame[: wire.V2_HEADER_BYTES]))
    with pytest.raises(wire.FrameError, match="frame MAC"):
        opener.open_body(bytes(frame[wire.V2_HEADER_BYTES :]), seq)


def test_acks_and_rejections_parse_from_any_split() -> None:
    stream = wire.ack(1) + wire.ack(2) + wire.rejection(3, wire.BAD_TOKEN)
    for cut in range(len(stream) + 1):
        reader = wire.AckReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == [(1, None), (2, None), (3, wire.BAD_TOKEN)]
    with pytest.raises(wire.FrameError, match="unexpected"):
        wire.AckReader().feed(b"\x99" + b"\0" * 8)


def test_greeting() -> None:
    challenge = wire.new_challenge()
    assert wire.parse_greeting(wire.greeting(challenge)) == challenge
    with pytest.raises(wire.FrameError, match="did not greet"):
        wire.parse_greeting(b"HTTP/1.0 400 Bad\r\n\r\n")


def test_fuzzed_frames_and_reports_are_all_handled_and_counted() -> None:
    """A bounded share of ``make fuzz`` (100,000 inputs): every input to the frame and report
    decoders is taken or rejected and counted, none escapes. It found that bad UTF-8 in a
    report's string raised UnicodeDecodeError past ``HeadState.ingest``; positive control:
    catch only ``msgspec.DecodeError`` there again."""
    from tests.tools import fuzz_wire

    counts, failures = fuzz_wire.fuzz(3000, seed=11)
    assert failures == []
    assert sum(counts.values()) == 3000
    outcomes = {key.split(" -> ")[1] for key in counts}
    assert {"taken", "bad token", "bad frame", "bad report", "replayed"} <= outcomes


def test_fuzzed_http_requests_are_all_answered_and_counted() -> None:
    """A bounded share of ``make fuzz``'s HTTP target: every request fed to the
    head's HTTP port, its clients' own, mutated, or with hostile lines and headers, is
    answered once with a status line or left incomplete, each refusal counted, and nothing
    reaches the port's catch-all. Positive control: ``length.isdigit()`` and ``int(length)``
    back in ``HttpConnection`` and the non-ASCII lengths escape as ValueError."""
    from tests.tools import fuzz_wire

    counts, failures = fuzz_wire.fuzz(2000, seed=12, target="http")
    assert failures == []
    assert sum(counts.values()) == 2000
    outcomes = {key.split(" -> ")[1] for key in counts}
    assert {"200", "401", "400 refused", "431 refused", "501 refused", "incomplete"} <= outcomes
