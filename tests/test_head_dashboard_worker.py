"""The head reads Ray's dashboard in a thread of its own: a dashboard that accepts and never
answers costs its own figures, never a GCS round, and ``/healthz`` names its state apart
from the head's ``ok``.

Before: the dashboard was read inside the GCS poller's round, each read waiting the whole GCS
deadline, so at a short interval the scheduler view went old (``/healthz`` false, "no GCS read
yet", ``status --head`` partial) although every GCS read succeeded."""

import asyncio
import threading
import time
from typing import Any, Optional

import pytest

from rayscope.head import daemon
from rayscope.head.poll import dashboard as head_dashboard
from rayscope.head.poll.dashboard import NOT_NEEDED, DashboardJob, DashboardSetting, DashboardWorker
from rayscope.head.poll.poller import poll_once
from rayscope.head.store.state import HeadState
from rayscope.schema.dashboard import DASHBOARD_STATUS, DashboardRead
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import RayNode
from rayscope.sources.gcs import reader as gcs
from tests.scenarios import SEED_VIEWS
from tests.support.dashboard import FakeDashboard, hangs
from tests.support.poller import ViewsOnly, healthz
from tests.support.ports import refused_port
from tests.waiting import eventually


class Reader(ViewsOnly):
    """A GCS that answers the seed's views at once (no agent reports: every GPU node needs
    the dashboard) and publishes ``published`` as its dashboard; each read's time kept."""

    versions: Optional[SourceStatus] = None
    cluster_ray_version: Optional[str] = "2.60.0"

    def __init__(self, published: str, timeout_s: float) -> None:
        self.address, self.timeout_s, self.published = f"127.0.0.1:{refused_port()}", timeout_s, published
        self.reads: list[float] = []

    def read(self) -> tuple[list[RayNode], SourceStatus]:
        self.reads.append(time.monotonic())
        return SEED_VIEWS, SourceStatus(name="gcs", ok=True, detail=self.address)

    def dashboard_url(self) -> tuple[Optional[str], str]:
        return self.published, ""


@pytest.mark.fault
def test_a_silent_dashboard_never_delays_or_ages_the_gcs_view(
    monkeypatch: pytest.MonkeyPatch, fault: Any
) -> None:
    """A head at a 0.5 s interval (GCS deadline 3 s) whose cluster publishes a dashboard that
    accepts and never answers: its GCS rounds keep their interval, ``/healthz`` stays ok,
    and its ``dashboard`` entry says failing, with why. Before: one round per 3.5 s, the
    view 3 s old, ``ok`` false."""
    fault.expect(
        "Ray's dashboard accepts and never answers; the head at --interval 0.5, GCS deadline 3 s"
        " (before: 2 GCS rounds in 3.6 s, 3.5 s apart; /healthz false between them: view old)",
        "GCS rounds keep their interval; /healthz ok all along (asked every 0.1 s), its dashboard"
        " entry failing with why",
    )
    silent = FakeDashboard(hangs)
    reader = Reader(silent.url.removeprefix("http://"), timeout_s=3.0)
    monkeypatch.setattr(gcs, "GcsReader", lambda address, timeout_s: reader)
    head = daemon.Head(("127.0.0.1", 0), ("127.0.0.1", 0), reader.address, 0.5, b"", 3.0)
    seen: dict[str, Any] = {}

    def watch() -> None:
        try:
            began = time.monotonic()
            while not reader.reads and time.monotonic() - began < 5:
                time.sleep(0.02)
            time.sleep(0.1)  # the first round's view is kept
            seen["not ok"] = []
            while time.monotonic() - began < 3.6:  # the first dashboard read runs out of its 3 s
                health = healthz(head.state)
                if not health["ok"]:
                    seen["not ok"].append(health["problems"])
                time.sleep(0.1)
            seen["reads"] = list(reader.reads)
            seen["health"] = healthz(head.state)
        except BaseException as err:  # pragma: no cover - shown by the assertions below
            seen["error"] = err
        finally:
            head.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        asyncio.run(head.serve())  # the main thread: it takes the signals
    finally:
        watcher.join(10)
        silent.close()
    assert "error" not in seen, seen.get("error")
    assert seen["not ok"] == [], seen["not ok"][:1]
    reads = seen["reads"]
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert len(reads) >= 5 and max(gaps) < 1.2, f"GCS rounds {len(reads)}, gaps {gaps}"
    health = seen["health"]
    assert (health["ok"], health["problems"], health["scheduler_view"]) == (True, [], "fresh")
    entry = health["dashboard"]
    assert entry["state"] == "failing" and entry["alive"], entry
    assert silent.url.removeprefix("http://") in entry["reason"] and entry["last_ok_s_ago"] is None, entry
    assert entry["last_read_s_ago"] is not None and entry["last_read_s_ago"] < 1.0, entry
    assert len(silent.requests) >= 1
    fault.observe(
        f"{len(reads)} GCS rounds in 3.6 s, longest gap {max(gaps):.2f} s; /healthz ok, dashboard"
        f" {entry['state']}: {entry['reason']}"
    )


class Blocking:
    """A dashboard read that waits until ``release`` is set, then answers ``read``."""

    def __init__(self, read: Optional[DashboardRead]) -> None:
        self.release, self.started, self.read, self.calls = threading.Event(), threading.Event(), read, 0

    def __call__(
        self, state: HeadState, job: DashboardJob, setting: DashboardSetting
    ) -> Optional[DashboardRead]:
        self.calls += 1
        self.started.set()
        self.release.wait(10)
        state.set_dashboard(self.read)
        return self.read


def started_worker(
    read: Any, setting: Optional[DashboardSetting] = None
) -> tuple[HeadState, DashboardWorker, threading.Event]:
    state = HeadState(interval_s=1.0, gcs_address=f"127.0.0.1:{refused_port()}")
    stop = threading.Event()
    worker = DashboardWorker(state, setting or DashboardSetting(None, {}), stop, read=read)
    worker.start()
    return state, worker, stop


def test_the_poller_hands_the_read_over_and_goes_on() -> None:
    """The round returns while the read it offered is still blocked; the figures the read
    gives are kept when it ends."""
    answered = DashboardRead(status=SourceStatus(name=DASHBOARD_STATUS, ok=True))
    read = Blocking(answered)
    state, worker, stop = started_worker(read)
    try:
        began = time.monotonic()
        status = poll_once(state, Reader("127.0.0.1:9", 3.0), dashboard=worker)  # type: ignore[arg-type]
        assert status.ok and time.monotonic() - began < 0.5
        assert read.started.wait(5) and state.health()["dashboard"]["reading_for_s"] is not None
        state.poller.set_alive(True)
        state.poller.round_done()
        assert state.health()["ok"]
        read.release.set()
        eventually(lambda: state.health()["dashboard"]["state"] == "ok", what="the read kept", every_s=0.02)
        assert state.status(time.monotonic()).sources  # and the state merges it
    finally:
        read.release.set()
        stop.set()


def test_each_state_of_the_dashboard_is_named_and_none_makes_the_head_unhealthy() -> None:
    off = HeadState(interval_s=1.0, gcs_address=None)
    DashboardWorker(off, DashboardSetting("none", {}), threading.Event())
    assert (
        off.health()["dashboard"]["state"] == "off"
        and "--dashboard none" in off.health()["dashboard"]["reason"]
    )

    failed = DashboardRead(status=SourceStatus(name=DASHBOARD_STATUS, ok=False, reason="timed out after 3 s"))
    read = Blocking(failed)
    read.release.set()
    state, worker, stop = started_worker(read)
    state.poller.set_alive(True)
    state.poller.round_done()
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True))
    try:
        worker.offer(DashboardJob(needed=True))
        eventually(lambda: state.health()["dashboard"]["state"] == "failing", what="failing", every_s=0.02)
        health = state.health()
        assert health["ok"] and health["problems"] == []
        assert health["dashboard"]["reason"] == "timed out after 3 s" and health["dashboard"]["failures"] == 1
        read.read = None
        worker.offer(NOT_NEEDED)
        eventually(
            lambda: state.health()["dashboard"]["state"] == "not needed", what="not needed", every_s=0.02
        )
        assert state.health()["dashboard"]["reason"] == ""
    finally:
        stop.set()


def test_a_read_that_raises_is_counted_and_a_dead_worker_is_restarted() -> None:
    calls: list[str] = []

    def read(state: HeadState, job: DashboardJob, setting: DashboardSetting) -> Optional[DashboardRead]:
        calls.append("x")
        if len(calls) == 1:
            raise RuntimeError("bug in a dashboard answer")
        raise SystemExit("killed from inside a library")

    state, worker, stop = started_worker(read)
    try:
        worker.offer(DashboardJob(needed=True))
        eventually(lambda: state.health()["dashboard"]["errors"] == 1, what="the bug counted", every_s=0.02)
        entry = state.health()["dashboard"]
        assert entry["alive"] and entry["reason"] == "RuntimeError: bug in a dashboard answer"
        worker.offer(DashboardJob(needed=True))
        eventually(lambda: not state.health()["dashboard"]["alive"], what="the worker dead", every_s=0.02)
        assert state.health()["dashboard"]["reason"].startswith("worker died: SystemExit")
        assert worker.check() and state.health()["dashboard"]["restarts"] == 1
        assert not worker.check()
    finally:
        stop.set()


def test_building_the_job_never_raises_into_the_round(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> DashboardJob:
        raise ValueError("no address today")

    monkeypatch.setattr(head_dashboard, "dashboard_job", broken)
    state = HeadState(interval_s=1.0, gcs_address=f"127.0.0.1:{refused_port()}")
    worker = DashboardWorker(state, DashboardSetting(None, {}), threading.Event())
    status = poll_once(state, Reader("127.0.0.1:9", 3.0), dashboard=worker)  # type: ignore[arg-type]
    assert status.ok and state.health()["dashboard"]["reason"] == "ValueError: no address today"
