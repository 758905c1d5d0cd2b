"""``/healthz`` says the truth. A head whose every GCS read fails says it
has no scheduler view and why, and is not ``ok``; a view that went old says so too.

Before (SECURITY.md): ``ok: true``, ``scheduler_view_age_s: null``, ``errors: 0`` for as long
as every read failed (the probe watched 12 s): a round that completes with a failed read
counted as a healthy poller, and the read's reason was nowhere.
"""

import threading
import time
from typing import Any, Optional

import pytest

from rayscope.head.poll.poller import PollerGuard
from rayscope.head.store.state import HeadState
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import RayNode
from tests.reliability_plugin import FaultRecord
from tests.scenarios import SEED_VIEWS
from tests.support.poller import ViewsOnly, healthz
from tests.waiting import eventually

DOWN = SourceStatus(name="gcs", ok=False, reason="GCS unreachable at 127.0.0.1:1 (timeout 5 s)")
"""What a dead GCS gives. 127.0.0.1:1 here (and as the state's address) is only text: nothing
dials it (the reader is a stand-in), and the reason lands in RELIABILITY.md's row, which must
read the same every run (a port from the OS would not)."""


class Reader(ViewsOnly):
    """A GCS reader answering ``views`` while ``up``, else what a dead GCS gives."""

    versions: Optional[SourceStatus] = None

    def __init__(self, up: bool) -> None:
        self.up, self.calls = up, 0

    def read(self) -> tuple[list[RayNode], SourceStatus]:
        self.calls += 1
        return (SEED_VIEWS, SourceStatus(name="gcs", ok=True)) if self.up else ([], DOWN)


def polled_health(reader: Reader, interval_s: float = 0.05) -> dict[str, Any]:
    """``/healthz`` after three GCS rounds of a poller on ``reader``; the poller stopped."""
    state = HeadState(interval_s=interval_s, gcs_address="127.0.0.1:1")
    stop = threading.Event()
    PollerGuard(state, reader, stop).start()  # type: ignore[arg-type]
    try:
        eventually(lambda: reader.calls >= 3, what="three GCS rounds", every_s=0.02)
        return healthz(state)
    finally:
        stop.set()


@pytest.mark.fault
def test_every_gcs_read_failing_is_no_scheduler_view_and_not_ok(fault: FaultRecord) -> None:
    """Before: ``ok`` true, ``errors`` 0, no reason anywhere."""
    fault.expect(
        "every GCS read fails (the poller's rounds complete)",
        "/healthz: ok false, scheduler_view missing, the read's reason in scheduler_view_error,"
        " gcs_poller.last_error and problems (before: ok true, scheduler_view_age_s null, errors 0)",
    )
    health = polled_health(Reader(up=False))
    assert health["ok"] is False
    assert health["scheduler_view"] == "missing" and health["scheduler_view_age_s"] is None
    assert health["scheduler_view_error"] == DOWN.reason
    assert health["gcs_poller"]["read_errors"] >= 3 and DOWN.reason in health["gcs_poller"]["last_error"]
    assert health["problems"] == [f"no scheduler view: no GCS read has succeeded ({DOWN.reason})"]
    fault.observe(
        f"ok {str(health['ok']).lower()}, scheduler_view {health['scheduler_view']},"
        f" read_errors {health['gcs_poller']['read_errors']}, problems: {health['problems'][0]}"
    )


def test_a_view_that_went_old_is_not_ok_and_says_why() -> None:
    state = HeadState(interval_s=1.0, gcs_address="127.0.0.1:1")
    state.poller.set_alive(True)
    state.poller.round_done()
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=time.monotonic() - 10)
    state.set_view([], DOWN)
    health = healthz(state)
    assert (health["ok"], health["scheduler_view"], health["scheduler_view_stale"]) == (False, "old", True)
    assert health["problems"] == [f"scheduler view 10 s old ({DOWN.reason})"]


def test_a_head_whose_gcs_answers_is_ok() -> None:
    """The control: the same poller on a GCS that answers."""
    health = polled_health(Reader(up=True))
    assert (health["ok"], health["problems"], health["scheduler_view"]) == (True, [], "fresh")
    assert (health["scheduler_view_error"], health["gcs_poller"]["read_errors"]) == ("", 0)
