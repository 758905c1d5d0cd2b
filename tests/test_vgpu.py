"""Virtual and shared GPUs, the pure parts: which used figure rayscope trusts per
GPU (rayscope.core.gpu.memory), what every output says about it, and time-sliced GPUs counted once.

The recorded cluster (tests/scenarios.virtual_status) holds a vGPU guest whose NVML claims
14.5 of 16 GiB used on an idle A40-16C slice, a pass-through A100, a vGPU host's A40, an MPS
server and two nodes time-slicing one T4. Bare metal's goldens (status_seed, status_mixed, ...)
are the other half of the proof: they did not change.

Positive controls: make :func:`rayscope.core.gpu.trust.memory_used_reliable` trust ``vgpu_guest`` and
the vGPU goldens show ``VRAM: 14.5/16.0 GB``, the fit test's exit becomes 1; drop the
``shared_overcount`` subtraction in ``rayscope.core.rollup.totals`` and the sums test fails.
"""

from collections.abc import Sequence
from typing import Optional

import msgspec
import pytest

from rayscope.core.capacity.fit import exit_code, fit
from rayscope.core.gpu.memory import measured_memory
from rayscope.core.gpu.trust import CudaFigure, GpuUsed, gpu_used, settle_on_agent
from rayscope.errors import AgentError
from rayscope.node.cuda_samples import CudaSamples, interval_from_env, settle_on_agent_all
from rayscope.render.fit import fit_lines
from rayscope.render.gpus import status_gpu_lines
from rayscope.render.metrics import metrics_text
from rayscope.render.node import node_lines
from rayscope.render.status import status_json, status_lines
from rayscope.schema.fit import FitRequest
from rayscope.schema.report import UNSET, GpuDevice, GpuProcess
from rayscope.sources.cuda.sample import CudaRequest, CudaSample, CudaSampler
from tests.golden import check_golden
from tests.scenarios import (
    GIB,
    SLICE_A,
    SLICE_B,
    VGPU,
    head_view,
    report,
    vgpu_node_diagnostics,
    view,
    virtual_gpu,
    virtual_status,
)

PHANTOM = int(14.5 * GIB)
A40_16C = 16 * GIB


def text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def test_goldens() -> None:
    plain, sampled = virtual_status(), virtual_status(cuda_age_s=12.0)
    check_golden("status_virtual.txt", text(status_lines(plain)))
    check_golden("status_virtual.json", status_json(plain) + "\n")
    check_golden("status_virtual.prom", metrics_text(plain))
    check_golden("status_gpus_virtual.txt", text(status_lines(plain) + status_gpu_lines(plain)))
    check_golden("status_virtual_cuda.txt", text(status_lines(sampled)))
    check_golden("fit_virtual_4096.txt", text(fit_lines(fit(plain, FitRequest(gpu_memory_mb=4096)))))
    check_golden("fit_virtual_cuda_4096.txt", text(fit_lines(fit(sampled, FitRequest(gpu_memory_mb=4096)))))
    check_golden("node_virtual.txt", text(node_lines(vgpu_node_diagnostics(), gpus=True)))
    check_golden("node_virtual_cuda.txt", text(node_lines(vgpu_node_diagnostics(12.0))))


def vgpu_line(status: object) -> str:
    lines = status_lines(status)  # type: ignore[arg-type]
    return next(line for line in lines if "10.0.2.1" in line)


def test_the_status_line_says_so_in_the_line_itself() -> None:
    assert vgpu_line(virtual_status()) == (
        "  10.0.2.1 [HEAD] A40 GPU: 0.01/1 booked: 4096/16384 MB  VRAM: NA/16.0 GB"
        " (vGPU: NVML used not trusted)  CPU: 0/8"
    )
    assert vgpu_line(virtual_status(cuda_age_s=12.0)) == (  # 12 s at collection + the report's 2 s
        "  10.0.2.1 [HEAD] A40 GPU: 0.01/1 booked: 4096/16384 MB  VRAM: 0.8/16.0 GB (vGPU: CUDA 14s old)"
        "  CPU: 0/8"
    )
    passthrough = [line for line in status_lines(virtual_status()) if "10.0.2.2" in line]
    assert passthrough == ["  10.0.2.2 [worker] A100 GPU: 0.00/1 VRAM: 6.0/40.0 GB  CPU: 0/8"]


def test_json_keeps_bioengines_types_the_reason_and_nvmls_raw_figure() -> None:
    doc = msgspec.json.decode(status_json(virtual_status()))
    node = doc["nodes"][VGPU]
    assert (node["used_gpu_memory"], node["used_gpu_memory_bytes"]) == ("NA", None)
    assert node["total_gpu_memory"] == node["total_gpu_memory_bytes"] == A40_16C
    assert node["nvml_memory_used_bytes"] == PHANTOM
    assert node["used_gpu_memory_reason"].startswith("vGPU guest: NVML used not trusted; no CUDA sample")
    gpu = node["gpus"][0]
    assert (gpu["virtualization_mode"], gpu["memory_used_bytes"], gpu["nvml_memory_used_bytes"]) == (
        "vgpu_guest",
        None,
        PHANTOM,
    )
    assert "memory_used_source" not in gpu  # absent with the figure, never a guess
    sampled = msgspec.json.decode(status_json(virtual_status(cuda_age_s=12.0)))["nodes"][VGPU]
    assert (sampled["used_gpu_memory_bytes"], sampled["used_gpu_memory_source"]) == (int(0.8 * GIB), "cuda")
    assert sampled["used_gpu_memory_age_s"] == 14.0 and sampled["used_gpu_memory"] == int(0.8 * GIB)
    assert sampled["gpus"][0]["memory_used_source"] == "cuda"


def test_fit_says_not_checked_instead_of_refusing() -> None:
    """Before this the phantom figure was NVML's used memory like any other: 1.5 GiB free
    refused a 4096 MB replica that fits by booking (exit 1). Now the check is not made there
    (exit 0); with a fresh CUDA sample it is made on CUDA's figure."""
    old_agent = virtual_status()
    phantom = msgspec.structs.replace(
        old_agent.nodes[VGPU].gpus[0],  # type: ignore[index]
        memory_used_bytes=PHANTOM,
        virtualization_mode=UNSET,
        nvml_memory_used_bytes=UNSET,
        memory_used_reason=UNSET,
    )
    reports = {VGPU: report(VGPU, [phantom], "10.0.2.1")}
    views = [view(VGPU, "10.0.2.1", *_vgpu_resources())]
    before = fit(head_view(views, reports), FitRequest(gpu_memory_mb=4096))
    assert (exit_code(before), before.nodes[0].measured) == (1, "short")
    assert "GPU0 has 1.5 GB free" in text(fit_lines(before))
    now = fit(virtual_status(), FitRequest(gpu_memory_mb=4096))
    head = now.nodes[0]
    assert (exit_code(now), head.measured, head.not_checked_gpus, now.fits_measured) == (
        0,
        "not_checked",
        [0],
        None,
    )
    sampled = fit(virtual_status(cuda_age_s=12.0), FitRequest(gpu_memory_mb=4096)).nodes[0]
    assert (sampled.measured, sampled.gpus[0].free_bytes, sampled.gpus[0].source) == (
        "ok",
        int(15.2 * GIB) + 1,
        "cuda",
    )


def _vgpu_resources() -> tuple[dict[str, float], dict[str, float]]:
    total: dict[str, float] = {"CPU": 8, "GPU": 1, "accelerator_type:A40": 1, "node:__internal_head__": 1}
    total["VRAM_MB"] = 16384
    return total, {**total, "GPU": 0.99, "VRAM_MB": 12288}


def test_a_replica_short_on_the_checked_gpus_goes_to_one_not_checked() -> None:
    """A node with a measured, nearly full GPU and a vGPU GPU nobody measured: the replica
    may fit on the second, so the answer is "not checked", never "short"."""
    full = settle_on_agent(virtual_gpu(1, "NVIDIA A40-16C", A40_16C, 15 * GIB, "none"))
    guest = settle_on_agent(virtual_gpu(0, "NVIDIA A40-16C", A40_16C, PHANTOM, "vgpu_guest"))
    total, free = _vgpu_resources()
    status = head_view(
        [view(VGPU, "10.0.2.1", {**total, "GPU": 2}, {**free, "GPU": 1.99})],
        {VGPU: report(VGPU, [guest, full], "10.0.2.1")},
    )
    node = fit(status, FitRequest(gpu_memory_mb=4096)).nodes[0]
    assert (node.measured, node.not_checked_gpus, [g.index for g in node.gpus]) == ("not_checked", [0], [1])


def gpu(**fields: object) -> GpuDevice:
    base = GpuDevice(index=0, uuid="GPU-1", name="A40", memory_total_bytes=A40_16C, memory_used_bytes=PHANTOM)
    return msgspec.structs.replace(base, **fields)


def test_gpu_used_is_the_one_judgement() -> None:
    # An agent before this: NVML's figure, read at collection.
    assert gpu_used(gpu()) == GpuUsed(PHANTOM, "nvml", 0.0, "", PHANTOM)
    # A report that claims NVML's figure on a vGPU guest is not believed.
    claim = gpu(virtualization_mode="vgpu_guest", memory_used_source="nvml", nvml_memory_used_bytes=PHANTOM)
    assert gpu_used(claim) == GpuUsed(None, None, None, "vGPU guest: NVML used not trusted", PHANTOM)
    # A mode this rayscope has no name for: nothing is guessed.
    assert gpu_used(gpu(virtualization_mode="vgpu_v9", nvml_memory_used_bytes=PHANTOM)).used_bytes is None
    cuda = gpu(
        virtualization_mode="vgpu_guest",
        memory_used_bytes=GIB,
        memory_used_source="cuda",
        memory_used_age_s=3.0,
        nvml_memory_used_bytes=PHANTOM,
    )
    assert gpu_used(cuda) == GpuUsed(GIB, "cuda", 3.0, "", PHANTOM)
    for mode in ("none", "passthrough", "host_vgpu", "host_vsga"):
        assert (
            gpu_used(settle_on_agent(gpu(virtualization_mode=mode, nvml_memory_used_bytes=PHANTOM))).source
            == "nvml"
        )


@pytest.mark.parametrize(
    ("figure", "reason"),
    [
        (
            None,
            "vGPU guest: NVML used not trusted; no CUDA sample: RAYSCOPE_CUDA_SAMPLE_S not set on the agent",
        ),
        (
            CudaFigure(GIB, 130.0, ""),
            "vGPU guest: NVML used not trusted; CUDA sample 130s old (fresh for 120s)",
        ),
        (
            CudaFigure(
                None,
                None,
                "not sampled: compute mode exclusive_process (a CUDA context could lock others out)",
            ),
            "vGPU guest: NVML used not trusted; CUDA: not sampled: compute mode exclusive_process"
            " (a CUDA context could lock others out)",
        ),
    ],
)
def test_a_sample_replaces_nvml_only_while_fresh(figure: Optional[CudaFigure], reason: str) -> None:
    raw = gpu(virtualization_mode="vgpu_guest", nvml_memory_used_bytes=PHANTOM)
    settled = settle_on_agent(raw, figure, 120.0)
    assert (settled.memory_used_bytes, settled.memory_used_reason) == (None, reason)
    fresh = settle_on_agent(raw, CudaFigure(GIB, 119.0, ""), 120.0)
    assert (fresh.memory_used_bytes, fresh.memory_used_source, fresh.memory_used_age_s) == (
        GIB,
        "cuda",
        119.0,
    )


def test_mig_instances_of_a_vgpu_guest_are_not_trusted_either() -> None:
    instance = GpuDevice(
        index=0, parent_index=0, memory_total_bytes=GIB, memory_used_bytes=1, nvml_memory_used_bytes=1
    )
    settled = settle_on_agent(
        gpu(virtualization_mode="vgpu_guest", nvml_memory_used_bytes=PHANTOM, mig_devices=[instance])
    )
    assert settled.mig_devices[0].memory_used_bytes is None
    assert (
        settled.mig_devices[0].memory_used_reason
        == "vGPU guest: NVML used not trusted; CUDA samples whole GPUs only"
    )


def test_time_sliced_gpus_are_said_so_and_summed_once() -> None:
    status = virtual_status()
    a, b = status.nodes[SLICE_A], status.nodes[SLICE_B]
    uuid = a.gpus[0].uuid  # type: ignore[index]
    assert (a.shared_gpus, b.shared_gpus) == ({uuid: [SLICE_B]}, {uuid: [SLICE_A]})
    assert status.cluster.shared_gpus == 1
    others = [n for n in status.nodes.values() if n.node_id not in (SLICE_A, SLICE_B)]
    assert all(n.shared_gpus is UNSET for n in others)
    # rayscope's sums: the T4 once (the first node's figures); the vGPU guest left out.
    assert status.cluster.total_gpu_memory_bytes == (40 + 48 + 24 + 15) * GIB
    assert status.cluster.used_gpu_memory_bytes == (6 + 32 + 6 + 3) * GIB
    # BioEngine's add every node's number, as BioEngine does.
    assert status.cluster.total_gpu_memory == (16 + 40 + 48 + 24 + 15 + 15) * GIB
    assert "  GPU0 Tesla T4  booked NA  used 3.0 GB  util 0%  shared with 1 other node" in status_gpu_lines(
        status
    )


def test_one_uuid_under_two_models_is_no_shared_gpu() -> None:
    status = virtual_status()
    renamed = msgspec.structs.replace(status.nodes[SLICE_B].gpus[0], name="Tesla T4 (other)")  # type: ignore[index]
    views = [view(n.node_id, n.node_ip or "", {"GPU": 1}, {"GPU": 1}) for n in (status.nodes[SLICE_A],)]
    views.append(view(SLICE_B, "10.0.2.6", {"GPU": 1}, {"GPU": 1}))
    reports = {
        SLICE_A: report(SLICE_A, status.nodes[SLICE_A].gpus, "10.0.2.5"),
        SLICE_B: report(SLICE_B, [renamed], "10.0.2.6"),
    }
    again = head_view(views, reports)
    assert again.cluster.shared_gpus is UNSET and again.nodes[SLICE_A].shared_gpus is UNSET


def test_mode_labels_are_bounded() -> None:
    """A report's own word never becomes a label value."""
    status = virtual_status()
    mine = status.nodes[VGPU].gpus[0]  # type: ignore[index]
    evil = msgspec.structs.replace(mine, virtualization_mode='x",a="b', compute_mode="turbo")
    node = msgspec.structs.replace(status.nodes[VGPU], gpus=[evil])
    metrics = metrics_text(msgspec.structs.replace(status, nodes={**status.nodes, VGPU: node}))
    mine = [line for line in metrics.splitlines() if "_mode{" in line and VGPU in line]
    assert [line.rsplit(",", 1)[1] for line in mine] == ['mode="unknown"} 1', 'mode="unknown"} 1']


def test_per_process_memory_on_a_vgpu_guest_is_marked() -> None:
    from rayscope.render.gpus import gpu_block_lines
    from rayscope.schema.report import GpuAttribution, GpuUser

    user = GpuUser(
        kind="process", pids=[7], name="python", booked_gpu=0.0, booked_vram_mb=0.0, used_memory_bytes=GIB
    )
    guest = settle_on_agent(
        gpu(
            virtualization_mode="vgpu_guest",
            nvml_memory_used_bytes=PHANTOM,
            processes=[GpuProcess(pid=7, used_memory_bytes=GIB)],
            attribution=GpuAttribution(booked_vram_mb=0, users=[user]),
        )
    )
    lines = gpu_block_lines([guest], None)
    assert lines[1] == "  pid 7 python booked nothing used 1.0 GB (NVML, not trusted)"
    bare = msgspec.structs.replace(guest, virtualization_mode="none")
    assert gpu_block_lines([settle_on_agent(bare)], None)[1] == "  pid 7 python booked nothing used 1.0 GB"


def test_measured_memory_leaves_an_untrusted_gpu_out_and_keeps_nvmls_figure() -> None:
    guest = settle_on_agent(gpu(virtualization_mode="vgpu_guest", nvml_memory_used_bytes=PHANTOM))
    memory = measured_memory([guest])
    assert (memory.total_bytes, memory.used_bytes, memory.nvml_used_bytes, memory.unmeasured) == (
        A40_16C,
        None,
        PHANTOM,
        0,
    )


# --- the node agent's side: which GPUs it asks CUDA about ---------------------------------------


class FakeSampler(CudaSampler):
    """What :class:`CudaSampler` answers, without a child: the requests it was given."""

    def __init__(self, answer: dict[str, CudaSample]) -> None:
        super().__init__(min_interval_s=60.0)
        self.answer = answer
        self.asked: list[list[CudaRequest]] = []

    def sample(self, requests: Sequence[CudaRequest]) -> dict[str, CudaSample]:
        self.asked.append(list(requests))
        return {r.uuid: self.answer[r.uuid] for r in requests}


def test_only_gpus_whose_nvml_figure_is_not_trusted_are_sampled() -> None:
    guest = gpu(
        uuid="GPU-g", virtualization_mode="vgpu_guest", compute_mode="default", nvml_memory_used_bytes=PHANTOM
    )
    bare = gpu(uuid="GPU-b", virtualization_mode="none", nvml_memory_used_bytes=GIB)
    sample = CudaSample(
        uuid="GPU-g", free_bytes=int(15.2 * GIB), total_bytes=A40_16C, age_s=0.0, duration_s=0.05
    )
    sampler = FakeSampler({"GPU-g": sample})
    samples = CudaSamples(sampler)
    settled, sources = settle_on_agent_all([guest, bare], samples)
    assert [[r.uuid for r in batch] for batch in sampler.asked] == [["GPU-g"]]
    assert sampler.asked[0][0].free_bytes_readings == (int(1.5 * GIB),)
    assert settled is not None
    assert (settled[0].memory_used_bytes, settled[0].memory_used_source) == (
        A40_16C - int(15.2 * GIB),
        "cuda",
    )
    assert (settled[1].memory_used_bytes, settled[1].memory_used_source) == (GIB, "nvml")
    assert [(s.name, s.ok, s.detail) for s in sources] == [
        ("cuda", True, "1 GPU(s), every 60 s, last sample 50 ms")
    ]
    settle_on_agent_all([guest], samples)  # CUDA's own free figure is a reading the next time
    assert sampler.asked[1][0].free_bytes_readings == (int(15.2 * GIB), int(1.5 * GIB))


def test_without_sampling_nothing_is_asked_and_the_reason_says_how_to_ask() -> None:
    settled, sources = settle_on_agent_all(
        [gpu(virtualization_mode="vgpu_guest", nvml_memory_used_bytes=PHANTOM)], None
    )
    assert sources == [] and settled is not None
    assert settled[0].memory_used_reason == (
        "vGPU guest: NVML used not trusted; no CUDA sample: RAYSCOPE_CUDA_SAMPLE_S not set on the agent"
    )


@pytest.mark.parametrize("value", ["5", "abc", "inf", "-60", "1e9"])
def test_a_bad_interval_is_refused_by_name(value: str) -> None:
    with pytest.raises(AgentError, match="RAYSCOPE_CUDA_SAMPLE_S"):
        interval_from_env({"RAYSCOPE_CUDA_SAMPLE_S": value})


def test_sampling_is_off_unless_asked() -> None:
    assert [
        interval_from_env(e) for e in ({}, {"RAYSCOPE_CUDA_SAMPLE_S": "0"}, {"RAYSCOPE_CUDA_SAMPLE_S": "off"})
    ] == [
        None,
        None,
        None,
    ]
    assert interval_from_env({"RAYSCOPE_CUDA_SAMPLE_S": "60"}) == 60.0
    samples = CudaSamples.from_env({"RAYSCOPE_CUDA_SAMPLE_S": "30"})
    assert samples is not None and (samples.sampler.min_interval_s, samples.max_age_s) == (30.0, 60.0)
