"""The head's page (``GET /``, agent/rayscope/render/page/document.py): the seed cluster's golden, the three
numbers per GPU, every mark, the honest banners, and 1,000 nodes paginated.

The DOM is read with the standard library's HTML parser (the live browser test,
tests/test_live_page.py, reads the same page through Chromium)."""

import base64
import hashlib
import re

import msgspec

from rayscope.core.gpu.placement import place_devices
from rayscope.core.gpu.settled import settle_gpu
from rayscope.render.page.assets import CSP
from rayscope.render.page.document import (
    PAGE_NODES,
    PageQuery,
    login_html,
    page_html,
    page_query,
    session_html,
    view_html,
)
from rayscope.schema.report import GpuHealth, SourceStatus
from rayscope.schema.status import ClusterStatus
from tests.golden import check_golden
from tests.page_scenarios import VM, big_status, first_hour_status, first_hour_usage, unet_usage
from tests.scenarios import EUROPA, T4, mixed_status, seed_status
from tests.support.page import cells
from tests.support.placement import fragmented_status
from tests.support.seeds import seed_with_gpus


def head_seed() -> ClusterStatus:
    """The seed cluster as a head serves it with ``?gpus=1``: actors attributed, the
    scheduler view read 1 s ago."""
    status, _ = seed_with_gpus()
    return msgspec.structs.replace(status, gcs_address="172.17.0.3:6379", scheduler_age_s=1.0)


def test_the_seed_page_golden_shows_the_three_numbers_per_gpu() -> None:
    """The README's seed cluster: Europa booked 20480 of 24576 MB by four actors through
    0.04 GPU while NVML measures 22.5 GB; the deNBI T4 booked 0.99 GPU, 5.8 GB measured.
    Positive control: drawing Europa's booking from the node's ``used_gpu`` (the fraction)
    shows 0.04 where 20480 MB should be."""
    html = page_html(head_seed(), PageQuery(), 5.0)
    check_golden("page_seed.html", html)
    found = cells(html)
    europa, t4 = found[f"{EUROPA}:0"], found[f"{T4}:0"]
    assert (europa["booked"], europa["fraction"], europa["measured"]) == (
        ["20480/24576 MB"],
        ["0.04"],
        ["22.5/24.0 GB"],
    )
    assert (t4["booked"], t4["fraction"], t4["measured"]) == (["0.99 GPU"], ["0.99"], ["5.8/24.0 GB"])
    hover = "\n".join(europa["title"])
    for actor in ("federated-unet#a1b2", "federated-unet#c3d4", "federated-unet#e5f6", "federated-unet#0789"):
        assert f"{actor}: booked 5120 MB VRAM_MB + GPU 0.01" in hover  # the actor's name on hover
    assert europa["mark"] == ["over booking"] and t4["mark"] == []
    assert "Cluster: 16/32 CPUs, 1.03/2 GPUs, booked: 20480/24576 MB" in html  # the status line
    assert "172.17.0.3 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: 22.5/24.0 GB  CPU: 8/8" in html
    assert "(4096 MB free)" in html and "(1.5 GB free)" in html  # free space, by booking and measured
    assert "scheduler view 1s old" in html


def test_the_page_loads_nothing_but_itself_and_the_csp_allows_exactly_its_code() -> None:
    """No URL to anywhere in the page (no ``src``, no ``href`` but its own query links and
    the login form's ``/login``); the CSP's hashes are those of its one style and one script.
    Positive control: a changed script without a new hash would be blocked by the browser
    (and this test fails)."""
    pages = {
        "page": (page_html(head_seed(), PageQuery(), 5.0), {"?marked=1", "?page=1"}),
        "login form": (login_html("wrong token"), set()),
        "login's answer": (session_html("123.abc"), {"/"}),
    }
    for name, (html, links) in pages.items():
        assert not re.search(r"\bsrc=", html), name
        assert set(re.findall(r'href="([^"]*)"', html)) <= links, name
        assert "http://" not in html and "https://" not in html and "//" not in html.replace("://", ""), name
        for tag in ("style", "script"):
            (body,) = re.findall(f"<{tag}>(.*?)</{tag}>", html, re.S)
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            assert f"{tag}-src 'sha256-{digest}'" in CSP, (name, tag)
    assert "default-src 'none'" in CSP and "connect-src 'self'" in CSP


def test_the_refresh_fragment_is_the_main_element_only() -> None:
    status = head_seed()
    fragment = page_html(status, PageQuery(fragment=True), 5.0)
    assert fragment == view_html(status, PageQuery())
    assert "<html" not in fragment and "<script" not in fragment
    assert f'data-gpu="{EUROPA}:0"' in fragment


def test_stale_unmeasured_and_no_agent_nodes_are_marked() -> None:
    """The mixed cluster: the T4's report 42 s old, a lost GPU on Europa, a node no agent
    reports. Each shows its mark; the stale T4 keeps its last figure, drawn as old."""
    html = page_html(mixed_status(), PageQuery(), 5.0)
    found = cells(html)
    assert found[f"{T4}:0"]["mark"] == ["stale 42s"]
    assert 'class="old"' in html  # the stale figure in grey, not as a fresh measurement
    assert "not measured" in found[f"{EUROPA}:1"]["mark"]
    assert (
        '10.0.0.11 [worker] A100 GPU: 0.50/2 VRAM: NA/NA GB  CPU: 0/4 <span class="who" title="node id'
        f' {"0a" * 28}">host-10.0.0.11 · node 0a0a0a0a</span> <span class="mark node"'
        ' title="no rayscope agent reports this node: its GPU memory is not measured (run rayscope push'
        ' on it, or rayscope head --agents ray)">no agent</span></summary>'
    ) in html
    no_agent = [key for key in found if key.startswith("0a")]
    assert len(no_agent) == 2  # two GPUs the scheduler counts, drawn though no agent reports them
    assert all(found[key]["booked"] == ["NA"] for key in no_agent)


def test_an_unhealthy_gpu_and_an_unreliable_measurement_are_marked() -> None:
    """Europa's GPU with an XID 79; the T4 on a vGPU guest (NVML answered, rayscope does not
    trust its used memory: the node's reason). The untrusted figure is hatched, never a
    number in the measured text. Positive control: read ``memory_used_bytes`` as measured."""
    status = head_seed()
    europa, t4 = status.nodes[EUROPA], status.nodes[T4]
    assert europa.gpus is not None
    # Settled as the rollup settles a report's GPU: the page reads its flags, judges none.
    sick = settle_gpu(msgspec.structs.replace(europa.gpus[0], health=GpuHealth(xid_errors=2, last_xid=79)))
    reason = "vGPU guest: NVML's used memory is the vGPU manager's, not a measurement"
    nodes = {
        **status.nodes,
        EUROPA: msgspec.structs.replace(europa, gpus=[sick]),
        T4: msgspec.structs.replace(t4, used_gpu_memory_bytes=None, used_gpu_memory_reason=reason),
    }
    html = page_html(msgspec.structs.replace(status, nodes=nodes), PageQuery(), 5.0)
    found = cells(html)
    assert found[f"{EUROPA}:0"]["mark"] == ["unhealthy", "over booking"]
    assert 'title="XID 79 (2 since start)"' in html
    assert found[f"{T4}:0"]["mark"] == ["unreliable measurement"]
    assert found[f"{T4}:0"]["measured"] == ["NA (NVML says 5.8)/24.0 GB"]
    assert 'class="untrusted"' in html and reason.replace("'", "&#x27;") in html


def test_a_device_fuller_than_the_node_sum_is_marked() -> None:
    """Two 0.6 replicas on a 2-GPU node: 1.2/2 by the sum, 0.6 on each device: not fuller.
    One whole-GPU actor on a 4-GPU node booked 1.5: GPU1 is full, the node reads 0.38."""
    from tests.support.placement import FOUR, booking, node, raylet

    status = node(4, 1.5, total_vram=4 * 40960, used_vram=20480)
    actors = [booking("b" * 32, [(1, 1.0)]), booking("a" * 32, [(0, 0.5)], vram_mb=20480)]
    status.placement = place_devices(status, actors, raylet(None, "PCI_BUS_ID"), FOUR)
    cluster = ClusterStatus(
        generated_at=0.0, view="gcs", cluster=fragmented_status().cluster, nodes={"n": status}
    )
    found = cells(page_html(cluster, PageQuery(), 5.0))
    marks = {key.rsplit(":", 1)[1]: cell["mark"] for key, cell in found.items()}
    assert marks["ray1"] == ["fuller than the node sum"]
    assert marks["ray0"] == [] and marks["ray2"] == []
    assert [found[k]["fraction"] for k in sorted(found)] == [["0.50"], ["1.00"], ["0.00"], ["0.00"]]
    fragmented = cells(page_html(fragmented_status(), PageQuery(), 5.0))
    assert [cell["mark"] for cell in fragmented.values()] == [[], []]  # 0.6 on each of two: not fuller


def test_no_scheduler_view_and_an_old_one_say_so() -> None:
    """Honest without the GCS: a banner saying bookings are not known; an old view its age."""
    status = head_seed()
    none = msgspec.structs.replace(
        status,
        scheduler_age_s=None,
        sources=[SourceStatus(name="gcs", ok=False, reason="GCS unreachable at 10.0.0.1:6379")],
    )
    html = page_html(none, PageQuery(), 5.0)
    assert "No scheduler view: the head has not read the GCS (GCS unreachable at 10.0.0.1:6379)" in html
    assert "no scheduler view" in html
    old = msgspec.structs.replace(status, scheduler_age_s=42.0, scheduler_stale=True)
    html = page_html(old, PageQuery(), 5.0)
    assert "Scheduler view 42s old (the GCS stopped answering)" in html
    assert "scheduler view 42s old" in html


def test_pending_demands_and_their_reasons_are_listed() -> None:
    from tests.scenarios import pending_status

    status = pending_status()
    html = page_html(status, PageQuery(), 5.0)
    assert status.cluster.pending
    for demand in status.cluster.pending:
        assert demand.reason_text.replace("'", "&#x27;") in html
    assert "nothing waits" in page_html(
        msgspec.structs.replace(status, cluster=msgspec.structs.replace(status.cluster, pending=[])),
        PageQuery(),
        5.0,
    )


def test_strings_from_reports_and_the_gcs_are_escaped() -> None:
    """An actor named ``<script>`` is text, not markup."""
    status = head_seed()
    europa = status.nodes[EUROPA]
    assert europa.gpus is not None and europa.gpus[0].attribution is not None
    att = europa.gpus[0].attribution
    evil = msgspec.structs.replace(att.users[0], name='<script>alert("x")</script>\x1b[2J')
    gpu = msgspec.structs.replace(europa.gpus[0], attribution=msgspec.structs.replace(att, users=[evil]))
    nodes = {**status.nodes, EUROPA: msgspec.structs.replace(europa, gpus=[gpu])}
    html = page_html(msgspec.structs.replace(status, nodes=nodes), PageQuery(), 5.0)
    assert html.count("<script>") == 1  # the page's own
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html and "\x1b" not in html


def test_a_thousand_nodes_of_eight_gpus_come_a_hundred_to_a_page() -> None:
    """1,000 × 8 GPUs: ten pages of 100 nodes, each bounded in size; the navigation says how
    many marked nodes each page holds, and ``?marked=1`` lists only those."""
    status = big_status(1000)
    html = page_html(status, PageQuery(), 5.0)
    found = cells(html)
    assert len(found) == PAGE_NODES * 8
    assert len(html) < 1_500_000
    assert html.count('<a href="?page=') + html.count('<a class="here" href="?page=') == 10
    assert "100 of 1000 nodes shown" in html
    last = page_html(status, PageQuery(page=10), 5.0)
    assert next(iter(cells(last))).startswith(f"{999 - 99:056x}")
    marked = page_html(status, PageQuery(marked=True), 5.0)
    marked_nodes = {key.rsplit(":", 1)[0] for key in cells(marked)}
    expected = {f"{i:056x}" for i in range(1000) if i % 17 == 5 or i % 10 == 0 or i % 13 == 0}
    assert marked_nodes <= expected and len(marked_nodes) == min(PAGE_NODES, len(expected))
    assert f"only the {len(expected)} marked nodes" in html
    assert page_query({"page": ["3"], "marked": ["1"]}) == PageQuery(3, True, False)
    assert page_query({"page": ["-1"]}) == page_query({"page": ["x" * 100]}) == PageQuery()
    assert "100 of 1000 nodes shown" in page_html(status, PageQuery(page=99), 5.0)  # clamped to the last


def test_each_app_has_its_bar_with_the_booking_to_ask_for() -> None:
    """With the head's usage history the page shows each app's booking per replica beside
    its peak and the suggestion (``usage``'s app line); without one, nothing."""
    from rayscope.render.page.usage import apps_html
    from rayscope.schema.usage import UsageDocument

    unet = unet_usage(
        peak_used_bytes=2662 * 1024**2,
        p95_used_bytes=2600 * 1024**2,
        samples=56,
        suggested_vram_mb=3072,
        frees_mb=8192.0,
    )
    doc = UsageDocument(
        generated_at=0.0, window_s=3600, head_window_s=3600, slot_s=5, headroom_pct=10,
        known_since=0.0, covered_s=3600, apps=[unet],
    )  # fmt: skip
    html = apps_html(doc)
    assert 'data-app="federated-unet"' in html and "4 replicas" in html
    assert "booked 5120 MB  peak 2662 MB" in html and "suggest 3072 MB (frees 8192 MB)" in html
    assert 'width="100.00"' in html and 'width="60.00"' in html  # booked is the scale; suggestion 3072/5120
    assert apps_html(None) == "" and apps_html(msgspec.structs.replace(doc, apps=[])) == ""


def test_a_marked_node_says_why_and_the_marked_link_counts_only_what_is_marked() -> None:
    """A node without an agent had an orange edge and no word (the reason was at
    the end of its line, unmarked); the navigation offered "only the 0 marked node(s)" on a
    cluster with nothing marked. Now each marker that marks a node is its badge, the reason
    on hover; the link names how many are marked, and is no link when none is."""
    first = page_html(first_hour_status(), PageQuery(), 5.0, first_hour_usage())
    badges = re.findall(r'<span class="mark node" title="([^"]*)">([^<]*)</span>', first)
    assert badges == [
        (
            "no rayscope agent reports this node: its GPU memory is not measured (run rayscope push on it,"
            " or rayscope head --agents ray)",
            "no agent",
        )
    ]
    assert '<details class="node marked" id="n-' + T4 in first  # the edge, and now its word
    assert '<a href="?marked=1">only the 2 marked nodes</a>' in first  # deNBI, and Europa's over booking
    seed = page_html(seed_status(), PageQuery(), 5.0)  # every node's agent reporting, nothing to flag
    assert "?marked=1" not in seed and '<span class="note">no node is marked</span>' in seed
    one = page_html(head_seed(), PageQuery(), 5.0)  # Europa over its booking, nothing else
    assert '<a href="?marked=1">only the marked node</a>' in one
    stale = page_html(mixed_status(), PageQuery(), 5.0)
    assert ">stale 42s</span>" in stale and ">no agent</span>" in stale and ">no raylet</span>" in stale


def test_a_device_only_rays_placement_knows_has_a_segment_per_actor() -> None:
    """The legend says one segment per actor while a node whose agent reports no
    NVML drew its four replicas as one block, "4 actor(s): 20480 MB". Ray's placement names
    each actor and its VRAM_MB share on the device: a segment each, by actor id (names and
    use come with an NVML report)."""
    found = cells(page_html(first_hour_status(), PageQuery(), 5.0))
    titles = found[f"{VM}:ray0"]["title"]
    unknown = "(no NVML report: its name and use not known)"
    assert [t for t in titles if t.startswith("actor ")] == [
        f"actor 5e{i:02x}{'0' * 28}: booked 5120 MB VRAM_MB + GPU 0.01 {unknown}" for i in range(4)
    ]
    assert found[f"{VM}:ray0"]["booked"] == ["20480/24576 MB"]
    assert not any("actor(s)" in t for cell in found.values() for t in cell["title"])
    denbi = [t for t in found[f"{T4}:ray0"]["title"] if t.startswith("actor ")]
    assert denbi == [f"actor d00d{'0' * 28}: booked GPU 0.33 {unknown}"]
