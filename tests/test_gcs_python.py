"""Which interpreter runs the one-shot GCS read: this one if it has ray, else the Ray
node's own (a local raylet's worker command), this cluster's raylets first."""

import sys
from typing import Optional

from rayscope.schema.report import RayletInfo
from rayscope.sources.gcs.child import gcs_python

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
