"""A head that misbehaves on purpose: what ``status``, ``usage`` and ``fit`` with ``--head``
must survive. Each mode answers every connection the same way:

* ``drip-body``: a good status line and headers (``Content-Length: 1000``), then the body
  one byte every :data:`DRIP_S`;
* ``drip-headers``: the status line and headers themselves, one byte every :data:`DRIP_S`;
* ``huge-length``: ``Content-Length: 1000000000``, then a few bytes and silence;
* ``endless-chunks``: ``Transfer-Encoding: chunked`` and 64 KiB chunks for ever, as fast as
  the client reads;
* ``bad-status``: a status line that is no HTTP status line (``HTTP/1.1 2x0 OK``);
* ``digit-status``: a status code of non-ASCII digits (``HTTP/1.1 ²00 OK``: ``'²'.isdigit()``
  is true, ``int('²')`` raises);
* ``digit-length``: ``Content-Length: ¹²`` (latin-1 on the wire, as headers are read);
* ``bad-header``: a header line without a colon;
* ``late-old``: a well-formed answer of an older head (no ``X-Rayscope-*`` headers, so the
  fast path hands the command to the CLI, which asks again), each sent whole after
  :data:`LATE_S`;
* ``ok``: a well-formed head's answer (the positive control of the harness itself).

Bytes are written raw on a socket (no HTTP library could be made to send these). The server
runs in a thread of the test (:class:`MisbehavingHead`) or alone for a measurement::

    python -m tests.misbehaving_head MODE    # prints the URL, serves until killed
"""

import socket
import sys
import threading
import time
from typing import Optional

from tests.support import fake_server

DRIP_S = 2.0
"""Between two dripped bytes: under any ``--timeout`` a test gives, so that a deadline per
``recv`` never fires and only a deadline for the whole exchange does."""
LATE_S = 2.0
BODY = b'{"schema": 1}'
MODES = (
    "drip-body",
    "drip-headers",
    "huge-length",
    "endless-chunks",
    "bad-status",
    "digit-status",
    "digit-length",
    "bad-header",
    "late-old",
    "ok",
)
GOOD_HEAD = b"HTTP/1.1 200 OK\r\nServer: rayscope-head\r\nContent-Type: application/json\r\n"


ANSWERS: dict[str, tuple[bytes, bytes]] = {
    "drip-body": (GOOD_HEAD + b"Content-Length: 1000\r\n\r\n", b"x" * 1000),
    "drip-headers": (b"", GOOD_HEAD + b"X-Pad: " + b"y" * 1000 + b"\r\nContent-Length: 2\r\n\r\n{}"),
    "huge-length": (GOOD_HEAD + b"Content-Length: 1000000000\r\n\r\n{", b""),
    "bad-status": (b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}", b""),
    "digit-status": (b"HTTP/1.1 \xb200 OK\r\nServer: rayscope-head\r\nContent-Length: 2\r\n\r\n{}", b""),
    "digit-length": (GOOD_HEAD + b"Content-Length: \xb9\xb2\r\n\r\n{}" + b" " * 10, b""),
    "bad-header": (GOOD_HEAD + b"no colon here\r\nContent-Length: 2\r\n\r\n{}", b""),
    "late-old": (b"", b""),
    "ok": (GOOD_HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY), b""),
}
"""Per mode: (what is sent at once, what is dripped after it); ``endless-chunks`` is a loop."""


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


def serve_one(conn: socket.socket, mode: str, stop: threading.Event) -> None:
    """Answer one connection in ``mode`` until the client goes or ``stop`` is set."""
    with conn:
        try:
            conn.settimeout(30)
            _read_request(conn)
            if mode == "endless-chunks":
                conn.sendall(GOOD_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
                chunk = b"%x\r\n%s\r\n" % (65536, b"z" * 65536)
                while not stop.is_set():
                    conn.sendall(chunk)
                return
            if mode == "late-old":
                if not stop.wait(LATE_S):
                    conn.sendall(ANSWERS["ok"][0])
                return
            at_once, dripped = ANSWERS[mode]
            conn.sendall(at_once)
            for i in range(len(dripped)):
                if stop.wait(DRIP_S):
                    return
                conn.sendall(dripped[i : i + 1])
            if mode == "huge-length":
                stop.wait(60)
        except OSError:  # the client gave up: what the test wants
            return


class MisbehavingHead(fake_server.FakeServer):
    """A fake server on 127.0.0.1 answering every connection in ``mode``; ``url``,
    ``connections`` (how many were taken); a context manager that stops it."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        super().__init__(lambda conn: serve_one(conn, mode, self.stop))


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in MODES:
        print(f"usage: python -m tests.misbehaving_head {{{','.join(MODES)}}}", file=sys.stderr)
        return 2
    with MisbehavingHead(args[0]) as head:
        print(head.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
