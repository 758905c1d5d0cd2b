"""Ray's dashboard on a live cluster (issue 32): the demo's two raylets with the dashboard on,
each raylet (and so its dashboard agent) on the fake NVML with a scenario of its own, read the
way ``status`` will read it: the address from the GCS child's answer, then the one GET.

Needs ``ray[default]`` in the test venv (the dashboard's aiohttp and the rest).

Positive control: start the cluster without ``--nvml-scenarios`` (``scenarios={}``) and every
node reads ``gpus == []``: :func:`test_every_node_reads_its_own_gpus_from_the_dashboard` fails.
"""

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rayscope.sources import dashboard
from rayscope.sources.gcs import child as gcs_child
from rayscope.units import MIB
from tests import fake_nvml
from tests.conftest import LiveCluster, running_dashboard_cluster

pytestmark = pytest.mark.live

T4 = "Tesla T4"


def denbi_scenario(pid: int) -> str:
    """deNBI's T4: 3 GiB used (+0.3 reserved), one process of 2 GiB."""
    return (
        fake_nvml.HEADER
        + "count 1\n"
        + fake_nvml.gpu(0, T4, pci="00000000:00:1E.0", total_gib=15, used_gib=3.0)
        + fake_nvml.process("gpu0", pid, 2.0)
    )


@pytest.fixture(scope="module")
def dashboard_cluster(fake_nvml_lib: fake_nvml.FakeNvml, sleeper: int) -> Iterator[LiveCluster]:
    scenarios = {"head": fake_nvml.two_gpus(sleeper), "denbi": denbi_scenario(sleeper)}
    with running_dashboard_cluster("demo", fake_nvml_lib, scenarios) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def child_answer(dashboard_cluster: LiveCluster) -> dict[str, Any]:
    """The GCS child's answer, as ``status`` runs it."""
    answer: list[Any] = []
    gcs_child.read_cluster(dashboard_cluster.gcs_address, 60.0, sys.executable, _answer=answer)
    assert answer, "the GCS child gave no answer"
    return dict(answer[0])


def test_the_gcs_child_names_the_dashboard_the_cluster_published(
    dashboard_cluster: LiveCluster, child_answer: dict[str, Any]
) -> None:
    assert child_answer["dashboard_url"] == dashboard_cluster.state["dashboard_url"]
    assert child_answer["dashboard_url_error"] == ""


def test_every_node_reads_its_own_gpus_from_the_dashboard(
    dashboard_cluster: LiveCluster, child_answer: dict[str, Any], sleeper: int
) -> None:
    address, why = dashboard.choose_address(None, {}, child_answer["dashboard_url"], "")
    assert address is not None, why
    before = time.time()
    version = child_answer["cluster_ray_version"]
    nodes, status = dashboard.read_nodes(address, 30.0, version, {}, "127.0.0.1")
    assert status.ok, status.reason
    head, denbi = nodes[dashboard_cluster.node_id("head")], nodes[dashboard_cluster.node_id("denbi")]
    assert head.gpus is not None and denbi.gpus is not None
    assert [(g.name, g.memory_used_bytes, g.memory_total_bytes) for g in head.gpus] == [
        (fake_nvml.RTX_3090, 7475 * MIB, 24576 * MIB),
        (fake_nvml.RTX_3090, 307 * MIB, 24576 * MIB),
    ]
    assert [(g.name, g.memory_used_bytes, g.memory_total_bytes) for g in denbi.gpus] == [
        (T4, 3379 * MIB, 15360 * MIB)
    ]
    assert [(p.pid, p.used_memory_bytes) for p in denbi.gpus[0].processes] == [(sleeper, 2048 * MIB)]
    assert denbi.gpus[0].processes_believed is dashboard.believes_processes(version)
    for node in (head, denbi):
        assert node.measured_at is not None and before - 60 < node.measured_at <= time.time() + 1
        assert node.node_ip == "127.0.0.1"
