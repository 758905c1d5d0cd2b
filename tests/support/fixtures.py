"""The fixtures more than one test module uses (a pytest plugin: ``tests/conftest.py`` names it)."""

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

from rayscope.sources.gcs import prestart as gcs_prestart
from tests.support.dashboard import FakeDashboard, Serving
from tests.support.report_port import Port

if TYPE_CHECKING:
    from tests.conftest import LiveCluster
    from tests.support.fleet import Fleet


@pytest.fixture
def fake_gcs() -> Iterator[str]:
    """A listening port that never answers: enough for the port check to pass."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def no_child_left() -> Iterator[None]:
    """The early GCS child a test started and no read took, killed after the test."""
    yield
    gcs_prestart.discard()


@pytest.fixture
def port() -> Iterator[Port]:
    """The report port in this process, closed after the test."""
    p = Port()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def serving() -> Iterator[Serving]:
    """Starts fake dashboards, each answering with the function given; all closed after the test."""
    started: list[FakeDashboard] = []

    def start(serve: Callable[[socket.socket, bytes], None]) -> FakeDashboard:
        started.append(FakeDashboard(serve))
        return started[-1]

    yield start
    for server in started:
        server.close()


@pytest.fixture(scope="module")
def reporting_fleet(
    live_cluster: "LiveCluster", tmp_path_factory: pytest.TempPathFactory, wire_token: Path
) -> Iterator["Fleet"]:
    """A head agent and a push agent per node of the session's cluster, every agent reporting
    (one fleet per test module)."""
    from tests.support.fleet import running_fleet  # the live modules' own: not at every session's start

    with running_fleet(live_cluster, tmp_path_factory.mktemp("fleet"), wire_token) as running:
        yield running
