"""The dashboard's GET beside the GCS read, never after it: started from the GCS
child's early stderr line, or at once for an address the operator named; taken when the GCS
read is done, within the command's one deadline (``rayscope.sources.dashboard.parallel``).

Positive control: drop ``on_line`` from ``gcs_prestart.finish``'s calls in
``gcs_child._child_answer`` and :func:`test_the_get_starts_from_the_childs_early_line` fails:
the GET then starts in ``result()``, after the child has answered.
"""

import socket
import time
from pathlib import Path
from typing import Callable

import pytest

from rayscope.errors import EXIT_USAGE, AgentError
from rayscope.net.deadline import Deadline
from rayscope.node import collect
from rayscope.sources import dashboard
from rayscope.sources.dashboard.parallel import ParallelRead
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import read as gcs_read
from tests.support.dashboard import NODE_ID, Serving, answer, hangs, http, node
from tests.support.ports import refused_port

pytestmark = pytest.mark.usefixtures("no_child_left")


def timed(seen: list[float]) -> Callable[[socket.socket, bytes], None]:
    """A dashboard that notes when it was asked, then answers one node."""

    def serve(conn: socket.socket, _request: bytes) -> None:
        seen.append(time.monotonic())
        conn.sendall(http(200, answer(node())))

    return serve


def host_port(url: str) -> str:
    return url.removeprefix("http://")


def test_the_get_starts_from_the_childs_early_line(tmp_path: Path, fake_gcs: str, serving: Serving) -> None:
    """A GCS child that names the dashboard at once and answers 1.5 s later: the dashboard
    is asked within that time, not after it."""
    asked: list[float] = []
    server = serving(timed(asked))
    python = tmp_path / "python"
    mark = gcs_read.DASHBOARD_MARK + f'"{host_port(server.url)}"'
    python.write_text(f'#!/bin/sh\necho \'{mark}\' >&2\nsleep 1.5\necho \'{{"ok": false, "error": "x"}}\'\n')
    python.chmod(0o755)
    deadline = Deadline(10.0)
    early = ParallelRead(None, deadline, {})
    gcs_child.read_cluster(fake_gcs, 10.0, str(python), watch=gcs_child.Watch(deadline, early.on_child_line))
    answered = time.monotonic()
    assert asked and asked[0] < answered - 1.0, "the dashboard was asked after the GCS read"
    read = early.result("2.60.0", None, "")
    assert read is not None and read.status.ok and set(read.nodes) == {NODE_ID}
    assert read.status.detail.endswith("address from GCS")


def test_an_address_the_operator_named_is_asked_at_once(serving: Serving) -> None:
    asked: list[float] = []
    server = serving(timed(asked))
    early = ParallelRead(server.url, Deadline(5.0), {})
    deadline = time.monotonic() + 5
    while not asked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert asked, "not asked before the GCS read's end"
    read = early.result("2.60.0", "10.9.9.9:8265", "")  # the published address: not used
    assert read is not None and read.status.ok and read.status.detail.endswith("address from --dashboard")


def test_the_environment_names_it_too(serving: Serving) -> None:
    server = serving(timed([]))
    read = ParallelRead(None, Deadline(5.0), {dashboard.DASHBOARD_ENV: server.url}).result(None, None, "")
    assert read is not None and read.status.ok and "address from $RAYSCOPE_DASHBOARD" in read.status.detail


def test_a_hanging_dashboard_costs_nothing_past_the_deadline(serving: Serving) -> None:
    server = serving(hangs)
    started = time.monotonic()
    early = ParallelRead(server.url, Deadline(1.0), {})
    read = early.result("2.60.0", None, "")
    assert time.monotonic() - started < 1.6
    assert read is not None and not read.status.ok and "did not answer in time" in read.status.reason


def test_a_child_whose_line_never_came_leaves_the_address_to_its_answer(serving: Serving) -> None:
    server = serving(timed([]))
    early = ParallelRead(None, Deadline(5.0), {})
    early.on_child_line("rayscope: ray imported\n")
    early.on_child_line(gcs_read.DASHBOARD_MARK + "not json\n")
    read = early.result("2.60.0", host_port(server.url), "")
    assert read is not None and read.status.ok


def test_no_published_address_says_the_fix() -> None:
    early = ParallelRead(None, Deadline(5.0), {})
    early.on_child_line(gcs_read.DASHBOARD_MARK + "null\n")
    read = early.result(None, None, "the cluster published no dashboard address")
    assert read is not None and not read.status.ok
    assert read.status.reason == (
        f"no Ray dashboard: the cluster published no dashboard address; {dashboard.NO_DASHBOARD_FIX}"
    )


@pytest.mark.parametrize("off", ["none", "NONE", " none "])
def test_none_reads_nothing(off: str) -> None:
    early = ParallelRead(off, Deadline(5.0), {})
    assert early.result(None, f"127.0.0.1:{refused_port()}", "") is None
    assert early.off_status().ok and early.off_status().detail == "not read (--dashboard none)"


def test_a_bad_address_is_a_usage_error_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="--dashboard"):
        ParallelRead("ftp://x", Deadline(5.0), {})
    monkeypatch.setenv(dashboard.DASHBOARD_ENV, "http://")
    with pytest.raises(AgentError) as caught:
        collect.start_dashboard(None, Deadline(5.0))
    assert caught.value.exit_code == EXIT_USAGE and "$RAYSCOPE_DASHBOARD" in str(caught.value)
