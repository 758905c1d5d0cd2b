"""JSON nested deeper than the decoder goes is that peer's failure, never a crash
(rayscope.net.peer_json, SECURITY.md *Peer JSON*): from Ray's dashboard, whether ``status``,
``fit`` and ``rayscope.cluster_state()`` found it by ``--dashboard`` or in the GCS; from a
head agent answering ``--head``; in the head's own read of the dashboard; in the head's state
file, the cluster's metadata in the GCS, a raylet's ``--labels`` and the report wire.

Before (measured on 8b32fdd): a 2 KB dashboard answer nesting 1,000 brackets in a field
rayscope never reads made ``status``, ``fit`` and ``cluster_state()`` exit 70 (``internal
error: RecursionError``) by either address, and the head's poll round raise; a head's answer
or its ``X-Rayscope-Note`` so nested made ``status --head`` exit 70; the GCS's metadata so
nested made the GCS child crash, and with it the whole GCS read. Positive control: make
``peer_json.check_depth`` return at once and take ``RecursionError`` out of the two ``except``
clauses of ``rayscope.net.peer_json``: 15 of the tests here fail again (RecursionError, exit 70).
"""

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import msgspec
import pytest

import rayscope
from rayscope.cli import fast_status
from rayscope.client import head as client_head
from rayscope.core.validate import ReportError
from rayscope.errors import EXIT_INTERNAL, AgentError
from rayscope.head.poll.dashboard import DashboardSetting, poll_dashboard
from rayscope.head.store.state import HeadState
from rayscope.head.store.usage_store import read_state
from rayscope.schema.report import SourceStatus
from rayscope.sources import raylet
from rayscope.sources.gcs import child as gcs_child
from rayscope.sources.gcs import raycompat
from tests import scenarios
from tests.support.dashboard import FakeDashboard, answer, http, node
from tests.support.fake_head import FakeHead, run_cli, run_entry

DEEP = 1_000
"""What a 2 KB answer nests: far past the interpreter's recursion limit."""
RAY = "2.60.0"


def with_deep_field(body: bytes, levels: int = DEEP) -> bytes:
    """A dashboard answer with a field rayscope never reads nested ``levels`` deep."""
    assert body.endswith(b"}")
    return body[:-1] + b', "unread": ' + b"[" * levels + b"]" * levels + b"}"


DEEP_ANSWER = with_deep_field(answer(node(scenarios.T4)))


# --- status, fit and cluster_state() against a dashboard that nests too deep ------------------


class FakeGcs:
    """The GCS read's child, answered here: the seed's scheduler view and, with ``published``,
    the dashboard address the cluster published in its KV."""

    def __init__(self, published: Optional[str]) -> None:
        self.published = published

    def __call__(
        self,
        address: str,
        timeout_s: float,
        python: Optional[str],
        actors: bool,
        watch: Optional[gcs_child.Watch] = None,
        _answer: Optional[list[Any]] = None,
    ) -> tuple[Any, Any, Any, list[SourceStatus]]:
        if _answer is not None:
            _answer.append({"cluster_ray_version": RAY, "dashboard_url": self.published})
        ok = SourceStatus(name="gcs", ok=True, detail=address)
        return list(scenarios.SEED_VIEWS), ([] if actors else None), None, [ok]


@pytest.fixture
def dashboards() -> Iterator[Callable[[bytes], FakeDashboard]]:
    started: list[FakeDashboard] = []

    def serving(body: bytes) -> FakeDashboard:
        server = FakeDashboard(lambda conn, _request: conn.sendall(http(200, body)))
        started.append(server)
        return server

    yield serving
    for server in started:
        server.close()


def host_port(url: str) -> str:
    return url.removeprefix("http://")


def embedded(monkeypatch: pytest.MonkeyPatch, published: Optional[str]) -> None:
    """``status`` and ``fit`` without a head agent, on the seed's GCS view, no raylet here."""
    for name in ("RAYSCOPE_HEAD", "RAYSCOPE_DASHBOARD", "RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(gcs_child, "read_pending_too", FakeGcs(published))
    monkeypatch.setattr(raylet, "find_raylets", lambda: ([], SourceStatus(name="raylet", ok=True)))


def dashboard_lines(out: str, err: str) -> list[str]:
    return [line for line in (out + err).splitlines() if "dashboard" in line.lower()]


def without_dashboard_words(text: str) -> list[str]:
    return [line for line in text.splitlines() if "dashboard" not in line.lower()]


@pytest.mark.parametrize("origin", ["--dashboard", "GCS"])
def test_status_shows_every_other_figure_and_one_line_naming_the_dashboard(
    origin: str,
    dashboards: Callable[[bytes], FakeDashboard],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hostile, failing = dashboards(DEEP_ANSWER), dashboards(b"{}")
    assert len(DEEP_ANSWER) < 2_500
    runs = {}
    for name, server in (("deep", hostile), ("failing", failing)):
        embedded(monkeypatch, host_port(server.url) if origin == "GCS" else None)
        argv = ["status", "--gcs", "127.0.0.1:6379"]
        argv += ["--dashboard", server.url] if origin == "--dashboard" else []
        runs[name] = run_cli(argv, capsys)
    code, out, err = runs["deep"]
    assert code != EXIT_INTERNAL and "internal error" not in err and "Traceback" not in err, err
    assert code == runs["failing"][0]
    said = [line for line in out.splitlines() if line.startswith("DASHBOARD:")]
    assert len(said) == 1 and hostile.url in said[0] and "levels deep, over the 64 decoded" in said[0], out
    # A broken dashboard costs only its figures: the rest as with one that answered no summary.
    assert without_dashboard_words(out) == without_dashboard_words(runs["failing"][1])
    assert "10.0.0.5" in out and "172.17.0.3" in out  # every node, with the scheduler's figures


def test_status_json_and_fit_say_it_in_their_sources(
    dashboards: Callable[[bytes], FakeDashboard],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = dashboards(DEEP_ANSWER)
    embedded(monkeypatch, host_port(server.url))
    code, out, err = run_cli(["status", "--gcs", "127.0.0.1:6379", "--json"], capsys)
    assert code != EXIT_INTERNAL and "internal error" not in err, err
    doc = msgspec.json.decode(out)
    [source] = [s for s in doc["sources"] if s["name"] == "dashboard"]
    assert not source["ok"] and "levels deep, over the 64 decoded" in source["reason"]
    assert set(doc["nodes"]) == {v.node_id for v in scenarios.SEED_VIEWS}
    code, out, err = run_cli(["fit", "--gcs", "127.0.0.1:6379", "--gpu-memory-mb", "1024"], capsys)
    assert code != EXIT_INTERNAL and "internal error" not in err and "Traceback" not in err, err


def test_cluster_state_returns_the_document_with_the_dashboards_failure(
    dashboards: Callable[[bytes], FakeDashboard], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = dashboards(DEEP_ANSWER)
    embedded(monkeypatch, None)
    doc = rayscope.cluster_state(gcs="127.0.0.1:6379", dashboard=server.url)
    [source] = [s for s in doc["sources"] if s["name"] == "dashboard"]
    assert not source["ok"] and server.url in source["reason"]
    assert len(doc["nodes"]) == len(scenarios.SEED_VIEWS)
    embedded(monkeypatch, host_port(server.url))
    assert rayscope.fit(gpu_memory_mb=1024, gcs="127.0.0.1:6379")["shape"]


# --- the head's own read of the dashboard -------------------------------------------------------


class FakeReader:
    """The head's GCS client, answering the seed's view and the dashboard it published."""

    address = "127.0.0.1:6379"
    timeout_s = 5.0
    cluster_ray_version = RAY
    versions = None

    def __init__(self, published: str) -> None:
        self.published = published

    def read(self) -> tuple[list[Any], SourceStatus]:
        return list(scenarios.SEED_VIEWS), SourceStatus(name="gcs", ok=True, detail=self.address)

    def read_actors(self) -> tuple[Any, SourceStatus]:
        return [], SourceStatus(name="gcs_actors", ok=True)

    def read_pending(self) -> tuple[Any, SourceStatus]:
        return None, SourceStatus(name="gcs_pending", ok=True)

    def dashboard_url(self) -> tuple[Optional[str], str]:
        return self.published, ""


def test_the_heads_dashboard_read_is_one_line_and_never_raises(
    dashboards: Callable[[bytes], FakeDashboard], caplog: pytest.LogCaptureFixture
) -> None:
    """The head's read of the dashboard (its poll, in the poller's round or a thread of its
    own) keeps the failure as the source's one-line reason; it raised ``RecursionError``."""
    server = dashboards(DEEP_ANSWER)
    state = HeadState(5.0, "127.0.0.1:6379")
    reader: Any = FakeReader(host_port(server.url))
    views, gcs_status = reader.read()
    state.set_view(views, gcs_status)
    with caplog.at_level(logging.DEBUG, logger="rayscope"):
        poll_dashboard(state, reader, DashboardSetting(None, {}))
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    doc = state.status(0.0)
    [source] = [s for s in doc.sources if s.name == "dashboard"]
    assert not source.ok and "\n" not in source.reason
    assert source.reason.startswith(f"the Ray dashboard at {server.url} answered no node summary")
    assert "levels deep, over the 64 decoded" in source.reason
    assert set(doc.nodes) >= {v.node_id for v in scenarios.SEED_VIEWS}


# --- a head agent whose answers nest too deep ----------------------------------------------------


class DeepHead(FakeHead):
    """A head agent whose document (``where="body"``) or note header nests too deep."""

    def __init__(self, where: str) -> None:
        super().__init__(scenarios.seed_status(), mode="old" if where == "body" else "new")
        self.where = where

    def answer(
        self, path: str, authorization: Optional[str]
    ) -> tuple[int, str, bytes, list[tuple[str, str]]]:
        code, kind, body, headers = super().answer(path, authorization)
        nested = "[" * DEEP + "]" * DEEP
        if self.where == "body":
            return code, "application/json", b'{"schema": 2, "x": ' + nested.encode() + b"}", headers
        return code, kind, body, [(k, nested if k == "X-Rayscope-Note" else v) for k, v in headers]


def token_file(tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123456789abcdef\n")
    token.chmod(0o600)
    return token


HEAD_READS = [["status"], ["status", "--json"], ["fit", "--gpu-memory-mb", "1024"], ["usage"]]
DEEP_PARTS = [
    (where, argv) for where in ("body", "note") for argv in HEAD_READS if (where, argv) != ("note", ["usage"])
]
"""Each read of a head, with its body nesting too deep and with its note header so: ``usage``
reads no ``X-Rayscope-Note``, so it has the body case only."""


@pytest.mark.parametrize(("where", "argv"), DEEP_PARTS, ids=[f"{w}-{' '.join(a)}" for w, a in DEEP_PARTS])
def test_a_head_whose_answer_nests_too_deep_is_one_line_and_exit_2(
    where: str,
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    token = token_file(tmp_path)
    monkeypatch.delenv("RAYSCOPE_HEAD", raising=False)
    head = DeepHead(where)
    try:
        code, out, err = run_entry(
            [*argv, "--head", head.url, "--token-file", str(token)], capsys, monkeypatch
        )
    finally:
        head.close()
    assert "Traceback" not in err and "internal error" not in err, err
    if where == "note":  # not taken: the CLI reads the document and judges it itself
        assert code in (0, 1) and out and len(err.strip().splitlines()) <= 1, err
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and head.url in lines[0], err


def test_the_api_raises_its_error_for_a_head_that_nests_too_deep(tmp_path: Path) -> None:
    head = DeepHead("body")
    try:
        for call in (rayscope.cluster_state, rayscope.usage):
            with pytest.raises(rayscope.RayscopeError) as raised:
                call(head=head.url, token_file=str(token_file(tmp_path)))
            assert raised.value.exit_code == 2 and "JSON nested" in str(raised.value)
    finally:
        head.close()


def test_the_clients_decoder_names_the_head() -> None:
    body = b'{"schema": 2, "nodes": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    with pytest.raises(AgentError) as raised:
        client_head._decoded("http://h:7532", body, client_head._STATUS)
    assert str(raised.value).startswith("unexpected answer from head agent at http://h:7532: JSON nested")


def test_fast_status_headers_nested_too_deep_are_not_taken() -> None:
    nested = "[" * DEEP + "]" * DEEP
    headers = {"x-rayscope-schema": "2", "x-rayscope-exit": "1", "x-rayscope-note": nested}
    assert fast_status.status_headers(headers, verbose=False) is None
    assert fast_status._json_text(nested.encode(), {}) is None


# --- files and fields other processes wrote ------------------------------------------------------


def test_a_state_file_nested_too_deep_starts_an_empty_history(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    path.write_bytes(b'{"schema": 1, "x": ' + b"[" * DEEP + b"]" * DEEP + b"}")
    path.chmod(0o600)
    assert read_state(str(path)) is None


class MetadataClient:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def internal_kv_get(self, key: bytes, namespace: bytes, timeout: float) -> bytes:
        return self.raw


def test_the_clusters_metadata_nested_too_deep_is_a_reason_not_a_crash() -> None:
    """The GCS child reads it (any peer of a cluster without token auth writes the KV)."""
    nested = b'{"ray_version": "2.60.0", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    version, why = raycompat.cluster_ray_version(MetadataClient(nested), 1.0)
    assert version is None and why == "the cluster's metadata is not JSON"
    huge = b'{"ray_version": "2.60.0", "x": "' + b"x" * raycompat.MAX_METADATA_BYTES + b'"}'
    assert raycompat.cluster_ray_version(MetadataClient(huge), 1.0) == (
        None,
        "the cluster's metadata is over 64 KiB: not Ray's",
    )
    assert raycompat.cluster_ray_version(MetadataClient(b'{"ray_version": "2.60.0"}'), 1.0) == ("2.60.0", "")


def test_a_raylets_labels_nested_too_deep_are_none() -> None:
    assert raylet.parse_labels("[" * DEEP + "]" * DEEP) == {}
    assert raylet.parse_labels('{"zone": "a"}') == {"zone": "a"}


def test_the_gcs_childs_answer_nested_too_deep_is_the_reads_failure(tmp_path: Path, fake_gcs: str) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nprintf '%s' '" + "[" * DEEP + "]" * DEEP + "'\n")
    python.chmod(0o755)
    views, _, statuses = gcs_child.read_cluster(fake_gcs, 5.0, str(python))
    assert views == [] and not statuses[0].ok and "failed" in statuses[0].reason


def test_a_report_nesting_an_unknown_field_too_deep_is_rejected() -> None:
    """SECURITY.md: nesting too deep for the decoder is a rejection, not a crash (msgpack
    skips an unknown field by recursing into it, as JSON does)."""
    outer = msgspec.msgpack.encode(scenarios.SEED_REPORTS[scenarios.EUROPA].report)
    assert 0x80 <= outer[0] <= 0x8E  # a map of under 15 entries: one more key is one more entry
    deep_value = b"\x91" * 100_000 + b"\x90"  # [[[...[]...]]]
    payload = bytes([outer[0] + 1]) + outer[1:] + b"\xa7unknown" + deep_value
    state = HeadState(5.0, None)
    state.ingest(bytes([outer[0] + 1]) + outer[1:] + b"\xa7unknown" + b"\x91\x90", 0.0)  # shallow: taken
    state = HeadState(5.0, None)
    with pytest.raises(ReportError, match="malformed report"):
        state.ingest(payload, 0.0)
    assert state.health()["nodes_reporting"] == 0


def test_a_shape_nested_too_deep_is_a_usage_error() -> None:
    """The operator's own text, not a peer's: still one line, exit 2, not 70."""
    from rayscope.core.capacity.sizing import parse_shape

    with pytest.raises(AgentError) as raised:
        parse_shape("[" * 100_000 + "]" * 100_000)
    assert raised.value.exit_code == 2 and "nested too deep" in str(raised.value)
