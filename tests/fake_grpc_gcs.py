"""A fake GCS that fails every gRPC call with an error text of its choosing: just enough
HTTP/2 (the preface, SETTINGS, PING acks, one trailers-only HEADERS frame per request) for
Ray's own C++ client to read ``grpc-status`` and ``grpc-message``, as a hostile or broken
peer on the GCS port would send them. No grpcio needed (Ray does not ship it).
"""

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

from tests.support import fake_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, HEADERS, PING = 4, 1, 6
ACK, END_STREAM_AND_HEADERS = 1, 5
INTERNAL = b"13"


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header, not indexed, no Huffman (names and values under 128 bytes)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


def trailers(message: str) -> bytes:
    """``:status 200`` (HPACK static index 8), then gRPC's trailers: INTERNAL and ``message``
    percent-encoded, as gRPC puts it on the wire (the client decodes it back)."""
    encoded = quote(message, safe="").encode()
    return (
        b"\x88"
        + literal(b"content-type", b"application/grpc")
        + literal(b"grpc-status", INTERNAL)
        + literal(b"grpc-message", encoded)
    )


def _serve(conn: socket.socket, answer: bytes) -> None:
    buffer = b""
    with conn:
        try:
            conn.settimeout(30)
            conn.sendall(frame(SETTINGS, 0, 0, b""))
            while data := conn.recv(65536):
                buffer = (buffer + data).removeprefix(PREFACE)
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    length, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
                    stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    buffer = buffer[9 + length :]
                    if kind == SETTINGS and not flags & ACK:
                        conn.sendall(frame(SETTINGS, ACK, 0, b""))
                    elif kind == PING and not flags & ACK:
                        conn.sendall(frame(PING, ACK, 0, b"\0" * 8))
                    elif kind == HEADERS:
                        conn.sendall(frame(HEADERS, END_STREAM_AND_HEADERS, stream, answer))
        except OSError:
            pass


@contextmanager
def failing_gcs(message: str) -> Iterator[str]:
    """``HOST:PORT`` of a fake GCS whose every call fails with ``message``."""
    answer = trailers(message)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=_serve, args=(conn, answer), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        fake_server.wake(server)
        thread.join(5)
        server.close()
