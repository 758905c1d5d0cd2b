"""Which measurement a node's GPU memory shows, the rule of
``rayscope.core.gpu.precedence`` on recorded states: a fresh report that measured the node,
else Ray's dashboard's figure with its age, else NA and why; and where each output says so.

Positive controls: make ``precedence.measured_here`` return ``False`` and
:func:`test_a_fresh_report_wins_over_the_dashboard` fails (the dashboard's 7.3 GiB replaces the
agent's 5.8); drop the ``age_s > DASHBOARD_MAX_AGE_S`` test in ``_why_not`` and
:func:`test_an_old_dashboard_figure_is_not_shown` fails.
"""

import json
from pathlib import Path

import msgspec
import pytest

from rayscope.core.capacity import fit as fitting
from rayscope.core.capacity.sizing import fit_request
from rayscope.core.gpu import precedence
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.head.store.state import HeadState
from rayscope.render.fit import fit_lines
from rayscope.render.gpus import status_gpu_lines
from rayscope.render.metrics import metrics_text
from rayscope.render.page.bars import bar_html, gpu_bars
from rayscope.render.status import status_json, status_lines
from rayscope.schema.dashboard import DASHBOARD_SOURCE, DashboardNode, DashboardRead
from rayscope.schema.report import SourceStatus, known
from rayscope.sources import dashboard
from tests import scenarios
from tests.golden import check_golden
from tests.scenarios import (
    CPU,
    EUROPA,
    NOW,
    SEED_VIEWS,
    T4,
    dashboard_edges_status,
    dashboard_read,
    dashboard_status,
    gpu,
    report,
)

RECORDED = Path(__file__).resolve().parent / "data" / "dashboard"
GIB = 1024**3


def lines(status: object) -> str:
    return "\n".join(status_lines(status)) + "\n"  # type: ignore[arg-type]


# --- the goldens ------------------------------------------------------------------------------


def test_the_seed_without_agents_reads_every_gpu_node_from_this_host_or_the_dashboard() -> None:
    status = dashboard_status()
    check_golden("status_dashboard.txt", lines(status))
    check_golden("status_dashboard.json", status_json(status) + "\n")
    assert "VRAM: 4.8/15.0 GB" in lines(status)
    worker = status.nodes[T4]
    assert (worker.used_gpu_memory_source, worker.used_gpu_memory_age_s) == (DASHBOARD_SOURCE, 3.4)
    assert known(worker.gpus_source) == DASHBOARD_SOURCE
    assert (worker.total_gpu_memory, worker.used_gpu_memory) == (15360 * 2**20, 4915 * 2**20)
    assert status.nodes[EUROPA].used_gpu_memory_source == "nvml"
    assert known(status.nodes[EUROPA].gpus_source) is None
    assert status.cluster.gpu_nodes_measured == status.cluster.gpu_nodes == 2


def test_gpus_match_the_dashboards_pids_to_actors() -> None:
    text = "\n".join(status_gpu_lines(dashboard_status(gpus=True))) + "\n"
    check_golden("status_gpus_dashboard.txt", text)
    assert "used 4.8 GB (Ray dashboard, 3s old)" in text
    assert "denbi-app#d1d1 booked 0.33 GPU used 4.2 GB" in text


def test_a_dashboard_that_failed_is_one_line_naming_the_fix() -> None:
    text = lines(dashboard_status(dashboard_read(ok=False)))
    check_golden("status_dashboard_down.txt", text)
    said = [line for line in text.splitlines() if line.startswith("DASHBOARD:")]
    assert said == [
        "DASHBOARD: the Ray dashboard at http://172.17.0.3:8265 answered HTTP 500: Internal Server"
        f" Error; {precedence.NODE_AGENT_FIX}"
    ]
    # The output as it was before the dashboard was read, and that one line.
    before = lines(dashboard_status(asked=False)).splitlines()
    assert [line for line in text.splitlines() if not line.startswith("DASHBOARD:")] == before


def test_rule_three_says_why_per_node() -> None:
    status = dashboard_edges_status()
    check_golden("status_dashboard_edges.txt", lines(status))
    check_golden("status_dashboard_edges.json", status_json(status) + "\n")
    reasons = {n.node_ip: n.used_gpu_memory_reason for n in status.nodes.values()}
    assert reasons["10.0.0.22"] == (
        "no agent; Ray dashboard: its figure is 75s old (its agent on the node stopped, or the"
        " node's clock is behind this one's)"
    )
    assert reasons["10.0.0.23"] == "no agent; Ray dashboard: no sample from this node's agent yet"
    assert reasons["10.0.0.24"] == "no agent; Ray dashboard: this node is not in its summary"
    assert "NVML used not trusted" in reasons["10.0.0.21"]


def test_fit_checks_the_dashboards_free_memory_and_names_it() -> None:
    status = dashboard_status()
    result = fitting.fit(status, fit_request(4096, None, 1, 0.0, 0.0, None, "fraction"))
    text = "\n".join(fit_lines(result)) + "\n"
    check_golden("fit_dashboard_fraction_4096.txt", text)
    assert "(Ray dashboard on 10.0.0.5)" in text
    busy = msgspec.structs.replace(status, nodes={**status.nodes})
    t4 = status.nodes[T4]
    busy.nodes[T4] = msgspec.structs.replace(t4, used_gpu=0.0)
    placed = fitting.fit(busy, fit_request(14000, None, 2, 0.0, 0.0, None, "fraction"))
    [worker] = [n for n in placed.nodes if n.node_id == T4]
    assert worker.placed == 1 and worker.measured == "short"
    assert [(g.source, g.age_s) for g in worker.gpus] == [(DASHBOARD_SOURCE, 3.4)]


def test_the_page_and_metrics_carry_the_dashboards_figure() -> None:
    status = dashboard_status()
    [bar] = gpu_bars(status.nodes[T4])
    assert bar.used_bytes == 4915 * 2**20 and bar.source == "Ray dashboard, 3s old"
    assert "4.8/15.0 GB (Ray dashboard, 3s old)" in bar_html(bar)
    metrics = metrics_text(status)
    assert f'rayscope_gpu_memory_used_bytes{{node_id="{T4}"' in metrics


# --- the rule ---------------------------------------------------------------------------------


def t4_said(used_gib: float, age_s: float = 2.0) -> DashboardRead:
    gpu_ = scenarios.dashboard_gpu("Tesla T4", 15360, int(used_gib * 1024), {})
    node = DashboardNode(node_id=T4, measured_at=NOW - age_s, gpus=[gpu_])
    return DashboardRead(nodes={T4: node}, status=SourceStatus(name="dashboard", ok=True, detail="x"))


def head_view(reports: dict[str, object], read: DashboardRead) -> object:
    return merge(
        scheduler_nodes(SEED_VIEWS),
        reports,  # type: ignore[arg-type]
        now=NOW,
        stale_after_s=15.0,
        view="head",
        sources=[SourceStatus(name="gcs", ok=True)],
        scheduler_read_at=NOW,
        dashboard=read,
    )


def test_a_fresh_report_wins_over_the_dashboard() -> None:
    status = head_view({T4: report(T4, [gpu(0, 5.8, "Tesla T4")], "10.0.0.5")}, t4_said(7.3))
    node = status.nodes[T4]  # type: ignore[attr-defined]
    assert node.used_gpu_memory_source == "nvml" and node.used_gpu_memory_bytes == int(5.8 * GIB)
    assert known(node.gpus_source) is None


def test_a_stale_report_gives_way_to_the_dashboards_fresh_figure() -> None:
    status = head_view({T4: report(T4, [gpu(0, 5.8, "Tesla T4")], "10.0.0.5", age_s=42.0)}, t4_said(7.3))
    node = status.nodes[T4]  # type: ignore[attr-defined]
    assert node.stale and node.agent == "stale"  # the agent is still said to have stopped
    assert not precedence.figures_old(node)
    assert (node.used_gpu_memory_source, node.used_gpu_memory_bytes) == (
        DASHBOARD_SOURCE,
        int(7.3 * 1024) * 2**20,
    )
    assert status.cluster.used_gpu_memory_bytes == node.used_gpu_memory_bytes  # type: ignore[attr-defined]
    assert "stale 42s" in "\n".join(status_lines(status))  # type: ignore[arg-type]


def test_a_report_whose_nvml_failed_gives_way_to_the_dashboard() -> None:
    status = head_view({T4: report(T4, None, "10.0.0.5")}, t4_said(7.3))
    assert status.nodes[T4].used_gpu_memory_source == DASHBOARD_SOURCE  # type: ignore[attr-defined]


def test_an_old_dashboard_figure_is_not_shown() -> None:
    fresh = head_view({}, t4_said(7.3, age_s=precedence.DASHBOARD_MAX_AGE_S)).nodes[T4]  # type: ignore[attr-defined]
    old = head_view({}, t4_said(7.3, age_s=precedence.DASHBOARD_MAX_AGE_S + 1)).nodes[T4]  # type: ignore[attr-defined]
    assert fresh.used_gpu_memory_age_s == precedence.DASHBOARD_MAX_AGE_S
    assert old.used_gpu_memory_bytes is None and "61s old" in old.used_gpu_memory_reason


def test_a_node_clock_ahead_reads_age_zero_never_negative() -> None:
    node = head_view({}, t4_said(7.3, age_s=-30.0)).nodes[T4]  # type: ignore[attr-defined]
    assert node.used_gpu_memory_age_s == 0.0


def test_not_asked_changes_nothing() -> None:
    """``--dashboard none`` (or a head whose every GPU node has an agent): no read, no
    change; a read that lists the node not: it says so."""
    not_asked = dashboard_status(asked=False)
    assert not_asked.nodes[T4].used_gpu_memory_reason == "no agent"
    assert not any(s.name == "dashboard" for s in not_asked.sources)
    empty = dashboard_status(DashboardRead(status=SourceStatus(name="dashboard", ok=True, detail="x")))
    assert (
        empty.nodes[T4].used_gpu_memory_reason == "no agent; Ray dashboard: this node is not in its summary"
    )


def test_a_failed_dashboard_nobody_needed_is_not_said() -> None:
    europa_only = [SEED_VIEWS[0]]
    status = dashboard_status(dashboard_read(ok=False), europa_only)
    assert not any(s.name == "dashboard" for s in status.sources)
    assert "DASHBOARD" not in lines(status)


@pytest.mark.parametrize(("index", "parent", "instance"), [(0, None, 0), (1003, 1, 3), (7006, 7, 6)])
def test_a_mig_instance_is_listed_under_its_gpu(index: int, parent: object, instance: int) -> None:
    gpu_ = msgspec.structs.replace(
        scenarios.dashboard_gpu("NVIDIA A100 MIG 3g.20gb", 20096, 100, {}), index=index
    )
    device = precedence.dashboard_device(gpu_, 1.0)
    assert (device.parent_index, device.index) == (parent, instance)


def test_only_alive_actors_of_the_node_take_its_pids() -> None:
    status = dashboard_status()
    actors = [
        *scenarios.DASHBOARD_ACTORS,
        msgspec.structs.replace(scenarios.DASHBOARD_ACTORS[0], actor_id="e" * 32, node_id=EUROPA, pid=9001),
    ]
    processes = precedence.dashboard_processes(status.nodes[T4], actors)
    assert processes is not None
    assert [(p.pid, p.actor_id, p.visible) for p in processes] == [
        (scenarios.APP_PID, "d1" * 16, True),
        (9001, None, False),  # an actor's pid on another node: not this one's
    ]
    assert precedence.dashboard_processes(status.nodes[T4], None) is None


# --- Ray before 2.57: per-process memory not believed ---------------------------------------


@pytest.mark.parametrize("release", ["2.52.1", "2.55.1"])
def test_a_release_that_writes_bus_utilisation_has_its_process_memory_not_used(release: str) -> None:
    """Ray 2.50-2.56 may write a process's memory as its memory-bus utilisation × the GPU's
    total (ray-project/ray#61456): recorded, the sleeper's 1.2 GiB reads 12288 MiB. Its
    figure is not used: the process is listed, its memory NA, the GPU says why; the device
    and node figures stand."""
    doc = json.loads((RECORDED / f"ray-{release}.json").read_text())
    nodes, said = dashboard.parse_summary(200, json.dumps(doc["summary"]).encode(), "http://x", doc["ray"])
    [node] = nodes.values()
    recorded = msgspec.structs.replace(node, node_id=T4, measured_at=NOW - 1.0)
    status = dashboard_status(DashboardRead(nodes={T4: recorded}, status=said), gpus=True)
    [first, _] = status.nodes[T4].gpus or []
    assert first.errors == {"process memory": precedence.PROCESSES_NOT_BELIEVED}
    assert first.processes and all(p.used_memory_bytes is None for p in first.processes)
    assert recorded.gpus is not None and recorded.gpus[0].processes[0].used_memory_bytes == 12288 * 2**20
    assert status.nodes[T4].used_gpu_memory_bytes == (7475 + 307) * 2**20
    text = "\n".join(status_gpu_lines(status))
    assert "(process memory: not believed" in text and "used NA" in text


def test_the_current_release_has_its_process_memory_used() -> None:
    doc = json.loads((RECORDED / "ray-2.60.0.json").read_text())
    nodes, said = dashboard.parse_summary(200, json.dumps(doc["summary"]).encode(), "http://x", doc["ray"])
    [node] = nodes.values()
    status = dashboard_status(
        DashboardRead(nodes={T4: msgspec.structs.replace(node, node_id=T4)}, status=said)
    )
    [first, _] = status.nodes[T4].gpus or []
    assert first.errors == {} and first.processes and first.processes[0].used_memory_bytes


# --- the head ---------------------------------------------------------------------------------


def test_the_head_reads_the_dashboard_only_for_nodes_no_agent_measures() -> None:
    state = HeadState(interval_s=5.0, gcs_address="x:1")
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=NOW)
    assert state.needs_dashboard(NOW)
    for node_id, ip in ((EUROPA, "172.17.0.3"), (T4, "10.0.0.5")):
        state.ingest(msgspec.msgpack.encode(report(node_id, [gpu(0, 1.0)], ip).report), NOW)
    assert not state.needs_dashboard(NOW + 1)  # the CPU node needs no GPU figure
    assert state.needs_dashboard(NOW + 16)  # the reports went stale


def test_the_head_merges_the_dashboard_it_read() -> None:
    state = HeadState(interval_s=5.0, gcs_address="x:1")
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=NOW)
    state.set_dashboard(dashboard_read())
    status = state.status(NOW, wall_now=NOW)
    assert status.nodes[T4].used_gpu_memory_source == DASHBOARD_SOURCE
    assert status.nodes[CPU].total_gpu_memory_bytes == 0
    assert any(s.name == "dashboard" and s.ok for s in status.sources)
    state.set_dashboard(None)
    assert state.status(NOW, wall_now=NOW).nodes[T4].used_gpu_memory_source is None


def test_a_gpu_named_as_a_vgpu_is_not_trusted_anywhere() -> None:
    gpu_ = scenarios.dashboard_gpu("NVIDIA A40-16C", 16384, 14848, {77: 14000})
    device = precedence.dashboard_device(gpu_, 2.0)
    assert device.memory_used_bytes is None and known(device.nvml_memory_used_bytes) == 14848 * 2**20
    from rayscope.core.gpu.trust import nvml_trusted

    assert not nvml_trusted(device)


def test_the_heads_usage_history_takes_the_dashboards_figures() -> None:
    """``usage`` covers a node no agent measures: the dashboard's per-process figure of
    deNBI's app (its pid matched to the actor) is recorded as the app's use."""
    import time

    state = HeadState(interval_s=5.0, gcs_address="x:1")
    state.set_view(SEED_VIEWS, SourceStatus(name="gcs", ok=True), read_at=time.monotonic())
    state.set_actors(scenarios.DASHBOARD_ACTORS, SourceStatus(name="gcs_actors", ok=True))
    fresh = {T4: msgspec.structs.replace(dashboard_read().nodes[T4], measured_at=time.time() - 1.0)}
    state.set_dashboard(
        DashboardRead(nodes=fresh, status=SourceStatus(name="dashboard", ok=True, detail="x"))
    )
    state.fold_usage(time.monotonic())
    [app] = state.usage.document(time.monotonic()).apps
    assert app.app == "denbi-app" and app.peak_used_bytes == 4300 * 2**20  # named by its name
