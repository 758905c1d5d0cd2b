"""Which interpreter runs the one-shot GCS read: this one if it has ray, else the Ray
node's own (a local raylet's worker command), this cluster's raylets first."""

import socket
import sys
from typing import Optional

import pytest

from rayscope.schema.report import RayletInfo
from rayscope.sources.gcs import child
from rayscope.sources.gcs import reader as gcs_reader
from rayscope.sources.gcs.child import gcs_python
from tests.support.fake_server import FakeServer

RAY_VENV = "/opt/ray/bin/python"
OTHER_VENV = "/srv/other-ray/bin/python"


def raylet(gcs: str, python: Optional[str], pid: int = 10) -> RayletInfo:
    return RayletInfo(
        pid=pid, node_id="ab" * 28, node_ip="10.0.0.1", gcs_address=gcs, python_executable=python
    )


def test_this_python_when_it_can_import_ray() -> None:
    assert gcs_python([raylet("h:1", RAY_VENV)], "h:1", ray_here=True) == sys.executable


def test_the_ray_nodes_python_when_this_one_cannot() -> None:
    raylets = [raylet("other:1", OTHER_VENV, 1), raylet("h:1", RAY_VENV, 2)]
    assert gcs_python(raylets, "h:1", ray_here=False, runnable=lambda p: True) == RAY_VENV
    # Another cluster's Ray node Python still has ray: better than none.
    assert gcs_python(raylets, "elsewhere:1", ray_here=False, runnable=lambda p: True) == OTHER_VENV


def test_a_python_that_is_not_there_is_passed_over() -> None:
    """A raylet in a container names a path that does not exist on the host."""
    raylets = [raylet("h:1", "/in/container/python", 1), raylet("h:1", RAY_VENV, 2)]
    assert gcs_python(raylets, "h:1", ray_here=False, runnable=lambda p: p == RAY_VENV) == RAY_VENV
    assert gcs_python(raylets, "h:1", ray_here=False, runnable=lambda p: False) is None
    assert gcs_python([raylet("h:1", None)], "h:1", ray_here=False) is None
    assert gcs_python([], "h:1", ray_here=False) is None


def test_without_ray_the_reason_says_where_refused_raylets_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ray here and no raylet's Python: the reason does not claim no raylet names one
    (root's raylets may have been skipped for their owner, or unreadable to this user); it
    says where those are named and what to run as. A silent peer stands in for a GCS port."""
    monkeypatch.setattr(gcs_reader, "ray_importable", lambda: False)

    def silent(conn: socket.socket) -> None:
        conn.recv(1)

    with FakeServer(silent) as server:
        views, actors, statuses = child.read_cluster(f"127.0.0.1:{server.port}", 2.0, None)
    assert (views, actors) == ([], None)
    reason = statuses[0].reason
    assert reason.startswith(f"ray is not importable by this Python ({sys.executable}), and no raylet")
    assert "(rayscope node names those refused or unreadable)" in reason and "run rayscope as root" in reason
