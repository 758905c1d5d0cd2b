"""The Python API as a consumer program uses it (docs/api.md): ``tests/consumer.py``, in its
own process, imports only rayscope's public names and asks the seed cluster
``rayscope.cluster_state(gcs=...)`` and ``rayscope.fit(gpu_memory_mb=4096, gcs=...)``.

A Ray actor asks the same (:func:`test_the_api_answers_inside_a_ray_actor`), as BioEngine's
cluster actor would.

Positive controls: make :func:`rayscope.client.api.cluster_state` print what it read and
:func:`test_a_program_gets_the_status_and_fit_documents` fails on stdout; make
``rayscope/__init__.py`` import :mod:`rayscope.client.api` at the top and
:func:`test_import_rayscope_stays_cheap` names it.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rayscope
from tests.conftest import REPO, LiveCluster, base_env
from tests.support.ports import refused_port

CONSUMER = REPO / "tests" / "consumer.py"
RUN_TIMEOUT_S = 180.0


def consumer_names(path: Path) -> set[str]:
    """Every ``rayscope.X`` the consumer uses, and every module it imports."""
    tree = ast.parse(path.read_text())
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "rayscope"
    }
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return used | {f"import {name}" for name in imported}


def test_the_consumer_uses_public_names_only() -> None:
    names = consumer_names(CONSUMER)
    assert {n for n in names if not n.startswith("import ")} <= set(rayscope.__all__), names
    assert {n for n in names if n.startswith("import rayscope")} == {"import rayscope"}, names


def test_import_rayscope_stays_cheap() -> None:
    """``import rayscope`` loads no module of the package but its ``__init__`` (the API is
    imported on first use): ``status --head``'s fast path starts there."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import rayscope, sys; print(sorted(m for m in sys.modules if 'rayscope' in m))",
        ],
        env={**base_env(), "PYTHONPATH": str(REPO / "agent")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout.replace("'", '"')) == ["rayscope"]


@pytest.mark.live
def test_a_program_gets_the_status_and_fit_documents(live_cluster: LiveCluster) -> None:
    closed = f"127.0.0.1:{refused_port()}"
    done = subprocess.run(
        [sys.executable, str(CONSUMER), live_cluster.gcs_address, closed],
        cwd="/",
        env={**live_cluster.env, "PYTHONPATH": str(REPO / "agent")},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")  # never prints: stderr is empty
    doc = json.loads(done.stdout)  # and stdout holds the consumer's one document
    head = doc["state"]["nodes"][live_cluster.node_id("head")]
    assert (head["used_vram_mb"], head["total_vram_mb"], head["used_gpu"]) == (20480, 24576, 0.04)
    assert doc["state"]["schema"] == 2 and doc["state"]["cluster"]["used_vram_mb"] == 20480
    assert doc["fit"]["fits"] is True
    assert doc["fit"]["shape"] == {"GPU": 0.01, "VRAM_MB": 4096}
    placed = {n["node_id"]: n["placed"] for n in doc["fit"]["nodes"]}
    assert placed[live_cluster.node_id("head")] == 1
    assert doc["error"] == f"GCS unreachable at {closed} (connection refused)"
    assert doc["ray_imported"] is False  # the GCS read ran in a child process: no ray.init here


@pytest.mark.live
def test_the_api_answers_inside_a_ray_actor(live_cluster: LiveCluster) -> None:
    """As BioEngine's cluster actor would call it: no ray.init of its own, nothing printed."""
    reply = live_cluster.request(op="api_in_actor", timeout_s=RUN_TIMEOUT_S)
    head = reply["state"]["nodes"][live_cluster.node_id("head")]
    assert (head["used_vram_mb"], reply["fit"]["fits"], reply["printed"]) == (20480, True, "")
