"""A head that misbehaves cannot hold a ``--head`` read past ``--timeout``, nor fill the
client's memory, nor make it say anything but one line and exit 2.

Every mode of tests/misbehaving_head.py against every command that reads a head: ``status``
(the fast path, agent/fast_status.py), ``status --json``, ``usage`` and ``fit`` (the CLI,
agent/client.py), all through the one transport (agent/head_request.py). The GCS read's
``--timeout`` includes the probe that names a wrong port (agent/peer.py ``Naming``).

Before (measured on 5cffc7d, ``--timeout 3``, under load): a body or headers dripped one
byte every 2 s: still running when killed at 45 s, both paths; ``Content-Length:
1000000000``: 966 MB peak RSS (the fast path allocated the claimed length); an endless
chunked body: 2.2 GB (fast path, handed to http.client) and 2.8 GB (``usage``) when killed at
15 s; a status code ``²00``: ``internal error: ValueError`` and exit 1 on the fast path;
``Content-Length: ¹²`` and a header line without a colon: taken (http.client read the body
to the close); the GCS read at an HTTP port: 2.5-2.6 s past ``--timeout`` (the probe ran
after the deadline). Positive control: give ``_Reader._recv`` the whole ``timeout_s`` per
``recv`` instead of ``deadline.bound``, and the drip cases run past the deadline.
"""

import asyncio
import contextlib
import http.server
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayscope import __main__ as entry
from rayscope import units
from rayscope.client import request as head_request
from rayscope.errors import AgentError
from rayscope.net import peer
from rayscope.net.deadline import Deadline
from rayscope.net.tls import NO_TLS
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import reader as gcs
from tests.conftest import base_env
from tests.misbehaving_head import MisbehavingHead
from tests.reliability_plugin import FaultRecord
from tests.support import fake_server
from tests.support.http_port import asyncio_serving
from tests.support.ports import refused_port

TIMEOUT_S = 3.0
SLACK_S = 0.5
"""What a read may take past its deadline: the last ``recv`` returning, the line printed."""
COMMANDS = {
    "status": ["status"],
    "status --json": ["status", "--json"],
    "usage": ["usage"],
    "fit": ["fit", "--gpu-memory-mb", "1024"],
}
LATE = "did not send its whole answer within --timeout 3 s"
SAID = {
    "drip-body": LATE,
    "drip-headers": LATE,
    "huge-length": "answered a Content-Length of 1,000,000,000 bytes, over the cap of 8 MiB",
    "endless-chunks": "answered a chunked body over the cap of 8 MiB",
    "bad-status": "answered a status code that is not a number (digits 0-9 only)",
    "digit-status": "answered a status code that is not a number (digits 0-9 only)",
    "digit-length": "answered a Content-Length that is not a number (digits 0-9 only)",
    "bad-header": "answered a header line that does not parse",
}
SMALL_CAP = 8 * units.MIB
"""The body cap in this process's runs: the rule, not the size, is under test (the real
cap's run is the fault test below, in its own process)."""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RAYSCOPE_HEAD",
        "RAYSCOPE_TOKEN_FILE",
        "RAYSCOPE_TLS_CERT",
        "RAYSCOPE_TLS_KEY",
        "RAYSCOPE_TLS_CA",
    ):
        monkeypatch.delenv(name, raising=False)


def run_entry(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """``rayscope ARGV`` in this process, as the console script runs it (fast path, then CLI)."""
    monkeypatch.setattr(sys, "argv", ["rayscope", *argv])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    captured = capsys.readouterr()
    return int(stopped.value.code or 0), captured.out, captured.err


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("mode", sorted(SAID))
def test_a_misbehaving_head_is_one_line_exit_2_within_the_timeout_and_the_cap(
    mode: str, command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_request, "MAX_BODY_BYTES", SMALL_CAP)
    closed = f"127.0.0.1:{refused_port()}"
    for warm in (["status"], ["usage"]):  # the imports of both paths, before measuring
        run_entry([*warm, "--head", closed], capsys, monkeypatch)
    with MisbehavingHead(mode) as head:
        argv = [*COMMANDS[command], "--head", head.url, "--timeout", f"{TIMEOUT_S:g}"]
        tracemalloc.start()
        started = time.monotonic()
        try:
            code, out, err = run_entry(argv, capsys, monkeypatch)
            took = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (code, out) == (2, ""), err
    assert err.startswith(f"rayscope: head agent at {head.url} {SAID[mode]}"), err
    assert err.count("\n") == 1, err
    assert took < TIMEOUT_S + SLACK_S, took
    assert peak < 3 * SMALL_CAP, peak  # never a claimed length: 1,000,000,000 would be 1 GB
    if mode.startswith("drip"):
        assert took >= TIMEOUT_S - SLACK_S  # the deadline ended it, not a parse


def test_a_well_behaved_answer_through_the_harness_reaches_the_decoder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness's own control: its ``ok`` answer is read whole and decoded (a document of
    another schema, said as such), so every refusal above is the transport's."""
    with MisbehavingHead("ok") as head:
        code, _, err = run_entry(["usage", "--head", head.url, "--timeout", "3"], capsys, monkeypatch)
    assert code == 2 and "serves document schema 1" in err, err


def test_a_body_is_read_as_it_comes_never_allocated_from_its_claimed_length() -> None:
    """A head that claims 200 MB (under the cap) and sends 10 bytes: the read holds what
    came, not what was claimed. Before: ``bytearray(length)`` at once."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    stop = threading.Event()

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 200000000\r\n\r\n0123456789")
            stop.wait(10)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    tracemalloc.start()
    try:
        with pytest.raises(AgentError, match="did not send its whole answer within --timeout 1 s"):
            head_request.get(f"http://127.0.0.1:{server.getsockname()[1]}", "/", b"", 1.0, NO_TLS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        stop.set()
        thread.join(5)
        server.close()
    assert peak < 2 * units.MIB, peak


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", 0), ("ff", 255), ("FF", 255), ("10000000", 2**28), ("ffffffffffffffff", 2**64 - 1)],
)
def test_parse_hex_count_takes_hex_digits(text: str, expected: int) -> None:
    assert units.parse_hex_count(text, "chunk size", maximum=2**64) == expected


@pytest.mark.parametrize("text", ["", "0x1", "-1", "+1", " 1", "1 ", "1_0", "٢", "²", "ｆ", "g", "1" * 17])
def test_parse_hex_count_refuses_everything_else_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="chunk size"):
        units.parse_hex_count(text, "chunk size")


def test_parse_hex_count_has_a_maximum() -> None:
    with pytest.raises(ValueError, match="over 255"):
        units.parse_hex_count("100", "chunk size", maximum=255)


def test_the_deadline_bounds_every_wait() -> None:
    deadline = Deadline(0.2)
    assert 0 < deadline.left() <= 0.2 and deadline.within(5.0) <= 0.2 and deadline.within(0.01) == 0.01
    time.sleep(0.25)
    assert deadline.expired() and deadline.left() == 0.0 and deadline.within(1.0) == 0.0
    with pytest.raises(TimeoutError), socket.socket() as sock:
        deadline.bound(sock)


# The GCS read: its --timeout includes the probe that names what answers -----------------


@contextlib.contextmanager
def http_port() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with fake_server.serving(server):
        yield int(server.server_address[1])


@contextlib.contextmanager
def tls_port(tmp_path: Path) -> Iterator[int]:
    """A TLS server that drops a plain request without a word (asyncio's, as a head's)."""
    from tests.support.pki import make_pki

    tmp_path.mkdir(parents=True, exist_ok=True)
    pki = make_pki(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki["head.pem"]), str(pki["head.key"]))
    with asyncio_serving(asyncio.Protocol, context) as port:
        yield port


@pytest.mark.fault
def test_the_gcs_reads_timeout_includes_the_probe_that_names_the_port(
    tmp_path: Path, fault: FaultRecord
) -> None:
    """``status --gcs`` at an HTTP or a TLS port: the port named, and the read over within
    its ``--timeout``. Before: named 2.3-2.6 s after it (the probe ran after the child's
    deadline: 0.5 s waiting for the peer to speak first, then its answer, then a TLS
    handshake). Positive control: probe in ``gcs_child._child_timeout`` as before
    (``peer.described`` after the deadline) and ``took`` is over by a second or more."""
    fault.expect(
        "`status --gcs` at an HTTP or a TLS port (no GCS), --timeout 1 and 3",
        "the port named (an HTTP server, a TLS server) and the read over within --timeout"
        " (before, 5cffc7d: named 2.3-2.6 s after it)",
    )
    if not gcs.ray_importable():
        pytest.fail("ray must be importable by the test interpreter for the GCS read")
    seen = []
    for kind in ("http", "tls"):
        for timeout_s in (1.0, 3.0):
            ports = http_port() if kind == "http" else tls_port(tmp_path / f"{kind}{timeout_s:g}")
            with ports as port:
                address = f"127.0.0.1:{port}"
                started = time.monotonic()
                with pytest.raises(gcs.GcsUnavailable) as caught:
                    gcs_child._run_child(address, timeout_s, sys.executable)
                took = time.monotonic() - started
            seen.append(f"{kind} --timeout {timeout_s:g}: {took:.2f} s")
            what = peer.WHAT[peer.HTTP if kind == "http" else peer.TLS]
            said = f"no GCS at {address}: it is {what}; Ray's GCS listens on 6379 by default"
            assert str(caught.value) == said
            assert took < timeout_s + 0.3, (kind, timeout_s, took)
    fault.observe("named within the timeout: " + ", ".join(seen))


def test_what_the_fast_path_hands_on_is_asked_again_within_the_same_timeout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older head that answers whole after 2 s, ``--timeout 3``: the fast path's answer
    (no ``X-Rayscope-*``) goes to the CLI, whose second request gets what is left of the
    same deadline and times out at 3 s. Without the carried deadline: a new 3 s for the
    second request, 4 s in all (and 6 s for an answer at 2.9 s). Positive control: drop
    ``head_request.carry`` in ``fast_status.answer_from_head``."""
    with MisbehavingHead("late-old") as head:
        started = time.monotonic()
        code, out, err = run_entry(["status", "--head", head.url, "--timeout", "3"], capsys, monkeypatch)
        took = time.monotonic() - started
        asked = head.connections
    assert (code, out, err) == (2, "", f"rayscope: head agent unreachable at {head.url} (timeout 3 s)\n")
    assert asked == 2 and took < TIMEOUT_S + SLACK_S, (asked, took)


def test_a_probe_never_waits_past_its_deadline() -> None:
    """A port that takes the connection and says nothing: the probe gives up at the
    deadline, whatever its own waits (0.5 s, then 1 s) would be."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        started = time.monotonic()
        assert peer.probe("127.0.0.1", silent.getsockname()[1], deadline=Deadline(0.3)) is None
        assert time.monotonic() - started < 0.45


def test_a_port_check_whose_probe_cannot_start_closes_its_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GCS read's port check hands its connection to a probe thread, which closes it;
    a thread that cannot start (the process at its thread limit, the head polling every
    interval) must not leave it open to the collector. Positive control: drop the ``try``
    around ``Thread.start`` in ``peer.Naming``."""

    def cannot_start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        port = listening.getsockname()[1]
        sock = socket.create_connection(("127.0.0.1", port), timeout=1)
        monkeypatch.setattr(threading.Thread, "start", cannot_start)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            peer.Naming(sock, "127.0.0.1", port, Deadline(1.0))
        monkeypatch.undo()
        closed = sock.fileno() == -1
        sock.close()
    assert closed


# The real cap, in a process of its own: the RELIABILITY.md row ---------------------------


MEASURE = """
import os, subprocess, sys, time
cap_s = float(sys.argv[1])
child = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL)
until = time.monotonic() + cap_s
while True:
    pid, status, usage = os.wait4(child.pid, os.WNOHANG if time.monotonic() < until else 0)
    if pid:
        break
    if time.monotonic() >= until:
        child.kill()
    time.sleep(0.02)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""
"""Runs a command and says its exit code and peak RSS (``ru_maxrss``). A process of its own
between the test and the command: a child's ``ru_maxrss`` starts at its parent's peak (the
memory it was forked or vforked from), which for pytest is far more than a client's."""


def _run_measured(argv: list[str], cap_s: float) -> tuple[int, float, float, str]:
    """(exit code, seconds, peak RSS in MiB, stderr) of ``python -m rayscope ARGV``, killed
    after ``cap_s``."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(cap_s), sys.executable, "-m", "rayscope", *argv],
        env=base_env(RAY_AUTH_MODE="disabled"),
        capture_output=True,
        text=True,
        timeout=cap_s + 30,
        check=True,
    )
    took = time.monotonic() - started
    code, maxrss_kib = done.stdout.split()
    return int(code), took, int(maxrss_kib) / 1024, done.stderr


@pytest.mark.fault
def test_a_hostile_head_costs_a_client_one_timeout_and_bounded_memory(fault: FaultRecord) -> None:
    fault.expect(
        "a head that drips its body or headers (a byte every 2 s), claims Content-Length 1000000000,"
        " or sends an endless chunked body; `status` and `usage` with --head --timeout 3",
        "exit 2 and one line within --timeout (+ the interpreter's start); peak RSS under the"
        " 256 MiB body cap + 64 MiB (before, 5cffc7d: the drips still ran when killed at 45 s;"
        " 966 MB for the claimed length; 2.2 and 2.8 GB for the endless body, killed at 15 s)",
    )
    seen = []
    for mode in ("drip-body", "drip-headers", "huge-length", "endless-chunks"):
        for command in ("status", "usage"):
            with MisbehavingHead(mode) as head:
                code, took, rss_mb, err = _run_measured([command, "--head", head.url, "--timeout", "3"], 30)
            seen.append(f"{mode} {command}: exit {code} in {took:.1f} s, {rss_mb:.0f} MiB")
            assert code == 2 and err.count("\n") == 1, err
            assert took < TIMEOUT_S + 3.0, (mode, command, took)  # the interpreter's start, under load
            assert rss_mb < 256 + 64, (mode, command, rss_mb)
    fault.observe("; ".join(seen))
