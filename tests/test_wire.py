"""Frames, Structs on the wire, and a head that survives whatever a peer sends it."""

import contextlib
import socket
import struct
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import wire
from agent.head import HeadState, ReportError
from agent.model import (
    SCHEMA_VERSION,
    ClusterStatus,
    NodeDiagnostics,
    NodeReport,
    RayletInfo,
    RayNode,
    SourceStatus,
)
from tests.scenarios import SEED_REPORTS, mixed_status, seed_node_diagnostics

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
    frame = wire.seal(b"payload", TOKEN)
    length = wire.body_length(frame[:4])
    assert length == len(frame) - 4
    assert wire.open_body(frame[4:], TOKEN) == b"payload"


def test_wrong_token_is_a_bad_mac() -> None:
    frame = wire.seal(b"payload", TOKEN)
    with pytest.raises(wire.FrameError, match="bad MAC"):
        wire.open_body(frame[4:], b"another token")


def test_oversized_header_is_refused_before_the_body() -> None:
    with pytest.raises(wire.FrameError, match="exceeds"):
        wire.body_length(struct.pack(">I", wire.MAX_FRAME_BYTES + 1))
    with pytest.raises(wire.FrameError, match="shorter than its MAC"):
        wire.body_length(struct.pack(">I", 3))


def test_newer_schema_is_rejected() -> None:
    state = HeadState(5.0, None)
    newer = msgspec.structs.replace(a_report(), schema=SCHEMA_VERSION + 1)
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


def test_head_forgets_nothing_without_a_scheduler_view() -> None:
    state = HeadState(1.0, None)
    state.ingest(msgspec.msgpack.encode(a_report()), received_at=100.0)
    assert state.forget_gone(now=1000.0) == []


def test_token_file(tmp_path: Path) -> None:
    (tmp_path / "t").write_text(" secret \n")
    assert wire.read_token(str(tmp_path / "t")) == b"secret"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        wire.read_token(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="cannot read"):
        wire.read_token(str(tmp_path / "missing"))
    assert wire.read_token(None) == b""


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
    body = wire.seal(payload, token)[wire.LENGTH.size :]
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
    good = wire.seal(msgspec.msgpack.encode(a_report()), TOKEN)
    return st.one_of(
        st.binary(max_size=512),  # garbage
        st.integers(min_value=1, max_value=len(good) - 1).map(lambda n: good[:n]),  # truncated
        st.just(struct.pack(">I", wire.MAX_FRAME_BYTES + 1) + b"x" * 64),  # oversized
        st.just(wire.seal(msgspec.msgpack.encode(a_report()), b"wrong token")),  # wrong MAC
        st.binary(max_size=256).map(lambda b: wire.seal(b, TOKEN)),  # authentic garbage
    )


@pytest.mark.live
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=_frames())
def test_hostile_frames_do_not_kill_the_head(head_daemon: Any, frame: bytes) -> None:
    _send(head_daemon.listen_port, frame)
    assert head_daemon.process.poll() is None
    code, body = head_daemon.get("/healthz")
    assert code == 200 and msgspec.json.decode(body)["ok"] is True


@pytest.mark.live
def test_after_hostile_frames_a_good_report_is_still_taken(head_daemon: Any) -> None:
    """Sets up its own hostile frames: it must not lean on the test above having run."""
    _send(head_daemon.listen_port, wire.seal(msgspec.msgpack.encode(a_report()), b"wrong token"))
    _send(head_daemon.listen_port, b"\x00\x00\x00\x40" + b"x" * 10)
    report = msgspec.structs.replace(a_report(), node_id="f00d" * 14)
    with socket.create_connection(("127.0.0.1", head_daemon.listen_port), timeout=5) as s:
        s.sendall(wire.seal(msgspec.msgpack.encode(report), TOKEN))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            _, body = head_daemon.get("/v1/status?all=1")
            if "f00d" * 14 in msgspec.json.decode(body)["nodes"]:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the head never showed the good report")
    assert "rejected frame" in head_daemon.log_text() or "truncated frame" in head_daemon.log_text()
    health = msgspec.json.decode(head_daemon.get("/healthz")[1])
    assert health["frames_rejected"] > 0 and health["reports_received"] >= 1
