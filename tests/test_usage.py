"""The usage window and its rules, pure: the clock is a parameter, nothing sleeps.

Insertion (a slot keeps its maximum), expiry (a sample leaves with its slot, an actor with
its last sample), peak and p95 over the whole window or a shorter one, the suggestion rule
(peak + headroom rounded up to 256 MiB, exact), grouping by app, and what the operator
reads. Positive control: make :meth:`SlotRing.add` keep the last sample instead of the
maximum and the insertion and peak tests fail; drop the clearing in ``advance`` and the
expiry tests do.
"""

import pytest

from rayscope.core.actor_names import app_name
from rayscope.core.usage.summary import NOT_HELD, nearest_rank, parse_window, suggestion_mb, usage_document
from rayscope.core.usage.window import EMPTY, ActorMeta, SlotRing, UsageWindow, slot_count, slot_width
from rayscope.render.usage import span, usage_lines
from rayscope.schema.usage import MAX_SLOTS

MIB = 1024**2
GIB = 1024**3
WALL = 1_800_000_000.0  # the wall clock at now=0 of the tests' monotonic clock


def meta(actor_id: str = "a1" * 16, **kw: object) -> ActorMeta:
    defaults: dict[str, object] = {
        "name": "federated-unet-0",
        "class_name": "Replica",
        "pid": 4242,
        "node_id": "4e" * 28,
        "booked_vram_mb": 5120.0,
        "booked_gpu": 0.01,
        "booked_mb": 5120.0,
    }
    return ActorMeta(actor_id, **{**defaults, **kw})  # type: ignore[arg-type]


# --- the ring ---------------------------------------------------------------------------


def test_a_slot_keeps_the_largest_sample_and_counts_them_all() -> None:
    ring = SlotRing(4)
    for value in (3, 9, 5):
        assert ring.add(10, value)
    values, counts = ring.last(10, 4)
    assert values == [EMPTY, EMPTY, EMPTY, 9]
    assert counts == [0, 0, 0, 3]


def test_advancing_empties_the_slots_skipped_and_a_full_turn_empties_all() -> None:
    ring = SlotRing(4)
    ring.add(0, 1)
    ring.add(1, 2)
    ring.add(3, 4)  # slot 2 got nothing
    assert ring.last(3, 4) == ([1, 2, EMPTY, 4], [1, 1, 0, 1])
    ring.add(5, 6)  # slots 0 and 1 leave the window, 4 got nothing
    assert ring.last(5, 4) == ([EMPTY, 4, EMPTY, 6], [0, 1, 0, 1])
    assert ring.last(9, 4) == ([EMPTY] * 4, [0] * 4)  # four slots later: nothing left


def test_a_sample_older_than_the_window_is_refused() -> None:
    ring = SlotRing(4)
    ring.add(10, 5)
    assert not ring.add(6, 99)  # 10 - 4: out
    assert ring.add(7, 1)  # the oldest slot still in
    assert ring.last(10, 4)[0] == [1, EMPTY, EMPTY, 5]


def test_the_last_k_slots_read_across_the_ring_s_end() -> None:
    ring = SlotRing(5)
    for slot in range(3, 10):
        ring.add(slot, slot * 10)
    assert ring.last(9, 5)[0] == [50, 60, 70, 80, 90]
    assert ring.last(9, 2)[0] == [80, 90]


def test_slots_are_one_interval_wide_until_the_window_needs_more_than_the_most_slots() -> None:
    assert slot_width(3600, 5) == 5 and slot_count(3600, 5) == MAX_SLOTS
    assert slot_width(3600, 1) == 5  # 3600 one-second slots would be 5x the memory
    assert slot_width(600, 1) == 1 and slot_count(600, 1) == 600
    week = slot_width(7 * 86_400, 5)
    assert week == 840 and slot_count(7 * 86_400, week) == MAX_SLOTS


# --- the window -------------------------------------------------------------------------


def test_peak_and_p95_over_the_window_and_over_a_shorter_one() -> None:
    window = UsageWindow(100, 1, now=0.0)
    for t in range(100):  # 1 MiB, 2 MiB, ... 100 MiB, one per slot
        window.record(meta(), [("GPU-0", (t + 1) * MIB)], now=t + 0.5)
    doc = usage_document(window, now=99.5, wall_now=WALL)
    (actor,) = doc.actors
    assert (actor.peak_used_bytes, actor.p95_used_bytes, actor.samples) == (100 * MIB, 95 * MIB, 100)
    short = usage_document(window, now=99.5, wall_now=WALL, window_s=10)
    assert short.window_s == 10
    assert (short.actors[0].peak_used_bytes, short.actors[0].samples) == (100 * MIB, 10)
    assert short.actors[0].p95_used_bytes == 100 * MIB  # ceil(0.95 * 10) = the 10th of 10


def test_a_window_longer_than_the_head_s_is_the_head_s() -> None:
    window = UsageWindow(60, 1, now=0.0)
    window.record(meta(), [("GPU-0", GIB)], now=1.0)
    doc = usage_document(window, now=2.0, wall_now=WALL, window_s=3600)
    assert (doc.window_s, doc.head_window_s, doc.actors[0].peak_used_bytes) == (60, 60, GIB)


def test_a_peak_leaves_the_window_with_its_slot() -> None:
    window = UsageWindow(10, 1, now=0.0)
    window.record(meta(), [("GPU-0", 8 * GIB)], now=0.0)
    for t in range(1, 15):
        window.record(meta(), [("GPU-0", 2 * GIB)], now=float(t))
    (actor,) = usage_document(window, now=14.0, wall_now=WALL).actors
    assert actor.peak_used_bytes == 2 * GIB  # the 8 GiB of t=0 is 14 s old in a 10 s window


def test_a_gone_actor_stays_for_the_window_then_is_forgotten() -> None:
    window = UsageWindow(10, 1, now=0.0)
    window.record(meta("a1" * 16), [("GPU-0", GIB)], now=0.0)
    window.record(meta("b2" * 16), [("GPU-0", GIB)], now=0.0)
    window.mark_alive(["b2" * 16])  # a1 left the actor table
    doc = usage_document(window, now=5.0, wall_now=WALL)
    assert {a.actor_id[:2]: a.alive for a in doc.actors} == {"a1": False, "b2": True}
    assert doc.apps[0].replicas == 1 and doc.apps[0].actors == 2
    assert window.expire(9.5) == []  # slot 0 is still in the window of slots 0..9
    assert sorted(window.expire(10.0)) == ["a1" * 16, "b2" * 16]
    assert usage_document(window, now=10.0, wall_now=WALL).actors == []


def test_a_multi_gpu_actor_s_slot_is_the_sum_over_its_devices() -> None:
    window = UsageWindow(10, 1, now=0.0)
    window.record(meta(), [("GPU-0", 3 * GIB), ("GPU-1", 2 * GIB)], now=0.0)
    window.record(meta(), [("GPU-0", 1 * GIB)], now=1.0)
    (actor,) = usage_document(window, now=1.0, wall_now=WALL).actors
    assert actor.peak_used_bytes == 5 * GIB and actor.devices == ["GPU-0", "GPU-1"]
    assert actor.samples == 2


def test_the_window_says_since_when_it_knows() -> None:
    window = UsageWindow(3600, 5, now=100.0)
    window.record(meta(), [("GPU-0", GIB)], now=130.0)
    doc = usage_document(window, now=160.0, wall_now=WALL + 160)
    assert doc.known_since == WALL + 100 and doc.covered_s == 60 and doc.window_s == 3600
    assert doc.actors[0].window_s == 30  # first seen at 130


RUNS = {
    "a full window": ([GIB + i for i in range(10)], [1] * 10),
    "gaps and an empty last slot": ([GIB, EMPTY, 2 * GIB, EMPTY, 3 * GIB, EMPTY], [1, 3, 2, 0, 65_535, 0]),
    "longer than the window": ([i * MIB for i in range(1, 26)], [2] * 25),
    "nothing measured": ([EMPTY] * 4, [0] * 4),
    "counts that do not match": ([GIB, 2 * GIB, 3 * GIB], [1, 1]),
}


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("last_slot", [103, 109, 117])
def test_a_restored_run_is_what_restoring_it_slot_by_slot_keeps(name: str, last_slot: int) -> None:
    """``UsageWindow.restore_run`` (a restart's arrays copied whole) keeps exactly what
    ``restore`` keeps slot by slot, wherever the run ends in the ring; a device restored
    twice merges. Positive control: drop the clearing of counts in empty slots and the
    "gaps" run's sample count differs."""
    values, counts = RUNS[name]
    first = last_slot - len(values) + 1
    windows = []
    for whole in (True, False):
        window = UsageWindow(10, 1, now=0.0)
        for _ in range(2):  # the second time: the device is there, merged slot by slot
            if whole:
                window.restore_run(meta(), 50.0, "GPU-0", last_slot, values, counts)
            else:
                slots = [(first + i, v, c) for i, (v, c) in enumerate(zip(values, counts))]
                window.restore(meta(), 50.0, "GPU-0", slots)
        windows.append(window)
    kept = [
        {
            a: (s.first_seen, s.last_slot, {d: (r.newest, r.values, r.counts) for d, r in s.devices.items()})
            for a, s in w.actors.items()
        }
        for w in windows
    ]
    assert kept[0] == kept[1]
    docs = [usage_document(w, now=float(last_slot + 1), wall_now=WALL) for w in windows]
    assert docs[0] == docs[1]


# --- the rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peak", "headroom", "suggested"),
    [
        (int(2.5 * GIB), 10, 2816),  # 2560 MiB + 10% = 2816 MiB exactly: a step, not the next
        (2048 * MIB, 0, 2048),
        (2048 * MIB + 1, 0, 2304),  # one byte over a step is the next step
        (1, 10, 256),
        (int(2.6 * GIB), 10, 3072),  # 2662.4 MiB + 10% = 2928.6 MiB
        (int(4.5 * GIB), 25, 5888),  # 4608 MiB + 25% = 5760 MiB
    ],
)
def test_the_suggestion_is_peak_plus_headroom_rounded_up_to_256_mib(
    peak: int, headroom: float, suggested: int
) -> None:
    assert suggestion_mb(peak, headroom) == suggested


def test_nearest_rank() -> None:
    assert nearest_rank([]) is None
    assert nearest_rank([7]) == 7
    assert nearest_rank(list(range(1, 21))) == 19  # ceil(0.95 * 20) = 19th
    assert nearest_rank(list(range(1, 22))) == 20


def test_what_re_booking_frees_and_the_risk_of_an_oom() -> None:
    window = UsageWindow(60, 1, now=0.0)
    for i, gib in enumerate((2.0, 2.6)):  # two replicas of 5120 MB that hold at most 2.6 GiB
        window.record(meta(f"{i}a" * 16, name=f"federated-unet-{i}"), [("GPU-0", int(gib * GIB))], now=1.0)
    over = meta("cc" * 16, name="over-booker", class_name="Trainer", booked_vram_mb=2048.0, booked_mb=2048.0)
    window.record(over, [("GPU-0", int(2.5 * GIB))], now=1.0)
    doc = usage_document(window, now=2.0, wall_now=WALL, headroom_pct=10)
    apps = {a.app: a for a in doc.apps}
    replica = apps["federated-unet"]
    assert (replica.replicas, replica.booked_mb, replica.peak_used_bytes) == (2, 5120, int(2.6 * GIB))
    assert (replica.suggested_vram_mb, replica.frees_mb, replica.oom_risk) == (3072, 2 * 2048, False)
    trainer = apps["over-booker"]  # a named actor: its name, not its class
    assert (trainer.suggested_vram_mb, trainer.frees_mb, trainer.oom_risk) == (2816, -768, True)
    assert doc.frees_mb == 4096  # the app that needs more is not netted against it
    actors = {a.name: a for a in doc.actors}
    assert actors["federated-unet-0"].suggested_vram_mb == 2304
    assert actors["federated-unet-0"].frees_mb == 2816


def test_unmeasured_memory_gets_the_reason_and_no_suggestion() -> None:
    """A vGPU guest without a CUDA sample (or NVML without per-process memory): the latest
    report's reason, never a suggestion made of what it could not measure."""
    window = UsageWindow(60, 1, now=0.0)
    reason = "vGPU guest: NVML's used memory comes from the vGPU manager"
    window.record(meta(), [], now=1.0, reason=reason)
    window.record(meta("b2" * 16), [("GPU-0", GIB)], now=1.0)
    doc = usage_document(window, now=2.0, wall_now=WALL)
    unmeasured = next(a for a in doc.actors if a.actor_id.startswith("a1"))
    assert (unmeasured.suggested_vram_mb, unmeasured.reason, unmeasured.peak_used_bytes) == (
        None,
        reason,
        None,
    )
    (app,) = doc.apps
    assert app.suggested_vram_mb is None and app.frees_mb is None
    assert app.reason == f"1 of 2 replica(s) not measured: {reason}"


def test_an_actor_that_held_nothing_gets_no_suggestion() -> None:
    window = UsageWindow(60, 1, now=0.0)
    window.record(meta(), [("GPU-0", 0)], now=1.0)
    (actor,) = usage_document(window, now=2.0, wall_now=WALL).actors
    assert (actor.peak_used_bytes, actor.suggested_vram_mb, actor.reason) == (0, None, NOT_HELD)


@pytest.mark.parametrize(
    ("class_name", "name", "app"),
    [
        (
            "ServeReplica:cellpose-finetuning:CellposeModel",
            "SERVE_REPLICA::x#y#z",
            "cellpose-finetuning/CellposeModel",
        ),
        ("", "SERVE_REPLICA::bioimage-io#Inference#k3x9", "bioimage-io/Inference"),
        ("LiveCluster.place.<locals>.Replica", "federated-unet-0", "federated-unet"),
        ("Trainer", "worker_12", "worker"),
        ("LiveCluster.place.<locals>.Replica", "denbi-app", "denbi-app"),
        ("Replica", "v2", "v2"),
        ("Replica", "app-w1-0", "app-w1"),
        ("Replica", "resnet50-0", "resnet50"),
        ("Replica", "llama3-1", "llama3"),
        ("", "lonely", "lonely"),
        ("LiveCluster.place.<locals>.Replica", "", "Replica"),
        ("", "", "actor"),
    ],
)
def test_actors_are_grouped_by_serve_deployment_else_by_class_and_name(
    class_name: str, name: str, app: str
) -> None:
    """Before: ``app-w1-0``, ``resnet50-0``, ``llama3-1`` (a base ending in a digit) and a
    single named ``denbi-app`` all read as their class, ``Replica``."""
    assert app_name(class_name, name) == app


def test_apps_are_ray_s_identities_never_a_name_pattern_alone() -> None:
    """Named replica sets of one class stay apart, one name shared by two classes is two
    apps (their class said), an anonymous actor groups under its class. Before, all five
    ``Replica`` actors were one app, ``Replica  5 replicas``."""
    window = UsageWindow(3600, 5, now=0.0)
    actors = [
        ("resnet50-0", "Replica"),
        ("resnet50-1", "Replica"),
        ("llama3-1", "Replica"),
        ("denbi-app", "Replica"),
        ("", "Replica"),
        ("llama3-0", "Trainer"),
    ]
    for i, (name, class_name) in enumerate(actors):
        window.record(
            meta(f"{i:02x}" * 16, name=name, class_name=class_name, pid=100 + i), [("GPU-0", GIB)], 10.0
        )
    doc = usage_document(window, now=20.0, wall_now=WALL + 20)
    apps = {a.app: a.replicas for a in doc.apps}
    assert apps == {"resnet50": 2, "llama3 (Replica)": 1, "llama3 (Trainer)": 1, "denbi-app": 1, "Replica": 1}
    assert {a.name: a.app for a in doc.actors}["llama3-0"] == "llama3 (Trainer)"


@pytest.mark.parametrize(
    ("text", "seconds"), [("3600", 3600), ("90s", 90), ("30m", 1800), ("1h", 3600), ("7d", 604_800)]
)
def test_windows_are_read_with_units(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["0", "-1h", "nan", "1y", "32d", "h", ""])
def test_a_bad_window_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="window"):
        parse_window(text)


# --- what the operator reads -----------------------------------------------------------


def test_usage_lines() -> None:
    window = UsageWindow(3600, 5, now=0.0)
    for i, gib in enumerate((2.0, 2.6)):
        window.record(
            meta(
                f"{i}a" * 16,
                name="CellposeModel",
                class_name="ServeReplica:cellpose:CellposeModel",
                pid=100 + i,
            ),
            [("GPU-0", int(gib * GIB))],
            now=10.0,
        )
    t4 = meta("dd" * 16, name="denbi-app", booked_vram_mb=0.0, booked_gpu=0.33, booked_mb=5068.8, pid=300)
    window.record(t4, [("GPU-1", int(1.5 * GIB))], now=10.0)
    doc = usage_document(window, now=20.0, wall_now=WALL + 20)
    assert usage_lines(doc) == [
        "Usage over the last 1 h, headroom 10% (the head knows 20 s of it, since 2027-01-15 08:00:00 UTC):",
        "",
        "cellpose/CellposeModel  2 replicas  booked 5120 MB  peak 2662 MB  p95 2662 MB  2 samples"
        "  suggest 3072 MB (frees 4096 MB)",
        "  CellposeModel#0a0a pid 100  booked 5120 MB  peak 2048 MB  p95 2048 MB  1 sample"
        "  suggest 2304 MB (frees 2816 MB)",
        "  CellposeModel#1a1a pid 101  booked 5120 MB  peak 2662 MB  p95 2662 MB  1 sample"
        "  suggest 3072 MB (frees 2048 MB)",
        "denbi-app  1 replica  booked 0.33 GPU (5069 MB)  peak 1536 MB  p95 1536 MB  1 sample"
        "  suggest 1792 MB (frees 3277 MB)",
        "  denbi-app#dddd pid 300  booked 0.33 GPU (5069 MB)  peak 1536 MB  p95 1536 MB  1 sample"
        "  suggest 1792 MB (frees 3277 MB)",
        "",
        "Re-booking at the suggestions frees 7373 MB cluster-wide.",
    ]


def test_spans() -> None:
    assert [span(s) for s in (0, 14, 3600, 7500, 90_061)] == ["0 s", "14 s", "1 h", "2 h 5 m", "1 d 1 h"]
