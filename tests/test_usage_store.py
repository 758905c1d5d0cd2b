"""The head's usage store: reports in through the ingest hook, attributed once per interval,
kept across a restart in ``--usage-state``, served on ``/v1/usage`` behind the read token,
and its metrics clean for ``promtool check metrics``.

Recorded shapes (no Ray, no NVML); the clock is a parameter. Positive controls: drop the
``usage.seen`` call in ``HeadState.ingest`` and the first test finds nothing; skip the
downtime in ``UsageStore.restore`` and the restart test's slots land too late; remove
``/v1/usage`` from the paths behind the token check and the 401 test fails.
"""

import json
import os
from collections.abc import Mapping
from email.message import Message
from pathlib import Path
from typing import Optional

import msgspec
import pytest

from rayscope.core.gpu import trust as gpu_trust
from rayscope.core.usage.summary import usage_document
from rayscope.errors import AgentError
from rayscope.head.serve.routes import Request, Routes
from rayscope.head.store import usage_store
from rayscope.head.store.state import HeadState
from rayscope.head.store.usage_store import UsageStore, open_store, read_state, report_samples
from rayscope.render.usage import usage_family_names, usage_metrics
from rayscope.schema.report import GpuDevice, GpuProcess, NodeReport, ProcessInfo
from rayscope.schema.status import ActorBooking
from rayscope.schema.usage import UsageDocument
from rayscope.sinks.logs import LogThrottle
from tests.conftest import run_rayscope
from tests.schemas import parsed
from tests.support.ports import refused_port
from tests.support.promtool import lint

GIB = 1024**3
MIB = 1024**2
NODE = "4e" * 28
OTHER = "0b" * 28
WALL = 1_800_000_000.0
TOKEN = b"0123456789abcdef0123456789abcdef"
READ_TOKEN = b"fedcba9876543210fedcba9876543210"


def report(
    gib_by_pid: Mapping[int, Optional[float]], node: str = NODE, used_gib: Optional[float] = 20.0
) -> NodeReport:
    processes = [
        GpuProcess(pid=pid, used_memory_bytes=None if gib is None else int(gib * GIB), kinds=["compute"])
        for pid, gib in gib_by_pid.items()
    ]
    gpu = GpuDevice(
        index=0,
        uuid="GPU-00000000-5f1c-4d3e-9a7b-000000000000",
        name="NVIDIA GeForce RTX 3090",
        memory_total_bytes=24 * GIB,
        memory_used_bytes=None if used_gib is None else int(used_gib * GIB),
        processes=processes,
    )
    infos = [ProcessInfo(pid=pid, worker_pid=pid, node_id=node, title="ray::Replica") for pid in gib_by_pid]
    return NodeReport(node_id=node, collected_at=1.0, gpus=[gpu], processes=infos)


def actor(pid: int, name: str, vram_mb: float = 5120.0, gpu: float = 0.01, node: str = NODE) -> ActorBooking:
    required = {"CPU": 1.0, "GPU": gpu, **({"VRAM_MB": vram_mb} if vram_mb else {})}
    return ActorBooking(
        actor_id=f"{pid:032x}",
        node_id=node,
        pid=pid,
        name=name,
        class_name="LiveCluster.place.<locals>.Replica",
        required=required,
        gpu_ids=[0],
        gpu_shares=[(0, gpu)],
    )


ACTORS = [actor(101, "federated-unet-0"), actor(102, "federated-unet-1"), actor(103, "denbi-app", 0.0, 0.33)]


def test_reports_reach_the_window_through_the_ingest_hook_once_per_interval() -> None:
    state = HeadState(5.0, None, UsageStore(3600, 5, 0.0, WALL))
    state.set_actors(ACTORS, msgspec.structs.replace(state._actors_status, ok=True))
    for gibs in ({101: 2.0, 102: 1.0, 103: 3.0}, {101: 2.6, 102: 1.2, 103: 1.0}):  # two in one interval
        state.ingest(msgspec.msgpack.encode(report(gibs)), received_at=1.0)
    state.fold_usage(now=5.0)
    state.ingest(msgspec.msgpack.encode(report({101: 1.0, 102: 4.5, 103: 1.0})), received_at=6.0)
    state.fold_usage(now=10.0)
    doc = state.usage.document(12.0)
    peaks = {a.name: (a.peak_used_bytes, a.samples) for a in doc.actors}
    assert peaks == {
        "federated-unet-0": (int(2.6 * GIB), 3),
        "federated-unet-1": (int(4.5 * GIB), 3),
        "denbi-app": (3 * GIB, 3),
    }
    denbi = next(a for a in doc.actors if a.name == "denbi-app")
    assert denbi.booked_mb == pytest.approx(0.33 * 24 * 1024) and denbi.booked_vram_mb == 0
    assert denbi.devices == ["GPU-00000000-5f1c-4d3e-9a7b-000000000000"]


def test_without_an_actor_table_nothing_is_attributed_and_the_document_says_so() -> None:
    state = HeadState(5.0, None, UsageStore(3600, 5, 0.0, WALL))
    state.ingest(msgspec.msgpack.encode(report({101: 2.0})), received_at=1.0)
    state.fold_usage(now=5.0)
    doc = state.usage.document(6.0)
    assert doc.actors == [] and not doc.actors_read


def test_an_agent_faster_than_the_head_keeps_its_newest_report_past_the_cap() -> None:
    store = UsageStore(3600, 5, 0.0, WALL)
    for i in range(usage_store.MAX_PENDING + 3):
        store.seen(NODE, report({101: float(i)}))
    (held,) = store.take().values()
    assert len(held) == usage_store.MAX_PENDING
    assert held[-1].gpus is not None and held[-1].gpus[0].processes is not None
    assert held[-1].gpus[0].processes[0].used_memory_bytes == (usage_store.MAX_PENDING + 2) * GIB
    assert store.take() == {}


def test_an_unmeasured_gpu_gives_its_reason_instead_of_a_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    found = report_samples(NODE, report({101: 2.0}, used_gib=None), ACTORS[:1], {NODE})
    ((_, samples, reason, _),) = found.values()
    assert (samples, reason) == ([], usage_store.UNMEASURED_GPU)
    ((_, samples, reason, _),) = report_samples(NODE, report({101: None}), ACTORS[:1], {NODE}).values()
    assert (samples, reason) == ([], usage_store.UNMEASURED_PROCESS)
    # A vGPU guest without a CUDA sample, as rayscope.core.gpu.trust.gpu_used judges it.
    vgpu = "vGPU guest: NVML's used memory comes from the vGPU manager"
    real = gpu_trust.gpu_used
    monkeypatch.setattr(gpu_trust, "gpu_used", lambda gpu: real(gpu)._replace(used_bytes=None, reason=vgpu))
    store = UsageStore(3600, 5, 0.0, WALL)
    store.fold({NODE: [report({101: 14.5})]}, ACTORS[:1], {}, now=5.0)
    (row,) = store.document(6.0).actors
    assert (row.suggested_vram_mb, row.peak_used_bytes, row.reason) == (None, None, vgpu)


def test_an_idle_actor_of_a_raylet_sharing_the_host_is_not_sampled_on_another_node_s_report() -> None:
    """Two raylets on one machine: the other node's idle actor is placed on this report's GPU
    by its GPU id only; its own node's report measures it, not this one."""
    other = actor(201, "elsewhere", node=OTHER)
    found = report_samples(NODE, report({101: 2.0}), [ACTORS[0], other], {NODE, OTHER})
    assert set(found) == {ACTORS[0].actor_id}


# --- the state file -----------------------------------------------------------------------


def filled(path: Optional[str], now: float = 100.0) -> UsageStore:
    store = UsageStore(3600, 5, 0.0, WALL, state_file=path)
    store.fold({NODE: [report({101: 2.6, 102: 1.0})]}, ACTORS, {}, now=now - 60)
    store.fold({NODE: [report({101: 1.0, 102: 1.5})]}, ACTORS, {}, now=now)
    return store


def test_a_restart_keeps_the_history_and_counts_the_downtime(tmp_path: Path) -> None:
    path = str(tmp_path / "usage.json")
    before = filled(path)
    before.save(100.0)
    # The new head starts 600 s (wall) later, its monotonic clock somewhere else entirely.
    after = open_store(3600, 5, path, now=50_000.0, wall_now=WALL + 700)
    doc = after.document(50_000.0)
    assert after.restored_from == path and doc.restored_from == path
    assert doc.known_since == WALL and doc.covered_s == 700  # since the first head started
    peaks = {a.name: a.peak_used_bytes for a in doc.actors}
    assert peaks == {"federated-unet-0": int(2.6 * GIB), "federated-unet-1": int(1.5 * GIB), "denbi-app": 0}
    # The 2.6 GiB sample was 660 s old at the restart: it leaves a 700 s window 40 s later.
    assert {a.name: a.peak_used_bytes for a in after.document(50_045.0, window_s=700).actors} == {
        "federated-unet-0": GIB,
        "federated-unet-1": int(1.5 * GIB),
        "denbi-app": 0,  # booked a GPU, on no process of it: measured, at 0
    }


def test_history_older_than_the_window_is_not_restored(tmp_path: Path) -> None:
    path = str(tmp_path / "usage.json")
    filled(path).save(100.0)
    after = open_store(3600, 5, path, now=0.0, wall_now=WALL + 100 + 3600)
    assert after.document(0.0).actors == []


def test_a_state_file_that_is_not_one_starts_an_empty_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "usage.json"
    path.write_text('{"not": "usage"}')
    store = open_store(3600, 5, str(path), now=0.0, wall_now=WALL)
    assert store.restored_from == "" and "is not a usage history" in caplog.text
    assert json.loads(path.read_text())["actors"] == []  # replaced at once by a good one


def test_a_state_file_behind_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    filled(str(target)).save(100.0)
    link = tmp_path / "usage.json"
    link.symlink_to(target)
    with pytest.raises(AgentError) as err:
        read_state(str(link))
    assert err.value.exit_code == 2 and "cannot read --usage-state" in str(err.value)


def test_a_state_file_another_user_planted_is_refused(tmp_path: Path) -> None:
    """In a shared directory another user could plant a made-up history (root runs the head)."""
    if os.geteuid() != 0:
        pytest.fail("needs root, to plant a file as uid 65534 (the tests run as root)")
    path = tmp_path / "usage.json"
    filled(str(path)).save(100.0)
    os.chown(path, 65534, 65534)
    with pytest.raises(AgentError) as err:
        read_state(str(path))
    assert err.value.exit_code == 2 and "not a regular file of root or uid 0" in str(err.value)


def test_a_state_file_that_cannot_be_written_stops_the_head_at_its_start(tmp_path: Path) -> None:
    with pytest.raises(AgentError) as err:
        open_store(3600, 5, str(tmp_path / "no-such-dir" / "usage.json"), now=0.0, wall_now=WALL)
    assert err.value.exit_code == 3 and "cannot write" in str(err.value)
    (tmp_path / "usage.json").mkdir()  # a directory where the file should be
    with pytest.raises(AgentError) as err:
        open_store(3600, 5, str(tmp_path / "usage.json"), now=0.0, wall_now=WALL)
    assert err.value.exit_code == 2 and "not a regular file" in str(err.value)


# --- the HTTP route and the metrics ---------------------------------------------------------


def get(routes: Routes, target: str, token: bytes = b"") -> tuple[int, bytes]:
    headers = Message()
    if token:
        headers["Authorization"] = "Bearer " + token.decode()
    response = routes.answer(Request("GET", target, headers))
    return response.status, bytes(response.body)


def usage_routes() -> Routes:
    state = HeadState(5.0, None, filled(None, now=1e6))
    return Routes(state, (TOKEN, READ_TOKEN), LogThrottle(usage_store.log))


def test_usage_needs_the_read_token_like_status() -> None:
    routes = usage_routes()
    assert get(routes, "/v1/usage")[0] == 401
    assert get(routes, "/v1/usage", b"wrong")[0] == 401
    status, body = get(routes, "/v1/usage?window=30m&headroom=25", READ_TOKEN)
    assert status == 200
    parsed(body, "usage")  # schema/usage.schema.json
    doc = msgspec.json.decode(body, type=UsageDocument)
    assert (doc.window_s, doc.headroom_pct) == (1800, 25)
    assert {a.name for a in doc.actors} == {"federated-unet-0", "federated-unet-1", "denbi-app"}


@pytest.mark.parametrize("query", ["window=0", "window=1y", "headroom=-5", "headroom=nan", "headroom=x"])
def test_a_bad_usage_query_is_a_400_that_says_why(query: str) -> None:
    status, body = get(usage_routes(), f"/v1/usage?{query}", TOKEN)
    assert status == 400 and body.startswith(b"bad query: ")


def test_metrics_carry_the_peak_per_app_and_never_an_actor_id() -> None:
    status, body = get(usage_routes(), "/metrics", READ_TOKEN)
    text = body.decode()
    assert status == 200
    assert 'rayscope_app_gpu_memory_peak_bytes{app="federated-unet"} ' + str(int(2.6 * GIB)) in text
    assert all(a.actor_id not in text for a in ACTORS)


def test_the_usage_metrics_pass_promtool_check_metrics() -> None:
    store = filled(None)
    store.fold({NODE: [report({103: 3.0})]}, ACTORS, {}, now=110.0)
    window = store.window
    doc = usage_document(window, 120.0, WALL + 120)
    text = usage_metrics(doc)
    assert [
        line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")
    ] == usage_family_names()
    done = lint(text)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


# --- the command line ---------------------------------------------------------------------


def test_usage_without_a_head_says_only_the_head_remembers() -> None:
    done = run_rayscope("usage")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "rayscope: usage needs a head agent (--head URL or $RAYSCOPE_HEAD): only the head remembers\n"
    )


def test_usage_of_a_head_that_is_not_there_is_one_line() -> None:
    port = refused_port()
    done = run_rayscope("usage", "--head", f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert (
        done.stderr == f"rayscope: head agent unreachable at http://127.0.0.1:{port} (connection refused)\n"
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["usage", "--headroom", "-5"], "--headroom"),
        (["usage", "--window", "0"], "--window"),
        (["usage", "--window", "1y"], "--window"),
        (["head", "--usage-window", "forever"], "--usage-window"),
    ],
)
def test_a_bad_usage_option_is_a_usage_error_naming_it(args: list[str], option: str) -> None:
    done = run_rayscope(*args)
    assert done.returncode == 2 and done.stderr.startswith(f"rayscope: {args[0]} {option}")
    assert "Traceback" not in done.stderr
