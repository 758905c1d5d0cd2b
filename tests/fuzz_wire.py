"""Fuzz target for the head's frame and report decoders:
``python -m tests.fuzz_wire [N] [SEED] [--json FILE]``.

Each input is a byte stream fed, in random chunks, to a real :class:`rayscope.head.ingest.ReportProtocol`
(over a fake transport) as a peer would send it: authentic version-2 and version-1 frames,
then mutated (bit flips, cut, spliced, repeated, reordered, wrong token, forged lengths), and
authentic frames around mutated or generated report payloads. Invariants, checked per input:

* nothing escapes the protocol's callbacks (an exception there is an *unhandled* input);
* every connection the head closes has exactly one counted rejection (``/healthz`` counts),
  and every frame it took was acknowledged;
* ``HeadState.ingest`` raises nothing but ``ReportError`` for any payload;
* a head holding such reports answers every view (``/v1/status``, ``?gpus=1``, ``format=lines``,
  ``/metrics``, the page) with 200 and counts no merge or render as failed: one input in 100
  sends reports with non-ASCII digits (``'²'``, ``'٢'``, ``'５'``) in every string field
  (tests/hostile.py), or mutated ones, to a head that knows two of their nodes.

Prints one line per outcome with its count; exits 1 on any unhandled input. ``--json``
also writes the figures (the counts, the run's time and interpreter) for RELIABILITY.md
(tests/reliability.py). ``make fuzz`` runs 100,000 inputs; the test suite runs a bounded
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
from rayscope.head import ingest
from rayscope.head.admission import ConnectionGuard
from rayscope.head.state import HeadState
from rayscope.logs import LogThrottle
from rayscope.net import wire
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

    from rayscope.head.routes import Request, Routes
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


def fuzz(inputs: int, seed: int = 0) -> tuple["Counter[str]", list[str]]:
    """Run ``inputs`` inputs (nine in ten streams, one in ten bare payloads, one in a hundred
    of those a head's views over hostile reports)."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    failures: list[str] = []

    async def main() -> None:
        for i in range(inputs):
            if i % 100 == 99:
                failure = fuzz_views(rng, counts)
            else:
                failure = fuzz_decoder(rng, counts) if i % 10 == 9 else await run_one(rng, counts)
            if failure is not None:
                failures.append(failure)

    asyncio.run(main())
    return counts, failures


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="?", type=int, default=100_000)
    parser.add_argument("seed", nargs="?", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here (for RELIABILITY.md)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the head's line per rejected input: the counts say it
    started = time.monotonic()
    counts, failures = fuzz(args.inputs, args.seed)
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
