"""Fake servers for the tests: a TCP listener on 127.0.0.1 whose port the OS picks, each
connection handed to ``handle`` on a thread of its own, and a close that ends at once; and
:func:`serving`, the standard library's HTTP servers run the same way.

The accept loop waits at most ``ACCEPT_TIMEOUT_S`` for a connection before it looks at the stop
flag, and :meth:`FakeServer.close` shuts the listener down, which wakes a blocked ``accept()``
on Linux. ``serve_forever`` polls for ``shutdown()`` every ``POLL_S`` (its default, 0.5 s, was
half a second of every close). No close runs out a join's timeout: it fails the test instead.
"""

import contextlib
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Optional, TypeVar

ACCEPT_TIMEOUT_S = 0.1
CONNECTION_TIMEOUT_S = 10.0
JOIN_TIMEOUT_S = 5.0
POLL_S = 0.02

F = TypeVar("F", bound="FakeServer")


def wake(listener: socket.socket) -> None:
    """Shut ``listener`` down: a thread blocked in its ``accept()`` gets an OSError at once
    (closing it alone does not wake that thread on Linux)."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)


class FakeServer:
    """``handle(conn)`` for every connection to ``port``; ``connections`` counts them. The
    handler's socket has a ``CONNECTION_TIMEOUT_S`` timeout and is closed after it returns."""

    def __init__(self, handle: Callable[[socket.socket], None], backlog: int = 16) -> None:
        self.handle = handle
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(backlog)
        self.listener.settimeout(ACCEPT_TIMEOUT_S)
        self.port: int = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.stop = threading.Event()
        self._handlers: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:  # shut down by close()
                return
            conn.settimeout(CONNECTION_TIMEOUT_S)
            self.connections += 1
            handler = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._handlers.append(handler)
            handler.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client hung up: its test says what it saw
            self.handle(conn)

    def close(self) -> None:
        """Stop accepting, wake the acceptor, and wait for every handler (``stop`` is set for
        handlers that wait on it)."""
        self.stop.set()
        wake(self.listener)
        self._acceptor.join(JOIN_TIMEOUT_S)
        self.listener.close()
        for handler in self._handlers:
            handler.join(JOIN_TIMEOUT_S)
        alive = [t for t in [self._acceptor, *self._handlers] if t.is_alive()]
        assert not alive, f"the fake server's threads outlived its close: {alive}"

    def __enter__(self: "F") -> "F":
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        error: Optional[BaseException],
        trace: Optional[TracebackType],
    ) -> None:
        self.close()


def serve_forever(server: socketserver.BaseServer) -> threading.Thread:
    """``server.serve_forever()`` on a started daemon thread that notices ``shutdown()`` within
    ``POLL_S``; end it with :func:`stop`."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True)
    thread.start()
    return thread


def stop(server: socketserver.BaseServer, thread: threading.Thread) -> None:
    """Shut ``server`` down, close it and join its :func:`serve_forever` thread."""
    server.shutdown()
    server.server_close()
    thread.join(JOIN_TIMEOUT_S)
    assert not thread.is_alive(), "the server's thread outlived its shutdown"


S = TypeVar("S", bound=socketserver.BaseServer)


@contextlib.contextmanager
def serving(server: S) -> Iterator[S]:
    """``server`` served on a thread (:func:`serve_forever`) until the block ends."""
    thread = serve_forever(server)
    try:
        yield server
    finally:
        stop(server, thread)
