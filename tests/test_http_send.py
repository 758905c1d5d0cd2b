"""The head's HTTP port sends a large answer as the client takes it, from the cached answer
itself (agent/rayscope/head/serve/http.py ``HttpConnection._write``): every byte arrives, over
plain TCP and TLS, to a client that reads slowly, and the port copies none of it whole.

Before: the headers and the body were joined, and what the socket did not take
at once was copied into the transport's buffer: 52 MB twice per ``/v1/status`` at 10,000
nodes, into fresh pages. Positive control: send ``response_bytes(response)`` whole in
``HttpConnection.send`` and the memory test finds the body copied.
"""

import asyncio
import contextlib
import hashlib
import logging
import socket
import ssl
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

from rayscope.head.serve.http import HttpPort
from rayscope.head.serve.routes import Request, Response
from rayscope.sinks.logs import LogThrottle
from tests.support.pki import make_pki

BODY = bytes(range(256)) * (20 * 4096)
"""20 MiB, every byte value: what arrives must be the cached answer, byte for byte."""


class Answering:
    """The port's routes: every request gets :data:`BODY`."""

    def answer(self, request: Request) -> Response:
        return Response(200, "application/octet-stream", BODY)


@contextlib.contextmanager
def serving(context: Optional[ssl.SSLContext]) -> Iterator[int]:
    """An HTTP port on loopback in its own event loop; its port number."""
    loop = asyncio.new_event_loop()
    port = HttpPort(Answering(), LogThrottle(logging.getLogger("test")))  # type: ignore[arg-type]
    server = loop.run_until_complete(loop.create_server(port.connection, "127.0.0.1", 0, ssl=context))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def shut_down() -> None:
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.2)  # the connections' own closes, run

    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        asyncio.run_coroutine_threadsafe(shut_down(), loop).result(10)
        port.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def fetch(port: int, context: Optional[ssl.SSLContext], pause_s: float = 0.0) -> tuple[bytes, int]:
    """``GET /`` read in 64 KiB parts (``pause_s`` after each of the first 32): the digest
    of the body and its length."""
    sock: socket.socket = socket.create_connection(("127.0.0.1", port), timeout=30)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    with sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        buffer = bytearray(65536)
        received, parts = bytearray(), 0
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        head, _, rest = bytes(received).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: %d" % len(BODY) in head
        digest, length = hashlib.sha256(rest), len(rest)
        while True:
            got = sock.recv_into(buffer)
            if not got:
                return digest.digest(), length
            digest.update(memoryview(buffer)[:got])
            length += got
            parts += 1
            if parts < 32:
                time.sleep(pause_s)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(pki["head.pem"]), str(pki["head.key"]))
    client = ssl.create_default_context(cafile=str(pki["ca.pem"]))
    return server, client


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
def test_a_large_answer_arrives_whole_to_a_slow_reader(
    secure: bool, tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    with serving(tls[0] if secure else None) as port:
        digest, length = fetch(port, tls[1] if secure else None, pause_s=0.02)
    assert (digest, length) == (hashlib.sha256(BODY).digest(), len(BODY))


def test_the_port_sends_the_cached_answer_without_copying_it_whole(tmp_path: Path) -> None:
    with serving(None) as port:
        fetch(port, None)  # the imports and the pools, before measuring
        tracemalloc.start()
        try:
            digest, _ = fetch(port, None, pause_s=0.02)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert digest == hashlib.sha256(BODY).digest()
    assert peak < len(BODY) // 4, peak  # a few pieces in flight; before: the body, twice
