"""The per-release Ray adapter (agent/rayscope/sources/gcs/raycompat.py) and what rayscope does with the
Ray versions it finds. The releases themselves run in ``make compat``; here the parts that
can be checked without a cluster: version discovery, the versions status, the choice of the
interpreter, the child script.

Positive controls: reading the raylet's release from the wrong ``ray`` directory (the last
one in its path, ``core/src/ray``) fails ``test_raylet_binary_names_its_release``; letting
``gcs_python`` keep this interpreter whatever its Ray fails
``test_a_cluster_of_another_release_is_read_by_its_own_python``.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from rayscope.schema.report import RayletInfo
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import raycompat
from rayscope.sources.gcs.child import gcs_python
from rayscope.sources.gcs.reader import ray_versions_status
from tests.support.ports import refused_port

RAYLET = Path("lib/python3.9/site-packages/ray/core/src/ray/raylet/raylet")


def install(root: Path, *dist_infos: str) -> Path:
    binary = root / RAYLET
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    for name in dist_infos:
        (root / "lib/python3.9/site-packages" / name).mkdir()
    return binary


def test_raylet_binary_names_its_release(tmp_path: Path) -> None:
    assert raycompat.installed_ray_version(str(install(tmp_path, "ray-2.33.0.dist-info"))) == "2.33.0"


@pytest.mark.parametrize("dist_infos", [(), ("ray-2.33.0.dist-info", "ray-2.40.0.dist-info")])
def test_no_single_dist_info_is_unknown_not_a_guess(tmp_path: Path, dist_infos: tuple[str, ...]) -> None:
    assert raycompat.installed_ray_version(str(install(tmp_path, *dist_infos))) is None


def test_a_raylet_outside_a_ray_package_is_unknown(tmp_path: Path) -> None:
    assert raycompat.installed_ray_version(str(tmp_path / "bin" / "raylet")) is None


class KvClient:
    """The one GCS client call cluster_ray_version makes, answering ``value`` or raising it."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.asked: list[tuple[bytes, bytes]] = []

    def internal_kv_get(self, key: bytes, namespace: bytes, timeout: Optional[float] = None) -> Any:
        self.asked.append((key, namespace))
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_cluster_version_comes_from_the_cluster_metadata() -> None:
    client = KvClient(json.dumps({"ray_version": "2.33.0", "python_version": "3.9.18"}).encode())
    assert raycompat.cluster_ray_version(client, 1.0) == ("2.33.0", "")
    assert client.asked == [(b"CLUSTER_METADATA", b"cluster")]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "the cluster wrote no metadata"),
        (b"{not json", "not JSON"),
        (b"{}", "names no Ray version"),
        (TimeoutError("deadline"), "not readable: TimeoutError: deadline"),
    ],
)
def test_an_unknown_cluster_version_says_why(value: Any, why: str) -> None:
    version, reason = raycompat.cluster_ray_version(KvClient(value), 1.0)
    assert version is None and why in reason


def test_versions_status_says_when_reader_and_cluster_differ() -> None:
    same = ray_versions_status("2.60.0", "2.60.0", "")
    assert same.ok and same.reason == "" and same.detail == "cluster Ray 2.60.0, reader Ray 2.60.0"
    differ = ray_versions_status("2.60.0", "2.33.0", "")
    assert differ.ok and differ.reason == "the reader's Ray 2.60.0 differs from the cluster's Ray 2.33.0"
    unknown = ray_versions_status("2.60.0", None, "the cluster wrote no metadata")
    assert unknown.detail == "cluster Ray unknown, reader Ray 2.60.0"
    assert unknown.reason == "the cluster's Ray version is unknown: the cluster wrote no metadata"


def raylet(gcs_address: str, python: str, ray_version: Optional[str]) -> RayletInfo:
    return RayletInfo(
        pid=10,
        node_id="ab" * 28,
        node_ip="10.0.0.1",
        gcs_address=gcs_address,
        python_executable=python,
        ray_version=ray_version,
    )


def test_a_cluster_of_another_release_is_read_by_its_own_python() -> None:
    node = [raylet("h:1", "/opt/ray233/bin/python", "2.33.0")]

    def choose(here: str) -> Optional[str]:
        return gcs_python(node, "h:1", True, lambda p: True, lambda: here)

    assert choose("2.60.0") == "/opt/ray233/bin/python"
    assert choose("2.33.0") == sys.executable


def test_this_python_stays_when_the_clusters_release_is_unknown_or_elsewhere() -> None:
    unknown = [raylet("h:1", "/opt/ray/bin/python", None)]
    assert gcs_python(unknown, "h:1", True, lambda p: True, lambda: "2.60.0") == sys.executable
    other_cluster = [raylet("other:1", "/opt/ray233/bin/python", "2.33.0")]
    assert gcs_python(other_cluster, "h:1", True, lambda p: True, lambda: "2.60.0") == sys.executable
    not_runnable = [raylet("h:1", "/opt/ray233/bin/python", "2.33.0")]
    assert gcs_python(not_runnable, "h:1", True, lambda p: False, lambda: "2.60.0") == sys.executable


def test_labels_prefer_the_autoscaler_states_own_field() -> None:
    gcs_pb2: Any = pytest.importorskip("ray.core.generated.gcs_pb2")
    autoscaler_pb2: Any = pytest.importorskip("ray.core.generated.autoscaler_pb2")
    info = gcs_pb2.GcsNodeInfo(labels={"ray.io/node_id": "ab", "zone": "a"})
    state = autoscaler_pb2.NodeState(labels={"zone": "b"}, dynamic_labels={"zone": "c"})
    assert raycompat.node_labels(info, state) == {"ray.io/node_id": "ab", "zone": "b"}
    assert raycompat.node_labels(info, None) == {"ray.io/node_id": "ab", "zone": "a"}


def test_the_child_script_is_standalone() -> None:
    """What a Ray node's Python runs: raycompat and gcs_read joined, importing nothing of
    rayscope (``-S``: no site-packages at all, so no ray either: the answer says so)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", gcs_child.child_script(), f"127.0.0.1:{refused_port()}", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == {
        "ok": False,
        "error": "ModuleNotFoundError: No module named 'ray'",
        "python": sys.executable,
    }


def test_the_stated_range_is_the_tested_range() -> None:
    """pyproject.toml, README.md and --help name exactly the Rays and Pythons that
    ``make compat`` runs (its matrix ends), nothing wider."""
    from rayscope import SUPPORTED_PYTHON, SUPPORTED_RAY
    from tests.conftest import REPO, run_rayscope
    from tests.tools.compat import MATRIX

    oldest, newest = (
        min(MATRIX, key=lambda p: version_key(p[0])),
        max(MATRIX, key=lambda p: version_key(p[0])),
    )
    assert (oldest[0], newest[0]) == SUPPORTED_RAY
    pythons = sorted({p for _, p in MATRIX}, key=version_key)
    assert (pythons[0], pythons[-1]) == SUPPORTED_PYTHON
    lo, hi = SUPPORTED_RAY
    assert f'ray = ["ray>={lo},<={hi}"]' in (REPO / "pyproject.toml").read_text()
    assert f"Tested with Ray {lo} to {hi} and Python 3.9 to 3.13" in (REPO / "README.md").read_text()
    help_text = " ".join(run_rayscope("--help").stdout.replace("│", " ").split())
    assert f"Tested with Ray {lo} to {hi} and Python 3.9 to 3.13." in help_text


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def test_this_pythons_ray_is_read_without_importing_it() -> None:
    from importlib import metadata

    assert raycompat.reader_ray_version() == metadata.version("ray")
