"""Fuzz targets for the head's frame and report decoders and its HTTP request parser:
``python -m tests.tools.fuzz_wire [N] [SEED] [--target all|report|http] [--json FILE]``.

Report port: each input is a byte stream fed, in random chunks, to a real
:class:`rayscope.head.serve.ingest.ReportProtocol` (over a fake transport) as a peer would send it:
authentic version-2 and version-1 frames, then mutated (bit flips, cut, spliced, repeated,
reordered, wrong token, forged lengths), and authentic frames around mutated or generated
report payloads. Invariants, checked per input:

* nothing escapes the protocol's callbacks (an exception there is an *unhandled* input);
* every connection the head closes has exactly one counted rejection (``/healthz`` counts),
  and every frame it took was acknowledged;
* ``HeadState.ingest`` raises nothing but ``ReportError`` for any payload;
* a head holding such reports answers every view (``/v1/status``, ``?gpus=1``, ``format=lines``,
  ``/metrics``, the page) with 200 and counts no merge or render as failed: one input in 100
  sends reports with non-ASCII digits (``'²'``, ``'٢'``, ``'５'``) in every string field
  (tests/hostile.py), or mutated ones, to a head that knows two of their nodes.

HTTP port: each input is a request fed, in random chunks, to a real
:class:`rayscope.head.serve.http.HttpConnection` of a port with the head's own routes (answered in
the loop, not in the worker threads: the reading is under test): requests the head's
clients send, then mutated, and requests with hostile request lines and headers (non-ASCII
and 5,000-digit ``Content-Length``, two lengths, transfer codings, NULs, folded and
colon-less lines, huge lines). Invariants: nothing escapes, nothing reaches the port's
catch-all (a ``400`` for a request that made the reading raise: a bug); a complete request
gets exactly one answer with an HTTP/1.1 status line, and a refused one is counted.

``--target`` picks one (``all``, ``make fuzz``'s: seven in ten report streams, two in ten
HTTP requests, one in ten bare payloads).

Prints one line per outcome with its count; exits 1 on any unhandled input. ``--json``
also writes the figures (the counts, the run's time and interpreter) for RELIABILITY.md
(tests/tools/reliability.py). ``make fuzz`` runs 100,000 inputs; the test suite runs a bounded
share (tests/test_wire.py).
"""

import argparse
import asyncio
import json
import logging
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

import msgspec

from rayscope.core.validate import ReportError
from rayscope.head.access.admission import ConnectionGuard
from rayscope.head.serve import http, ingest
from rayscope.head.serve.routes import Request, Routes
from rayscope.head.store.state import HeadState
from rayscope.net import wire
from rayscope.sinks.logs import LogThrottle
from tests import hostile
from tests.scenarios import SEED_REPORTS, SEED_VIEWS, view

TOKEN = b"fuzz-token-0123456789abcdef"
REPORTS = [msgspec.msgpack.encode(r.report) for r in SEED_REPORTS.values()]


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.9", 4242) if name == "peername" else default

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four byte-level mutations."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:  # bit flip
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut
            del out[at:]
        elif kind == 2:  # insert random bytes
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == 3 and out:  # delete a run
            del out[at : at + rng.randint(1, 16)]
        elif kind == 4 and out:  # set a byte to an edge value
            out[rng.randrange(len(out))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif kind == 5:  # splice in a slice of itself
            j = rng.randrange(len(out) + 1)
            out[at:at] = out[j : j + rng.randint(1, 64)]
        else:  # overwrite a 4-byte field with an edge length
            value = rng.choice((0, 31, 32, 33, wire.MAX_FRAME_BYTES, wire.MAX_FRAME_BYTES + 1, 2**32 - 1))
            out[at : at + 4] = value.to_bytes(4, "big")
    return bytes(out)


def random_msgpack(rng: random.Random, depth: int = 0) -> Any:
    """A random value: deep nesting, wrong types, huge and negative numbers, odd strings."""
    fields = ("schema", "node_id", "collected_at", "gpus", "host", "raylet", "processes", "sources", "x")
    makers: list[Callable[[], Any]] = [
        lambda: rng.choice((0, -1, 2**63 - 1, -(2**63), 1.5, float("inf"), float("nan"))),
        lambda: rng.randbytes(rng.randint(0, 8)).decode("latin-1") + "\x1b[31m\n",
        lambda: rng.choice((None, True, False, "", "node", "a" * 1000)),
        lambda: rng.randbytes(rng.randint(0, 8)),
    ]
    if depth < 60:
        makers += [
            lambda: [random_msgpack(rng, depth + 1) for _ in range(rng.randint(0, 3))],
            lambda: {rng.choice(fields): random_msgpack(rng, depth + 1) for _ in range(rng.randint(0, 4))},
        ] * 2
    return rng.choice(makers)()


KNOWN = ("f1" * 28, "f2" * 28)
"""Two-GPU nodes the views target's head knows; hostile reports are sent for them too."""


def hostile_payload(rng: random.Random) -> bytes:
    """A report with non-ASCII digits in every string field (tests/hostile.py): one digit
    set, digits rewritten or whole strings replaced, for a known node or a new one."""
    digits = rng.choice(list(hostile.DIGITS.values()))
    node_id = rng.choice((*KNOWN, "07" * 28))
    base = hostile.full_report(node_id, f"10.0.{rng.randrange(256)}.{rng.randrange(256)}", "gpu-07")
    rewrite = rng.choice((hostile.foreign, hostile.all_foreign))
    return bytes(msgspec.msgpack.encode(rewrite(base, digits, keep_node_id=node_id in KNOWN)))


def payload(rng: random.Random) -> bytes:
    """A report payload: real, mutated, generated, or with non-ASCII digits everywhere."""
    kind = rng.randrange(5)
    if kind == 4:
        return hostile_payload(rng) if rng.randrange(2) else mutate(rng, hostile_payload(rng))
    if kind == 0:
        return rng.choice(REPORTS)
    if kind == 1:
        return mutate(rng, rng.choice(REPORTS))
    if kind == 2:
        report = msgspec.msgpack.decode(rng.choice(REPORTS))
        report[rng.choice(list(report))] = random_msgpack(rng)
        return bytes(msgspec.msgpack.encode(report))
    return bytes(msgspec.msgpack.encode(random_msgpack(rng)))


def stream(rng: random.Random, challenge: bytes) -> tuple[bytes, str]:
    """Bytes a peer sends after the greeting, and what kind of input it is."""
    sealer = wire.Sealer(TOKEN, challenge)
    frames = [sealer.seal(rng.choice(REPORTS)) for _ in range(rng.randint(1, 3))]
    kinds: dict[str, Callable[[], bytes]] = {
        "v2 payloads": lambda: b"".join(sealer.seal(payload(rng)) for _ in range(rng.randint(1, 3))),
        "v2 mutated": lambda: mutate(rng, b"".join(frames)),
        "v2 replayed": lambda: b"".join([*frames, rng.choice(frames)]),
        "v2 reordered": lambda: b"".join(rng.sample(frames, len(frames))),
        "v2 wrong token": lambda: wire.Sealer(b"wrong", challenge).seal(rng.choice(REPORTS)),
        "v1 payloads": lambda: wire.seal_v1(payload(rng), TOKEN),
        "v1 mutated": lambda: mutate(rng, wire.seal_v1(rng.choice(REPORTS), TOKEN)),
        "garbage": lambda: rng.randbytes(rng.randint(0, 256)),
    }
    kind = rng.choice(list(kinds))
    return kinds[kind](), kind


def chunks(rng: random.Random, data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        n = rng.choice((1, 7, 29, 64, 1000, len(data)))
        out.append(data[at : at + n])
        at += n
    return out


async def run_one(rng: random.Random, counts: "Counter[str]") -> Optional[str]:
    """Feed one input; a description of the broken invariant, or None."""
    state = HeadState(5.0, None)
    throttle = LogThrottle(ingest.log, interval_s=3600)
    guard = ConnectionGuard(10, 10, throttle, state.count_rejected)
    protocol = ingest.ReportProtocol(state, TOKEN, 60.0, guard)
    transport = FakeTransport()
    data, kind = b"", "?"
    try:
        protocol.connection_made(transport)
        challenge = wire.parse_greeting(bytes(transport.written[: wire.GREETING_BYTES]))
        del transport.written[: wire.GREETING_BYTES]
        data, kind = stream(rng, challenge)
        for chunk in chunks(rng, data):
            if transport.closed:
                break
            protocol.data_received(chunk)
        if not transport.closed:
            protocol.eof_received()
        protocol.connection_lost(None)
    except Exception as err:  # the invariant under test: nothing escapes
        return f"{kind}: {type(err).__name__}: {err} on {data[:64].hex()}"
    if protocol.protocol_errors.by_kind:  # nor is caught by the callbacks' guard: a bug
        return f"{kind}: a callback raised {protocol.protocol_errors.by_kind} on {data[:64].hex()}"
    rejected = sum(guard.counters.rejected.values())
    if transport.closed and rejected != 1:
        return f"{kind}: closed with {rejected} counted rejections"
    replies = wire.AckReader().feed(bytes(transport.written)) if transport.written else []
    acked = max((seq for seq, reason in replies if reason is None), default=0)
    if data[:1] == bytes((wire.V2,)) and state.reports_received and acked < state.reports_received:
        return f"{kind}: {state.reports_received} reports taken, {acked} acknowledged"
    outcome = ",".join(sorted(guard.counters.rejected)) or (
        "taken" if state.reports_received else "incomplete"
    )
    counts[f"{kind} -> {outcome}"] += 1
    return None


def fuzz_decoder(rng: random.Random, counts: "Counter[str]") -> Optional[str]:
    data = payload(rng)
    try:
        HeadState(5.0, None).ingest(data, 0.0)
    except ReportError:
        counts["report decoder -> rejected"] += 1
        return None
    except Exception as err:  # the invariant under test
        return f"report decoder: {type(err).__name__}: {err} on {data[:64].hex()}"
    counts["report decoder -> taken"] += 1
    return None


VIEWS = ("/v1/status", "/v1/status?gpus=1", "/v1/status?format=lines&gpus=1", "/metrics?gpus=1", "/")


def fuzz_views(rng: random.Random, counts: "Counter[str]") -> Optional[str]:
    """One to three payloads (half of them hostile, the rest any :func:`payload`) into a head
    that knows the seed cluster and :data:`KNOWN`, with the actor table read; then every
    view. A view that is not 200, or a node counted unreadable, is an unhandled input."""
    from email.message import Message

    from rayscope.head.serve.routes import Request, Routes
    from rayscope.schema.report import SourceStatus
    from rayscope.schema.status import ActorBooking

    state = HeadState(5.0, None)
    two = {"CPU": 8.0, "GPU": 2.0}
    known = [view(k, f"10.0.8.{i + 1}", two, {**two, "GPU": 1.0}) for i, k in enumerate(KNOWN)]
    state.set_view([*SEED_VIEWS, *known], SourceStatus(name="gcs", ok=True))
    actor = ActorBooking(
        actor_id="a" * 32, node_id=KNOWN[0], pid=5100, required={"GPU": 1.0}, gpu_shares=[(1, 1.0)]
    )
    state.set_actors([actor], SourceStatus(name="gcs_actors", ok=True))
    sent = [hostile_payload(rng) if rng.randrange(2) else payload(rng) for _ in range(rng.randint(1, 3))]
    taken = 0
    for data in sent:
        try:
            state.ingest(data, time.monotonic())
            taken += 1
        except ReportError:
            pass
        except Exception as err:  # the invariant under test
            return f"report views: ingest: {type(err).__name__}: {err} on {data[:64].hex()}"
    routes = Routes(state, (), LogThrottle(ingest.log, interval_s=3600))
    for target in VIEWS:
        code = routes.answer(Request("GET", target, Message())).status
        if code != 200:
            return f"report views: {target} answered {code} on {b'|'.join(d[:32] for d in sent).hex()}"
    if state.failures.count:
        return f"report views: a node counted unreadable: {state.failures.last}"
    counts[f"report views -> {'taken' if taken else 'all refused'}, every view 200"] += 1
    return None


READ_TOKEN = b"fuzz-read-token-0123456789abcdef"
REQUESTS = [
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:7532\r\n\r\n",
    b"GET /v1/status?all=1&gpus=1 HTTP/1.1\r\nHost: 127.0.0.1:7532\r\nAccept-Encoding: identity\r\n"
    b"Authorization: Bearer " + READ_TOKEN + b"\r\nConnection: close\r\n\r\n",
    b"GET /v1/status?format=lines HTTP/1.1\r\nHost: 127.0.0.1:7532\r\nAccept-Encoding: gzip;q=0.5, br\r\n"
    b"Authorization: Bearer " + READ_TOKEN + b"\r\n\r\n",
    b"HEAD /metrics HTTP/1.0\r\nAuthorization: bearer " + READ_TOKEN + b"\r\n\r\n",
    b"GET /v1/usage?window=1h&headroom=20 HTTP/1.1\r\nHost: 127.0.0.1:7532\r\n\r\n",
    b"POST /login HTTP/1.1\r\nHost: 127.0.0.1:7532\r\nOrigin: http://127.0.0.1:7532\r\n"
    b"Content-Type: application/x-www-form-urlencoded"
    b"\r\nContent-Length: 10\r\n\r\ntoken=abcd",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1:7532\r\nCookie: rayscope_page=x.y\r\n\r\n",
]
"""Requests the head's clients send (status --head, a dashboard, a browser's login)."""
HOSTILE_VALUES = [
    b"\xb2",  # '²' in latin-1: isdigit(), and int() raises
    b"\xb9\xb2\xb3",
    "\u0663".encode(),  # Arabic-Indic three, as UTF-8 bytes
    "\uff15".encode(),  # fullwidth five
    b"9" * 5000,
    b"-1",
    b"+5",
    b" 5 ",
    b"1_0",
    b"0x10",
    b"4097",
    b"18446744073709551616",
    b"",
    b"\x00",
    b"chunked",
    b"gzip;q=\xb9",
]
HOSTILE_NAMES = [
    b"Content-Length",
    b"content-length",
    b"Transfer-Encoding",
    b"Accept-Encoding",
    b"Cookie",
    b"Host",
]
HOSTILE_LINES = [
    b"GET / HTTP/\xb9.\xb2",
    b"GET / HTTP/2.0",
    b"GET / HTTP/1.1 extra",
    b"GET\x00/ HTTP/1.1",
    b"G\xffT / HTTP/1.1",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1",
    b"GET  HTTP/1.1",
    b"",
    b" ",
    b"GET /?page=%C2%B2 HTTP/1.1",
]


def http_request(rng: random.Random) -> tuple[bytes, str]:
    """A request's bytes and what kind of input it is."""
    base = rng.choice(REQUESTS)
    kind = rng.randrange(5)
    if kind == 0:
        return base, "http clients'"
    if kind == 1:
        return mutate(rng, base), "http mutated"
    if kind == 2:
        head, _, body = base.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        for _ in range(rng.randint(1, 3)):
            line = rng.choice(HOSTILE_NAMES) + b": " + rng.choice(HOSTILE_VALUES)
            lines.insert(rng.randint(1, len(lines)), line)
        return b"\r\n".join(lines) + b"\r\n\r\n" + body, "http hostile header"
    if kind == 3:
        head, _, rest = base.partition(b"\r\n")
        odd = rng.choice(
            [rng.choice(HOSTILE_LINES), b" folded", b"no colon", b"X" * 20000 + b": 1", b"A\x00: b"]
        )
        if rng.random() < 0.5:
            return odd + b"\r\n" + rest, "http hostile line"
        return head + b"\r\n" + odd + b"\r\n" + rest, "http hostile line"
    return rng.randbytes(rng.randint(0, 512)), "http garbage"


class RecordingThrottle(LogThrottle):
    """The port's throttle, counting every kind noted (the catch-all's is a failure)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("rayscope.fuzz"), interval_s=3600)
        self.kinds: Counter[str] = Counter()

    def note(self, kind: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        self.kinds[kind] += 1


class InLoopPort(http.HttpPort):
    """The HTTP port with its routes answered at once in the loop (no worker threads)."""

    throttle: RecordingThrottle
    served = 0

    def serve(self, conn: http.HttpConnection, request: Request) -> None:
        self.served += 1
        conn.send(self.routes.answer(request), request.method == "HEAD")


def run_http(rng: random.Random, counts: "Counter[str]", port: InLoopPort) -> Optional[str]:
    """Feed one request; a description of the broken invariant, or None."""
    transport = FakeTransport()
    conn = port.connection()
    data, kind = http_request(rng)
    refused, served = port.counters.bad_requests, port.served
    try:
        conn.connection_made(transport)
        for chunk in chunks(rng, data):
            if transport.closed:
                break
            conn.data_received(chunk)
        conn.connection_lost(None)
    except Exception as err:  # the invariant under test: nothing escapes
        return f"{kind}: {type(err).__name__}: {err} on {data[:64].hex()}"
    bugs = sorted(k for k in port.throttle.kinds if k.startswith("http:unreadable"))
    port.throttle.kinds.clear()
    if bugs:  # the port's catch-all answered: the reading raised
        return f"{kind}: the reading raised ({', '.join(bugs)}) on {data[:64].hex()}"
    written = bytes(transport.written)
    refusals, answers = port.counters.bad_requests - refused, port.served - served
    if not written:
        if transport.closed or refusals or answers:
            return f"{kind}: closed or counted without an answer on {data[:64].hex()}"
        outcome = "incomplete"
    elif not written.startswith(b"HTTP/1.1 ") or written.count(b"\r\n\r\n", 0, 4096) < 1:
        return f"{kind}: an answer without a status line and headers: {written[:64]!r}"
    elif refusals + answers != 1:
        return f"{kind}: {refusals} refusals and {answers} answers counted for one request"
    else:
        outcome = written[9:12].decode("latin-1") + (" refused" if refusals else "")
    counts[f"{kind} -> {outcome}"] += 1
    return None


def fuzz(inputs: int, seed: int = 0, target: str = "all") -> tuple["Counter[str]", list[str]]:
    """Run ``inputs`` inputs of ``target`` (``all``: seven in ten report streams, two in
    ten HTTP requests, one in ten bare payloads; ``report``: nine in ten streams, one in
    ten payloads, the run before the HTTP target; ``http``: requests only). In ``all`` and
    ``report``, one input in a hundred is a head's views over hostile reports."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    failures: list[str] = []

    async def main() -> None:
        throttle = RecordingThrottle()
        routes = Routes(HeadState(5.0, None), (READ_TOKEN,), throttle)
        port = InLoopPort(routes, throttle)
        try:
            for i in range(inputs):
                if target == "http" or (target == "all" and i % 10 in (7, 8)):
                    failure = run_http(rng, counts, port)
                elif i % 100 == 99:
                    failure = fuzz_views(rng, counts)
                elif i % 10 == 9:
                    failure = fuzz_decoder(rng, counts)
                else:
                    failure = await run_one(rng, counts)
                if failure is not None:
                    failures.append(failure)
        finally:
            port.close()

    asyncio.run(main())
    return counts, failures


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="?", type=int, default=100_000)
    parser.add_argument("seed", nargs="?", type=int, default=0)
    parser.add_argument("--target", choices=("all", "report", "http"), default="all")
    parser.add_argument("--json", type=Path, help="also write the figures here (for RELIABILITY.md)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the head's line per rejected input: the counts say it
    started = time.monotonic()
    counts, failures = fuzz(args.inputs, args.seed, args.target)
    seconds = time.monotonic() - started
    for outcome, n in sorted(counts.items()):
        print(f"{n:8d}  {outcome}")
    handled = sum(counts.values())
    print(f"{args.inputs} inputs (seed {args.seed}): {handled} handled, {len(failures)} unhandled")
    for failure in failures[:20]:
        print("UNHANDLED", failure)
    if args.json is not None:
        figures = {
            "inputs": args.inputs,
            "seed": args.seed,
            "target": args.target,
            "handled": handled,
            "unhandled": len(failures),
            "unhandled_examples": failures[:20],
            "outcomes": dict(sorted(counts.items())),
            "seconds": round(seconds, 1),
            "finished_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
