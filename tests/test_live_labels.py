"""Label selectors on a real Ray cluster of its own: why a demand that selects nodes waits.

The cluster (``livecluster.py --topology labels``, nodes started with Ray's ``labels``, the
raylet's ``--labels``): a head with ``VRAM_MB`` 24576 labelled ``zone=a`` and a node with
``VRAM_MB`` 16384 labelled ``zone=b``. Left waiting: an actor selecting
``ray.io/accelerator-type=A100`` (no node has it: fake GPUs carry no accelerator label), one
selecting ``zone=b`` that books 20000 MB (more than that node has), one selecting
``zone=in(c,d)`` and one ``zone=!in(a,b)`` (no node), one selecting ``zone=c`` with the
fallback ``zone=b`` for 18000 MB, a placement group whose bundle selects ``zone=b`` for
20000 MB, and a ``STRICT_PACK`` group whose bundles select ``zone=a`` and ``zone=b``.

Positive controls: judging tasks and actors on every node, selectors ignored (``_judge`` in
``core/capacity/pending.py`` returning ``judge(shape, nodes, ...)``) fails the five actor tests
(tried: 5 failed, the placement-group test passed, it has its own path,
``judge_gang_selected``); matching ``!in`` as ``in`` fails the ``!in`` case.
"""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.conftest import REPO, LiveCluster, base_env, run_rayscope, running_cluster
from tests.raynode import RayHead
from tests.schemas import parsed
from tests.support.ports import free_port_for_ray
from tests.waiting import eventually

pytestmark = pytest.mark.live

NAMES = ("a100", "zone-b-big", "zone-in", "zone-not-in", "fallback")
PG_ZONE_B = [{"GPU": 0.01, "VRAM_MB": 20000}]
PG_SPLIT = [{"CPU": 0.1}, {"CPU": 0.1}]


class Selected:
    """The label cluster, the environment to reach it, and its settled status document."""

    def __init__(self, cluster: LiveCluster) -> None:
        self.cluster = cluster
        self.env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
        self.doc: dict[str, Any] = {}
        self.lines: list[str] = []

    def status(self, *args: str) -> Any:
        gcs = ["--gcs", self.cluster.gcs_address, "--timeout", "60"]
        return run_rayscope("status", *gcs, *args, env=self.env, timeout=120)

    def settle(self, timeout_s: float = 90.0) -> None:
        """Poll until every waiting actor and both placement groups show up with a selector."""

        def settled() -> Optional[dict[str, Any]]:
            done = self.status("--json")
            assert done.returncode == 0, done.stderr
            doc: dict[str, Any] = parsed(done.stdout, "status")
            seen = doc["cluster"]["pending"] or []
            names = {name for d in seen for name in d.get("names", [])}
            groups = [d for d in seen if d["kind"] == "placement_group" and d.get("bundle_selectors")]
            return doc if names >= set(NAMES) and len(groups) == 2 else None

        self.doc = eventually(settled, timeout_s, "the selected demand settled", every_s=0.5)
        text = self.status()
        assert text.returncode == 0, text.stderr
        self.lines = text.stdout.splitlines()

    def named(self, name: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            d for d in self.doc["cluster"]["pending"] if name in d.get("names", [])
        ]
        assert len(found) == 1, json.dumps(self.doc["cluster"]["pending"], indent=1)
        return found[0]

    def group(self, bundles: list[dict[str, float]]) -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            d
            for d in self.doc["cluster"]["pending"]
            if d["kind"] == "placement_group" and d["bundles"] == bundles
        ]
        assert len(found) == 1, json.dumps(self.doc["cluster"]["pending"], indent=1)
        return found[0]


@pytest.fixture(scope="module")
def selected() -> Iterator[Selected]:
    with running_cluster("labels") as cluster:
        none = {"num_cpus": 0, "num_gpus": 0.01}
        wanted: dict[str, dict[str, Any]] = {
            "a100": {**none, "label_selector": {"ray.io/accelerator-type": "A100"}},
            "zone-b-big": {**none, "resources": {"VRAM_MB": 20000}, "label_selector": {"zone": "b"}},
            "zone-in": {"num_cpus": 0.1, "label_selector": {"zone": "in(c,d)"}},
            "zone-not-in": {"num_cpus": 0.2, "label_selector": {"zone": "!in(a,b)"}},
            "fallback": {
                **none,
                "resources": {"VRAM_MB": 18000},
                "label_selector": {"zone": "c"},
                "fallback_strategy": [{"label_selector": {"zone": "b"}}],
            },
        }
        for name, options in wanted.items():
            cluster.request(op="submit", name=name, options=options)
        cluster.request(
            op="placement_group", name="pg-b", bundles=PG_ZONE_B, strategy="PACK", selectors=[{"zone": "b"}]
        )
        cluster.request(
            op="placement_group",
            name="pg-split",
            bundles=PG_SPLIT,
            strategy="STRICT_PACK",
            selectors=[{"zone": "a"}, {"zone": "b"}],
        )
        state = Selected(cluster)
        state.settle()
        yield state


def test_a_selector_no_node_matches_names_it_and_what_the_nodes_hold(selected: Selected) -> None:
    demand = selected.named("a100")
    assert (demand["reason"], demand["admitted_nodes"]) == ("no_label_match", 0)
    assert demand["label_selector"] == {"ray.io/accelerator-type": "A100"}
    assert demand["reason_text"] == (
        "no alive node has ray.io/accelerator-type=A100 (no node has ray.io/accelerator-type)"
    )
    at = selected.lines.index("  1 × GPU=0.01  selects ray.io/accelerator-type=A100  actors: a100")
    assert selected.lines[at + 1] == f"    {demand['reason_text']}"


def test_a_selected_node_too_small_gives_that_nodes_numbers(selected: Selected) -> None:
    demand = selected.named("zone-b-big")
    assert (demand["reason"], demand["admitted_nodes"]) == ("infeasible", 1)
    # The head (zone=a) has 24576 MB: judged on every node this would "have room now".
    assert demand["reason_text"] == (
        "zone=b admits 1 of 2 alive node(s): no node has 20000 MB (at most 16384 MB on one node)"
    )
    assert "  1 × GPU=0.01 VRAM_MB=20000  selects zone=b  actors: zone-b-big" in selected.lines


@pytest.mark.parametrize(("name", "value"), [("zone-in", "in(c,d)"), ("zone-not-in", "!in(a,b)")])
def test_in_and_not_in_operators(selected: Selected, name: str, value: str) -> None:
    demand = selected.named(name)
    assert (demand["reason"], demand["admitted_nodes"]) == ("no_label_match", 0)
    assert demand["label_selector"] == {"zone": value}
    assert demand["reason_text"] == f"no alive node has zone={value} (zone: a on 1 node, b on 1)"


def test_a_fallback_strategy_is_judged_after_its_selector(selected: Selected) -> None:
    demand = selected.named("fallback")
    assert demand["label_selector"] == {"zone": "c"}
    assert demand["fallback_selectors"] == [{"zone": "b"}]
    assert (demand["reason"], demand["admitted_nodes"]) == ("infeasible", 1)
    assert demand["reason_text"] == (
        "no alive node has zone=c (zone: a on 1 node, b on 1); its fallback zone=b admits 1 of 2"
        " alive node(s): no node has 18000 MB (at most 16384 MB on one node)"
    )
    assert "  1 × GPU=0.01 VRAM_MB=18000  selects zone=c, else zone=b  actors: fallback" in selected.lines


def test_placement_group_bundle_selectors(selected: Selected) -> None:
    small = selected.group(PG_ZONE_B)
    assert (small["strategy"], small["bundle_selectors"], small["reason"]) == (
        "PACK",
        [{"zone": "b"}],
        "infeasible",
    )
    assert small["reason_text"] == (
        "1 of 2 alive node(s) admit every bundle: no node has 20000 MB (at most 16384 MB on one node)"
    )
    split = selected.group(PG_SPLIT)
    assert (split["bundle_selectors"], split["reason"]) == ([{"zone": "a"}, {"zone": "b"}], "no_label_match")
    assert split["reason_text"] == (
        "STRICT_PACK: no alive node is admitted by every bundle's selector"
        " (bundle 0: zone=a admits 1; bundle 1: zone=b admits 1)"
    )
    assert (
        "  1 × placement group STRICT_PACK [{CPU=0.1}, {CPU=0.1}]  selects [{zone=a}, {zone=b}]"
        in selected.lines
    )


def fit(selected: Selected, *args: str) -> Any:
    gcs = ["--gcs", selected.cluster.gcs_address, "--timeout", "60"]
    return run_rayscope("fit", *gcs, *args, env=selected.env, timeout=120)


def selecting(*selectors: str) -> list[str]:
    return [arg for selector in selectors for arg in ("--label-selector", selector)]


SHAPE_LINE = 'Shape: {"GPU": 0.01, "VRAM_MB": 20000} per replica (VRAM_MB booking: a node advertises VRAM_MB)'


def test_fit_on_the_nodes_a_selector_admits(selected: Selected) -> None:
    """20000 MB fits the zone=a head (24576), not the zone=b node (16384): without the
    selector it would fit there."""
    b = selected.cluster.node_id("zone_b")[:8]
    done = fit(selected, "--gpu-memory-mb", "20000", *selecting("zone=b"))
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        SHAPE_LINE,
        "Label selector: zone=b admits 1 of 2 alive node(s)",
        "Fits: no, 0/1 replica(s) placed by booking",
        "",
        "Nodes:",
        f"  127.0.0.1 [worker] {b}: fits 0, gets 0 (VRAM_MB: 16384 MB free, needs 20000 MB)",
    ]
    done = fit(selected, "--gpu-memory-mb", "20000", *selecting("zone=a"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:3] == [
        "Label selector: zone=a admits 1 of 2 alive node(s)",
        "Fits: yes, 1/1 replica(s) placed by booking",
    ]


@pytest.mark.parametrize(
    ("selector", "admitted", "code"), [("zone=in(a,b)", 2, 0), ("zone=!a", 1, 1), ("zone=!in(a,b)", 0, 1)]
)
def test_fit_with_in_and_not_operators(selected: Selected, selector: str, admitted: int, code: int) -> None:
    done = fit(selected, "--gpu-memory-mb", "20000", *selecting(selector), "--json")
    assert done.returncode == code, done.stderr
    doc = parsed(done.stdout, "fit")
    assert (doc["admitted_nodes"], doc["alive_nodes"], len(doc["nodes"])) == (admitted, 2, admitted)
    assert doc["request"]["label_selector"] == dict([selector.split("=", 1)])


def test_fit_a_selector_no_node_matches_is_one_line(selected: Selected) -> None:
    done = fit(selected, "--gpu-memory-mb", "1024", *selecting("zone=c"))
    assert done.returncode == 1, done.stderr
    assert "Fits: no, no alive node has zone=c (zone: a on 1 node, b on 1)" in done.stdout.splitlines()
    assert "Nodes:" not in done.stdout
    doc = parsed(fit(selected, "--gpu-memory-mb", "1024", *selecting("zone=c"), "--json").stdout, "fit")
    assert (doc["fits"], doc["admitted_nodes"]) == (False, 0)
    assert doc["label_miss"] == "no alive node has zone=c (zone: a on 1 node, b on 1)"


def test_fit_selects_a_node_by_its_id(selected: Selected) -> None:
    node_id = selected.cluster.node_id("zone_b")
    doc = parsed(
        fit(selected, "--gpu-memory-mb", "1024", *selecting(f"ray.io/node-id={node_id}"), "--json").stdout,
        "fit",
    )
    assert [n["node_id"] for n in doc["nodes"]] == [node_id] and doc["fits"] is True


@pytest.mark.parametrize(
    ("selectors", "line"),
    [
        (
            ["zone=exists()"],
            "rayscope: could not tell: --label-selector zone=exists(): an operator rayscope does not know"
            " (Ray's are v, !v, in(a,b), !in(a,b))",
        ),
        (["zone"], "rayscope: --label-selector zone: give KEY=VALUE (e.g. zone=b, zone=!in(a,b))"),
        (["zone=a", "zone=b"], "rayscope: --label-selector: zone given twice (one value per key, as in Ray)"),
    ],
)
def test_fit_selectors_it_cannot_judge_exit_2(selected: Selected, selectors: list[str], line: str) -> None:
    done = fit(selected, "--gpu-memory-mb", "1024", *selecting(*selectors))
    assert (done.returncode, done.stdout, done.stderr.strip()) == (2, "", line)


API_PROGRAM = """
import json, sys
import rayscope
doc = rayscope.fit(gpu_memory_mb=20000, gcs=sys.argv[1], timeout=60, label_selector={"zone": "!in(b)"})
try:
    rayscope.fit(gpu_memory_mb=1024, gcs=sys.argv[1], timeout=60, label_selector={"zone": 3})
    bad = None
except rayscope.RayscopeError as err:
    bad = [str(err), err.exit_code]
print(json.dumps({"doc": doc, "bad": bad}))
"""


def test_the_api_takes_a_label_selector(selected: Selected) -> None:
    done = subprocess.run(
        [sys.executable, "-c", API_PROGRAM, selected.cluster.gcs_address],
        cwd="/",
        env={**selected.env, "PYTHONPATH": str(REPO / "agent")},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    answer = json.loads(done.stdout)
    doc = answer["doc"]
    assert (doc["fits"], doc["admitted_nodes"]) == (True, 1)
    assert doc["request"]["label_selector"] == {"zone": "!in(b)"}
    assert [n["node_id"] for n in doc["nodes"]] == [selected.cluster.node_id("head")]
    assert answer["bad"] == [
        "label_selector=: 'zone': 3 is an int, not a str",
        2,
    ]


def test_status_json_and_node_carry_each_nodes_labels(selected: Selected) -> None:
    nodes = selected.doc["nodes"]
    head, b = selected.cluster.node_id("head"), selected.cluster.node_id("zone_b")
    assert (nodes[head]["labels"], nodes[b]["labels"]) == ({"zone": "a"}, {"zone": "b"})
    done = run_rayscope(
        "node", "--gcs", selected.cluster.gcs_address, "--timeout", "60", env=selected.env, timeout=120
    )
    assert done.returncode in (0, 1), done.stderr
    lines = done.stdout.splitlines()
    for node_id, zone in ((head, "a"), (b, "b")):
        at = next(i for i, line in enumerate(lines) if line.startswith("Ray node ") and node_id in line)
        assert lines[at + 2] == f"  labels: zone={zone}", lines[at : at + 4]


def test_ray_start_labels_reach_status_and_fit(tmp_path: Path) -> None:
    """``ray start --head --labels``, the operator's way: the labels in ``status --json``
    and a ``fit`` selector that admits the node."""
    env = base_env(RAY_AUTH_MODE="disabled")
    head = RayHead(free_port_for_ray(), env, tmp_path / "ray.log", ["--labels=zone=x,rack=r1"])
    try:
        gcs = ["--gcs", head.address, "--timeout", "60"]
        env = {**env, "RAY_TMPDIR": head.root}

        def labelled() -> Optional[dict[str, Any]]:
            done = run_rayscope("status", "--json", *gcs, env=env, timeout=120)
            if done.returncode != 0:
                return None
            nodes = list(parsed(done.stdout, "status")["nodes"].values())
            return nodes[0] if len(nodes) == 1 and "labels" in nodes[0] else None

        node = eventually(labelled, 120, "the head's node in status --json", every_s=1)
        assert node["labels"] == {"rack": "r1", "zone": "x"}
        shape = ["--shape", '{"CPU": 1}']
        done = run_rayscope("fit", *shape, *gcs, *selecting("zone=x", "rack=!r2"), env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Label selector: zone=x rack=!r2 admits 1 of 1 alive node(s)" in done.stdout.splitlines()
        done = run_rayscope("fit", *shape, *gcs, *selecting("zone=y"), env=env, timeout=120)
        assert done.returncode == 1
        assert "Fits: no, no alive node has zone=y (zone: x on 1 node)" in done.stdout.splitlines()
    finally:
        head.stop()
