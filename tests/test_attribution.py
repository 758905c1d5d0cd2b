"""Attribution, pure: who holds each GPU's memory, against what they booked.

Recorded shapes, no Ray and no NVML: devices as the nvml source returns them, processes as
the procs source describes them, actors as the GCS actor table lists them.
"""

import msgspec

from rayscope.core.gpu.attribution import attribute_cluster, attribute_node
from rayscope.core.gpu.precedence import dashboard_processes
from rayscope.core.rollup import merge, scheduler_nodes
from rayscope.render.gpus import gpu_block_lines
from rayscope.render.status import status_json
from rayscope.schema.report import GpuDevice, NodeReport, ProcessInfo
from rayscope.schema.status import ActorBooking, ClusterStatus, ReceivedReport
from tests.golden import check_golden
from tests.scenarios import EUROPA, NOW, SEED_REPORTS, SEED_VIEWS, T4
from tests.support.seeds import (
    EUROPA_ACTORS,
    EUROPA_GPU,
    EUROPA_PROCESSES,
    RAYLET_PID,
    SEED_SOURCES,
    actor,
    device,
    gpu_process,
    outsider,
    seed_with_gpus,
    worker,
)

GIB = 1024**3
MIB = 1024**2
NODE = EUROPA
OTHER_NODE = "0b" * 28


def test_the_issue_example_lines() -> None:
    gpus, node = attribute_node([EUROPA_GPU], EUROPA_PROCESSES, EUROPA_ACTORS, {NODE})
    assert gpu_block_lines(gpus, node) == [
        "GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 4 actors  used 21.3 GB  util 87%",
        "  federated-unet#0789 booked 5120 MB used 4.8 GB",
        "  federated-unet#a1b2 booked 5120 MB used 5.4 GB  over booking",
        "  federated-unet#c3d4 booked 5120 MB used 4.9 GB",
        "  federated-unet#e5f6 booked 5120 MB used 5.0 GB",
    ]
    att = gpus[0].attribution
    assert att is not None
    assert (att.booked_vram_mb, att.booked_gpu, att.booked_actors) == (20480, 0.04, 4)
    assert att.capacity_mb == 24576 and att.flags == [] and att.unbooked_bytes == 0
    over = [u for u in att.users if u.flags]
    assert [(u.actor_id, u.flags, u.pids) for u in over] == [("a1b2" + "0" * 28, ["over_booking"], [101])]


def test_exactly_the_booking_is_not_over_it() -> None:
    """5.0 GiB is 5120 MiB: at the booking, not over it (VRAM_MB counts MiB)."""
    gpu = device(0, 5.0, [gpu_process(103, 5120 / 1024)])
    gpus, _ = attribute_node([gpu], [worker(103)], EUROPA_ACTORS, {NODE})
    assert gpus[0].attribution is not None
    user = next(u for u in gpus[0].attribution.users if u.pids == [103])
    assert user.flags == [] and user.used_memory_bytes == 5120 * MIB


def test_processes_outside_ray_and_actors_that_booked_nothing_are_unbooked() -> None:
    cpu_actor = actor("dead" + "0" * 28, 105, name="preprocess")  # no GPU, no VRAM_MB
    gpu = device(0, 8.0, [gpu_process(105, 1.5), gpu_process(7000, 2.0), gpu_process(101, 4.0)])
    processes = [worker(105, "ray::Preprocess"), outsider(7000, "jupyter-lab"), worker(101)]
    gpus, _ = attribute_node([gpu], processes, [*EUROPA_ACTORS, cpu_actor], {NODE})
    lines = gpu_block_lines(gpus, None)
    assert lines[0] == "GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 4 actors  used 8.0 GB  util 87%"
    assert "  preprocess#dead booked nothing used 1.5 GB  unbooked" in lines
    assert "  pid 7000 jupyter-lab booked nothing used 2.0 GB  unbooked" in lines
    assert gpus[0].attribution is not None and gpus[0].attribution.unbooked_bytes == int(3.5 * GIB)


def test_booked_actors_without_gpu_memory_show_on_the_gpu_ray_gave_them() -> None:
    """Booked but idle: listed with 0 used on the GPU Ray assigned, so the booking adds up."""
    gpu = device(0, 5.4, [gpu_process(101, 5.4)])
    gpus, _ = attribute_node([gpu], [worker(101)], EUROPA_ACTORS, {NODE})
    assert gpu_block_lines(gpus, None)[:3] == [
        "GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 4 actors  used 5.4 GB  util 87%",
        "  federated-unet#0789 booked 5120 MB used 0.0 GB",
        "  federated-unet#a1b2 booked 5120 MB used 5.4 GB  over booking",
    ]


def test_a_ray_worker_the_actor_table_does_not_name_has_unknown_booking() -> None:
    gpu = device(0, 3.0, [gpu_process(300, 3.0)])
    gpus, _ = attribute_node([gpu], [worker(300, "ray::train_step")], EUROPA_ACTORS, {NODE})
    assert (
        gpu_block_lines(gpus, None)[-1]
        == "  ray::train_step pid 300 booked unknown used 3.0 GB  booking unknown"
    )


def test_without_the_actor_table_bookings_are_na_not_zero() -> None:
    gpus, node = attribute_node([EUROPA_GPU], EUROPA_PROCESSES, None, {NODE})
    lines = gpu_block_lines(gpus, node)
    assert lines[0] == "GPU0 NVIDIA GeForce RTX 3090  booked NA  used 21.3 GB  util 87%"
    assert (
        lines[1] == "  ray::ServeReplica:unet:federated-unet pid 101 booked NA used 5.4 GB  booking unknown"
    )
    assert not node.actors_read


def test_a_pid_of_another_node_is_not_that_nodes_actor() -> None:
    """Pids repeat across hosts: the actor table's pid 101 on another node is not our 101."""
    elsewhere = [actor("f00d" + "0" * 28, 101, vram_mb=5120, gpu=0.01, node_id=OTHER_NODE)]
    gpu = device(0, 5.4, [gpu_process(101, 5.4)])
    gpus, _ = attribute_node([gpu], [outsider(101)], elsewhere, {NODE})
    assert gpu_block_lines(gpus, None) == [
        "GPU0 NVIDIA GeForce RTX 3090  booked nothing  used 5.4 GB  util 87%",
        "  pid 101 python booked nothing used 5.4 GB  unbooked",
    ]


def test_from_a_container_nothing_is_mapped_and_nothing_is_flagged() -> None:
    """Host pids unmappable: listed as such, bookings on the GPUs Ray gave, used unknown."""
    gpus, node = attribute_node([EUROPA_GPU], None, EUROPA_ACTORS[:1], {NODE})
    assert gpu_block_lines(gpus, node) == [
        "GPU0 NVIDIA GeForce RTX 3090  booked 5120 MB by 1 actor  used 21.3 GB  util 87%",
        "  federated-unet#a1b2 booked 5120 MB used NA GB",
        "  pid 101 booked unknown used 5.4 GB  not mapped",
        "  pid 102 booked unknown used 4.9 GB  not mapped",
        "  pid 103 booked unknown used 5.0 GB  not mapped",
        "  pid 104 booked unknown used 4.8 GB  not mapped",
    ]
    assert not node.processes_mapped


def test_a_fraction_booked_actor_is_judged_on_its_share_of_the_device() -> None:
    """No VRAM_MB: 0.25 of a 15 GiB T4 is 3.75 GiB; 5 GiB is over it."""
    t4 = device(0, 5.0, [gpu_process(200, 5.0)], total_gib=15, name="Tesla T4")
    booked = [actor("beef" + "0" * 28, 200, name="denbi-app", gpu=0.25)]
    gpus, _ = attribute_node([t4], [worker(200, "ray::App")], booked, {NODE})
    assert gpu_block_lines(gpus, None) == [
        "GPU0 Tesla T4  booked 0.25 GPU by 1 actor  used 5.0 GB  util 87%",
        "  denbi-app#beef booked 0.25 GPU used 5.0 GB  over booking",
    ]


def test_an_actor_on_two_gpus_books_half_on_each() -> None:
    big = actor("cafe" + "0" * 28, 400, name="llm", vram_mb=40960, gpu=2, gpu_ids=[0, 1])
    gpus = [device(0, 19.0, [gpu_process(400, 19.0)]), device(1, 19.0, [gpu_process(400, 19.0)])]
    attributed, _ = attribute_node(gpus, [worker(400, "ray::LLM")], [big], {NODE})
    assert [gpu_block_lines([g], None) for g in attributed] == [
        [
            "GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 1 actor  used 19.0 GB  util 87%",
            "  llm#cafe booked 20480 MB used 19.0 GB",
        ],
        [
            "GPU1 NVIDIA GeForce RTX 3090  booked 20480 MB by 1 actor  used 19.0 GB  util 87%",
            "  llm#cafe booked 20480 MB used 19.0 GB",
        ],
    ]


def test_node_wide_vram_booking_that_hides_a_full_device() -> None:
    """Two 24 GiB GPUs, VRAM_MB 49152 node-wide, half booked — all of it on GPU0."""
    booked = [
        actor(f"{i:04x}" + "0" * 28, 500 + i, name=f"unet-{i}", vram_mb=8192, gpu=0.01, gpu_ids=[0])
        for i in range(3)
    ]
    gpus = [device(0, 20.0, [gpu_process(500 + i, 6.5) for i in range(3)]), device(1, 0.0, [])]
    processes = [worker(500 + i) for i in range(3)]
    attributed, node = attribute_node(
        gpus, processes, booked, {NODE}, total_vram_mb=49152, used_vram_mb=24576
    )
    lines = gpu_block_lines(attributed, node)
    assert (
        lines[0] == "GPU0 NVIDIA GeForce RTX 3090  booked 24576 MB by 3 actors  used 20.0 GB  util 87%  full"
    )
    assert lines[-1] == "VRAM_MB booked node-wide 24576/49152 MB hides a full device: GPU0 (24576/24576 MB)"
    assert lines[-2] == "all GPUs: booked 24576 MB by 3 actors  actors use 19.5 GB  unbooked 0.0 GB"
    assert node.flags == ["hidden_full"] and node.full_gpus == [0]
    assert (node.booked_vram_mb, node.booked_actors, node.actors_used_bytes) == (24576, 3, 3 * int(6.5 * GIB))
    _, alone = attribute_node(gpus[:1], processes, booked, {NODE}, total_vram_mb=24576, used_vram_mb=24576)
    assert alone.flags == [] and alone.full_gpus == [0]  # one GPU: the node line already says it


def test_an_actor_that_booked_vram_but_no_gpu_is_on_no_gpu() -> None:
    stray = actor("abba" + "0" * 28, 600, name="cache", vram_mb=2048)
    gpus, node = attribute_node([device(0, 0.0, [])], [], [stray], {NODE})
    assert gpu_block_lines(gpus, node) == [
        "GPU0 NVIDIA GeForce RTX 3090  booked nothing  used 0.0 GB  util 87%",
        "on no GPU: cache#abba booked 2048 MB used NA GB",
    ]


def test_mig_processes_are_attributed_on_their_instance() -> None:
    instance = GpuDevice(
        index=0,
        parent_index=0,
        name="NVIDIA A100-SXM4-40GB MIG 3g.20gb",
        memory_total_bytes=int(19.5 * GIB),
        memory_used_bytes=4 * GIB,
        processes=[gpu_process(101, 4.0)],
    )
    a100 = GpuDevice(
        index=0,
        name="NVIDIA A100-SXM4-40GB",
        memory_total_bytes=40 * GIB,
        memory_used_bytes=4 * GIB,
        mig_enabled=True,
        mig_devices=[instance],
    )
    gpus, _ = attribute_node([a100], [worker(101)], EUROPA_ACTORS[:1], {NODE})
    assert gpu_block_lines(gpus, None) == [
        "GPU0 NVIDIA A100-SXM4-40GB  MIG on  booked 5120 MB by 1 actor  used 4.0 GB  util NA",
        "  GPU0/MIG0 NVIDIA A100-SXM4-40GB MIG 3g.20gb  booked 5120 MB by 1 actor  used 4.0 GB  util NA",
        "    federated-unet#a1b2 booked 5120 MB used 4.0 GB",
    ]


def test_status_gpus_golden() -> None:
    attributed, text = seed_with_gpus()
    check_golden("status_gpus_seed.txt", text)
    assert "GPUs of 172.17.0.3 [HEAD] e0e0e0e0e0e0:" in text
    assert "  GPU0 NVIDIA GeForce RTX 3090  booked 20480 MB by 4 actors  used 22.5 GB  util 87%" in text
    assert "    pid 7000 jupyter-lab booked nothing used 1.2 GB  unbooked" in text
    check_golden("status_gpus_seed.json", status_json(attributed) + "\n")


def test_an_older_report_without_the_new_fields_still_decodes() -> None:
    """A report as the core release's agents send it (no processes, no GPU details)."""
    old = (
        b'{"schema":1,"node_id":"e0","collected_at":1.0,"gpus":[{"index":0,"name":"Tesla T4",'
        b'"uuid":null,"memory_total_bytes":16,"memory_used_bytes":8,"memory_info_version":2,'
        b'"utilization_gpu_pct":5,"errors":{}}],"sources":[]}'
    )
    report = msgspec.json.decode(old, type=NodeReport)
    assert report.processes is None
    assert report.gpus is not None and report.gpus[0].processes is None and report.gpus[0].mig_devices == []


def _two_raylets_on_one_host(head_uuid: str, worker_uuid: str) -> ClusterStatus:
    """Europa's four replicas and the T4's deNBI app, both raylets on this host (the embedded
    path's co-hosted group), each GPU with the UUID given."""
    europa_gpu = msgspec.structs.replace(EUROPA_GPU, uuid=head_uuid)
    t4_gpu = device(0, 4.2, [gpu_process(900, 4.2)], total_gib=15.0, name="Tesla T4")
    t4_gpu = msgspec.structs.replace(t4_gpu, uuid=worker_uuid)
    europa = msgspec.structs.replace(SEED_REPORTS[NODE].report, gpus=[europa_gpu], processes=EUROPA_PROCESSES)
    t4 = msgspec.structs.replace(
        SEED_REPORTS[T4].report, gpus=[t4_gpu], processes=[worker(900, "ray::denbi-app", node_id=T4)]
    )
    reports = {NODE: europa, T4: t4}
    received = {n: ReceivedReport(report=r, received_at=NOW - 2) for n, r in reports.items()}
    status = merge(
        scheduler_nodes(SEED_VIEWS), received, now=NOW, stale_after_s=15.0, view="gcs", sources=SEED_SOURCES
    )
    denbi = actor("d00d" + "0" * 28, 900, name="denbi-app", gpu=0.33, node_id=T4)
    hosted = {NODE: {NODE, T4}, T4: {NODE, T4}}
    return attribute_cluster(status, reports, [*EUROPA_ACTORS, denbi], hosted)


def test_raylets_on_one_host_share_only_the_devices_they_were_measured_on() -> None:
    """Raylets on one machine share its GPUs, so an actor of either may hold memory on them;
    but where each was measured on devices of its own (no UUID in common: a container each, or
    Ray's dashboard agent under each raylet's environment, as in ``make demo``), neither
    holds memory on the other's. Before: the demo's T4 listed the head's four replicas and the
    head's RTX 3090 the worker's app, each booking counted on both GPUs ("by 5 actors")."""
    apart = _two_raylets_on_one_host("GPU-aaaa", "GPU-bbbb")
    head_gpu, t4_gpu = ((apart.nodes[n].gpus or [])[0] for n in (NODE, T4))
    assert head_gpu.attribution is not None and t4_gpu.attribution is not None
    assert (head_gpu.attribution.booked_actors, t4_gpu.attribution.booked_actors) == (4, 1)
    assert [u.name for u in t4_gpu.attribution.users] == ["denbi-app"]

    shared = _two_raylets_on_one_host("GPU-aaaa", "GPU-aaaa")  # one device seen by both
    seen = [(shared.nodes[n].gpus or [])[0].attribution for n in (NODE, T4)]
    assert [a.booked_actors if a else None for a in seen] == [5, 5]


def _dead(actor_id: str, pid: int, name: str) -> ActorBooking:
    """An actor the GCS lists as ``DEAD`` (its booking released), last run by ``pid``."""
    return msgspec.structs.replace(actor(actor_id, pid, name, vram_mb=5120, gpu=0.01), state="DEAD")


DEAD_UNET = _dead("dead" + "0" * 28, 555, "federated-unet-2")
TWO_GPUS = [device(0, 7.5, [gpu_process(555, 7.0)]), device(1, 5.0, [gpu_process(101, 5.0)])]


def test_memory_a_dead_actor_still_holds_is_named_and_counted_unbooked() -> None:
    """A worker whose actor died (its core log names the actor, the GCS lists it DEAD) still
    holds 7 GiB: leaked. Named as the actor it was, booked nothing (Ray released its
    booking), counted in the node's unbooked memory. Before: ``ray::Replica pid 555 booked
    NA used 7.0 GB  booking unknown`` (NA as if the actor table was not read) and
    ``unbooked 0.0 GB`` in the node's sums."""
    leftover = ProcessInfo(
        pid=555,
        title="ray::Replica",
        worker_pid=555,
        raylet_pid=RAYLET_PID,
        node_id=NODE,
        actor_id=DEAD_UNET.actor_id,
    )
    gpus, node = attribute_node(TWO_GPUS, [leftover, worker(101)], [*EUROPA_ACTORS, DEAD_UNET], {NODE})
    lines = gpu_block_lines(gpus, node)
    assert "  federated-unet-2#dead booked nothing used 7.0 GB  actor dead, unbooked" in lines, lines
    assert lines[-1] == "all GPUs: booked 20480 MB by 4 actors  actors use 5.0 GB  unbooked 7.0 GB", lines
    assert node.unbooked_bytes == 7 * GIB and node.booked_actors == 4


def test_a_dead_actor_s_pid_on_the_dashboard_is_named_too() -> None:
    """No agent: Ray's dashboard lists pid 555 on the GPU, the GCS lists a DEAD actor whose
    last pid on this node was 555. Before: ``pid 555 booked NA used 7.0 GB  not mapped``."""
    base = scheduler_nodes(SEED_VIEWS)[NODE]
    node = msgspec.structs.replace(base, gpus=TWO_GPUS)
    actors = [*EUROPA_ACTORS, DEAD_UNET]
    gpus, attribution = attribute_node(TWO_GPUS, dashboard_processes(node, actors), actors, {NODE})
    lines = gpu_block_lines(gpus, attribution)
    assert "  federated-unet-2#dead booked nothing used 7.0 GB  actor dead, unbooked" in lines, lines
    assert lines[-1].endswith("unbooked 7.0 GB"), lines


def test_a_pid_nobody_can_map_says_its_booking_is_unknown_and_is_summed_apart() -> None:
    """The actor table was read, yet no actor is known behind a pid this host cannot see:
    its booking is unknown (``NA`` says the table was not read), and the node's line sums
    what nobody could map. Before: ``booked NA`` and nothing in the node's sums."""
    gpus, node = attribute_node(
        TWO_GPUS, [ProcessInfo(pid=555, visible=False), worker(101)], EUROPA_ACTORS, {NODE}
    )
    lines = gpu_block_lines(gpus, node)
    assert "  pid 555 booked unknown used 7.0 GB  not mapped" in lines, lines
    assert lines[-1].endswith("unbooked 0.0 GB  not mapped 7.0 GB"), lines
