"""``rayscope fit`` on recorded cluster states: BioEngine's sizing, its clamp/refuse edges,
greedy placement, and the driver's view beside the booking.

The states are what the head agent (or this host's NVML) produces: ``ClusterStatus`` with
per-node ``gpus`` from NVML (tests/scenarios.py). "Booking fits, measured memory does not" is
such a state, recorded — the NVML numbers a head would carry for a nearly full RTX 3090.

Positive controls: dropping the 10% clamp fails ``test_up_to_ten_percent_over_is_one_gpu``;
computing capacity in floats (0.96 / 0.01 = 95.99…) fails ``test_capacity_uses_rays_fixed_point``;
ignoring NVML fails ``test_booking_fits_but_measured_memory_does_not``.
"""

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Optional

import msgspec
import pytest

from rayscope.core.capacity import fit
from rayscope.core.capacity.sizing import gpu_fraction, validate_shape
from rayscope.errors import AgentError
from rayscope.render.fit import fit_json, fit_lines, fit_node_line
from rayscope.schema.fit import FitRequest, FitResult, NodeFit
from rayscope.schema.report import SourceStatus
from tests.golden import check_golden
from tests.scenarios import (
    A100,
    CPU,
    EUROPA,
    T4,
    T4_MIB,
    busy_gpu_status,
    embedded_seed_status,
    fraction_status,
    mixed_status,
    seed_status,
)
from tests.schemas import parsed


def answer(status: Any, **request: Any) -> FitResult:
    return fit.fit(status, FitRequest(**request))


def by_node(result: FitResult) -> dict[str, NodeFit]:
    return {n.node_id: n for n in result.nodes}


# --- sizing: BioEngine's AppBuilder shape ------------------------------------------------


def test_vram_cluster_books_a_handle_plus_vram_mb() -> None:
    result = answer(seed_status(), gpu_memory_mb=4096)
    assert result.sizing == "vram_mb"
    assert result.shape == {"GPU": 0.01, "VRAM_MB": 4096}


def test_europa_fits_no_fifth_5120_replica_but_a_4096_one() -> None:
    """The seed's Europa: 4 × 5120 booked of 24576, so 4096 MB are left."""
    no = answer(seed_status(), gpu_memory_mb=5120)
    assert (no.fits, no.placed, fit.exit_code(no)) == (False, 0, 1)
    europa = by_node(no)[EUROPA]
    assert (europa.capacity, europa.limited_by, europa.available["VRAM_MB"]) == (0, "VRAM_MB", 4096)
    yes = answer(seed_status(), gpu_memory_mb=4096)
    assert (yes.fits, yes.placed, fit.exit_code(yes)) == (True, 1, 0)
    assert by_node(yes)[EUROPA].placed == 1


def test_nodes_without_vram_mb_take_no_vram_booked_replica() -> None:
    nodes = by_node(answer(seed_status(), gpu_memory_mb=1024))
    assert nodes[T4].missing == ["VRAM_MB"] and nodes[T4].capacity == 0
    assert nodes[CPU].missing == ["GPU", "VRAM_MB"]


@pytest.mark.parametrize(
    ("mb", "expected"),
    [
        (7680, 0.5),  # half a T4
        (15360, 1.0),  # exactly one
        (15361, 1.0),  # over, clamped
        (16896, 1.0),  # 10% over exactly: still clamped
        (16898, 1.0),  # 1.1001 raw rounds to 1.1: BioEngine deploys it as one GPU
        (16972, 1.0),  # 1.10495 rounds to 1.1: the last one booked
        (16973, None),  # 1.10501 rounds to 1.11: the first one refused
        (100, 0.01),  # round(0.0065, 2) = 0.01
        (77, 0.01),  # 0.00501: the smallest request that still gets a GPU
        (76, 0.0),  # 0.00495 rounds to 0: num_gpus=0, no GPU at all
        (10, 0.0),
        (5000, 0.33),
    ],
)
def test_gpu_fraction_edges(mb: int, expected: Any) -> None:
    assert gpu_fraction(mb, T4_MIB) == expected


def bioengine_num_gpus(mb: int, smallest_mb: float) -> Optional[float]:
    """BioEngine's rule restated independently (decimal arithmetic on the exact ratio): the
    fraction rounded half-even to 0.01 first; refused over 1.1; at most 1.0."""
    exact = Decimal(mb / smallest_mb).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
    if exact > Decimal("1.1"):
        return None
    return float(min(exact, Decimal(1)))


@pytest.mark.parametrize("smallest_mb", [15360.0, 16384.0, 24576.0, 40960.0, 81559.0, 15095.06])
def test_gpu_fraction_matches_bioengine_over_a_grid(smallest_mb: float) -> None:
    """Every whole MiB from 1 to 1.2 x the GPU, both boundaries inside: the 0 -> 0.01 step
    near 0.5% and the 1.0 -> refused step near 1.105. Positive control: applying the grace
    to the raw ratio (the old rule) disagrees on the requests between 1.1 and 1.105; never
    going below the 0.01 handle disagrees on the tiny ones."""
    top = int(smallest_mb * 1.2)
    mismatches = [
        mb for mb in range(1, top) if gpu_fraction(mb, smallest_mb) != bioengine_num_gpus(mb, smallest_mb)
    ]
    assert mismatches == []
    zero = [mb for mb in range(1, top) if gpu_fraction(mb, smallest_mb) == 0.0]
    refused = [mb for mb in range(1, top) if gpu_fraction(mb, smallest_mb) is None]
    assert zero and max(zero) / smallest_mb < 0.005 <= (max(zero) + 1) / smallest_mb
    assert refused and (min(refused) - 1) / smallest_mb < 1.105 <= min(refused) / smallest_mb + 1e-9


def test_a_tiny_request_is_booked_with_no_gpu_and_said_so() -> None:
    result = answer(fraction_status(), gpu_memory_mb=50)
    assert result.shape == {"GPU": 0.0} and result.fits
    assert result.hazard is not None and "runs with no GPU" in result.hazard
    assert f"Hazard: {result.hazard}" in fit_lines(result)


def test_up_to_ten_percent_over_is_one_gpu() -> None:
    result = answer(fraction_status(), gpu_memory_mb=16896)
    assert result.sizing == "fraction" and result.shape == {"GPU": 1.0}
    assert (result.smallest_gpu_mb, result.smallest_gpu_from) == (T4_MIB, "NVML on 10.0.0.5")
    # 0.67 free on the T4: a whole GPU goes to the A100 node.
    assert by_node(result)[A100].placed == 1 and result.fits


def test_a_rounded_fraction_over_one_point_one_is_refused() -> None:
    result = answer(fraction_status(), gpu_memory_mb=16973)
    assert result.refused == (
        "16973 MiB is 1.11 of the smallest GPU (15360 MiB, NVML on 10.0.0.5), over the 1.1 BioEngine allows"
    )
    assert (result.fits, fit.exit_code(result), result.nodes) == (False, 1, [])
    assert fit_lines(result)[1] == f"Fits: no, refused: {result.refused}"


def test_whole_gpu_ignores_vram_packing() -> None:
    result = answer(seed_status(), gpu_memory_mb=-1)
    assert result.sizing == "whole_gpu" and result.shape == {"GPU": 1.0}
    assert not result.fits  # Europa has 0.96 free, the T4 0.01


def test_sizing_fraction_on_a_vram_cluster_uses_vram_mb_as_the_gpu_size() -> None:
    """Europa's GPU size from its VRAM_MB total when NVML is not there (embedded view); the
    T4 has neither, so the answer is "could not tell", never a guess."""
    with pytest.raises(AgentError) as err:
        answer(embedded_seed_status(), gpu_memory_mb=8192, sizing="fraction")
    assert err.value.exit_code == 2
    assert str(err.value) == (
        "could not tell: the GPU memory size of 1 GPU node(s) is unknown"
        " (no NVML measurement, no VRAM_MB): pass --gpu-total-mb"
    )
    result = answer(embedded_seed_status(), gpu_memory_mb=8192, sizing="fraction", gpu_total_mb=16384)
    assert result.shape == {"GPU": 0.5} and result.smallest_gpu_from == "--gpu-total-mb"


def test_stale_nvml_is_not_a_gpu_size() -> None:
    """mixed: the T4's report is 42 s old, so its NVML size is not used."""
    with pytest.raises(AgentError, match="could not tell"):
        answer(mixed_status(), gpu_memory_mb=4096, sizing="fraction")


def test_no_gpu_node_books_a_whole_gpu_and_nothing_fits() -> None:
    status = fraction_status()
    cpu_only = msgspec.structs.replace(status, nodes={CPU: status.nodes[CPU]})
    result = answer(cpu_only, gpu_memory_mb=4096)
    assert result.shape == {"GPU": 1.0} and "no GPU node" in result.sizing_reason
    assert not result.fits and by_node(result)[CPU].missing == ["GPU"]


def test_cpus_and_memory_join_the_shape() -> None:
    result = answer(seed_status(), gpu_memory_mb=4096, num_cpus=1, memory_mb=512)
    assert result.shape == {"GPU": 0.01, "VRAM_MB": 4096, "CPU": 1, "memory": 512 * 1024**2}
    europa = by_node(result)[EUROPA]
    assert (europa.capacity, europa.limited_by) == (0, "CPU")  # the four replicas hold all 8 CPUs
    assert fit_node_line(europa, result.shape).endswith("(CPU: 0 free, needs 1)")


# --- placement ---------------------------------------------------------------------------


def test_capacity_uses_rays_fixed_point() -> None:
    """Europa has 0.96 GPU free: 96 handles of 0.01, not 95 (0.96 / 0.01 = 95.99999999999999)."""
    result = answer(seed_status(), shape={"GPU": 0.01})
    assert by_node(result)[EUROPA].capacity == 96


def test_replicas_spread_over_nodes_in_turn() -> None:
    result = answer(fraction_status(), gpu_memory_mb=7680, replicas=3)
    nodes = by_node(result)
    assert (nodes[T4].capacity, nodes[A100].capacity) == (1, 3)
    assert (nodes[T4].placed, nodes[A100].placed, nodes[CPU].placed) == (1, 2, 0)
    assert result.fits and result.placed == 3
    too_many = answer(fraction_status(), gpu_memory_mb=7680, replicas=5)
    assert (too_many.fits, too_many.placed, fit.exit_code(too_many)) == (False, 4, 1)


def test_raw_shape_with_accelerator_type() -> None:
    result = answer(fraction_status(), shape={"GPU": 0.25, "accelerator_type:T4": 0.001})
    nodes = by_node(result)
    assert nodes[T4].capacity == 2 and nodes[A100].missing == ["accelerator_type:T4"]


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"TPU": 1}, "unknown resource 'TPU'"),
        ({"GPU": 1.5}, "whole GPUs"),
        ({"GPU": -0.5}, "at least 0"),
        ({"GPU": "half"}, "not a number"),
        ({"CPU": 0}, "requests nothing"),
    ],
)
def test_bad_shapes_say_what_is_wrong(shape: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_shape(shape)


def test_without_scheduler_view_it_cannot_tell() -> None:
    status = msgspec.structs.replace(
        seed_status(),
        sources=[SourceStatus(name="gcs", ok=False, reason="GCS unreachable at x:1")],
        scheduler_age_s=None,
    )
    with pytest.raises(AgentError) as err:
        answer(status, gpu_memory_mb=1024)
    assert err.value.exit_code == 2 and "no scheduler view" in str(err.value)


def test_with_an_old_scheduler_view_it_cannot_tell() -> None:
    """Bookings 60 s old (the GCS stopped answering) are no ground for "it fits"."""
    status = msgspec.structs.replace(
        seed_status(),
        sources=[SourceStatus(name="gcs", ok=False, reason="GCS unreachable at x:1")],
        scheduler_age_s=60.0,
        scheduler_stale=True,
    )
    with pytest.raises(AgentError) as err:
        answer(status, gpu_memory_mb=1024)
    assert err.value.exit_code == 2 and "only a 60s old scheduler view" in str(err.value)


# --- the driver's view -------------------------------------------------------------------


def test_booking_fits_but_measured_memory_does_not() -> None:
    """VRAM_MB has 4096 MB free on Europa, but NVML sees 22.8 of 24 GB in use."""
    result = answer(busy_gpu_status(), gpu_memory_mb=4096)
    assert result.fits_booking and result.fits_measured is False and not result.fits
    assert fit.exit_code(result) == 1
    europa = by_node(result)[EUROPA]
    assert europa.measured == "short" and europa.gpus[0].short
    lines = fit_lines(result)
    assert lines[1] == "Fits: no, 1/1 replica(s) placed by booking, not by measured memory"
    assert (
        "    fits by booking, not by measured memory: GPU0 has 1.2 GB free (needs 4.0 GB per replica)"
        in lines
    )


def test_measured_memory_that_holds_the_replica() -> None:
    result = answer(busy_gpu_status(), gpu_memory_mb=1024)
    assert result.fits and result.fits_measured is True
    assert by_node(result)[EUROPA].measured == "ok"


def test_best_case_gpu_choice_on_a_multi_gpu_node() -> None:
    """Two A100s with 20.5 and 38 GB free: each replica goes where the most memory is left,
    so two of 10 GB both land on GPU1 (38 → 28 → 18 GB) — best case, as Ray's choice is unknown."""
    result = answer(fraction_status(), gpu_memory_mb=10240, replicas=3)
    assert result.shape == {"GPU": 0.67}
    a100 = by_node(result)[A100]
    assert (by_node(result)[T4].placed, a100.placed, a100.measured) == (1, 2, "ok")
    assert [(g.index, g.replicas) for g in a100.gpus] == [(0, 0), (1, 2)]


def test_without_head_agent_other_nodes_are_not_measured_and_it_says_so() -> None:
    result = answer(embedded_seed_status(), gpu_memory_mb=4096)
    assert result.fits and result.fits_measured is None
    assert by_node(result)[EUROPA].measured == "unknown"
    assert fit_lines(result)[-1] == (
        "Measured memory: NA on 1 node(s) given replicas: not measured: without a head agent only"
        " this host's NVML is read (run `rayscope head` and `rayscope push` on every node)"
    )


def test_stale_report_is_not_a_measurement() -> None:
    result = answer(mixed_status(), shape={"GPU": 0.01}, replicas=2)  # one on Europa, one on the T4
    t4 = by_node(result)[T4]
    assert t4.placed == 1 and t4.measured == "unknown" and t4.measured_reason == "stale report (42s old)"


# --- output ------------------------------------------------------------------------------


def test_golden_fit_outputs() -> None:
    check_golden("fit_seed_4096.txt", "\n".join(fit_lines(answer(seed_status(), gpu_memory_mb=4096))) + "\n")
    busy = answer(busy_gpu_status(), gpu_memory_mb=4096)
    check_golden("fit_busy_4096.txt", "\n".join(fit_lines(busy)) + "\n")
    spread = answer(fraction_status(), gpu_memory_mb=7680, replicas=3)
    check_golden("fit_fraction_3x7680.txt", "\n".join(fit_lines(spread)) + "\n")
    check_golden("fit_fraction_3x7680.json", fit_json(spread) + "\n")


def test_fit_json_round_trips() -> None:
    result = answer(fraction_status(), gpu_memory_mb=7680, replicas=3)
    doc = parsed(fit_json(result), "fit")
    assert doc["fits"] is True and doc["shape"] == {"GPU": 0.5}
    assert {n["node_id"]: n["placed"] for n in doc["nodes"]} == {T4: 1, A100: 2, CPU: 0}
    assert msgspec.json.decode(fit_json(result), type=FitResult) == result


def test_an_agent_whose_nvml_failed_says_why() -> None:
    """A head view where Europa's agent reports but its NVML did not answer: its reason."""
    status = seed_status()
    failed = [
        SourceStatus(name="nvml", ok=False, reason="NVIDIA driver not loaded"),
        SourceStatus(name="host", ok=True),
    ]
    europa = msgspec.structs.replace(status.nodes[EUROPA], gpus=None, sources=failed)
    status = msgspec.structs.replace(status, nodes={**status.nodes, EUROPA: europa})
    node = by_node(answer(status, gpu_memory_mb=4096))[EUROPA]
    assert (node.measured, node.measured_reason) == ("unknown", "NVIDIA driver not loaded")


# --- what would place it ------------------------------------------------------------------


def v100_worker_status(free_gpu: float) -> Any:
    """The seed's head (``VRAM_MB``, so ``auto`` books ``VRAM_MB``) and a 2-GPU worker that
    advertises none, its GPUs measured by its agent, ``free_gpu`` of its GPU free."""
    from rayscope.core.rollup import merge, scheduler_nodes
    from tests.scenarios import NOW, SEED_VIEWS, gpu, report, view

    worker = "0b" * 28
    views = [
        SEED_VIEWS[0],
        view(
            worker,
            "10.0.0.6",
            {"CPU": 16, "GPU": 2, "accelerator_type:V100": 1},
            {"CPU": 16, "GPU": free_gpu},
        ),
    ]
    reports = {worker: report(worker, [gpu(0, 1.0), gpu(1, 12.0)], "10.0.0.6")}
    return merge(
        scheduler_nodes(views), reports, now=NOW, stale_after_s=15.0, view="head", scheduler_read_at=NOW
    )


def test_fit_says_sizing_fraction_places_what_vram_mb_does_not() -> None:
    """Before: ``Fits: no`` with the V100 node ``(no VRAM_MB)`` while 1.5 of its GPUs were
    free, and not a word that ``--sizing fraction`` places it."""
    result = answer(v100_worker_status(1.5), gpu_memory_mb=12000)
    assert (result.fits, result.sizing) == (False, "vram_mb")
    assert result.hint == (
        "--sizing fraction places 1/1 replica(s) by booking: GPU 0.49 per replica (12000/24576 MB"
        " of the smallest GPU, VRAM_MB on 172.17.0.3); room on nodes without VRAM_MB: 10.0.0.6"
    )
    assert f"Hint: {result.hint}" in fit_lines(result)
    placed = answer(v100_worker_status(1.5), gpu_memory_mb=12000, sizing="fraction")
    assert placed.fits and placed.shape == {"GPU": 0.49}  # the hint's claim, made good


def test_no_hint_where_fraction_places_nothing_more_or_was_asked_for() -> None:
    assert answer(v100_worker_status(0.2), gpu_memory_mb=12000).hint == ""  # no room there either
    assert answer(v100_worker_status(1.5), gpu_memory_mb=12000, sizing="vram").hint == ""  # chosen
    assert answer(v100_worker_status(1.5), gpu_memory_mb=4096).hint == ""  # VRAM_MB placed it
