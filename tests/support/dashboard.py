"""A fake Ray dashboard on loopback (each connection answered by a given function, its
requests kept) and the ``/nodes?view=summary`` answers and HTTP responses the tests send from it."""

import contextlib
import json
import socket
import ssl
import threading
from typing import Any, Callable, Optional

from tests.support import fake_server

NODE_ID = "ab" * 28


def node(node_id: str = NODE_ID, **gpu: Any) -> dict[str, Any]:
    entry = {"index": 0, "uuid": "GPU-1", "name": "T4", "memoryUsed": 100, "memoryTotal": 15360, **gpu}
    return {"raylet": {"nodeId": node_id, "nodeManagerAddress": "10.0.0.1"}, "now": 1.5, "gpus": [entry]}


def answer(*nodes: dict[str, Any]) -> bytes:
    return json.dumps({"result": True, "msg": "", "data": {"summary": list(nodes)}}).encode()


class FakeDashboard:
    """A listening socket on 127.0.0.1 (or the ``listener`` given) whose every connection is
    handed to ``serve``; over TLS with the server ``context`` given (its URL then https)."""

    def __init__(
        self,
        serve: Callable[[socket.socket, bytes], None],
        context: Optional[ssl.SSLContext] = None,
        listener: Optional[socket.socket] = None,
    ) -> None:
        self.listener = listener if listener is not None else socket.create_server(("127.0.0.1", 0))
        scheme = "https" if context is not None else "http"
        host, port = self.listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{scheme}://{shown}:{port}"
        self.serve, self.context = serve, context
        self.requests: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:  # shut down by close()
                return
            conn.settimeout(5)
            if self.context is not None:
                try:
                    conn = self.context.wrap_socket(conn, server_side=True)  # closes conn if it fails
                except OSError:
                    continue
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                self.requests.append(request)
                with contextlib.suppress(OSError):  # the client hung up: its test says what it saw
                    self.serve(conn, request)

    def close(self) -> None:
        self.stop.set()
        fake_server.wake(self.listener)
        self.thread.join(timeout=10)
        self.listener.close()


def http(status: int, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def hangs(conn: socket.socket, _request: bytes) -> None:
    """A dashboard that never answers: it holds the connection until the client hangs up
    (a fixed sleep here was the close's wait on a healthy run)."""
    conn.recv(1)


Serving = Callable[[Callable[[socket.socket, bytes], None]], FakeDashboard]
