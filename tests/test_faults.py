"""Faults the head and the rollup must tell the truth about, without a cluster:
an old scheduler view, hosts without a raylet, a lost GPU, a dead GCS poller, one
completeness rule. The live versions are in test_live_faults.py.
"""

import logging
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

import msgspec
import pytest

from rayscope.core import completeness
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.head.poll.poller import PollerGuard
from rayscope.head.store.state import HeadState
from rayscope.render.metrics import metrics_text
from rayscope.render.status import status_lines
from rayscope.schema.report import GpuDevice, HostInfo, NodeReport, SourceStatus
from rayscope.schema.status import ClusterStatus, RayNode, ReceivedReport
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import prestart as gcs_prestart
from rayscope.sources.gcs import reader as gcs
from tests.scenarios import CPU, NOW, SEED_REPORTS, SEED_VIEWS, T4, UNKNOWN, gpu, mixed_status, report
from tests.support import http_port
from tests.support.ports import refused_port
from tests.waiting import eventually

GCS_DOWN = SourceStatus(name="gcs", ok=False, reason="GCS unreachable at 127.0.0.1:6379 (connection refused)")


def old_view_status(read_s_ago: float) -> ClusterStatus:
    """The head's answer when its last good GCS read was ``read_s_ago`` seconds ago (interval
    5 s: stale past 15 s) and the latest read failed."""
    return merge(
        scheduler_nodes(SEED_VIEWS),
        SEED_REPORTS,
        now=NOW,
        stale_after_s=15.0,
        view="head",
        sources=[GCS_DOWN],
        scheduler_read_at=NOW - read_s_ago,
    )


def test_an_old_scheduler_view_is_partial_and_says_how_old() -> None:
    """Positive control: drop ``scheduler_stale`` from ``rollup.scheduler_view`` and the
    head serves a 60 s old view with exit 0, as it did before (every node "alive")."""
    status = old_view_status(60.0)
    assert status.scheduler_age_s == 60.0 and status.scheduler_stale
    code, note = completeness.assess(status)
    assert code == 1
    assert note == (
        "partial: the scheduler view is 60s old (GCS unreachable at 127.0.0.1:6379 (connection refused)):"
        " nodes, liveness and bookings are as of then"
    )
    lines = status_lines(status)
    assert (
        "SCHEDULER VIEW: 60s old (the GCS stopped answering): nodes, liveness and bookings are as of then"
        in lines
    )
    node_lines = [line for line in lines if line.startswith("  ")]
    assert node_lines and all("scheduler view 60s old" in line for line in node_lines)
    text = metrics_text(status)
    assert "rayscope_scheduler_view_age_seconds 60" in text
    assert "rayscope_scheduler_view_stale 1" in text
    assert msgspec.json.decode(msgspec.json.encode(status))["scheduler_age_s"] == 60.0


def test_a_view_younger_than_three_intervals_is_complete() -> None:
    """One failed read is not yet an old view: 10 s < 15 s; nothing marked, exit 0."""
    status = old_view_status(10.0)
    assert not status.scheduler_stale
    assert completeness.assess(status) == (0, None)
    assert not any("scheduler view" in line for line in status_lines(status))
    assert "rayscope_scheduler_view_stale 0" in metrics_text(status)


def test_no_view_at_all_says_only_agents_are_shown() -> None:
    """Never read: the message that used to be printed for an old view is true here."""
    status = merge(
        scheduler_nodes([]), SEED_REPORTS, now=NOW, stale_after_s=15.0, view="head", sources=[GCS_DOWN]
    )
    assert status.scheduler_age_s is None
    code, note = completeness.assess(status)
    assert code == 1 and note is not None and note.endswith("only the agents' reports are shown")
    assert "\nrayscope_scheduler_view_age_seconds " not in metrics_text(status)


def test_exit_code_and_message_agree_on_a_gone_nodes_stale_report() -> None:
    """A stale report of a node the scheduler does not know: exit 0 and no "partial" note.
    Before: exit 0 but stderr said "partial: stale report from 1 node(s)"."""
    status = mixed_status()
    ghost = msgspec.structs.replace(status.nodes[UNKNOWN], stale=True, agent="stale", report_age_s=60.0)
    fresh_t4 = msgspec.structs.replace(status.nodes[T4], stale=False, agent="reporting")
    status = msgspec.structs.replace(status, nodes={**status.nodes, T4: fresh_t4, UNKNOWN: ghost})
    assert completeness.assess(status) == (0, None)


@pytest.mark.parametrize("read_s_ago", [None, 1.0, 60.0])
@pytest.mark.parametrize("stale_t4", [False, True])
def test_the_note_is_set_exactly_when_the_code_is_not_zero(
    read_s_ago: Optional[float], stale_t4: bool
) -> None:
    """One rule: code 0 ⇔ no note; a note starts with the word its code means."""
    reports = dict(SEED_REPORTS)
    if stale_t4:
        reports[T4] = report(T4, [gpu(0, 1.0, "Tesla T4")], "10.0.0.5", age_s=42.0)
    sources = [GCS_DOWN if read_s_ago != 1.0 else SourceStatus(name="gcs", ok=True)]
    read_at = None if read_s_ago is None else NOW - read_s_ago
    status = merge(
        scheduler_nodes(SEED_VIEWS) if read_at else {}, reports, now=NOW, stale_after_s=15.0, view="head",
        sources=sources, scheduler_read_at=read_at,
    )  # fmt: skip
    code, note = completeness.assess(status)
    assert (code == 0) == (note is None)
    if note is not None:
        assert note.startswith({1: "partial: ", 2: "no data: "}[code])
    assert code == (1 if stale_t4 or read_s_ago != 1.0 else 0)


def host_report(hostname: str) -> NodeReport:
    """A node agent on a host without a raylet (a login node): no node id."""
    return NodeReport(node_id="", collected_at=NOW, host=HostInfo(hostname=hostname), gpus=[gpu(0, 1.0)])


def test_hosts_without_a_raylet_each_get_their_own_entry() -> None:
    """Before: both collapsed into one node keyed ``""`` (the last one won), and
    ``status --gpus`` raised KeyError in the head (exit 2 on the client)."""
    state = HeadState(interval_s=1.0, gcs_address=None)
    encoder = msgspec.msgpack.Encoder()
    for name in ("login-a", "login-b"):
        state.ingest(encoder.encode(host_report(name)), time.time())
    for gpus in (False, True):
        status = state.status(time.time(), gpus=gpus)
        assert sorted(status.nodes) == ["host:login-a", "host:login-b"]
        assert {n.hostname for n in status.nodes.values()} == {"login-a", "login-b"}
        assert all(n.node_id == key for key, n in status.nodes.items())
        assert all(n.total_gpu_memory_bytes == gpu(0, 1.0).memory_total_bytes for n in status.nodes.values())
    text = metrics_text(state.status(time.time()))
    assert 'node_id="host:login-a"' in text and 'node_id="host:login-b"' in text


def test_a_lost_gpu_makes_its_nodes_total_unknown_not_smaller() -> None:
    """Positive control: sum only the GPUs with memory (the old ``measured_memory``) and the
    node shows one RTX 3090's total as if the lost one were not there."""
    lost = GpuDevice(index=1, errors={"device": "GPU is lost"})
    status = merge(
        scheduler_nodes(SEED_VIEWS),
        {T4: ReceivedReport(report=msgspec.structs.replace(SEED_REPORTS[T4].report, gpus=[gpu(0, 1.0), lost]),
                            received_at=NOW)},
        now=NOW, stale_after_s=15.0, view="head", sources=[SourceStatus(name="gcs", ok=True)],
    )  # fmt: skip
    node = status.nodes[T4]
    assert node.total_gpu_memory_bytes is None and node.used_gpu_memory_bytes is None
    assert (node.total_gpu_memory, node.used_gpu_memory) == ("NA", "NA")
    assert node.gpus_unmeasured == 1
    line = next(line for line in status_lines(status) if "10.0.0.5" in line)
    assert "VRAM: NA/NA GB" in line and "1 GPU(s) not measured" in line
    assert status.cluster.gpu_nodes_measured == 0


def test_a_cpu_node_nobody_measured_is_null_not_zero() -> None:
    """The scheduler gives the node no GPU and no agent reports it: unknown, not 0 bytes, in
    rayscope's keys (BioEngine's say 0 on a node without GPU, whoever measured it)."""
    status = merge(scheduler_nodes(SEED_VIEWS), {}, now=NOW, stale_after_s=15.0, view="head", sources=[])
    assert status.nodes[CPU].total_gpu_memory_bytes is None
    assert status.nodes[CPU].used_gpu_memory_bytes is None
    measured = merge(
        scheduler_nodes(SEED_VIEWS), {CPU: SEED_REPORTS[CPU]}, now=NOW, stale_after_s=15.0, view="head"
    )
    assert measured.nodes[CPU].total_gpu_memory_bytes == 0  # NVML answered: no GPU there


class FailingReader:
    """A GCS reader whose reads raise: first a bug, then a thread-killing BaseException."""

    def __init__(self, raises: BaseException) -> None:
        self.raises = raises
        self.calls = 0

    def read(self) -> tuple[list[RayNode], SourceStatus]:
        self.calls += 1
        raise self.raises


def _guarded_poller(
    failure: BaseException,
) -> tuple[HeadState, "FailingReader", threading.Event, PollerGuard]:
    """A started poller whose every GCS read raises ``failure`` (set the event to stop it)."""
    state = HeadState(interval_s=0.05, gcs_address=f"127.0.0.1:{refused_port()}")
    reader = FailingReader(failure)
    stop = threading.Event()
    guard = PollerGuard(state, reader, stop)  # type: ignore[arg-type]
    guard.start()
    return state, reader, stop, guard


def test_a_round_that_raises_is_counted_and_the_poller_goes_on() -> None:
    state, reader, stop, _ = _guarded_poller(RuntimeError("bug in a GCS answer"))
    try:
        eventually(lambda: reader.calls >= 3, what="three GCS rounds", every_s=0.02)
        poller = state.health(time.time())["gcs_poller"]
        assert poller["alive"] and poller["errors"] >= 2 and poller["restarts"] == 0
        assert poller["last_error"] == "RuntimeError: bug in a GCS answer"
    finally:
        stop.set()


def test_a_dead_poller_is_restarted_and_healthz_says_so() -> None:
    """Positive control: make ``PollerGuard.check`` a no-op and ``alive`` stays false,
    ``restarts`` 0 — the old head served its last view for good."""
    state, reader, stop, guard = _guarded_poller(SystemExit("killed from inside a library"))
    try:
        eventually(
            lambda: not state.health(time.time())["gcs_poller"]["alive"], what="the poller dead", every_s=0.02
        )
        dead = state.health(time.time())["gcs_poller"]
        assert not dead["ok"] and dead["last_error"].startswith("poller died: SystemExit")
        assert guard.check()
        eventually(lambda: reader.calls >= 2, what="rounds after the restart", every_s=0.02)
        assert state.health(time.time())["gcs_poller"]["restarts"] == 1
    finally:
        stop.set()


def test_the_view_heals_when_the_gcs_answers_again() -> None:
    state = HeadState(interval_s=1.0, gcs_address="x:1")
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=NOW - 60)
    state.set_view([], GCS_DOWN, read_at=NOW - 1)
    assert state.status(NOW).scheduler_stale
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=NOW - 0.5)
    healed = state.status(NOW)
    assert healed.scheduler_age_s == 0.5 and not healed.scheduler_stale


def test_the_port_check_and_the_child_share_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port check that takes 0.3 s of a 0.5 s deadline leaves the child the rest, not 0.5 s
    again. Before: ``subprocess.run(timeout=timeout_s)`` after a full check."""
    seen: dict[str, float] = {}

    def slow_check(address: str, timeout_s: float, deadline: object = None) -> None:
        time.sleep(0.3)

    def fake_finish(child: object, words: object, timeout_s: float, on_line: object = None) -> object:
        seen["timeout"] = timeout_s
        raise subprocess.TimeoutExpired(["python3"], timeout_s)

    monkeypatch.setattr(gcs, "check_port", slow_check)  # gcs_child calls it through gcs
    monkeypatch.setattr(gcs_prestart, "spawn", lambda *args: None)
    monkeypatch.setattr(gcs_prestart, "finish", fake_finish)  # the one wait on every GCS child
    with pytest.raises(gcs.GcsUnavailable, match=r"timeout 0\.5 s"):
        gcs_child._run_child(f"127.0.0.1:{refused_port()}", 0.5, "python3")
    assert seen["timeout"] <= 0.21


def _child_error(tmp_path: Path, shell: str, timeout_s: float) -> tuple[str, str]:
    """(address, message) of the GCS read run by a fake interpreter (a ``sh`` script) against
    a port that takes the connection, so the port check passes."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{shell}\n")
    fake.chmod(0o755)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(gcs.GcsUnavailable) as caught:
            gcs_child._run_child(address, timeout_s, str(fake))
    return address, str(caught.value)


@pytest.mark.parametrize("imported", [False, True], ids=["still importing ray", "GCS silent"])
def test_a_child_past_its_deadline_says_whether_it_had_imported_ray(tmp_path: Path, imported: bool) -> None:
    """On a loaded host ``import ray`` alone can outlast the 5 s deadline; the error said
    "GCS unreachable" either way, sending the operator after a healthy GCS. The child now
    says when ray is imported; the parent reads that from the killed child's stderr."""
    from rayscope.sources.gcs import read as gcs_read

    marker = f"echo '{gcs_read.IMPORTED}' >&2; " if imported else ""
    started = time.monotonic()
    address, message = _child_error(tmp_path, f"{marker}exec sleep 30", 1.0)
    assert time.monotonic() - started < 10
    assert "timeout 1 s" in message
    if imported:
        assert message == f"GCS unreachable at {address} (timeout 1 s)"
    else:
        assert "still importing ray" in message and "raise --timeout" in message


def test_a_child_that_dies_after_importing_ray_names_its_own_last_words(tmp_path: Path) -> None:
    """The import marker is rayscope's, not the child's error: a child that crashes after it
    is reported by its exit code or its own last stderr line, never "ray imported"."""
    from rayscope.sources.gcs import read as gcs_read

    _, message = _child_error(tmp_path, f"echo '{gcs_read.IMPORTED}' >&2; exit 3", 5.0)
    assert message == f"GCS read under {tmp_path / 'python'} failed: exit code 3"


class BrokenState(HeadState):
    """A head state whose rollup raises (a bug in one answer)."""

    def status(self, now: float, gpus: bool = False, wall_now: Optional[float] = None) -> ClusterStatus:
        raise KeyError("host:login-a")


def test_a_bug_in_one_answer_is_an_http_500_and_the_head_keeps_serving() -> None:
    """Before: the handler thread died and the client read "remote end closed connection"
    (``status --head --gpus`` exit 2); now the client gets a status line and a reason."""
    import http.client

    from rayscope.head.serve.http import HttpPort
    from rayscope.head.serve.routes import Routes
    from rayscope.sinks.logs import LogThrottle

    state = BrokenState(interval_s=1.0, gcs_address=None)
    throttle = LogThrottle(logging.getLogger("rayscope.head"))
    port = HttpPort(Routes(state, (), throttle), throttle)
    with http_port.serving(port) as http_port_number:
        for path in ("/v1/status?gpus=1", "/healthz"):
            connection = http.client.HTTPConnection("127.0.0.1", http_port_number, timeout=10)
            connection.request("GET", path)
            response = connection.getresponse()
            assert response.status == (500 if path.startswith("/v1") else 200)
            response.read()
            connection.close()


def test_a_head_that_fails_once_listening_closes_both_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ends ``Head.serve`` once both ports listen (here: the GCS poller's thread
    cannot start) closes both at once, not left listening to the collector (an unclosed
    socket's ResourceWarning, later, wherever it was collected): a second head binds them.
    Positive control: drop the ``finally`` in ``Head.serve`` and the bind fails (in use)."""
    import asyncio

    from rayscope.head import daemon

    def cannot_start(self: PollerGuard, restarted: bool = False) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(PollerGuard, "start", cannot_start)
    head = daemon.Head(("127.0.0.1", 0), ("127.0.0.1", 0), None, 1.0, b"")
    with pytest.raises(RuntimeError, match="can't start new thread"):
        asyncio.run(head.serve())
    assert 0 not in (head.listen[1], head.http[1])  # the ports the OS gave, both bound
    for address in (head.listen, head.http):
        with socket.socket() as again:
            again.bind(address)  # EADDRINUSE while the failed head's port still listens


def test_a_bug_in_reading_a_request_is_a_400_and_one_throttled_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As a property of the port and not of each parser: whatever raises
    while a request is read (here the length check itself) answers 400 and writes one
    throttled line, never asyncio's traceback. Positive control: drop the ``try`` in
    ``HttpConnection.data_received`` and each request logs a 10-line traceback, no answer."""

    from rayscope.head.serve import http
    from rayscope.head.serve.routes import Routes
    from rayscope.sinks.logs import LogThrottle

    def broken(parsed: object) -> int:
        raise ValueError("a bug")

    monkeypatch.setattr(http, "body_length", broken)
    state = HeadState(interval_s=1.0, gcs_address=None)
    throttle = LogThrottle(logging.getLogger("rayscope.head"))
    port = http.HttpPort(Routes(state, (), throttle), throttle)
    with http_port.serving(port) as http_port_number:
        caplog.set_level(logging.DEBUG)  # after the loop's own "Using selector" line
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", http_port_number), timeout=5) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
                assert s.recv(65536).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "could not be read (ValueError)" in lines[0], lines
    assert port.counters.bad_requests == 50
