"""Per-device placement, pure: Ray's GPU ids on physical devices, and their match to NVML.

Shapes as the sources return them: actors with ``gpu_shares`` as the GCS actor table holds
them (``resource_mapping``), the raylet with its environment, NVML devices with UUIDs and
PCI bus ids. Positive control: taking Ray's id as the NVML index (the old rule) fails the
``CUDA_VISIBLE_DEVICES`` tests; summing per node instead of per device fails the packing ones.
"""

from rayscope.core.capacity.fit import fit
from rayscope.core.gpu.attribution import attribute_cluster
from rayscope.core.gpu.placement import (
    device_free,
    match_visible,
    place_devices,
    placement_known,
    replicas_on_devices,
)
from rayscope.render.fit import fit_lines
from rayscope.render.gpus import status_gpu_lines
from rayscope.render.metrics import metrics_text
from rayscope.render.status import status_lines
from rayscope.schema.fit import FitRequest
from rayscope.schema.report import NodeReport, SourceStatus
from rayscope.schema.status import ClusterStatus, ClusterTotals
from tests.golden import check_golden
from tests.support.placement import FOUR, NODE, booking, fragmented_status, gpu, node, raylet, uuid


def test_each_device_gets_what_ray_put_on_it() -> None:
    """Two 0.6 replicas on two devices: 0.4 free on each, so a 0.5 fits nowhere although the
    node sum shows 0.8 free (DESIGN.md: Ray keeps it pending)."""
    actors = [booking("a", [(0, 0.6)], vram_mb=8000), booking("b", [(1, 0.6)], vram_mb=8000)]
    placement = place_devices(node(2, 1.2), actors, raylet(None), FOUR[:2])
    assert [(d.gpu_id, d.booked_gpu, d.free_gpu, d.booked_vram_mb) for d in placement.devices] == [
        (0, 0.6, 0.4, 8000.0),
        (1, 0.6, 0.4, 8000.0),
    ]
    assert replicas_on_devices(placement.devices, 0.5) == 0
    assert replicas_on_devices(placement.devices, 0.4) == 2
    assert placement.unplaced_gpu == 0.0


def test_quantities_come_from_ray_not_an_even_split() -> None:
    """An actor Ray gave 2 whole GPUs, and fractions packed onto one device."""
    actors = [
        booking("big", [(2, 1.0), (3, 1.0)]),
        booking("q1", [(0, 0.25)], vram_mb=1000),
        booking("q2", [(0, 0.5)], vram_mb=2000),
        booking("q3", [(1, 0.25)]),
    ]
    devices = place_devices(node(4, 3.0), actors, raylet(None), FOUR).devices
    assert [d.booked_gpu for d in devices] == [0.75, 0.25, 1.0, 1.0]
    assert [d.booked_vram_mb for d in devices] == [3000.0, 0.0, 0.0, 0.0]
    assert devices[0].actors == {"q1": 0.25, "q2": 0.5}
    assert replicas_on_devices(devices, 1.0) == 0
    assert replicas_on_devices(devices, 0.25) == 1 + 3


def test_tasks_booking_gpu_leave_the_placement_partial() -> None:
    """A node that booked 0.5 more than its actors hold: the devices' free is an upper bound."""
    status = node(2, 1.0)
    status.placement = place_devices(status, [booking("a", [(0, 0.5)])], raylet(None), FOUR[:2])
    assert status.placement.unplaced_gpu == 0.5
    assert not placement_known(status)
    assert [d.free_gpu for d in device_free(status)] == [0.5, 1.0]


def test_visible_devices_as_indices_map_to_those_devices() -> None:
    """``CUDA_VISIBLE_DEVICES=1,3``: Ray's id 0 is GPU1, id 1 is GPU3, not GPU0 and GPU1."""
    matched = match_visible(2, raylet("1,3"), FOUR)
    assert [(entry, g.uuid if g else None) for entry, g, _ in matched] == [("1", uuid(1)), ("3", uuid(3))]


def test_visible_devices_as_uuids_map_by_uuid_and_prefix() -> None:
    matched = match_visible(2, raylet(f"{uuid(2)},{uuid(0)[:12]}"), FOUR)
    assert [g.index if g else None for _, g, _ in matched] == [2, 0]
    missing = match_visible(1, raylet("GPU-ffffffff"), FOUR)
    assert missing[0][1] is None and missing[0][2].startswith("ambiguous: no NVML device")


def test_pci_order_is_bus_order_not_nvml_order() -> None:
    """NVML listing the devices out of bus order: CUDA_DEVICE_ORDER=PCI_BUS_ID counts by bus."""
    shuffled = [gpu(0, "00000000:81:00.0"), gpu(1, "00000000:01:00.0")]
    matched = match_visible(2, raylet(None, "PCI_BUS_ID"), shuffled)
    assert [g.index if g else None for _, g, _ in matched] == [1, 0]


def test_mixed_models_in_fastest_first_order_are_ambiguous() -> None:
    """CUDA's default order ranks by speed: with an A100 and a T4 index 0 is not told."""
    mixed = [gpu(0, "00000000:01:00.0", "Tesla T4"), gpu(1, "00000000:02:00.0")]
    matched = match_visible(2, raylet(None), mixed)
    assert all(g is None and how.startswith("ambiguous: CUDA index") for _, g, how in matched)
    by_bus = match_visible(2, raylet(None, "PCI_BUS_ID"), mixed)
    assert [g.index if g else None for _, g, _ in by_bus] == [0, 1]


def test_an_unread_environment_is_not_guessed() -> None:
    matched = match_visible(2, raylet(None, read=False), FOUR)
    assert all(g is None for _, g, _ in matched)
    assert match_visible(1, raylet(None, read=False), FOUR[:1])[0][2] == "the only GPU"


def test_attribution_puts_an_idle_actor_on_the_device_ray_gave_it() -> None:
    """With ``CUDA_VISIBLE_DEVICES=2,3`` an actor holding Ray id 1 is on GPU3 (old rule: GPU1)."""
    status = ClusterStatus(generated_at=0.0, view="gcs", cluster=ClusterTotals(), nodes={NODE: node(2, 0.5)})
    report = NodeReport(node_id=NODE, collected_at=0.0, raylet=raylet("2,3"), gpus=FOUR, processes=[])
    out = attribute_cluster(status, {NODE: report}, [booking("q", [(1, 0.5)])])
    gpus = out.nodes[NODE].gpus or []
    holders = [[u.actor_id for u in g.attribution.users] if g.attribution else [] for g in gpus]
    assert holders == [[], [], [], ["q"]]
    placement = out.nodes[NODE].placement
    assert placement is not None
    assert [(d.visible_id, d.uuid, d.booked_gpu) for d in placement.devices] == [
        ("2", uuid(2), 0.0),
        ("3", uuid(3), 0.5),
    ]


def test_fit_refuses_a_fraction_no_single_device_holds() -> None:
    """Positive control: without the per-device bound (node sums) the 0.5 replica "fits"."""
    result = fit(fragmented_status(), FitRequest(shape={"GPU": 0.5}))
    assert (result.fits, result.nodes[0].capacity, result.nodes[0].limited_by) == (False, 0, "GPU per device")
    assert result.nodes[0].available["GPU"] == 0.8  # the node sum admits it
    assert "no device has 0.5 GPU free" in "\n".join(fit_lines(result))
    assert fit(fragmented_status(), FitRequest(shape={"GPU": 0.4}, replicas=2)).fits


def test_fit_falls_back_to_node_sums_when_tasks_hold_gpu_and_says_so() -> None:
    result = fit(fragmented_status(tasks_gpu=0.1), FitRequest(shape={"GPU": 0.5}))
    assert result.nodes[0].per_device is False and result.fits  # 0.7 free by the sum
    assert result.per_device_note == (
        "GPU judged on node sums, not per device, on 1 node(s):"
        " 1 with GPU booked by tasks, whose devices Ray does not publish"
    )
    assert result.per_device_note in fit_lines(result)


def test_status_lines_show_a_device_fuller_than_the_node_sum_golden() -> None:
    """A 4-GPU node booked 1.5/4 by the sum, with GPU1 whole and a 0.5 beside VRAM_MB on
    GPU0: GPU1 gets its own line under the node's (exact seed format kept); GPU0 does not (0.5
    booked). ``--gpus`` lists all four with their VRAM_MB and flags the node-wide booking.
    Positive control: judging on the node sum (0.38 booked) shows no device line."""
    status = node(4, 1.5, total_vram=4 * 40960, used_vram=20480)
    actors = [booking("b" * 32, [(1, 1.0)]), booking("a" * 32, [(0, 0.5)], vram_mb=20480)]
    status.placement = place_devices(status, actors, raylet(None, "PCI_BUS_ID"), FOUR)
    cluster = ClusterStatus(
        generated_at=0.0,
        view="gcs",
        sources=[SourceStatus(name="gcs", ok=True)],
        cluster=ClusterTotals(
            total_cpu=32, total_gpu=4, used_gpu=1.5, total_vram_mb=163840, used_vram_mb=20480
        ),
        nodes={NODE: status},
    )
    lines = status_lines(cluster)
    assert (
        lines[3] == "  10.0.0.9 [worker] A100 GPU: 1.50/4 booked: 20480/163840 MB  VRAM: NA/NA GB  CPU: 0/32"
    )
    assert [line for line in lines if "fuller" in line] == [
        "    GPU1 GPU-00000001-5f1c-4d3e-9a7b-000000000000  booked 1.00 GPU by 1 actor, 0.00 free"
        "  used 1.0/40.0 GB  fuller than the node sum"
    ]
    check_golden("status_gpus_multigpu.txt", "\n".join(lines + status_gpu_lines(cluster)) + "\n")
    metrics = metrics_text(cluster)
    assert (
        f'rayscope_device_vram_booked_bytes{{node_id="{NODE}",uuid="{uuid(0)}",gpu_id="0"}} {20480 * 2**20}'
        in metrics
    )
    check_golden("metrics_multigpu.prom", metrics)
