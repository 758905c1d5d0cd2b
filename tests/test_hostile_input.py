"""On a real head: a token holder's report with non-ASCII digits
in every string field takes no view down, and every other node is still served.

The reports (tests/hostile.py) go through the head's real report port, sealed with the
token, as an agent sends them; the views are asked of the head's real routes. Before (in
SECURITY.md): every view that merges answered HTTP 500 (``int('¹⁰')`` in ``rollup.sort_key``
for a node at ``¹⁰.⁰.⁰.⁵``; ``int('²')`` in ``placement.match_visible`` for a known node whose
``CUDA_VISIBLE_DEVICES`` is ``²,³``), while ``/healthz`` said ok.
"""

import json
import logging
import time
from email.message import Message

import msgspec
import pytest

from rayscope.head.serve.routes import Request, Routes
from rayscope.schema.report import NodeReport, SourceStatus
from rayscope.schema.status import ActorBooking
from rayscope.sinks.logs import LogThrottle
from tests.hostile import DIGITS, filled_strings, full_report, hostile_reports, string_fields
from tests.reliability_plugin import FaultRecord
from tests.scenarios import EUROPA, SEED_REPORTS, SEED_VIEWS, T4, view
from tests.support.report_port import Agent, Port

KNOWN = ("f1" * 28, "f2" * 28)
"""Two-GPU nodes the scheduler knows; hostile reports are sent for them."""
GOOD = {EUROPA: "172.17.0.3", T4: "10.0.0.5"}
"""Nodes with honest reports: every view must still show them."""
VIEWS = (
    "/v1/status",
    "/v1/status?gpus=1",
    "/v1/status?all=1&gpus=1",
    "/v1/status?format=lines",
    "/v1/status?format=lines&gpus=1",
    "/metrics",
    "/metrics?gpus=1",
    "/",
    "/v1/usage",
    "/healthz",
)


def test_the_hostile_report_fills_every_string_field_of_the_schema() -> None:
    """The generator's control: a string field added to the report schema and not filled by
    tests/hostile.py fails here (so the head test below covers it)."""
    assert filled_strings(full_report("ab" * 28, "10.0.0.5")) == string_fields(NodeReport)


def get(routes: Routes, target: str) -> tuple[int, str]:
    response = routes.answer(Request("GET", target, Message()))
    return response.status, response.body.decode()


def serves_the_good_nodes(target: str, body: str) -> bool:
    if target.startswith(("/v1/usage", "/healthz")):
        return True
    if target.startswith("/v1/status") and "format=lines" not in target:
        return set(GOOD) <= set(json.loads(body)["nodes"])
    return all(ip in body for ip in GOOD.values())


def serve_hostile_reports(port: Port, digits: str) -> dict[str, tuple[int, str]]:
    """The seed cluster and two known two-GPU nodes on a head with the actor table read;
    the honest agents' reports and :func:`tests.hostile.hostile_reports` sent through its
    report port; every view asked; (code, body) by view."""
    state = port.state
    known = [
        view(k, f"10.0.8.{i + 1}", {"CPU": 8, "GPU": 2}, {"CPU": 8, "GPU": 1}) for i, k in enumerate(KNOWN)
    ]
    state.set_view([*SEED_VIEWS, *known], SourceStatus(name="gcs", ok=True))
    actor = ActorBooking(
        actor_id="0123456789abcdef0123456702000000",
        node_id=KNOWN[0],
        pid=5100,
        required={"GPU": 1.0},
        gpu_ids=[1],
        gpu_shares=[(1, 1.0)],
    )
    state.set_actors([actor], SourceStatus(name="gcs_actors", ok=True))
    honest, hostile = Agent(port), Agent(port)
    acks = [honest.report(SEED_REPORTS[node_id].report) for node_id in GOOD]
    acks += [hostile.report(r) for r in hostile_reports(digits, KNOWN)]
    assert [reason for ack in acks for _, reason in ack] == [None] * 6  # every one taken
    state.fold_usage(time.monotonic())
    routes = Routes(state, (), LogThrottle(logging.getLogger("test")))
    return {target: get(routes, target) for target in VIEWS}


@pytest.mark.fault
def test_non_ascii_digits_in_every_string_field_take_no_view_down(fault: FaultRecord) -> None:
    """Before: 500 on 8 of the 10 views (``/v1/status``, ``?gpus=1``, ``/metrics``,
    ``format=lines``, the page) for the superscript set; ``٢`` and ``５`` read as digits. Now:
    200 everywhere for every set, the honest nodes served, nothing counted as unreadable."""
    fault.expect(
        "a token holder's reports with non-ASCII digits (², ٢, ５) in every string field",
        "every view of the head answers 200 and serves the other nodes; nothing unreadable"
        " (before: 8 of 10 views HTTP 500 for ², int('¹⁰') in rollup.sort_key)",
    )
    for name, digits in DIGITS.items():
        port = Port()
        try:
            answers = serve_hostile_reports(port, digits)
        finally:
            port.close()
        failed = {target: code for target, (code, _) in answers.items() if code != 200}
        assert failed == {}, name
        assert [t for t, (_, body) in answers.items() if not serves_the_good_nodes(t, body)] == []
        assert msgspec.json.decode(answers["/v1/status"][1])["nodes"][EUROPA]["node_ip"] == GOOD[EUROPA]
        assert set(KNOWN) <= set(json.loads(answers["/v1/status?gpus=1"][1])["nodes"])  # shown, not dropped
        # Nothing in them breaks a merge or a render any more (tests/test_isolation.py: what would).
        assert json.loads(answers["/healthz"][1])["render_errors"] == 0
        fault.observe(f"{name}: {len(answers) - len(failed)} of {len(VIEWS)} views 200, render_errors 0")
