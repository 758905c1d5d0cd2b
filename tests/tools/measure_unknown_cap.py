"""The head's memory at its unknown-node cap, filled with the largest reports it admits.

Starts a real ``rayscope head`` on loopback (a token file of mode 0600, no GCS: every node is
one the scheduler does not know), reads its resident memory from ``/proc``, then sends
``--ids`` of the largest admissible reports (``tests/support/largest_report.py``), each under a
made-up node id and with strings of its own, over the real wire, and reads it again: once the
reports are held, and once ``/v1/status`` has been answered (whose size it prints). More ids
than the cap (``MAX_UNKNOWN_HELD``) show that eviction holds the memory flat. The figures
SECURITY.md ("Nodes held") states come from:

    python -m tests.tools.measure_unknown_cap --ids 300
"""

import argparse
import http.client
import json
import os
import socket
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from rayscope.head.serve.http import HTTP_WORKERS
from rayscope.head.store.reports import MAX_UNKNOWN_HELD
from rayscope.net import wire
from tests.support.head import Head
from tests.support.largest_report import WORDS_PER_REPORT, largest_report

MIB = 1024**2
TIMEOUT_S = 30.0
GET_TIMEOUT_S = 120.0
PATHS = ["/v1/status", "/v1/status?all=1", "/v1/status?format=lines", "/metrics", "/v1/usage"]


def rss_mib(pid: int) -> tuple[float, float]:
    """``pid``'s resident memory now and at its peak (``VmRSS``, ``VmHWM``), in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def answered(head: Head, path: str) -> str:
    """The status of a GET of ``path``, or why none came whole (a slow reader may be cut off)."""
    try:
        return str(head.get(path, GET_TIMEOUT_S)[0])
    except (OSError, http.client.HTTPException) as err:
        return type(err).__name__


def send_reports(port: int, token: bytes, ids: int) -> int:
    """Send ``ids`` largest reports on one connection; how many were acknowledged."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        greeting = b""
        while len(greeting) < wire.GREETING_BYTES:
            chunk = sock.recv(wire.GREETING_BYTES - len(greeting))
            if not chunk:
                raise SystemExit("the head closed the connection before its greeting")
            greeting += chunk
        sealer = wire.Sealer(token, wire.parse_greeting(greeting))
        acks = wire.AckReader()
        acked = 0
        for i in range(ids):
            payload = msgspec.msgpack.encode(largest_report(f"{i:056x}", i * WORDS_PER_REPORT))
            assert len(payload) <= wire.MAX_PAYLOAD_BYTES, len(payload)
            sock.sendall(sealer.seal(payload))
            while True:  # one acknowledgement per frame: the next is sent once this one is held
                answers = acks.feed(sock.recv(65536))
                if answers:
                    break
            for _, reason in answers:
                if reason is not None:
                    raise SystemExit(f"report {i} rejected: {reason}")
                acked += 1
        return acked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=MAX_UNKNOWN_HELD + 44, help="made-up node ids to send")
    parser.add_argument("--readers", type=int, default=HTTP_WORKERS, help="GETs of each view at once, after")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rs-cap-") as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(os.urandom(16).hex() + "\n")
        token_file.chmod(0o600)
        head = Head(Path(tmp) / "head.log", token_file, 60, ("--dashboard", "none"))
        try:
            before, _ = rss_mib(head.process.pid)
            started = time.monotonic()
            acked = send_reports(head.listen_port, head.token.encode(), args.ids)
            sent_s = time.monotonic() - started
            health = json.loads(head.get("/healthz", GET_TIMEOUT_S)[1])
            held, _ = rss_mib(head.process.pid)
            status, body = head.get("/v1/status", GET_TIMEOUT_S)
            after, _ = rss_mib(head.process.pid)
            assert status == 200, status
            with ThreadPoolExecutor(args.readers) as pool:  # every HTTP worker rendering
                answers = list(pool.map(lambda p: answered(head, p), PATHS * args.readers))
            _, peak = rss_mib(head.process.pid)
            nodes = len(json.loads(body)["nodes"])
        finally:
            head.stop(TIMEOUT_S)
    print(
        f"cap (MAX_UNKNOWN_HELD): {MAX_UNKNOWN_HELD}; ids sent: {args.ids},"
        f" acknowledged: {acked} in {sent_s:.1f} s"
    )
    print(f"nodes held (/healthz nodes_reporting): {health.get('nodes_reporting')}; in /v1/status: {nodes}")
    print(f"head RSS: {before:.0f} MiB before, {held:.0f} MiB holding them, {after:.0f} MiB after /v1/status")
    print(f"/v1/status: {len(body) / MIB:.1f} MiB ({len(body)} bytes)")
    print(
        f"head peak RSS (VmHWM) after {args.readers} GETs at once of each of {', '.join(PATHS)}:"
        f" {peak:.0f} MiB"
    )
    print("their answers:", ", ".join(f"{n} {a}" for a, n in sorted(Counter(answers).items())))


if __name__ == "__main__":
    main()
