"""tests/support/fake_server.py: it serves each connection, and its close wakes an accept()
that nothing will ever satisfy at once instead of running out a join's timeout."""

import socket
import time

import pytest

from tests.support import fake_server
from tests.support.fake_server import FakeServer
from tests.waiting import eventually


def echo(conn: socket.socket) -> None:
    conn.sendall(conn.recv(64))


def ask(server: FakeServer, word: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(word)
        return client.recv(64)


def test_every_connection_is_handled_on_the_os_given_port() -> None:
    with FakeServer(echo) as server:
        assert server.port != 0
        assert [ask(server, b"one"), ask(server, b"two")] == [b"one", b"two"]
    assert server.connections == 2


def test_a_close_wakes_an_accept_that_never_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no accept timeout at all, only the shutdown ends the acceptor. Positive control:
    drop the shutdown from close() and this takes the join's 5 s, then fails."""
    monkeypatch.setattr(fake_server, "ACCEPT_TIMEOUT_S", None)
    server = FakeServer(echo)
    assert ask(server, b"up") == b"up"  # served: the acceptor is back in accept()
    started = time.monotonic()
    server.close()
    took = time.monotonic() - started
    assert took < fake_server.JOIN_TIMEOUT_S / 5, took
    assert not server._acceptor.is_alive()


def test_a_handler_waiting_on_stop_ends_with_the_close() -> None:
    def wait(_conn: socket.socket) -> None:
        server.stop.wait(60)

    with FakeServer(wait) as server:
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        eventually(lambda: server.connections == 1, 10, "the connection accepted")
    client.close()
