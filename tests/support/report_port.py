"""The head's report port in this process (its real protocol and connection guard) on loopback,
and a node agent's connection to it, sealing frames as ``rayscope push`` does."""

import asyncio
import logging
import socket
from typing import Any

import msgspec

from rayscope.head.access.admission import ConnectionGuard
from rayscope.head.serve import ingest
from rayscope.head.serve.callbacks import ProtocolErrors, loop_exception_handler
from rayscope.head.store.state import HeadState
from rayscope.net import wire
from rayscope.schema.report import NodeReport
from rayscope.sinks.logs import LogThrottle

TOKEN = b"0123456789abcdef0123456789abcdef"


class Port:
    """An in-process report port (the head's real protocol and guard) on a loopback port."""

    def __init__(self, max_total: int = 100, max_unauth_per_host: int = 10, throttle_s: float = 60) -> None:
        """``throttle_s``: the log throttle's window (the head's is 10 s)."""
        self.state = HeadState(1.0, None)
        self.throttle = LogThrottle(logging.getLogger("rayscope.head"), interval_s=throttle_s)
        self.guard = ConnectionGuard(max_total, max_unauth_per_host, self.throttle, self.state.count_rejected)
        self.errors = ProtocolErrors()
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(loop_exception_handler(self.throttle))  # as the head's
        self.server = self.loop.run_until_complete(
            self.loop.create_server(
                lambda: ingest.ReportProtocol(self.state, TOKEN, 60.0, self.guard, self.errors),
                "127.0.0.1",
                0,
            )
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.clients: list[socket.socket] = []

    def run(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.run(0.05)
        self.server.close()
        self.loop.run_until_complete(self.server.wait_closed())
        self.loop.close()


def connect(port: Port, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    port.clients.append(s)
    s.bind((source, 0))
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port.port))
    port.run(0.05)
    return s


def received(s: socket.socket) -> bytes:
    try:
        return s.recv(65536)
    except BlockingIOError:
        return b"<nothing>"


def closed_by_head(s: socket.socket) -> bool:
    while True:
        try:
            if not s.recv(65536):
                return True
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True


class Agent:
    """One connection to the port, sealing frames as a node agent does."""

    def __init__(self, port: Port) -> None:
        self.port = port
        self.sock = connect(port)
        self.sealer = wire.Sealer(TOKEN, wire.parse_greeting(received(self.sock)))

    def send(self, payload: bytes) -> list[tuple[int, Any]]:
        self.sock.send(self.sealer.seal(payload))
        self.port.run(0.1)
        data = received(self.sock)
        return [] if data == b"<nothing>" else wire.AckReader().feed(data)

    def report(self, report: NodeReport) -> list[tuple[int, Any]]:
        return self.send(msgspec.msgpack.encode(report))
