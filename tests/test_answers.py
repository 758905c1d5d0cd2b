"""The head's answers at scale: the rollup's per-report cache, answers rendered once per
change, the status lines served by the head, and the summary of a big cluster."""

import gzip
import json
import logging
from email.message import Message

import msgspec
import pytest

from rayscope.core.completeness import assess
from rayscope.core.rollup import merge, scheduler_nodes, scheduler_sums
from rayscope.head.serve import answers
from rayscope.head.serve import routes as routes_module
from rayscope.head.serve.routes import Request, Response, Routes
from rayscope.head.store.reports import SharedGpuWatch
from rayscope.head.store.state import HeadState
from rayscope.net import http as net_http
from rayscope.render.status import SUMMARY_NODES, status_json_into, status_lines, status_text_lines
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import ClusterStatus, ReceivedReport
from rayscope.sinks.logs import LogThrottle
from tests.reliability_plugin import FaultRecord
from tests.scenarios import EUROPA, NOW, SEED_REPORTS, SEED_VIEWS, T4, gpu, report, view
from tests.tools import bench


def fresh_copies(reports: dict[str, ReceivedReport]) -> dict[str, ReceivedReport]:
    """The same reports without anything the rollup cached on them."""
    return {
        k: ReceivedReport(report=r.report, received_at=r.received_at, local=r.local)
        for k, r in reports.items()
    }


@pytest.mark.parametrize("later_s", [0.0, 0.05, 7.0, 13.0, 14.99, 16.0, 40.0])
def test_a_cached_merge_is_the_merge(later_s: float) -> None:
    """Query after query the rollup reuses each report's merge and only moves its ages; at
    every instant (fresh, about to go stale, stale) that is the document a merge from
    scratch gives, byte for byte."""
    base = scheduler_nodes(SEED_VIEWS)
    cached = dict(SEED_REPORTS)
    local = ReceivedReport(report=SEED_REPORTS[T4].report, received_at=NOW - 30, local=True)
    cached[T4] = local
    for warm in (NOW, NOW + 1.0):  # the caches filled at other instants
        merge(base, cached, now=warm, stale_after_s=15.0, view="head", wall_now=warm + 5)
    now = NOW + later_s

    def document(reports: dict[str, ReceivedReport]) -> bytes:
        status = merge(base, reports, now=now, stale_after_s=15.0, view="head", wall_now=now + 5)
        return msgspec.json.encode(status)

    assert document(cached) == document(fresh_copies(cached))


def test_a_new_scheduler_view_is_merged_anew() -> None:
    """The cache is keyed by the scheduler node it merged into: a new view (other bookings)
    shows in the next merge."""
    reports = dict(SEED_REPORTS)
    first = merge(scheduler_nodes(SEED_VIEWS), reports, now=NOW, stale_after_s=15.0, view="head")
    views = [
        view(EUROPA, "172.17.0.3", {"CPU": 8, "GPU": 1, "VRAM_MB": 24576}, {"GPU": 0.5, "VRAM_MB": 0}),
        *SEED_VIEWS[1:],
    ]
    second = merge(scheduler_nodes(views), reports, now=NOW, stale_after_s=15.0, view="head")
    assert (first.nodes[EUROPA].used_gpu, second.nodes[EUROPA].used_gpu) == (0.04, 0.5)
    assert second.nodes[EUROPA].used_gpu_memory_bytes == first.nodes[EUROPA].used_gpu_memory_bytes


def head_with_seed(interval_s: float = 4.0) -> tuple[HeadState, Routes]:
    state = HeadState(interval_s, None)
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=NOW)
    return state, Routes(state, (), LogThrottle(logging.getLogger("test")))


def ingest(state: HeadState, node_id: str, ip: str, used_gib: float, at: float) -> None:
    body = report(node_id, [gpu(0, used_gib)], ip).report
    state.ingest(msgspec.msgpack.encode(body), at)


def get(routes: Routes, target: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    message = Message()
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    response = routes.answer(Request("GET", target, message))
    return response.status, dict(response.headers), bytes(response.body)


def test_an_answer_is_rendered_once_per_change_and_the_clock_moves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Repeated requests are served the same bytes; a new report shows once the render is
    older than a quarter interval; with nothing new, the clock alone re-renders after half
    an interval (ages and staleness move with it)."""
    clock = [NOW]
    monkeypatch.setattr(answers, "_monotonic", lambda: clock[0])
    state, routes = head_with_seed(interval_s=4.0)  # refresh 0.5 s, max age 2 s
    ingest(state, EUROPA, "172.17.0.3", 5.8, NOW)
    first = get(routes, "/v1/status")
    assert [get(routes, "/v1/status") for _ in range(5)] == [first] * 5
    assert routes.answers.renders == 1
    ingest(state, EUROPA, "172.17.0.3", 9.0, NOW + 0.1)
    clock[0] = NOW + 0.4
    assert get(routes, "/v1/status") == first  # younger than the refresh: still served
    clock[0] = NOW + 0.6
    _, _, body = get(routes, "/v1/status")
    assert json.loads(body)["nodes"][EUROPA]["used_gpu_memory_bytes"] == 9 * 1024**3
    assert routes.answers.renders == 2
    clock[0] = NOW + 1.5
    get(routes, "/v1/status")
    assert routes.answers.renders == 2  # nothing changed, younger than the max age
    clock[0] = NOW + 2.7
    get(routes, "/v1/status")
    assert routes.answers.renders == 3


def test_a_render_reuses_the_previous_buffer_only_when_no_client_holds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a change, ``/v1/status`` is encoded into the previous render's buffer when
    nothing else holds it (no fresh pages: a third of the encode at 10,000 nodes); a
    response still being sent keeps its bytes, and the render takes a new buffer.
    Positive control: drop the ``sys.getrefcount`` check in ``answers._spare`` and the held
    response's bytes change under it."""
    clock = [NOW]
    monkeypatch.setattr(answers, "_monotonic", lambda: clock[0])
    encode = status_json_into
    given: list[int] = []  # per render: the id of the buffer it was given, 0 for a new one

    def spy(status: ClusterStatus, buffer: bytearray, include_dead: bool = False) -> bytearray:
        given.append(id(buffer) if buffer else 0)
        return encode(status, buffer, include_dead)

    monkeypatch.setattr(routes_module, "status_json_into", spy)
    state, routes = head_with_seed(interval_s=4.0)

    def changed(gib: float) -> Response:
        ingest(state, EUROPA, "172.17.0.3", gib, clock[0])
        clock[0] += 1.0  # past the refresh
        return routes.answer(Request("GET", "/v1/status", Message()))

    first_id = id(changed(5.8).body)
    second = changed(6.0).body
    assert given == [0, first_id] and id(second) == first_id  # nobody held it: written in place
    del second
    held = changed(7.0)  # a client is being sent this one
    kept = bytes(held.body)
    after = changed(8.0).body
    assert given[-1] == 0 and after is not held.body and bytes(held.body) == kept
    for body, gib in ((held.body, 7.0), (after, 8.0)):
        document = json.loads(bytes(body))  # whole, and nothing of an earlier one after it
        assert document["nodes"][EUROPA]["used_gpu_memory_bytes"] == int(gib * 1024**3)


def test_the_head_looks_for_shared_gpus_only_while_two_reports_list_one() -> None:
    """The rollup looks through every node's GPUs for time-sliced ones only while two of the
    reports list one UUID (``SharedGpuWatch``, kept per merge from the reports that changed):
    the head's status says so exactly when a merge that always looks does.
    Positive control: never count in ``SharedGpuWatch._count`` and the shared GPU is not said."""
    watch = SharedGpuWatch()
    reports: dict[str, ReceivedReport] = {}
    verdicts = []
    for key, index in ((EUROPA, 0), (T4, 1), (T4, 0), (T4, 0), (EUROPA, 2)):
        reports[key] = report(key, [gpu(index, 1.0)], "10.0.0.5")
        verdicts.append(watch.unique(reports))
    del reports[T4]
    assert (verdicts, watch.unique(reports), watch.repeated) == ([True, True, False, False, True], True, 0)
    state, _ = head_with_seed()
    ingest(state, EUROPA, "172.17.0.3", 5.8, NOW)
    ingest(state, T4, "10.0.0.5", 3.0, NOW)  # the same GPU UUID: time-slicing
    shared = state.status(NOW + 1)
    assert shared.cluster.shared_gpus == 1
    looked = merge(state._base, dict(state._table.reports), now=NOW + 1, stale_after_s=12.0, view="head")
    shared.generated_at = looked.generated_at = 0.0
    shared.sources = looked.sources
    assert msgspec.json.encode(shared.nodes) == msgspec.json.encode(looked.nodes)


def test_status_answers_carry_what_status_would_say() -> None:
    """``format=lines`` is what ``status`` prints; every status answer carries its exit code
    and notes; gzip on request, the same bytes inside."""
    state, routes = head_with_seed()
    for node_id, ip in ((EUROPA, "172.17.0.3"), (T4, "10.0.0.5")):
        ingest(state, node_id, ip, 5.8, NOW)
    code, headers, body = get(routes, "/v1/status?format=lines&gpus=1")
    status = state.status(NOW, gpus=True)
    assert code == 200
    assert body.decode() == "\n".join(status_text_lines(status, False, True)) + "\n"
    exit_code, note = assess(status)
    assert (int(headers["X-Rayscope-Exit"]), json.loads(headers["X-Rayscope-Note"])) == (
        exit_code,
        note or "",
    )
    assert (exit_code, note) == (0, None)  # the CPU node runs no agent: that is not partial data
    assert json.loads(headers["X-Rayscope-Notes"])[0] == "sources:"
    _, zipped_headers, zipped = get(routes, "/v1/status?format=lines&gpus=1", Accept_Encoding="gzip, br")
    assert zipped_headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == body
    _, json_headers, document = get(routes, "/v1/status")
    assert json_headers["X-Rayscope-Exit"] == headers["X-Rayscope-Exit"]
    assert set(json.loads(document)["nodes"]) == {EUROPA, T4, SEED_VIEWS[2].node_id}


def test_a_peers_text_cannot_break_a_header() -> None:
    """The note quotes node labels a report chose: encoded, never a raw CR or LF."""
    state, routes = head_with_seed()
    rogue = report("ab" * 28, [gpu(0, 1.0)], "10.9.9.9").report
    rogue.host.hostname = "evil\r\nSet-Cookie: x=1"  # type: ignore[union-attr]
    state.ingest(msgspec.msgpack.encode(rogue), NOW - 100)  # stale at once: quoted in the note
    _, headers, _ = get(routes, "/v1/status")
    assert all("\r" not in v and "\n" not in v for v in headers.values())


def big_cluster(nodes: int, stale: int) -> HeadState:
    views = [
        view(f"{i:056x}", f"10.1.{i // 256}.{i % 256}", {"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1})
        for i in range(nodes)
    ]
    state = HeadState(5.0, None)
    state.set_view(views, SourceStatus(name="gcs", ok=True), read_at=NOW)
    for i, v in enumerate(views):
        ingest(state, v.node_id, v.node_ip, 1.0, NOW - (60 if i < stale else 0))
    return state


def test_a_big_cluster_lists_only_the_nodes_that_need_attention() -> None:
    """Over SUMMARY_NODES nodes the lines name the stale ones and count the rest; --all (and
    a small cluster) lists every node."""
    status = big_cluster(SUMMARY_NODES + 10, stale=2).status(NOW)
    lines = status_lines(status, summary=True)
    node_lines = [line for line in lines if line.startswith("  10.1.")]
    assert len(node_lines) == 2 and all("stale 60s" in line for line in node_lines)
    assert f"  ... and {SUMMARY_NODES + 8} more, nothing to flag (--all lists every node)" in lines
    every = [line for line in status_lines(status, include_dead=True) if line.startswith("  10.1.")]
    assert len(every) == SUMMARY_NODES + 10
    small = big_cluster(SUMMARY_NODES, stale=2).status(NOW)
    assert status_lines(small, summary=True) == status_lines(small)


def test_the_bookings_summed_once_per_view_are_the_bookings_summed_per_query() -> None:
    """The head sums the scheduler's bookings when a view arrives, not on every query: the
    same cluster line either way, dead nodes and nodes the scheduler does not know left out."""
    dead = view("de" * 28, "10.0.0.9", {"CPU": 4, "GPU": 1}, None, alive=False)
    base = scheduler_nodes([*SEED_VIEWS, dead])
    reports = {**SEED_REPORTS, "99" * 28: report("99" * 28, [gpu(0, 1.0)], "10.0.0.12")}
    per_query = merge(base, reports, now=NOW, stale_after_s=15.0, view="head")
    per_view = merge(
        base, reports, now=NOW, stale_after_s=15.0, view="head", sums=scheduler_sums(base.values())
    )
    assert msgspec.json.encode(per_view) == msgspec.json.encode(per_query)
    assert per_view.cluster.total_cpu == 32 and per_view.cluster.nodes_dead == 1


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        ("gzip", True),
        ("gzip, br", True),
        ("GZIP;Q=1", True),
        ("gzip;q=0.001", True),
        ("br, gzip ; q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("*;q=0.1", True),
        ("gzip;q=1.", True),
        ("", False),
        ("identity", False),
        ("br", False),
        ("gzip;q=0", False),
        ("gzip;q=0.000", False),
        ("gzip; q=0, *", False),  # named and refused: the star does not bring it back
        ("*;q=0", False),
        ("gzip;q=1.5", False),  # a weight that does not parse: not offered
        ("gzip;q=\u00b9", False),  # '¹': isdigit(), not a weight
        ("gzip;q=0.\u0665", False),  # Arabic-Indic five
        ("gzip;q=-1", False),
        ("nogzip", False),
    ],
)
def test_accept_encoding_is_read_with_its_weights(header: str, gzipped: bool) -> None:
    assert answers.accepts_gzip(header) == gzipped


@pytest.mark.fault
def test_gzip_refused_with_q_0_is_not_sent_and_every_answer_says_vary(fault: FaultRecord) -> None:
    """Before: ``Accept-Encoding: gzip;q=0`` (gzip refused) got gzip,
    and no answer said ``Vary: Accept-Encoding`` (a cache could serve one client's gzip
    body to another). Positive control: test ``"gzip" in header`` again in ``Routes._status``."""
    fault.expect(
        "a client that refuses gzip (`Accept-Encoding: gzip;q=0`) asks /v1/status, its lines and /metrics",
        "no Content-Encoding; `Vary: Accept-Encoding` on every answer, gzipped or not"
        " (before, 5cffc7d: gzip sent, no Vary)",
    )
    state, routes = head_with_seed()
    ingest(state, EUROPA, "172.17.0.3", 5.8, NOW)
    for path in ("/v1/status", "/v1/status?format=lines", "/metrics"):
        _, plain_headers, plain = get(routes, path)
        _, refused_headers, refused = get(routes, path, Accept_Encoding="gzip;q=0")
        _, zipped_headers, zipped = get(routes, path, Accept_Encoding="gzip;q=0.5")
        assert "Content-Encoding" not in refused_headers and refused == plain, path
        assert zipped_headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == plain, path
        for headers in (plain_headers, refused_headers, zipped_headers):
            assert headers["Vary"] == "Accept-Encoding", path
    fault.observe("gzip;q=0: identity on all 3; gzip;q=0.5: gzip; Vary: Accept-Encoding on all 9 answers")


def test_a_note_about_many_nodes_names_a_few_and_counts_the_rest() -> None:
    """4,000 nodes whose agents stopped: the note (stderr, and a header of every status
    answer) names 20 and counts the others, so the answer's headers stay far under what a
    client takes (64 KiB). Before: every node named, 75 KB of ``X-Rayscope-Note``, and
    ``status --head`` refused the answer (exit 2, "headers over 64 KiB") instead of saying
    partial (exit 1). Positive control: ``NAMED = 10**6`` in agent/rayscope/core/completeness.py."""
    reports = bench.synthetic_reports(4000)
    state = HeadState(5.0, None)
    state.set_view(bench.synthetic_views(reports), SourceStatus(name="gcs", ok=True), read_at=100.0)
    for r in reports:
        state.ingest(msgspec.msgpack.encode(r), 0.0)
    status = state.status(100.0)  # every report 100 s old: stale after 15 s
    headers = dict(answers.status_headers(status))
    note = json.loads(headers["X-Rayscope-Note"])
    assert headers["X-Rayscope-Exit"] == "1" and note.startswith("partial: stale report from 4000 node(s): ")
    assert note.endswith(" and 3,980 more") and note.count("(100s)") == 20
    assert sum(len(k) + len(v) + 4 for k, v in headers.items()) < net_http.MAX_HEAD_BYTES // 16
