"""One node's bad data is that node's problem. A node whose share of the
merge or of a renderer raises is shown as ``report unreadable: <why>`` and counted in
``/healthz``; every other node is served by every view.

The faults are injected where a node's data is handled (a function the merge or a renderer
calls per node, made to raise for one node), so each test holds whatever the next
unforeseen input is. Before (SECURITY.md): any of them was HTTP 500 on the view, for every
node, and ``/healthz`` said nothing.
"""

import json
import logging
from collections.abc import Callable
from email.message import Message
from typing import Any

import msgspec
import pytest

from rayscope.core import rollup
from rayscope.core.gpu import attribution, placement
from rayscope.head.serve.routes import Request, Routes
from rayscope.head.store.state import HeadState
from rayscope.render import gpus as render_gpus
from rayscope.render import metrics as render_metrics
from rayscope.render import status as render_status
from rayscope.render.page import document as render_page
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ActorBooking, ClusterStatus, NodeStatus
from rayscope.sinks.logs import LogThrottle
from tests.reliability_plugin import FaultRecord
from tests.scenarios import CPU, EUROPA, NOW, SEED_VIEWS, T4, gpu, report

BAD, GOOD = T4, EUROPA
BAD_IP, GOOD_IP = "10.0.0.5", "172.17.0.3"
WHY = "RuntimeError: a field no code foresaw"


def a_head(monkeypatch: pytest.MonkeyPatch) -> tuple[HeadState, Routes]:
    """The seed cluster on a head, both GPU nodes reporting, the actor table read."""
    monkeypatch.setattr("rayscope.head.serve.answers._monotonic", lambda: NOW)
    monkeypatch.setattr("rayscope.head.serve.routes.time.monotonic", lambda: NOW)
    state = HeadState(4.0, None)
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=NOW)
    state.set_actors(
        [ActorBooking(actor_id="a" * 32, node_id=GOOD)], SourceStatus(name="gcs_actors", ok=True)
    )
    for node_id, ip, name in ((GOOD, GOOD_IP, "NVIDIA GeForce RTX 3090"), (BAD, BAD_IP, "Tesla T4")):
        body = report(node_id, [gpu(0, 5.8, name)], ip).report
        state.ingest(msgspec.msgpack.encode(body), NOW)
    return state, Routes(state, (), LogThrottle(logging.getLogger("test")))


def get(routes: Routes, target: str) -> tuple[int, str]:
    response = routes.answer(Request("GET", target, Message()))
    return response.status, response.body.decode()


def fails_for_bad(function: Callable[..., Any], node_of: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, raising when ``node_of(*args)`` names the bad node."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        if node_of(*args, **kwargs) == BAD:
            raise RuntimeError("a field no code foresaw")
        return function(*args, **kwargs)

    return broken


def first_node(node: NodeStatus, *_: Any, **__: Any) -> str:
    """The node's id while it holds its report (what broke it is gone from an unreadable one)."""
    return node.node_id if node.gpus is not None else ""


def with_report(status: ClusterStatus, *_: Any, **__: Any) -> str:
    return BAD if BAD in status.nodes and status.nodes[BAD].gpus is not None else ""


def health(routes: Routes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(get(routes, "/healthz")[1])
    return document


def assert_isolated(routes: Routes, target: str, stage: str) -> str:
    """``target`` answers 200 with the good node served and the bad one unreadable, and
    ``/healthz`` counts the failure and says when; the body."""
    code, body = get(routes, target)
    assert code == 200, body
    if target.startswith("/v1/status") and "format=lines" not in target:
        nodes = json.loads(body)["nodes"]
        assert nodes[GOOD]["gpus"] and nodes[BAD]["unreadable"] == WHY
        assert nodes[BAD]["gpus"] is None and nodes[BAD]["total_cpu"] == 8  # the scheduler's numbers kept
    elif target.startswith("/metrics"):
        assert f'rayscope_gpu_memory_used_bytes{{node_id="{GOOD}"' in body
        assert f'rayscope_node_unreadable{{node_id="{BAD}",node_ip="{BAD_IP}"}} 1' in body
    else:
        assert GOOD_IP in body and f"report unreadable: {WHY}" in body
    said = health(routes)
    assert said["render_errors"] >= 1 and said["last_render_error"] == f"{stage} of node {BAD}: {WHY}"
    assert said["render_errors_since"] <= said["last_render_error_at"]
    return body


@pytest.mark.fault
def test_a_report_the_merge_fails_on_is_that_nodes_line(
    monkeypatch: pytest.MonkeyPatch, fault: FaultRecord
) -> None:
    fault.expect(
        "one node's report raises in the merge (a fault injected into rollup's per-report merge)",
        "every view answers 200, that node's line says 'report unreadable: <why>', the others are"
        " served, /healthz counts it (before: HTTP 500 on every view, /healthz silent)",
    )
    _, routes = a_head(monkeypatch)
    merged = rollup._merged_node
    monkeypatch.setattr(
        rollup, "_merged_node", fails_for_bad(merged, lambda known, received, *_: received.report.node_id)
    )
    for target in ("/v1/status", "/v1/status?format=lines", "/v1/status?gpus=1", "/metrics", "/"):
        assert_isolated(routes, target, "merge")
    lines = get(routes, "/v1/status?format=lines")[1]
    line = f"{BAD_IP} [worker] T4 GPU: 0.99/1 VRAM: NA/NA GB  CPU: 6/8  report unreadable: {WHY}"
    assert line in lines
    said = health(routes)
    headers = dict(routes.answer(Request("GET", "/v1/status", Message())).headers)
    assert headers["X-Rayscope-Exit"] == "1"  # partial: status --head says which node and why
    assert json.loads(headers["X-Rayscope-Note"]) == f"partial: report unreadable from 1 node(s): {BAD_IP}"
    fault.observe(f"5 of 5 views 200; its line: {line}; /healthz render_errors {said['render_errors']}")


def test_a_node_the_placement_fails_on_is_that_nodes_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``?gpus=1`` (the views that place and attribute): the match_visible hole's path."""
    _, routes = a_head(monkeypatch)
    monkeypatch.setattr(attribution, "place_devices", fails_for_bad(placement.place_devices, first_node))
    for target in ("/v1/status?gpus=1", "/v1/status?format=lines&gpus=1", "/metrics?gpus=1", "/"):
        assert_isolated(routes, target, "merge")


@pytest.mark.parametrize(
    ("module", "name", "node_of", "targets"),
    [
        (render_status, "node_line", first_node, ("/v1/status?format=lines",)),
        (
            render_gpus,
            "gpu_block_lines",
            lambda gpus, *_, **__: BAD if gpus[0].name == "Tesla T4" else "",
            ("/v1/status?format=lines&gpus=1",),
        ),
        (
            render_metrics,
            "_gpu_samples",
            lambda nodes: BAD if BAD in map(first_node, nodes) else "",
            ("/metrics",),
        ),
        (render_page, "gpu_bars", first_node, ("/",)),
        (render_status, "_shown", with_report, ("/v1/status",)),
    ],
    ids=["status lines", "gpus", "metrics", "page", "json"],
)
def test_a_node_a_renderer_fails_on_is_that_nodes_line(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, node_of: Any, targets: tuple[str, ...]
) -> None:
    _, routes = a_head(monkeypatch)
    monkeypatch.setattr(module, name, fails_for_bad(getattr(module, name), node_of))
    for target in targets:
        assert_isolated(routes, target, "render")


def test_a_failure_that_is_no_nodes_is_still_a_500(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: the isolation renders nodes alone, it does not hide a bug of the
    whole (the cluster line) behind made-up unreadable nodes."""
    _, routes = a_head(monkeypatch)

    def broken(_: ClusterStatus) -> str:
        raise RuntimeError("cluster line")

    monkeypatch.setattr(render_status, "cluster_line", broken)
    assert get(routes, "/v1/status?format=lines")[0] == 500
    assert health(routes)["render_errors"] == 0


def test_every_node_is_served_while_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    _, routes = a_head(monkeypatch)
    for target in ("/v1/status?gpus=1", "/v1/status?format=lines&gpus=1", "/metrics?gpus=1", "/"):
        code, body = get(routes, target)
        assert code == 200 and "unreadable" not in body
    said = health(routes)
    assert (said["render_errors"], said["render_errors_since"], said["last_render_error"]) == (0, None, "")
    assert CPU in get(routes, "/v1/status")[1]
