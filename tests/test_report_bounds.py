"""Rule 4 of SECURITY.md: a report cannot bend the view, even one from a node holding the token.

Each hostile report is what a token holder can send: it is decoded by the head's own
``HeadState.ingest`` (the frame layer is tested in tests/test_wire.py). A rejected report
raises ``ReportError``, which the connection counts in ``frames_rejected``.
"""

import math
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from rayscope.core.completeness import completeness_note
from rayscope.core.validate import ReportError
from rayscope.head.store.state import HeadState
from rayscope.render.gpus import status_gpu_lines
from rayscope.render.metrics import metrics_text
from rayscope.render.status import source_details, status_json, status_lines
from rayscope.schema.report import GpuDevice, GpuProcess, HostInfo, NodeReport, RayletInfo, SourceStatus
from rayscope.schema.status import RayNode
from tests.scenarios import NOW, gpu, view

INTERVAL_S = 1.0
NODE = "ab" * 28
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def report(**fields: Any) -> NodeReport:
    base: dict[str, Any] = {
        "node_id": NODE,
        "collected_at": NOW,
        "raylet": RayletInfo(pid=10, node_id=NODE, node_ip="10.0.0.5"),
        "host": HostInfo(hostname="gpu-5", cpu_count=8),
        "gpus": [gpu(0, 5.0)],
        "sources": [SourceStatus(name="nvml", ok=True)],
    }
    return NodeReport(**{**base, **fields})


def ingest(state: HeadState, value: Any, received_at: float = NOW) -> NodeReport:
    return state.ingest(msgspec.msgpack.encode(value), received_at)


def test_staleness_uses_the_heads_interval_not_the_reports() -> None:
    """A report claiming ``interval_s`` of a year stayed fresh for three years.
    Positive control: put ``report.interval_s`` back into ``rollup._apply_report``'s limit."""
    state = HeadState(INTERVAL_S, None)
    ingest(state, report(interval_s=365 * 86400.0), received_at=NOW - 10 * INTERVAL_S)
    node = state.status(NOW).nodes[NODE]
    assert node.stale and node.agent == "stale"


def _gpus(n: int) -> list[GpuDevice]:
    return [GpuDevice(index=i) for i in range(n)]


MIG = GpuDevice(index=0)
INF = {"GPU": math.inf}
HOSTILE: dict[str, Any] = {
    "10k GPUs": report(gpus=_gpus(10_000)),
    "10k processes on one GPU": report(gpus=[GpuDevice(index=0, processes=[GpuProcess(pid=1)] * 10_000)]),
    "a 1 MB hostname": report(host=HostInfo(hostname="x" * 1_000_000)),
    "MIG inside MIG": report(gpus=[GpuDevice(index=0, mig_devices=[GpuDevice(index=0, mig_devices=[MIG])])]),
    "negative memory": report(gpus=[GpuDevice(index=0, memory_total_bytes=-(1 << 40), memory_used_bytes=0)]),
    "NaN load": report(host=HostInfo(hostname="h", load_1m=math.nan)),
    "infinite resource": report(raylet=RayletInfo(pid=1, node_id=NODE, node_ip="x", static_resources=INF)),
    "negative pid": report(gpus=[GpuDevice(index=0, processes=[GpuProcess(pid=-1)])]),
    "attribution forged": None,  # built below: a field only the head sets
    "10k sources": report(sources=[SourceStatus(name="s", ok=True)] * 10_000),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_report_is_rejected_and_leaves_no_trace(name: str) -> None:
    """Positive control: drop the ``validate.check_report`` call in ``HeadState.ingest``."""
    state = HeadState(INTERVAL_S, None)
    value = HOSTILE[name]
    if name == "attribution forged":
        value = msgspec.to_builtins(report())
        value["gpus"][0]["attribution"] = {"booked_gpu": 1.0}
    with pytest.raises(ReportError):
        ingest(state, value)
    assert state.health()["nodes_reporting"] == 0


def test_deep_nesting_is_a_counted_rejection_not_a_recursion_error() -> None:
    """MIG devices nested 100,000 deep once raised RecursionError out of the decoder."""
    outer = msgspec.msgpack.encode(report(gpus=[]))
    layer = b"\x82\xa5index\x00\xabmig_devices\x91"  # {"index": 0, "mig_devices": [...]}
    deep = layer * 100_000 + b"\x81\xa5index\x00"
    assert outer.count(b"\xa4gpus\x90") == 1
    payload = outer.replace(b"\xa4gpus\x90", b"\xa4gpus\x91" + deep)
    state = HeadState(INTERVAL_S, None)
    with pytest.raises(ReportError):
        state.ingest(payload, NOW)


def test_the_largest_accepted_report_stays_small_in_the_status() -> None:
    """Bounds on counts keep a small frame from becoming a huge document: at the limits, the
    status JSON is at most 50 times the frame."""
    from rayscope.core import validate

    per_gpu = validate.MAX_PROCESSES // validate.MAX_GPUS  # the report's own cap, spread over its GPUs
    gpus = [
        GpuDevice(index=i, processes=[GpuProcess(pid=p) for p in range(per_gpu)])
        for i in range(validate.MAX_GPUS)
    ]
    payload = msgspec.msgpack.encode(report(gpus=gpus))
    state = HeadState(INTERVAL_S, None)
    state.ingest(payload, NOW)
    document = status_json(state.status(NOW), include_dead=True, indent=0)
    assert len(document) < 50 * len(payload)


def test_control_characters_never_reach_a_terminal_a_log_or_a_label() -> None:
    """Escape sequences in every string a node controls: stripped at ingest, so the lines,
    the metrics and the head's log lines (which name the node) are clean.
    Positive control: drop the ``printable`` call in ``validate``'s string check."""
    evil = "\x1b]0;owned\x07\x1b[2J\r\n\x9b31m"
    hostile = report(
        node_id=NODE + evil,
        raylet=RayletInfo(pid=10, node_id=NODE + evil, node_ip="10.0.0.5" + evil),
        host=HostInfo(hostname="gpu" + evil),
        gpus=[
            GpuDevice(
                index=0, name="A100" + evil, errors={"temp" + evil: "lost" + evil}, memory_total_bytes=1
            )
        ],
        sources=[SourceStatus(name="nvml" + evil, ok=False, reason="driver" + evil)],
    )
    state = HeadState(INTERVAL_S, None)
    kept = ingest(state, hostile)
    assert kept.node_id == NODE + "]0;owned[2J31m"
    status = state.status(NOW, gpus=True)
    text = "\n".join(status_lines(status, include_dead=True) + status_gpu_lines(status))
    assert not CONTROL.search(text.replace("\n", ""))
    metrics = metrics_text(status)
    assert not CONTROL.search(metrics.replace("\n", ""))


def test_render_strips_control_characters_from_strings_the_gcs_gave() -> None:
    """The embedded view reads strings straight from the GCS (any Ray user names actors and
    labels): the renderers strip them too. Positive control: drop ``printable_lines`` in
    ``render.status.status_lines``."""
    from rayscope.core.rollup import merge, scheduler_nodes

    total = {"CPU": 8.0, "GPU": 1.0, "accelerator_type:\x1b[2JX": 1.0}
    views = [view("cd" * 28, "10.0.0.7\x1b[2J", total, {"CPU": 8.0, "GPU": 1.0})]
    status = merge(scheduler_nodes(views), {}, now=NOW, stale_after_s=math.inf, view="gcs")
    status.sources = [SourceStatus(name="gcs", ok=False, reason="boom\x1b[31m\x07")]
    lines = status_lines(status, include_dead=True) + source_details(status.sources)
    assert lines and not any(CONTROL.search(line) for line in lines)
    note = completeness_note(status) or ""
    assert not CONTROL.search(note)


INVISIBLE = "\u2028\u2029\u061c\ufeff\u2060\U000e0041\U000e007f\ue000\x85\u200d\u00ad"
"""Line and paragraph separators, an Arabic letter mark, a BOM, a word joiner, tag characters,
a private-use character, NEL, a zero-width joiner, a soft hyphen: categories Zl, Zp, Cf, Co, Cc.
The hostname is in no line or label today: it is there for when one shows it."""
REMOVED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Co")


def _removed(text: str) -> list[str]:
    found = {f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in REMOVED_CATEGORIES}
    return sorted(found - {"U+000A"})  # the lines' own newlines


def test_invisible_and_line_breaking_characters_never_reach_a_line_or_a_label() -> None:
    """A node IP and a hostname with U+2028 and friends: the ``status`` lines and the
    ``/metrics`` labels have exactly the lines of a clean report and none of those code
    points (Python's ``splitlines``, terminals and editors break lines at U+2028, U+2029 and
    NEL). Positive control: the old ``_CONTROL`` (C0, DEL, C1, bidi overrides) let all but
    NEL and the joiner through, and the status gained lines."""

    def views(state: HeadState) -> tuple[list[str], str]:
        status = state.status(NOW, gpus=True)
        return status_lines(status, include_dead=True) + status_gpu_lines(status), metrics_text(status)

    clean_state, hostile_state = HeadState(INTERVAL_S, None), HeadState(INTERVAL_S, None)
    ingest(clean_state, report())
    hostile = report(
        raylet=RayletInfo(pid=10, node_id=NODE, node_ip="10.0.0.5" + INVISIBLE),
        host=HostInfo(hostname="gpu-5" + INVISIBLE, cpu_count=8),
        gpus=[gpu(0, 5.0, name="NVIDIA" + INVISIBLE)],
    )
    ingest(hostile_state, hostile)
    clean_lines, clean_metrics = views(clean_state)
    lines, metrics = views(hostile_state)
    text = "\n".join(lines)
    assert _removed(text) == [] and _removed(metrics) == []
    assert len(text.splitlines()) == len("\n".join(clean_lines).splitlines())
    assert len(metrics.splitlines()) == len(clean_metrics.splitlines())
    assert "  10.0.0.5 [worker] VRAM" in text and "GPU0 NVIDIA  booked" in text
    assert 'node_ip="10.0.0.5"}' in metrics


def test_the_printable_rule_is_exactly_the_five_categories_on_every_code_point() -> None:
    """``printable`` removes every code point of Cc, Cf, Zl, Zp and Co and keeps every other
    (checked for all 1,114,112, in chunks): the fast path's ``str.isprintable`` rejects all
    of them (and more: Zs, Cs, Cn, which the slow path keeps)."""
    from rayscope.labels import printable

    step = 4096
    for start in range(0, 0x110000, step):
        chunk = "".join(chr(cp) for cp in range(start, start + step) if not 0xD800 <= cp < 0xE000)
        expected = "".join(c for c in chunk if unicodedata.category(c) not in REMOVED_CATEGORIES)
        assert printable(chunk) == expected, f"code points from U+{start:04X}"
    assert printable("gpu-5 10.0.0.5") == "gpu-5 10.0.0.5"


def test_the_number_of_nodes_held_is_bounded_oldest_unknown_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the cap, a report from a new node evicts the report received longest ago among the
    nodes the scheduler does not know; nodes the scheduler knows are never evicted, and when
    only they are held, a new unknown node is rejected.
    Positive control: drop the ``_make_room`` call in ``ReportTable.put``."""
    from rayscope.head.store import reports

    monkeypatch.setattr(reports, "MAX_NODES_HELD", 3)
    state = HeadState(INTERVAL_S, None)
    known = ["k" * 56, "j" * 56]

    state.set_view([RayNode(node_id=n, node_ip="10.0.0.1") for n in known], SourceStatus(name="gcs", ok=True))
    for i, node_id in enumerate(["u1", "u2", "u3", "u4"]):
        ingest(state, report(node_id=node_id, raylet=None), received_at=NOW + i)
    assert state.health()["nodes_reporting"] == 3
    held = set(state.status(NOW + 10).nodes) - set(known)
    assert held == {"u2", "u3", "u4"}
    for i, node_id in enumerate(known):
        ingest(state, report(node_id=node_id, raylet=None), received_at=NOW + 20 + i)
    assert set(known) <= set(state.status(NOW + 30).nodes)
    assert state.health()["nodes_reporting"] == 3
    ingest(state, report(node_id=known[0], raylet=None), received_at=NOW + 40)  # refreshes in place
    assert state.health()["nodes_reporting"] == 3

    monkeypatch.setattr(reports, "MAX_NODES_HELD", 2)
    full = HeadState(INTERVAL_S, None)
    full.set_view([RayNode(node_id=n, node_ip="10.0.0.1") for n in known], SourceStatus(name="gcs", ok=True))
    for node_id in known:
        ingest(full, report(node_id=node_id, raylet=None))
    with pytest.raises(ReportError, match="full"):
        ingest(full, report(node_id="u5", raylet=None))
    assert set(full.status(NOW).nodes) == set(known)


def _report_types() -> list[msgspec.inspect.StructType]:
    """Every Struct type a node report can hold, NodeReport first."""
    seen: dict[type, msgspec.inspect.StructType] = {}

    def visit(kind: Any) -> None:
        if isinstance(kind, msgspec.inspect.StructType) and kind.cls not in seen:
            seen[kind.cls] = kind
            for field in kind.fields:
                visit(field.type)
        for inner in ("types", "item_type", "key_type", "value_type"):
            value = getattr(kind, inner, None)
            for item in value if isinstance(value, tuple) else [value] if value is not None else []:
                visit(item)

    visit(msgspec.inspect.type_info(NodeReport))
    return list(seen.values())


def test_every_number_and_list_of_a_report_is_bounded_by_its_type() -> None:
    """The decoder checks what the types say, so a report field added without a bound is a
    hole: every int is ``>= 0`` (temperatures excepted), every float finite and ``>= 0``, and
    every list or map has a ``max_length``. (GpuAttribution is refused whole by validate.)
    Positive control: give ``HostInfo.load_1m`` back the plain type ``Optional[float]``."""
    from rayscope.schema.report import GpuAttribution, GpuUser

    mi = msgspec.inspect

    def unbounded(kind: Any, signed: bool) -> bool:
        if isinstance(kind, mi.IntType):
            return kind.ge != 0 and not signed
        if isinstance(kind, mi.FloatType):
            return kind.ge != 0 or kind.le is None
        if isinstance(kind, mi.DictType):
            return kind.max_length is None or unbounded(kind.value_type, False)
        return isinstance(kind, mi.ListType) and kind.max_length is None

    holes = []
    for struct in _report_types():
        if struct.cls in (GpuAttribution, GpuUser):
            continue
        for field in struct.fields:
            kinds = field.type.types if isinstance(field.type, mi.UnionType) else (field.type,)
            if any(unbounded(kind, field.name == "temperature_c") for kind in kinds):
                holes.append(f"{struct.cls.__name__}.{field.name}")
    assert not holes, holes


EVIL = "\x1b]0;owned\x07\u202e\x9b"


def _filled(struct: msgspec.inspect.StructType, depth: int = 0) -> dict[str, Any]:
    """A report part with every field set: every string its own name, every list one item."""

    scalars: dict[type, Any] = {
        msgspec.inspect.BoolType: True,
        msgspec.inspect.IntType: 1,
        msgspec.inspect.FloatType: 1.0,
    }

    def value(kind: Any, name: str) -> Any:
        if isinstance(kind, msgspec.inspect.UnionType):
            kind = next(t for t in kind.types if not isinstance(t, msgspec.inspect.NoneType))
        if isinstance(kind, msgspec.inspect.StrType):
            return name
        if type(kind) in scalars:
            return scalars[type(kind)]
        if isinstance(kind, msgspec.inspect.ListType):
            item = value(kind.item_type, name)
            return [] if item is None else [item]
        if isinstance(kind, msgspec.inspect.DictType):
            return {value(kind.key_type, name + "-key"): value(kind.value_type, name)}
        assert isinstance(kind, msgspec.inspect.StructType), kind
        return _filled(kind, depth + 1) if depth < 3 else None

    filled = {f.name: value(f.type, f.name) for f in struct.fields if f.name not in ("attribution", "schema")}
    if "mig_devices" in filled and depth > 1:
        filled["mig_devices"] = []  # a MIG device (report, GPU, MIG) has none of its own
    return {k: v for k, v in filled.items() if v is not None}


def _with_one_evil_string(document: Any) -> Iterator[Any]:
    """Copies of ``document``, each with one of its strings (or map keys) made ``EVIL``."""
    if isinstance(document, str):
        yield document + EVIL
    elif isinstance(document, list):
        for i, item in enumerate(document):
            for changed in _with_one_evil_string(item):
                yield [*document[:i], changed, *document[i + 1 :]]
    elif isinstance(document, dict):
        for key, item in document.items():
            for changed in _with_one_evil_string(item):
                yield {**document, key: changed}
            if isinstance(key, str) and key not in NodeReport.__struct_fields__ and "-key" in key:
                yield {(k + EVIL if k == key else k): v for k, v in document.items()}


def test_every_string_of_a_report_loses_its_control_characters() -> None:
    """A report with every field set; in turn, each of its strings (map keys too) carries an
    escape sequence: the head keeps none. The strings walker is built from the types, so a
    field added later is covered; this proves it.
    Positive control: make ``validate._gatherer`` skip dict values."""
    report_type = msgspec.inspect.type_info(NodeReport)
    assert isinstance(report_type, msgspec.inspect.StructType)
    document = _filled(report_type)
    variants = list(_with_one_evil_string(document))
    assert len(variants) > 30
    for variant in variants:
        kept = ingest(HeadState(INTERVAL_S, None), variant)
        assert kept.gpus and kept.gpus[0].mig_devices and kept.processes  # every part is there
        assert kept.raylet and kept.raylet.labels
        text = msgspec.json.encode(kept).decode()
        assert "owned" in text
        assert not re.search(r"\\u00|\\u20|\x9b|\u202e", text), text
