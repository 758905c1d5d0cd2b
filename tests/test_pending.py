"""Pending demand, pure: each reason from a small read, golden files from the recorded live
case (tests/data/gcs_pending_read.json), BioEngine's ``pending_resources`` shape."""

from typing import Optional

import msgspec
import pytest

from rayscope.core.capacity import pending
from rayscope.core.capacity import selectors as sel
from rayscope.render.metrics import metrics_text
from rayscope.render.status import demand_line, status_json, status_lines
from rayscope.schema.pending import (
    LabelConstraint,
    PendingActor,
    PendingDemand,
    PendingGang,
    PendingNode,
    PendingRead,
    PendingRequest,
)
from tests.golden import check_golden
from tests.scenarios import labels_pending_status, pending_status, seed_status

GIB = 1024**3


def node(
    ip: str, total: dict[str, float], available: dict[str, float], node_id: Optional[str] = None
) -> PendingNode:
    return PendingNode(
        node_id=node_id or ip.replace(".", "") * 4, node_ip=ip, total=total, available=available
    )


def one(read: PendingRead) -> PendingDemand:
    demands = pending.judge_pending(read)[1]
    assert len(demands) == 1, demands
    return demands[0]


def placed(
    on: PendingNode,
    shape: dict[str, float],
    device_use: dict[str, dict[str, dict[str, float]]],
    count: int = 1,
) -> PendingDemand:
    """The one demand of ``count`` requests of ``shape`` on node ``on``, Ray's per-device
    placement ``device_use`` known."""
    return one(
        PendingRead(nodes=[on], requests=[PendingRequest(shape=shape, count=count)], device_use=device_use)
    )


TWO_GPUS = node("10.0.0.1", {"GPU": 2, "CPU": 8}, {"GPU": 0.8, "CPU": 8}, "aa")
SIXTY_PERCENT_EACH = {"aa": {"GPU": {"0": 0.6, "1": 0.6}}}


def test_fragmented_names_each_device_free() -> None:
    demand = placed(TWO_GPUS, {"GPU": 0.5}, SIXTY_PERCENT_EACH, count=2)
    assert (demand.reason, demand.by, demand.count) == ("fragmented", "device", 2)
    assert demand.reason_text == (
        "free by the node sum (0.8 GPU on 10.0.0.1), but no single GPU has 0.5:"
        " GPU 0: 0.4 free, GPU 1: 0.4 free"
    )


def test_without_per_device_placement_the_reason_says_node_sums() -> None:
    """Positive control of the fragmented case: the actors account for 0.6 of the node's 1.2
    booked GPU (a task holds the rest), so the devices are unknown and node sums decide."""
    demand = placed(TWO_GPUS, {"GPU": 0.5}, {"aa": {"GPU": {"0": 0.6}}})
    assert (demand.reason, demand.by) == ("waits", "node_sum")
    assert "(10.0.0.1, by node sums)" in demand.reason_text


def test_a_device_with_room_means_it_waits_on_something_else() -> None:
    demand = placed(
        node("10.0.0.1", {"GPU": 2}, {"GPU": 1.4}, "aa"), {"GPU": 0.5}, {"aa": {"GPU": {"0": 0.6}}}
    )
    assert (demand.reason, demand.by) == ("waits", "device")
    assert "per GPU" in demand.reason_text


def test_whole_gpus_need_wholly_free_devices() -> None:
    demand = placed(
        node("10.0.0.1", {"GPU": 2}, {"GPU": 1.0}, "aa"), {"GPU": 1}, {"aa": {"GPU": {"0": 0.5, "1": 0.5}}}
    )
    assert demand.reason == "fragmented"
    assert "but not 1 GPU(s) wholly free: GPU 0: 0.5 free, GPU 1: 0.5 free" in demand.reason_text


@pytest.mark.parametrize(
    ("shape", "total", "free", "reason", "text"),
    [
        (
            {"CPU": 2},
            {"CPU": 4},
            {"CPU": 1},
            "cpu_exhausted",
            "CPU exhausted: needs 2 CPU, the best node (10.0.0.1) has 1 CPU free of 4 CPU",
        ),
        (
            {"memory": 4 * GIB},
            {"memory": 8 * GIB},
            {"memory": 1 * GIB},
            "memory_exhausted",
            "memory exhausted: needs 4.0 GB, the best node (10.0.0.1) has 1.0 GB free of 8.0 GB",
        ),
        (
            {"GPU": 0.01, "VRAM_MB": 8192},
            {"GPU": 1, "VRAM_MB": 24576},
            {"GPU": 0.96, "VRAM_MB": 4096},
            "vram_exhausted",
            "VRAM_MB exhausted: needs 8192 MB, the best node (10.0.0.1) has 4096 MB free of 24576 MB",
        ),
        (
            {"GPU": 0.5},
            {"GPU": 1},
            {"GPU": 0.25},
            "gpu_exhausted",
            "GPU exhausted: needs 0.5 GPU, the best node (10.0.0.1) has 0.25 GPU free of 1 GPU",
        ),
        (
            {"GPU": 2},
            {"GPU": 1},
            {"GPU": 1},
            "infeasible",
            "no node has 2 GPU (at most 1 GPU on one node)",
        ),
        (
            {"GPU": 1, "accelerator_type:H100": 0.001},
            {"GPU": 1, "accelerator_type:T4": 1},
            {"GPU": 1, "accelerator_type:T4": 1},
            "infeasible",
            "no node has accelerator_type:H100 (accelerator types here: T4)",
        ),
    ],
)
def test_each_exhausted_and_infeasible_reason(
    shape: dict[str, float], total: dict[str, float], free: dict[str, float], reason: str, text: str
) -> None:
    demand = one(PendingRead(nodes=[node("10.0.0.1", total, free)], requests=[PendingRequest(shape=shape)]))
    assert (demand.reason, demand.reason_text) == (reason, text)


def test_the_best_node_is_named_for_vram() -> None:
    nodes = [
        node("10.0.0.1", {"VRAM_MB": 24576}, {"VRAM_MB": 1024}),
        node("10.0.0.2", {"VRAM_MB": 24576}, {"VRAM_MB": 6144}),
        node("10.0.0.3", {"CPU": 4}, {"CPU": 4}),
    ]
    demand = one(PendingRead(nodes=nodes, requests=[PendingRequest(shape={"VRAM_MB": 8192})]))
    assert demand.reason_text == (
        "VRAM_MB exhausted: needs 8192 MB, the best node (10.0.0.2) has 6144 MB free of 24576 MB"
    )


def test_an_actor_waiting_on_its_arguments_is_not_in_the_schedulers_demand() -> None:
    actor = PendingActor(
        actor_id="a1", name="late", state="DEPENDENCIES_UNREADY", required_resources={"GPU": 0.1}
    )
    demand = one(PendingRead(nodes=[TWO_GPUS], actors=[actor]))
    assert (demand.kind, demand.names, demand.reason) == ("actor", ["late"], "waits")
    assert demand.reason_text == "waits on its dependencies (its arguments are not ready yet)"


def test_a_request_for_nothing_waits_on_the_scheduler() -> None:
    demand = one(PendingRead(nodes=[TWO_GPUS], requests=[PendingRequest(shape={"CPU": 0.0})]))
    assert (demand.shape, demand.reason) == ({}, "waits")


def test_placement_group_resources_lose_their_suffix() -> None:
    group = "ab" * 18
    shape, found = pending.split_group(
        {f"GPU_group_{group}": 2.0, f"CPU_group_0_{group}": 1.0, f"bundle_group_{group}": 0.001}
    )
    assert (shape, found) == ({"CPU": 1.0, "GPU": 2.0}, group)
    assert pending.split_group({"GPU": 0.5, "accelerator_type:A10G": 0.001}) == (
        {"GPU": 0.5, "accelerator_type:A10G": 0.001},
        "",
    )


@pytest.mark.parametrize(
    ("strategy", "reason"),
    [("SPREAD", "waits"), ("STRICT_SPREAD", "gpu_exhausted"), ("STRICT_PACK", "gpu_exhausted")],
)
def test_placement_group_strategies(strategy: str, reason: str) -> None:
    """Two 1-GPU bundles on two 1-GPU nodes, one of them busy: SPREAD/PACK place them
    apart, STRICT_SPREAD needs two free nodes, STRICT_PACK one node with 2 GPUs."""
    nodes = [node("10.0.0.1", {"GPU": 1}, {"GPU": 1}), node("10.0.0.2", {"GPU": 1}, {"GPU": 1})]
    if strategy == "STRICT_SPREAD":
        nodes[1] = node("10.0.0.2", {"GPU": 1}, {"GPU": 0.5})
    if strategy == "STRICT_PACK":
        nodes = [node("10.0.0.1", {"GPU": 2}, {"GPU": 1})]
    gang = PendingGang(bundles=[{"GPU": 1}, {"GPU": 1}], details=f"{'cd' * 18}:{strategy}|PENDING")
    demand = one(PendingRead(nodes=nodes, gangs=[gang]))
    assert (demand.kind, demand.strategy, demand.reason) == ("placement_group", strategy, reason)
    assert demand.shape == {"GPU": 2.0}


def test_bioengine_shape_counts_tasks_apart_from_actors() -> None:
    """BioEngine: ``actors`` that ask for CPU, GPU or memory; ``tasks`` the rest of the
    demand, one dict each; ``total`` the sum of the lists' lengths."""
    actors = [
        PendingActor(actor_id="a1", name="gpu-actor", required_resources={"GPU": 0.5}),
        PendingActor(actor_id="a2", name="router", required_resources={"node:__internal_head__": 0.001}),
    ]
    read = PendingRead(
        nodes=[TWO_GPUS],
        requests=[
            PendingRequest(shape={"GPU": 0.5}, count=3),
            PendingRequest(shape={"node:__internal_head__": 0.001}, count=1),
        ],
        actors=actors,
        device_use=SIXTY_PERCENT_EACH,
    )
    resources, demands = pending.judge_pending(read)
    assert [a.name for a in resources.actors] == ["gpu-actor"]
    assert [t.required_resources for t in resources.tasks] == [{"GPU": 0.5}, {"GPU": 0.5}]
    assert resources.jobs == [] and resources.total == 3
    gpu = next(d for d in demands if d.shape == {"GPU": 0.5})
    assert (gpu.count, gpu.names) == (3, ["gpu-actor"])


def test_bioengine_lists_stop_at_the_state_apis_limit() -> None:
    read = PendingRead(nodes=[TWO_GPUS], requests=[PendingRequest(shape={"GPU": 4}, count=250)])
    resources, demands = pending.judge_pending(read)
    assert len(resources.tasks) == pending.BIOENGINE_LIST_LIMIT == resources.total
    assert demands[0].count == 250  # rayscope's own list keeps the true count


def test_bioengine_limits_each_list_apart() -> None:
    """BioEngine makes one state-API call per list, each answering at most 100: 100 actors
    do not crowd the tasks out (the old shared limit left 0 tasks here)."""
    actors = [PendingActor(actor_id=f"a{i}", required_resources={"GPU": 4.0}) for i in range(120)]
    read = PendingRead(nodes=[TWO_GPUS], requests=[PendingRequest(shape={"GPU": 8}, count=30)], actors=actors)
    resources, _ = pending.judge_pending(read)
    assert (len(resources.actors), len(resources.tasks), resources.total) == (100, 30, 130)


def test_bioengine_lists_only_actors_waiting_for_resources_by_plain_names() -> None:
    """What Ray 2.60's state API lists and BioEngine's filter keeps (seen on the live
    ``pending`` topology): an actor waiting on its arguments is ``DEPENDENCIES_UNREADY``, one
    inside a placement group asks ``CPU_group_<pg>``; neither is in BioEngine's list, both
    are in rayscope's ``pending`` with their reasons. Before: both were in ``actors``."""
    group = "ab" * 18
    read = PendingRead(
        nodes=[TWO_GPUS],
        actors=[
            PendingActor(actor_id="a1", name="gpu", required_resources={"GPU": 0.5}),
            PendingActor(
                actor_id="a2", name="dep", state="DEPENDENCIES_UNREADY", required_resources={"CPU": 1.0}
            ),
            PendingActor(
                actor_id="a3",
                name="in-pg",
                required_resources={f"CPU_group_{group}": 1.0, f"GPU_group_{group}": 2.0},
                placement_group_id=group,
            ),
            PendingActor(actor_id="a4", name="custom", required_resources={"VRAM_MB": 99999.0}),
        ],
    )
    resources, demands = pending.judge_pending(read)
    assert [a.name for a in resources.actors] == ["gpu"] and resources.total == 1
    reasons = {name: d.reason for d in demands for name in d.names}
    assert reasons["dep"] == "waits" and reasons["in-pg"] == "waits_placement_group"
    assert {"gpu", "custom"} <= reasons.keys()


def test_bioengine_shape_is_what_bioengine_documents() -> None:
    """``get_cluster_state``'s docstring: ``pending_resources`` = actors, jobs, tasks (lists
    of dicts) and total (an int)."""
    doc = msgspec.json.decode(status_json(pending_status()))
    block = doc["cluster"]["pending_resources"]
    assert set(block) == {"actors", "jobs", "tasks", "total"}
    assert all(
        isinstance(block[k], list) and all(isinstance(e, dict) for e in block[k])
        for k in ("actors", "jobs", "tasks")
    )
    assert type(block["total"]) is int and block["total"] == 4
    # in-pg waits inside its placement group: Ray's state API lists it with CPU_group_<pg>
    # names, which BioEngine's filter does not read; rayscope's own list explains it.
    assert "in-pg" not in [a["name"] for a in block["actors"]]
    assert any(d["names"] == ["in-pg"] for d in doc["cluster"]["pending"])


def test_nothing_waits_no_section_and_no_metric() -> None:
    status = seed_status()
    assert "Pending:" not in status_lines(status)
    assert "rayscope_pending_demands" not in metrics_text(status)
    empty = pending.attach(status, PendingRead())
    assert empty.cluster.pending == [] and "Pending:" not in status_lines(empty)
    assert "# TYPE rayscope_pending_demands gauge" in metrics_text(empty)


def test_metric_labels_are_bounded() -> None:
    """Shape and reason, never a name: 50 actors of one shape are one sample."""
    actors = [
        PendingActor(actor_id=f"a{i}", name=f"replica-{i}", required_resources={"GPU": 0.5})
        for i in range(50)
    ]
    read = PendingRead(
        nodes=[TWO_GPUS], requests=[PendingRequest(shape={"GPU": 0.5}, count=50)], actors=actors
    )
    text = metrics_text(pending.attach(seed_status(), read))
    samples = [line for line in text.splitlines() if line.startswith("rayscope_pending_demands{")]
    assert samples == ['rayscope_pending_demands{kind="request",shape="GPU=0.5",reason="waits"} 50']


def test_golden_label_selector_lines() -> None:
    """The Pending lines of demands that select nodes, from a recorded Ray 2.60 read."""
    status = labels_pending_status()
    lines = status_lines(status)
    assert "  1 × GPU=0.01 VRAM_MB=20000  selects zone=b  actors: zone-b-big" in lines
    check_golden("status_labels.txt", "\n".join(lines) + "\n")
    check_golden("status_labels.json", status_json(status) + "\n")


def test_golden_pending_outputs() -> None:
    status = pending_status()
    check_golden("status_pending.txt", "\n".join(status_lines(status)) + "\n")
    check_golden("status_pending.json", status_json(status) + "\n")
    check_golden("status_pending.prom", metrics_text(status))


def test_an_actor_name_cannot_write_to_the_terminal() -> None:
    """Exploit: any Ray user names actors; a name with an escape sequence must not reach the
    operator's terminal through the Pending lines (nor the reason under them). Positive
    control: ``status_lines`` without its final ``printable_lines`` fails this."""
    evil = "x\x1b]0;owned\x07\x1b[2J"
    actor = PendingActor(
        actor_id="a1", name=evil, required_resources={"GPU": 0.5, f"accelerator_type:{evil}": 0.001}
    )
    read = PendingRead(
        nodes=[TWO_GPUS],
        requests=[PendingRequest(shape={"GPU": 0.5, f"accelerator_type:{evil}": 0.001})],
        actors=[actor],
    )
    lines = status_lines(pending.attach(seed_status(), read))
    assert any("x]0;owned" in line for line in lines)  # shown, without its control characters
    assert not any("\x1b" in line or "\x07" in line for line in lines)


def test_pending_under_an_old_scheduler_view_says_how_old() -> None:
    """The demand is read with the scheduler view: when the GCS stops answering, the head
    keeps both, and the Pending header must carry the view's age like the node lines do.
    Positive control: call ``pending_lines(status)`` without the age in ``status_lines``."""
    status = pending_status()
    status.scheduler_age_s, status.scheduler_stale = 42.0, True
    lines = status_lines(status)
    assert "Pending: (scheduler view 42s old)" in lines
    fresh = status_lines(pending_status())
    assert "Pending:" in fresh and not any("old" in line for line in fresh if line.startswith("Pending"))


# Label selectors (Ray 2.49+): judged on the nodes they admit.
NODE_A = PendingNode(
    node_id="aa" * 28, node_ip="10.0.0.1", total={"GPU": 1, "VRAM_MB": 24576, "CPU": 4},
    available={"GPU": 1, "VRAM_MB": 24576, "CPU": 4}, labels={"zone": "a", "ray.io/accelerator-type": "T4"},
)  # fmt: skip
NODE_B = PendingNode(
    node_id="bb" * 28, node_ip="10.0.0.2", total={"GPU": 1, "VRAM_MB": 16384, "CPU": 4},
    available={"GPU": 1, "VRAM_MB": 16384, "CPU": 4}, labels={"zone": "b", "ray.io/accelerator-type": "T4"},
)  # fmt: skip
BIG = {"GPU": 0.01, "VRAM_MB": 20000}


def selected(*selectors: dict[str, str]) -> list[list[LabelConstraint]]:
    return [sel.parse(s) for s in selectors]


def test_a_selector_no_alive_node_meets_is_named_with_what_the_cluster_has() -> None:
    """Positive control: judged without the selector, the same request "has room now"."""
    request = PendingRequest(shape={}, label_selectors=selected({"ray.io/accelerator-type": "A100"}))
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert (demand.reason, demand.admitted_nodes) == ("no_label_match", 0)
    assert demand.reason_text == (
        "no alive node has ray.io/accelerator-type=A100 (ray.io/accelerator-type: T4 on 2 nodes)"
    )
    assert demand.label_selector == {"ray.io/accelerator-type": "A100"}
    plain = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[PendingRequest(shape={})]))
    assert plain.reason == "waits"


def test_the_selected_nodes_too_small_are_the_reason_not_the_others() -> None:
    """20000 MB fits node A (24576), not B (16384): selecting zone=b, B's total decides."""
    request = PendingRequest(shape=BIG, label_selectors=selected({"zone": "b"}))
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert (demand.reason, demand.admitted_nodes) == ("infeasible", 1)
    assert demand.reason_text == (
        "zone=b admits 1 of 2 alive node(s): no node has 20000 MB (at most 16384 MB on one node)"
    )


def test_selected_nodes_that_are_full_name_what_they_lack() -> None:
    full_b = msgspec.structs.replace(NODE_B, available={"GPU": 1, "VRAM_MB": 4096, "CPU": 4})
    request = PendingRequest(shape={"GPU": 0.01, "VRAM_MB": 8192}, label_selectors=selected({"zone": "!a"}))
    demand = one(PendingRead(nodes=[NODE_A, full_b], requests=[request]))
    assert demand.reason == "vram_exhausted"
    assert demand.reason_text == (
        "zone=!a admits 1 of 2 alive node(s): VRAM_MB exhausted: needs 8192 MB, the best node"
        " (10.0.0.2) has 4096 MB free of 16384 MB"
    )


def test_in_and_not_in() -> None:
    request = PendingRequest(shape=BIG, label_selectors=selected({"zone": "in(b,c)"}))
    assert one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request])).admitted_nodes == 1
    request = PendingRequest(shape=BIG, label_selectors=selected({"zone": "!in(a,b)"}))
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert demand.reason_text == "no alive node has zone=!in(a,b) (zone: a on 1 node, b on 1)"


def test_a_fallback_with_room_is_where_it_will_land() -> None:
    request = PendingRequest(shape=BIG, label_selectors=selected({"zone": "b"}, {"zone": "a"}))
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert (demand.reason, demand.admitted_nodes) == ("waits_fallback", 1)
    assert demand.reason_text == (
        "no node its selector zone=b admits has room now; its fallback zone=a admits 10.0.0.1 with room:"
        " it will land on the fallback"
    )
    assert demand.fallback_selectors == [{"zone": "a"}]


def test_a_fallback_that_admits_nodes_without_room_is_judged_on_them() -> None:
    request = PendingRequest(shape={"GPU": 2}, label_selectors=selected({"zone": "c"}, {"zone": "b"}))
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert demand.reason == "infeasible"
    assert demand.reason_text == (
        "no alive node has zone=c (zone: a on 1 node, b on 1); its fallback zone=b admits 1 of 2"
        " alive node(s): no node has 2 GPU (at most 1 GPU on one node)"
    )


def test_an_operator_rayscope_does_not_know_is_never_judged_as_matching() -> None:
    unknown = [LabelConstraint(key="zone", operator="LABEL_OPERATOR_EXISTS", values=[])]
    request = PendingRequest(shape={}, label_selectors=[unknown])
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert demand.reason == "label_unknown"
    assert "(zone=LABEL_OPERATOR_EXISTS): not judged" in demand.reason_text


def test_an_actor_is_matched_to_its_request_by_its_selector_too() -> None:
    """Two actors of one shape, different selectors: each request names its own actor."""
    actors = [
        PendingActor(actor_id="1", name="on-b", required_resources=BIG, label_selector={"zone": "b"}),
        PendingActor(actor_id="2", name="on-c", required_resources=BIG, label_selector={"zone": "c"}),
    ]
    requests = [
        PendingRequest(shape=BIG, label_selectors=selected({"zone": "c"})),
        PendingRequest(shape=BIG, label_selectors=selected({"zone": "b"})),
    ]
    demands = pending.judge_pending(PendingRead(nodes=[NODE_A, NODE_B], requests=requests, actors=actors))[1]
    by_name = {d.names[0]: d for d in demands}
    assert set(by_name) == {"on-b", "on-c"}
    assert by_name["on-b"].reason == "infeasible" and by_name["on-c"].reason == "no_label_match"


def test_an_actor_table_fallback_counts_where_the_request_has_none() -> None:
    """Ray 2.55-2.57 keep an actor's fallbacks in its actor table only."""
    actor = PendingActor(actor_id="1", name="x", required_resources=BIG, label_selector={"zone": "b"})
    read = PendingRead(
        nodes=[NODE_A, NODE_B],
        requests=[PendingRequest(shape=BIG, label_selectors=selected({"zone": "b"}))],
        actors=[actor],
        actor_fallbacks={"1": selected({"zone": "a"})},
    )
    assert one(read).reason == "waits_fallback"


def test_placement_group_bundles_each_on_the_nodes_their_selector_admits() -> None:
    gang = PendingGang(
        bundles=[{"CPU": 1}, {"GPU": 1}], details="ab12:PACK|PENDING",
        bundle_selectors=selected({"zone": "c"}, {"zone": "b"}),
    )  # fmt: skip
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], gangs=[gang]))
    assert demand.reason == "no_label_match"
    assert demand.reason_text == "bundle 0: no alive node has zone=c (zone: a on 1 node, b on 1)"
    assert demand.bundle_selectors == [{"zone": "c"}, {"zone": "b"}]
    spread = PendingGang(
        bundles=[{"GPU": 1}, {"GPU": 1}], details="ab12:STRICT_SPREAD|PENDING",
        bundle_selectors=selected({"zone": "b"}, {"zone": "b"}),
    )  # fmt: skip
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], gangs=[spread]))
    assert (demand.reason, demand.reason_text) == (
        "infeasible",
        "STRICT_SPREAD: bundle 1 has no node of its own left (1 node(s) its label selector admits,"
        " 1 bundle(s) before it)",
    )  # one zone=b node for two bundles of their own
    pack = PendingGang(
        bundles=[{"CPU": 1}, {"CPU": 1}], details="ab12:STRICT_PACK|PENDING",
        bundle_selectors=selected({"zone": "a"}, {"zone": "b"}),
    )  # fmt: skip
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], gangs=[pack]))
    assert demand.reason == "no_label_match" and demand.reason_text.startswith("STRICT_PACK: no alive node")


def test_a_selector_demand_line() -> None:
    request = PendingRequest(shape=BIG, label_selectors=selected({"zone": "b"}, {"zone": "a"}))
    demand = one(PendingRead(nodes=[NODE_A, NODE_B], requests=[request]))
    assert demand_line(demand) == "1 × GPU=0.01 VRAM_MB=20000  selects zone=b, else zone=a"
    request = PendingRequest(shape={}, label_selectors=selected({"zone": "x"}))
    assert (
        demand_line(one(PendingRead(nodes=[NODE_A], requests=[request])))
        == "1 × no resources  selects zone=x"
    )
