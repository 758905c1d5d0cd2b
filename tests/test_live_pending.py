"""What waits, and why: the pending demand on a real Ray cluster of its own (the seed
cluster's lines stay as they are).

The cluster (``livecluster.py --topology pending``): a 2-GPU ``A10G`` head where two 0.6-GPU
replicas sit one per device (0.4 left on each, 0.8 by the node sum), and a ``T4`` worker whose
``VRAM_MB`` (16384) two 8192 MB replicas fill. Then, left waiting: two 0.5-GPU ``A10G``
replicas (fragmented), one more 8192 MB replica (``VRAM_MB`` exhausted), one replica asking
for an ``A100`` (infeasible), a ``STRICT_PACK`` placement group of ``{CPU: 1, GPU: 2}`` (GPU
exhausted: 0.8 free) and an actor inside it (waits on the placement group).

Positive controls: judging the fragmented shape by node sums only (``devices_hold`` always
true) turns ``fragmented`` into ``waits`` and fails the first test; counting the placement
group's own bundles as tasks/actors breaks the agreement with ``ray status``; dropping the
accelerator resource from the shape makes the ``A100`` replica fit and fails the infeasible
test.
"""

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import HeadDaemon, LiveCluster, base_env, run_rayscope, running_cluster
from tests.schemas import parsed
from tests.waiting import eventually

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parent.parent
FRAGMENTED: dict[str, float] = {"GPU": 0.5, "accelerator_type:A10G": 0.001}
VRAM: dict[str, float] = {"GPU": 0.01, "VRAM_MB": 8192}
A100: dict[str, float] = {"GPU": 0.5, "accelerator_type:A100": 0.001}
GANG: dict[str, float] = {"CPU": 1, "GPU": 2}


def shape_key(shape: dict[str, float]) -> str:
    """A shape as a comparable key: names sorted, amounts as floats (8192 == 8192.0)."""
    return json.dumps({name: float(amount) for name, amount in sorted(shape.items())})


class Waiting:
    """The pending cluster, the environment to reach it, and its settled status document."""

    def __init__(self, cluster: LiveCluster) -> None:
        self.cluster = cluster
        self.env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
        self.doc: dict[str, Any] = {}
        self.lines: list[str] = []

    def status(self, *args: str) -> "subprocess.CompletedProcess[str]":
        # A generous deadline: the machine may be loaded by other clusters (import ray alone takes seconds).
        gcs = ["--gcs", self.cluster.gcs_address, "--timeout", "60"]
        return run_rayscope("status", *gcs, *args, env=self.env, timeout=120)

    def settle(self, timeout_s: float = 90.0) -> None:
        """Poll until every waiting shape shows up (raylets report their demand to the GCS
        asynchronously), then keep that document and the lines of the same state."""
        wanted = {
            ("request", shape_key(FRAGMENTED)): 2,
            ("request", shape_key(VRAM)): 1,
            ("request", shape_key(A100)): 1,
            ("placement_group", shape_key(GANG)): 1,
        }

        def settled() -> Optional[dict[str, Any]]:
            done = self.status("--json")
            assert done.returncode == 0, done.stderr
            doc: dict[str, Any] = parsed(done.stdout, "status")
            seen = doc["cluster"]["pending"] or []
            counts = {(d["kind"], shape_key(d["shape"])): d["count"] for d in seen}
            placed_last = any(d["reason"] == "waits_placement_group" for d in seen)
            return doc if placed_last and all(counts.get(key) == n for key, n in wanted.items()) else None

        self.doc = eventually(settled, timeout_s, "the pending demand settled", every_s=0.5)
        text = self.status()
        assert text.returncode == 0, text.stderr
        self.lines = text.stdout.splitlines()

    def demand(self, kind: str, shape: dict[str, float]) -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            d for d in self.doc["cluster"]["pending"] if d["kind"] == kind and d["shape"] == shape
        ]
        assert len(found) == 1, self.doc["cluster"]["pending"]
        return found[0]


@pytest.fixture(scope="module")
def waiting() -> Iterator[Waiting]:
    with running_cluster("pending") as cluster:
        zero_cpu = {"num_cpus": 0}
        for i in range(2):
            options = {**zero_cpu, "num_gpus": 0.5, "accelerator_type": "A10G"}
            cluster.request(op="submit", name=f"half-{i}", options=options)
        cluster.request(
            op="submit", name="vram-2", options={**zero_cpu, "num_gpus": 0.01, "resources": {"VRAM_MB": 8192}}
        )
        cluster.request(
            op="submit", name="a100", options={**zero_cpu, "num_gpus": 0.5, "accelerator_type": "A100"}
        )
        cluster.request(
            op="placement_group", name="big-pg", bundles=[{"CPU": 1, "GPU": 2}], strategy="STRICT_PACK"
        )
        cluster.request(
            op="submit", name="in-pg", options={"num_cpus": 1, "num_gpus": 2}, placement_group="big-pg"
        )
        state = Waiting(cluster)
        state.settle()
        yield state


def test_fractional_replicas_on_a_fragmented_two_gpu_node(waiting: Waiting) -> None:
    demand = waiting.demand("request", FRAGMENTED)
    assert demand["count"] == 2 and demand["names"] == ["half-0", "half-1"]
    assert demand["reason"] == "fragmented" and demand["by"] == "device"
    assert demand["reason_text"] == (
        "free by the node sum (0.8 GPU on 127.0.0.1), but no single GPU has 0.5:"
        " GPU 0: 0.4 free, GPU 1: 0.4 free"
    )
    at = waiting.lines.index("  2 × GPU=0.5 accelerator_type:A10G=0.001  actors: half-0, half-1")
    assert waiting.lines[at + 1] == f"    {demand['reason_text']}"


def test_a_full_vram_mb_node_with_one_more_replica(waiting: Waiting) -> None:
    demand = waiting.demand("request", VRAM)
    assert (demand["count"], demand["names"], demand["reason"]) == (1, ["vram-2"], "vram_exhausted")
    assert demand["reason_text"] == (
        "VRAM_MB exhausted: needs 8192 MB, the best node (127.0.0.1) has 0 MB free of 16384 MB"
    )


def test_an_accelerator_type_no_node_has(waiting: Waiting) -> None:
    demand = waiting.demand("request", A100)
    assert (demand["count"], demand["names"], demand["reason"]) == (1, ["a100"], "infeasible")
    assert demand["reason_text"] == "no node has accelerator_type:A100 (accelerator types here: A10G, T4)"


def test_a_placement_group_that_cannot_be_placed(waiting: Waiting) -> None:
    group = waiting.demand("placement_group", GANG)
    assert (group["strategy"], group["bundles"], group["reason"]) == ("STRICT_PACK", [GANG], "gpu_exhausted")
    assert (
        group["reason_text"]
        == "GPU exhausted: needs 2 GPU, the best node (127.0.0.1) has 0.8 GPU free of 2 GPU"
    )
    inside = waiting.demand("request", GANG)
    assert inside["names"] == ["in-pg"] and inside["reason"] == "waits_placement_group"
    assert inside["placement_group"] == group["placement_group"]
    assert inside["reason_text"].startswith(
        f"waits on placement group {group['placement_group'][:12]} (STRICT_PACK)"
    )


def _ray_pending_demands(text: str) -> dict[tuple[str, str], int]:
    """``ray status``'s "Pending Demands" block: (kind, shape) → count, shapes sorted."""
    counts: dict[tuple[str, str], int] = {}
    block = text.split("Pending Demands:", 1)[1].split("\n\n", 1)[0]
    for line in block.splitlines():
        request = re.match(r"^\s+(\{.*?\}): (\d+)\+ pending tasks/actors", line)
        gang = re.match(r"^\s+(\{.*?\}) \* (\d+) \((\w+)\): (\d+)\+ pending placement groups", line)
        if request:
            key = ("request", shape_key(ast.literal_eval(request.group(1))))
            counts[key] = counts.get(key, 0) + int(request.group(2))
        elif gang:
            bundle = {k: v * int(gang.group(2)) for k, v in ast.literal_eval(gang.group(1)).items()}
            key = ("placement_group", shape_key(bundle))
            counts[key] = counts.get(key, 0) + int(gang.group(4))
    return counts


def test_counts_per_shape_agree_with_ray_status(waiting: Waiting) -> None:
    ours: dict[tuple[str, str], int] = {}
    for demand in parsed(waiting.status("--json").stdout, "status")["cluster"]["pending"]:
        if demand["kind"] in ("request", "placement_group"):
            key = (demand["kind"], shape_key(demand["shape"]))
            ours[key] = ours.get(key, 0) + demand["count"]
    assert len(ours) == 5  # four shapes of tasks/actors, one placement group
    ray_cli = str(Path(sys.executable).parent / "ray")

    def theirs() -> dict[tuple[str, str], int]:
        done = subprocess.run(
            [ray_cli, "status", "--address", waiting.cluster.gcs_address],
            env=waiting.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return _ray_pending_demands(done.stdout)

    # `ray status` reads the autoscaler's report, which lags the GCS by a few seconds:
    # once it listed no demand at all while ours (read from the GCS) had all five.
    eventually(lambda: theirs() == ours, 60, f"`ray status` lists {ours}", every_s=2)


def test_bioengine_pending_resources_shape(waiting: Waiting) -> None:
    """BioEngine documents ``pending_resources`` as lists of dicts (actors, jobs, tasks)
    and ``total`` an int; its SLURM loop counts ``PENDING_CREATION`` actors that ask for
    CPU, GPU or memory by those names: ``in-pg`` asks ``CPU_group_<pg>`` (Ray's state API
    lists it so), so BioEngine's list leaves it out and rayscope's ``pending`` explains it."""
    pending = waiting.doc["cluster"]["pending_resources"]
    assert set(pending) == {"actors", "jobs", "tasks", "total"}
    for key in ("actors", "jobs", "tasks"):
        assert isinstance(pending[key], list) and all(isinstance(e, dict) for e in pending[key])
    assert isinstance(pending["total"], int) and not isinstance(pending["total"], bool)
    assert pending["total"] == sum(len(pending[k]) for k in ("actors", "jobs", "tasks"))
    names = sorted(a["name"] for a in pending["actors"])
    assert names == ["a100", "half-0", "half-1", "vram-2"]
    assert [
        d["names"] for d in waiting.doc["cluster"]["pending"] if d["reason"] == "waits_placement_group"
    ] == [["in-pg"]]
    assert all(
        {"actor_id", "name", "state", "job_id", "required_resources"} <= a.keys() for a in pending["actors"]
    )
    assert pending["tasks"] == []  # every waiting request here is an actor


def test_metrics_and_the_head_view(waiting: Waiting, tmp_path: Path) -> None:
    """The head reads the demand with the scheduler view: same reasons, and /metrics."""
    extra = ["--gcs", waiting.cluster.gcs_address, "--interval", "1"]
    head = HeadDaemon(waiting.env, tmp_path / "head.log", extra, None)
    try:

        def with_pending() -> Optional[dict[str, Any]]:
            code, body = head.get("/v1/status")
            doc: dict[str, Any] = parsed(body, "status") if code == 200 else {}
            return doc if doc and doc["cluster"].get("pending") else None

        doc = eventually(with_pending, 60, "the head's document with the pending demand", every_s=0.5)
        ours = {(d["kind"], d["reason"], d["count"]) for d in doc["cluster"]["pending"]}
        embedded = {(d["kind"], d["reason"], d["count"]) for d in waiting.doc["cluster"]["pending"]}
        assert ours == embedded
        assert doc["view"] == "head" and doc["cluster"]["pending_resources"]["total"] == 4
        code, body = head.get("/metrics")
        assert code == 200
        metrics = body.decode().splitlines()
        assert (
            'rayscope_pending_demands{kind="request",shape="GPU=0.5 accelerator_type:A10G=0.001",'
            'reason="fragmented"} 2'
        ) in metrics
        assert (
            'rayscope_pending_demands{kind="placement_group",shape="CPU=1 GPU=2",reason="gpu_exhausted"} 1'
            in metrics
        )
        assert not any("half-0" in line for line in metrics)  # no per-actor labels
    finally:
        assert head.stop() == 0


def test_the_docs_quote_this_run(waiting: Waiting) -> None:
    """docs/pending.md's fragmented example is what this test's cluster prints, line for line."""
    at = waiting.lines.index("Pending:")
    block = waiting.lines[at : at + 3]
    page = (REPO / "docs" / "pending.md").read_text()
    assert "\n".join(block) in page, "\n".join(waiting.lines)
