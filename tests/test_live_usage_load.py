"""An expensive answer is rendered once per change and cannot starve the rest.

A real ``rayscope head`` on loopback holding a full usage window of 1,000 actors (restored
from ``--usage-state``: 720 slots each). Before: ``/v1/usage`` was computed per request
(0.6-0.9 s each at 1,000 actors, one at a time under the store's lock) in the port's 16
workers, so 40 parallel requests queued every other request, ``/healthz`` included, behind
them: the probe measured ``/healthz`` held for 19.8 s.
"""

import http.client
import logging
import threading
import time
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import msgspec
import pytest

from rayscope.head.serve import answers
from rayscope.head.serve.http import HTTP_WORKERS, MAX_WAITING, HttpPort
from rayscope.head.serve.routes import Request, Response, Routes, text
from rayscope.head.store.state import HeadState
from rayscope.head.store.usage_store import open_store
from rayscope.sinks.logs import LogThrottle
from tests.conftest import HeadDaemon, base_env
from tests.reliability_plugin import FaultRecord
from tests.support import http_port
from tests.support.ports import refused_port
from tests.support.usage_state import ACTORS, INTERVAL_S, full_window
from tests.waiting import eventually

PARALLEL = 40
HEALTH_BOUND_S = 1.0
"""The slowest ``/healthz`` answer allowed while the 40 requests run (a shared, loaded machine:
the answer itself takes milliseconds)."""


def timed_get(url: str, timeout_s: float = 120.0) -> tuple[int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        response.read()
        return int(response.status), time.monotonic() - started


@pytest.mark.live
@pytest.mark.fault
def test_parallel_usage_requests_never_hold_healthz(tmp_path: Path, fault: FaultRecord) -> None:
    """40 parallel ``/v1/usage`` at 1,000 actors: every one answers, and ``/healthz``, asked
    every 50 ms meanwhile, answers within :data:`HEALTH_BOUND_S` each time.
    Positive control: send ``/healthz`` to the shared pool in ``HttpPort.serve`` and compute
    ``/v1/usage`` per request in ``Routes.usage``: ``/healthz`` waits behind the renders."""
    fault.expect(
        f"{PARALLEL} parallel /v1/usage on a head holding {ACTORS} actors over a full window (before:"
        " answered after 17.1 s, /healthz held 10.7 s, machine under load)",
        f"every one answered; /healthz, asked every 50 ms meanwhile, within {HEALTH_BOUND_S:g} s each time",
    )
    state = tmp_path / "usage.json"
    full_window(state)
    head = HeadDaemon(
        base_env(RAY_AUTH_MODE="disabled"),
        tmp_path / "head.log",
        ["--gcs", f"127.0.0.1:{refused_port()}", "--interval", str(INTERVAL_S), "--usage-state", str(state)],
        None,
    )
    try:
        status, body = head.get("/v1/usage")
        assert status == 200 and len(msgspec.json.decode(body)["actors"]) == ACTORS
        health: list[float] = []
        usage: list[tuple[int, float]] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                health.append(timed_get(head.url + "/healthz", 60.0)[1])
                stop.wait(0.05)

        def ask() -> None:
            usage.append(timed_get(head.url + "/v1/usage?window=59m"))  # not the cached default

        prober = threading.Thread(target=probe)
        askers = [threading.Thread(target=ask) for _ in range(PARALLEL)]
        started = time.monotonic()
        prober.start()
        for thread in askers:
            thread.start()
        for thread in askers:
            thread.join(timeout=300)
        all_answered_s = time.monotonic() - started
        stop.set()
        prober.join(timeout=60)
        fault.observe(
            f"all {len(usage)} answered in {all_answered_s:.2f} s; /healthz: {len(health)} probes,"
            f" slowest {max(health):.3f} s, median {sorted(health)[len(health) // 2]:.3f} s"
            " (machine under load)"
        )
        print(fault.observed[-1])
        assert [code for code, _ in usage] == [200] * PARALLEL
        assert max(health) < HEALTH_BOUND_S
        assert all_answered_s < 10.0  # one render for all 40, not 40 one after the other
    finally:
        head.stop()


def get(routes: Routes, target: str) -> bytes:
    response = routes.answer(Request("GET", target, Message()))
    assert response.status == 200, response.body
    return bytes(response.body)


def test_the_usage_document_is_computed_once_per_fold_or_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/v1/usage``, ``/metrics`` and the page share one computed document per window and
    headroom, until the next fold or an interval later (ages move).
    Positive control: compute the document in ``Routes.usage`` per request (as before) and
    the count is 5 after the first five requests, not 1."""
    clock = [1000.0]
    monkeypatch.setattr(answers, "_monotonic", lambda: clock[0])
    path = tmp_path / "usage.json"
    full_window(path, actors=20)
    store = open_store(3600.0, INTERVAL_S, str(path), now=clock[0], wall_now=time.time())
    state = HeadState(INTERVAL_S, None, store)
    routes = Routes(state, (), LogThrottle(logging.getLogger("test")))
    first = get(routes, "/v1/usage")
    assert [get(routes, "/v1/usage") for _ in range(4)] == [first] * 4
    get(routes, "/metrics")
    get(routes, "/")
    assert routes.answers.usage_renders == 1
    get(routes, "/v1/usage?window=30m")  # another window: its own document
    assert routes.answers.usage_renders == 2
    clock[0] += 1.0
    state.fold_usage(clock[0])  # the poller's fold: the history changed
    get(routes, "/v1/usage")
    assert routes.answers.usage_renders == 3
    clock[0] += INTERVAL_S - 0.5
    get(routes, "/v1/usage")
    assert routes.answers.usage_renders == 3  # nothing new, younger than an interval
    clock[0] += 1.0
    get(routes, "/v1/usage")
    assert routes.answers.usage_renders == 4  # an interval old: the ages moved


def test_the_answers_kept_are_bounded() -> None:
    """Each usage query names its own key: at most ``MAX_ENTRIES`` are kept."""
    routes = Routes(HeadState(INTERVAL_S, None), (), LogThrottle(logging.getLogger("test")))
    for minutes in range(1, 3 * answers.MAX_ENTRIES):
        get(routes, f"/v1/usage?window={minutes}m")
    assert len(routes.answers._entries) == answers.MAX_ENTRIES


@pytest.fixture
def blocked_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, threading.Event, HttpPort]]:
    """An HTTP port whose every answer but ``/healthz``'s blocks until the event is set."""
    release = threading.Event()
    throttle = LogThrottle(logging.getLogger("test"))
    routes = Routes(HeadState(INTERVAL_S, None), (), throttle)
    answer = routes.answer

    def blocking(request: Request) -> Response:
        if not request.target.startswith("/healthz"):
            release.wait(30)
            return text(200, "late")
        return answer(request)

    monkeypatch.setattr(routes, "answer", blocking)
    port = HttpPort(routes, throttle)
    with http_port.serving(port) as number:
        try:
            yield number, release, port
        finally:
            release.set()


def test_healthz_never_waits_in_the_workers_queue(
    blocked_port: tuple[int, threading.Event, HttpPort],
) -> None:
    """Every worker busy and the queue full (renders that take long): ``/healthz`` still
    answers at once, from its own worker. Positive control: drop the ``/healthz`` branch of
    ``HttpPort.serve`` and it waits (here: times out) behind the blocked answers."""
    port, release, http_port = blocked_port
    busy: list[http.client.HTTPConnection] = []
    try:  # every connection closed, a failed assert's too (not left to the collector)
        for _ in range(HTTP_WORKERS + MAX_WAITING // 2):
            busy.append(http.client.HTTPConnection("127.0.0.1", port, timeout=30))
            busy[-1].request("GET", "/v1/usage")
        sent = len(busy)
        eventually(lambda: http_port._in_flight == sent, 10, "every request read and handed to the pool")
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        busy.append(probe)
        started = time.monotonic()
        probe.request("GET", "/healthz")
        response = probe.getresponse()
        took = time.monotonic() - started
        assert response.status == 200 and b'"ok"' in response.read()
        assert took < 2.0
        release.set()
        for connection in busy[:-1]:
            assert connection.getresponse().status == 200
    finally:
        for connection in busy:
            connection.close()
