"""A callback of the head's asyncio protocols that raises (``MemoryError`` above all, as
under ``ulimit -v``) closes that connection, is logged once per kind per 10 s, never as a
traceback, and the head serves every other connection; a ``MemoryError`` the head cannot
put on a connection stops it with one line and exit 70.

Before: asyncio logged a traceback for every frame (``Fatal error: protocol.data_received()
call failed``), a ``connection_made`` that raised left its connection open, and the head
under a memory limit died with exit 127 and no line."""

import asyncio
import contextlib
import logging
import resource
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rayscope.head.serve import http as http_port
from rayscope.head.serve.callbacks import loop_exception_handler
from rayscope.head.serve.http import HttpPort
from rayscope.head.serve.routes import Routes
from rayscope.head.store.state import HeadState
from rayscope.net import wire
from rayscope.sinks.logs import THROTTLE_S, LogThrottle
from tests.conftest import REPO, base_env
from tests.scenarios import SEED_REPORTS
from tests.support.head import Head as HeadProcess
from tests.support.ports import HEAD_ON_PORT_0, refused_port
from tests.support.report_port import Agent, Port, received
from tests.waiting import eventually

CONNECTIONS = 30


def a_payload() -> bytes:
    return msgspec.msgpack.encode(SEED_REPORTS[next(iter(SEED_REPORTS))].report)


def out_of_memory(*_: Any) -> Any:
    raise MemoryError


def ended(s: socket.socket) -> bytes:
    """What the head sent on ``s`` before it closed it (``b"<open>"``: it did not close)."""
    s.setblocking(True)
    s.settimeout(2)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        return b"<open>"
    return data


def head_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("rayscope") or r.name == "asyncio"]


class Undecodable:
    def decode(self, payload: bytes) -> Any:
        raise MemoryError


@pytest.mark.parametrize("where", ["opener", "decoder"])
def test_a_memory_error_on_the_report_port_closes_that_connection_and_is_one_line(
    where: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before (opener): 30 tracebacks, one per frame. Before (decoder): the agent was told
    its report was bad (``rejected frame (bad report)``): the head's memory is not the report's."""
    port = Port(max_unauth_per_host=2 * CONNECTIONS, throttle_s=THROTTLE_S)
    try:
        if where == "opener":
            monkeypatch.setattr(wire.Opener, "open_body", out_of_memory)
        else:
            monkeypatch.setattr(port.state, "_decoder", Undecodable())
        caplog.set_level(logging.INFO)
        agents = [Agent(port) for _ in range(CONNECTIONS)]
        for agent in agents:
            agent.sock.send(agent.sealer.seal(a_payload()))
            port.run(0.01)
        port.run(0.2)
        left = [ended(agent.sock) for agent in agents]
        assert left == [b""] * CONNECTIONS  # each closed, no ack and no rejection sent
        lines = [r for r in head_lines(caplog) if r.levelno >= logging.WARNING]
        assert [r.exc_info for r in lines] == [None], [r.getMessage() for r in lines]
        assert "MemoryError in data_received" in lines[0].getMessage(), lines[0].getMessage()
        assert port.errors.as_dict() == {
            "protocol_errors": CONNECTIONS,
            "protocol_errors_MemoryError": CONNECTIONS,
        }
        monkeypatch.undo()
        good = Agent(port)
        assert good.send(a_payload()) == [(1, None)] and port.state.reports_received == 1
    finally:
        port.close()


class HttpServer:
    """The head's HTTP port (its real protocol, routes and loop handler) in this process."""

    def __init__(self) -> None:
        self.state = HeadState(1.0, None)
        self.throttle = LogThrottle(logging.getLogger("rayscope.head"), THROTTLE_S)
        self.port = HttpPort(Routes(self.state, (), self.throttle), self.throttle)
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(loop_exception_handler(self.throttle))
        self.server = self.loop.run_until_complete(
            self.loop.create_server(self.port.connection, "127.0.0.1", 0)
        )
        self.address = self.server.sockets[0].getsockname()[:2]

    def ask(self) -> socket.socket:
        s = socket.create_connection(self.address)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.setblocking(False)
        return s

    def run(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def close(self) -> None:
        self.server.close()
        self.loop.run_until_complete(self.server.wait_closed())
        self.port.close()
        self.loop.close()


@pytest.mark.parametrize("callback", ["connection_made", "data_received"])
def test_a_memory_error_on_the_http_port_closes_that_connection_and_is_one_line(
    callback: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before (connection_made): 30 tracebacks, and every connection left open past the
    request deadline. Before (data_received): a 400, the client's fault."""
    server = HttpServer()
    try:
        if callback == "connection_made":
            monkeypatch.setattr(HttpPort, "admit", out_of_memory)
        else:
            monkeypatch.setattr(http_port.HttpConnection, "_take", out_of_memory)
        caplog.set_level(logging.INFO)
        clients = [server.ask() for _ in range(CONNECTIONS)]
        server.run(0.3)
        left = [ended(c) for c in clients]
        for c in clients:
            c.close()
        assert left == [b""] * CONNECTIONS
        lines = [r for r in head_lines(caplog) if r.levelno >= logging.WARNING]
        assert [r.exc_info for r in lines] == [None], [r.getMessage() for r in lines]
        assert f"MemoryError in {callback}" in lines[0].getMessage()
        assert server.port.errors.as_dict()["protocol_errors_MemoryError"] == CONNECTIONS
        monkeypatch.undo()
        again = server.ask()
        server.run(0.3)
        assert received(again).startswith(b"HTTP/1.1 200")
        again.close()
    finally:
        server.close()


def test_the_loop_handler_says_each_kind_once_and_a_memory_error_outside_a_connection_is_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttle = LogThrottle(logging.getLogger("rayscope.head"), THROTTLE_S)
    fatal: list[str] = []
    handle = loop_exception_handler(throttle, fatal.append)
    loop = asyncio.new_event_loop()
    try:
        caplog.set_level(logging.INFO)
        for _ in range(50):
            handle(loop, {"message": "Exception in callback tick()", "exception": RuntimeError("bug")})
            handle(
                loop,
                {"message": "Fatal error on transport", "exception": MemoryError(), "transport": object()},
            )
        assert fatal == []
        lines = [r.getMessage() for r in head_lines(caplog)]
        assert len(lines) == 2 and all(r.exc_info is None for r in head_lines(caplog)), lines
        handle(loop, {"message": "Exception in callback tick()", "exception": MemoryError()})
        assert fatal == ["MemoryError in the event loop (Exception in callback tick())"]
    finally:
        loop.close()


HEAD_OUT_OF_MEMORY = """
import sys
from rayscope.head import daemon
from rayscope.head.poll.poller import PollerGuard

def out_of_memory(self, restarted=False):
    raise MemoryError  # in the event loop's tick, outside any connection: the head cannot go on

PollerGuard.check = out_of_memory
from rayscope.__main__ import main
sys.argv = ["rayscope", *sys.argv[1:]]
main()
"""


@pytest.mark.fault
def test_a_head_that_cannot_go_on_exits_70_with_one_line(fault: Any) -> None:
    """The head process, its poller's guard raising ``MemoryError`` in the event loop's
    tick (after one interval): it stops, and says so in one line, exit 70. Injected: a real
    memory limit does not choose where its ``MemoryError`` falls. Before: one asyncio
    traceback, and the head ran on with its poller unguarded (killed at 20 s)."""
    fault.expect(
        "MemoryError in the head's event loop outside any connection (injected into the tick that"
        " restarts the poller; before: one traceback, the head ran on without that tick)",
        "the head stops: one line on stderr, no traceback, exit 70",
    )
    args = ["head", *HEAD_ON_PORT_0, "--gcs", f"127.0.0.1:{refused_port()}"]
    args += ["--interval", "0.2", "--dashboard", "none"]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HEAD_OUT_OF_MEMORY), *args],
        check=False,
        cwd=REPO,
        env=base_env(RAY_AUTH_MODE="disabled"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = [line for line in done.stderr.splitlines() if line.startswith("rayscope:")]
    assert done.returncode == 70, done.stderr
    assert len(said) == 1, done.stderr
    assert said[0].startswith("rayscope: the head cannot go on: MemoryError in the event loop"), said
    assert said[0].endswith("; stopped") and "Traceback" not in done.stderr, done.stderr
    fault.observe(f"exit {done.returncode}: {said[0].split(' (', 1)[0]} (...); stopped; no traceback")


def vm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


@pytest.mark.fault
def test_a_head_out_of_memory_closes_connections_logs_one_line_and_serves_on(
    tmp_path: Any, wire_token: Any, fault: Any
) -> None:
    """A real head whose address space is capped 96 MiB above what it holds (``prlimit``,
    as ``ulimit -v`` would), flooded by 300 agents that each send all but the end of a
    1 MiB frame. Before (the same flood, the head started under a 400 MiB limit): 2,020 log
    lines with 235 tracebacks in 2 s."""
    fault.expect(
        "the head under an address-space limit (RLIMIT_AS 96 MiB above its size), 300 agents each"
        " holding a 1 MiB frame open (before, the same flood under a 400 MiB limit: 2,020 log lines"
        " with 235 asyncio tracebacks in 2 s, /healthz silent)",
        "connections it cannot hold are closed, one log line per kind per 10 s and no traceback;"
        " /healthz counts them, and the head takes the next report",
    )
    head = HeadProcess(tmp_path / "head.log", wire_token, 1.0, ("--dashboard", "none"))
    flood: list[socket.socket] = []
    try:
        size = vm_bytes(head.process.pid)
        cap = size + (96 << 20)
        resource.prlimit(head.process.pid, resource.RLIMIT_AS, (cap, cap))
        token = wire_token.read_text().strip().encode()
        payload = b"x" * (wire.MAX_PAYLOAD_BYTES - 64)
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", head.listen_port), timeout=5)
            flood.append(s)
            sealer = wire.Sealer(token, wire.parse_greeting(s.recv(4096)))
            with contextlib.suppress(OSError):  # closed by the head already
                s.sendall(sealer.seal(payload)[:-16])
        time.sleep(1.0)
        for s in flood:
            s.close()
        health = eventually(
            lambda: head.health() if head.health().get("protocol_errors") else None, 10, "counted"
        )
        log = head.log_text()
        memory_lines = [line for line in log.splitlines() if "MemoryError" in line]
        assert 1 <= len(memory_lines) <= 3 and "Traceback" not in log, log[-3000:]
        good = socket.create_connection(("127.0.0.1", head.listen_port), timeout=5)
        with good:
            sealer = wire.Sealer(token, wire.parse_greeting(good.recv(4096)))
            good.sendall(sealer.seal(a_payload()))
            assert wire.AckReader().feed(good.recv(4096)) == [(1, None)]
        assert head.process.poll() is None
        fault.observe(
            f"{health['protocol_errors']} connections closed for MemoryError, {len(memory_lines)} log"
            f" line(s) naming it, 0 tracebacks; the next report acked (VmSize {size >> 20} MiB, cap"
            f" {cap >> 20} MiB)"
        )
    finally:
        for s in flood:
            s.close()
        head.stop()
