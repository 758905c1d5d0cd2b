"""Virtual and shared GPUs on the seed's real Ray cluster: the Europa head's one GPU
is, in turn, a vGPU guest's idle A40-16C slice whose NVML claims 14.5 GiB used, a passed-through
A100, a vGPU host's A40, and an RTX 3090 under MPS whose two clients are Ray actors. Only the
driver is fake (tests/fake_nvml, and tests/fake_cuda for CUDA's own figure, which differs from
NVML's so the test tells which one is shown).

Positive controls: make ``rayscope.core.gpu.trust.memory_used_reliable`` trust ``vgpu_guest`` and the
vGPU lines read ``VRAM: 14.5/16.0 GB`` and ``fit`` exits 1 ("1.5 GB free"); drop the MPS list
from ``rayscope.sources.nvml.devices.merge_processes`` and the MPS test loses both actors' memory; drop
``settle``'s CUDA branch and the sampling test never sees ``CUDA``.
"""

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from tests import fake_cuda
from tests import fake_nvml as fake
from tests.conftest import HeadDaemon, LiveCluster, push_agent, run_rayscope
from tests.schemas import parsed

pytestmark = pytest.mark.live

GIB = fake.GIB
PHANTOM = int(fake.PHANTOM_USED_GIB * GIB)
BOOKING = "GPU: 0.04/1 booked: 20480/24576 MB"
UNTRUSTED = "vGPU guest: NVML used not trusted"


def with_scenario(
    cluster: LiveCluster, env: dict[str, str], lib: fake.FakeNvml, name: str, text: str
) -> dict[str, str]:
    path = cluster.root / f"vgpu-{name}.txt"
    path.write_text(text)
    return lib.env(env, path)


@pytest.fixture
def vgpu(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], fake_nvml_lib: fake.FakeNvml
) -> dict[str, str]:
    return with_scenario(live_cluster, rayscope_env, fake_nvml_lib, "guest", fake.vgpu_guest())


def rayscope(env: dict[str, str], cluster: LiveCluster, *args: str) -> "tuple[int, str, str]":
    done = run_rayscope(*args, "--gcs", cluster.gcs_address, env=env)
    return done.returncode, done.stdout, done.stderr


def actor_id(cluster: LiveCluster, name: str) -> str:
    return str(next(a["actor_id"] for a in cluster.state["actors"] if a["name"] == name))


def head_line(out: str) -> str:
    return next(line for line in out.splitlines() if "[HEAD]" in line)


def test_a_vgpu_guest_never_shows_the_phantom_figure_as_measured(
    live_cluster: LiveCluster, vgpu: dict[str, str]
) -> None:
    code, out, err = rayscope(vgpu, live_cluster, "status")
    assert code == 0, err
    print(out)
    assert head_line(out) == (
        f"  127.0.0.1 [HEAD] G {BOOKING}  VRAM: NA/16.0 GB (vGPU: NVML used not trusted)  CPU: 8/8"
    )
    code, out, err = rayscope(vgpu, live_cluster, "status", "--json")
    doc = parsed(out, "status")
    node = doc["nodes"][live_cluster.node_id("head")]
    assert (node["used_gpu_memory"], node["used_gpu_memory_bytes"], node["nvml_memory_used_bytes"]) == (
        "NA",
        None,
        PHANTOM,
    )
    assert node["total_gpu_memory_bytes"] == 16 * GIB
    assert node["used_gpu_memory_reason"] == (
        f"{UNTRUSTED}; no CUDA sample: RAYSCOPE_CUDA_SAMPLE_S not set on the agent"
    )
    gpu = node["gpus"][0]
    assert (gpu["virtualization_mode"], gpu["compute_mode"], gpu["memory_used_bytes"]) == (
        "vgpu_guest",
        "default",
        None,
    )
    assert doc["cluster"]["used_gpu_memory_bytes"] is None  # the sums leave it out
    code, out, err = rayscope(vgpu, live_cluster, "node", "--gpus")
    assert code == 0, err
    print(out)
    lines = out.splitlines()
    # Every raylet of this host shares its one GPU: Europa's four replicas and deNBI's app.
    booked = "booked 20480 MB + 0.33 GPU by 5 actors"
    gpu_line = (  # 20480 MB booked of a 16 GiB device: full
        f"  GPU0 NVIDIA A40-16C  vGPU guest  {booked}  used NA GB (NVML's 14.5 GB not trusted)  util 0%  full"
        "  (power_draw_mw: Not Supported; temperature_c: Not Supported)"
    )
    assert gpu_line in lines
    unet = f"federated-unet-0#{actor_id(live_cluster, 'federated-unet-0')[:4]}"
    assert f"    {unet} booked 5120 MB used 0.0 GB (NVML, not trusted)" in lines  # per process, marked
    code, out, err = rayscope(vgpu, live_cluster, "node")
    assert (
        "  GPU0 NVIDIA A40-16C  vGPU guest  used NA/16.0 GB (NVML's 14.5 GB not trusted)  util 0%"
        "  (power_draw_mw: Not Supported; temperature_c: Not Supported)" in out.splitlines()
    ), out + err


def test_fit_does_not_refuse_on_the_phantom_figure(live_cluster: LiveCluster, vgpu: dict[str, str]) -> None:
    """Before this: "fits by booking, not by measured memory: GPU0 has 1.5 GB free", exit 1."""
    code, out, err = rayscope(vgpu, live_cluster, "fit", "--gpu-memory-mb", "4096")
    print(out)
    assert code == 0, out + err
    head = live_cluster.node_id("head")[:8]
    lines = out.splitlines()
    assert lines[1] == "Fits: yes, 1/1 replica(s) placed by booking"
    node_line = f"  127.0.0.1 [HEAD] G {head}: fits 1, gets 1 (limited by VRAM_MB: 4096 MB free)"
    assert lines[lines.index(node_line) + 1] == (
        f"    measured memory: not checked on GPU0 ({UNTRUSTED}; no CUDA sample:"
        " RAYSCOPE_CUDA_SAMPLE_S not set on the agent)"
    )
    code, out, _ = rayscope(vgpu, live_cluster, "fit", "--gpu-memory-mb", "4096", "--json")
    doc = parsed(out, "fit")
    node = next(n for n in doc["nodes"] if n["placed"])
    assert (node["measured"], node["not_checked_gpus"], doc["fits_measured"], doc["fits"]) == (
        "not_checked",
        [0],
        None,
        True,
    )


@pytest.mark.parametrize(
    ("name", "scenario", "vram", "kind"),
    [
        ("passthrough", fake.passthrough, "VRAM: 6.0/40.0 GB", "pass-through"),
        ("host_vgpu", lambda _pid: fake.host_vgpu(), "VRAM: 32.0/48.0 GB", "vGPU host"),
    ],
)
def test_pass_through_and_a_vgpu_host_read_as_bare_metal(
    live_cluster: LiveCluster,
    rayscope_env: dict[str, str],
    fake_nvml_lib: fake.FakeNvml,
    sleeper: int,
    name: str,
    scenario: Callable[[int], str],
    vram: str,
    kind: str,
) -> None:
    env = with_scenario(live_cluster, rayscope_env, fake_nvml_lib, name, scenario(sleeper))
    code, out, err = rayscope(env, live_cluster, "status")
    assert code == 0 and head_line(out) == f"  127.0.0.1 [HEAD] G {BOOKING}  {vram}  CPU: 8/8", out + err
    _, out, _ = rayscope(env, live_cluster, "node", "--gpus")
    gpu_line = next(line for line in out.splitlines() if line.startswith("  GPU0 "))
    assert f"  {kind}  booked" in gpu_line and "not trusted" not in gpu_line, out
    assert rayscope(env, live_cluster, "fit", "--gpu-memory-mb", "4096")[0] == 0


def test_mps_clients_are_found_as_the_actors_they_are(
    live_cluster: LiveCluster, rayscope_env: dict[str, str], fake_nvml_lib: fake.FakeNvml, sleeper: int
) -> None:
    """The compute list holds the MPS server (a process outside Ray); the MPS list the two
    clients, two federated-unet replicas: attribution finds them, memory and all."""
    actors = {a["name"]: a for a in live_cluster.state["actors"]}
    first, second = actors["federated-unet-0"], actors["federated-unet-1"]
    env = with_scenario(
        live_cluster, rayscope_env, fake_nvml_lib, "mps", fake.mps(sleeper, (first["pid"], second["pid"]))
    )
    _, out, _ = rayscope(env, live_cluster, "status", "--gpus")
    print(out)
    lines = out.splitlines()
    assert head_line(out) == f"  127.0.0.1 [HEAD] G {BOOKING}  VRAM: 6.0/24.0 GB  CPU: 8/8"
    start = lines.index(f"GPUs of 127.0.0.1 [HEAD] {live_cluster.node_id('head')[:12]}:")
    block = lines[start + 1 : start + 8]
    assert block[0] == (
        "  GPU0 NVIDIA GeForce RTX 3090  exclusive process, MPS  booked 20480 MB + 0.33 GPU by 5 actors"
        "  used 6.0 GB  util 87%"
    )
    assert f"    federated-unet-0#{first['actor_id'][:4]} booked 5120 MB used 3.0 GB" in block
    assert f"    federated-unet-1#{second['actor_id'][:4]} booked 5120 MB used 2.0 GB" in block
    assert f"    pid {sleeper} sleep booked nothing used 0.4 GB  unbooked" in block
    doc = parsed(rayscope(env, live_cluster, "status", "--json", "--gpus")[1], "status")
    gpu = doc["nodes"][live_cluster.node_id("head")]["gpus"][0]
    kinds = {p["pid"]: p["kinds"] for p in gpu["processes"]}
    assert kinds == {sleeper: ["compute"], first["pid"]: ["mps"], second["pid"]: ["mps"]}
    assert (gpu["mps_serving"], gpu["compute_mode"]) == (True, "exclusive_process")


# --- through the head agent, with the node agent's CUDA samples ------------------------------


@pytest.fixture
def cuda_dir(tmp_path: Path) -> fake_cuda.FakeCuda:
    return fake_cuda.build(tmp_path / "cuda")


def wait_for(read: Callable[[], Optional[Any]], timeout_s: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = read()
        if got:
            return got
        time.sleep(0.5)
    pytest.fail("timed out")


@pytest.fixture
def sampled_head(
    live_cluster: LiveCluster,
    vgpu: dict[str, str],
    cuda_dir: fake_cuda.FakeCuda,
    tmp_path: Path,
    wire_token: Path,
) -> Iterator[tuple[HeadDaemon, Path, dict[str, str]]]:
    """A head agent and the Europa node's push agent, which samples CUDA every 10 s (the
    shortest interval it takes) from the fake libcuda beside the fake NVML."""
    log = cuda_dir.beside(fake_cuda.vgpu_guest(fake.uuid(0)))
    env = {**vgpu, "LD_LIBRARY_PATH": f"{cuda_dir.lib_dir}:{vgpu['LD_LIBRARY_PATH']}"}
    head = HeadDaemon(
        env, tmp_path / "head.log", ["--gcs", live_cluster.gcs_address, "--interval", "1"], wire_token
    )
    agent = push_agent(
        head.listen_port,
        live_cluster.node_id("head"),
        {**env, "RAYSCOPE_CUDA_SAMPLE_S": "10"},
        tmp_path / "push.log",
        wire_token,
    )
    try:
        yield head, log, env
    finally:
        agent.stop()
        head.stop()


def test_with_cuda_sampling_the_reliable_figure_appears_with_its_source_and_age(
    live_cluster: LiveCluster, sampled_head: tuple[HeadDaemon, Path, dict[str, str]], wire_token: Path
) -> None:
    head, log, env = sampled_head
    via_head = ["--head", head.url, "--token-file", str(wire_token)]

    def line() -> Optional[str]:
        done = run_rayscope("status", *via_head, env=env)
        found = head_line(done.stdout) if "[HEAD]" in done.stdout else ""
        return found if "CUDA" in found else None

    got = wait_for(line)
    print(got)
    assert re.fullmatch(
        rf"  127\.0\.0\.1 \[HEAD\] G {re.escape(BOOKING)}  VRAM: 0\.8/16\.0 GB \(vGPU: CUDA \d+s old\)"
        r"  CPU: 8/8  agent: manual",
        got,
    ), got
    doc = parsed(run_rayscope("status", "--json", *via_head, env=env).stdout, "status")
    node = doc["nodes"][live_cluster.node_id("head")]
    assert (node["used_gpu_memory_source"], node["nvml_memory_used_bytes"]) == ("cuda", PHANTOM)
    assert node["used_gpu_memory_bytes"] == 16 * GIB - fake_cuda.VGPU_FREE_BYTES
    assert node["used_gpu_memory"] == node["used_gpu_memory_bytes"]  # BioEngine's key: a number now
    assert 0 <= node["used_gpu_memory_age_s"] <= 25
    cuda = next(s for s in node["sources"] if s["name"] == "cuda")
    print("cuda source:", cuda)
    assert cuda["ok"] and re.fullmatch(r"1 GPU\(s\), every 10 s, last sample \d+ ms", cuda["detail"])
    assert fake_cuda.retained(log) and {e[0] for e in fake_cuda.events(log)} >= {"init", "retain", "release"}
    fit = run_rayscope("fit", "--gpu-memory-mb", "4096", *via_head, env=env)
    print(fit.stdout)
    assert fit.returncode == 0, fit.stdout + fit.stderr
    assert re.search(
        r"    measured: GPU0 has 15\.2 GB free \(CUDA, \d+s old\) \(needs 4\.0 GB per replica\)", fit.stdout
    )


def test_one_gpu_reported_by_two_nodes_is_said_so_and_summed_once(
    live_cluster: LiveCluster,
    rayscope_env: dict[str, str],
    fake_nvml_lib: fake.FakeNvml,
    tmp_path: Path,
    wire_token: Path,
) -> None:
    """Europa's and deNBI's raylets run on this one host, so their agents report the same GPU
    (one UUID): time-slicing as Ray sees it. Each node keeps its numbers; the GPU lines say it
    is shared; rayscope's cluster sums count it once (BioEngine's add both, as BioEngine does)."""
    one_gpu = (
        fake.HEADER
        + "count 1\n"
        + fake.gpu(0, fake.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=5.0)
    )
    env = with_scenario(live_cluster, rayscope_env, fake_nvml_lib, "sliced", one_gpu)
    head = HeadDaemon(
        env, tmp_path / "head.log", ["--gcs", live_cluster.gcs_address, "--interval", "1"], wire_token
    )
    agents = [
        push_agent(
            head.listen_port, live_cluster.node_id(name), env, tmp_path / f"push-{name}.log", wire_token
        )
        for name in ("head", "denbi")
    ]
    via_head = ["--head", head.url, "--token-file", str(wire_token)]
    try:

        def both() -> Optional[dict[str, Any]]:
            done = run_rayscope("status", "--json", *via_head, env=env)
            doc: dict[str, Any] = parsed(done.stdout, "status") if done.stdout else {}
            return doc if doc and doc["cluster"]["gpu_nodes_measured"] == 2 else None

        doc = wait_for(both)
        cluster = doc["cluster"]
        assert (cluster["shared_gpus"], cluster["total_gpu_memory_bytes"]) == (1, 24 * GIB)
        assert cluster["used_gpu_memory_bytes"] == 5 * GIB
        assert cluster["total_gpu_memory"] == 48 * GIB  # BioEngine's: the node numbers added
        europa, denbi = (doc["nodes"][live_cluster.node_id(n)] for n in ("head", "denbi"))
        assert europa["shared_gpus"] == {fake.uuid(0): [live_cluster.node_id("denbi")]}
        assert denbi["shared_gpus"] == {fake.uuid(0): [live_cluster.node_id("head")]}
        lines = run_rayscope("status", "--gpus", *via_head, env=env).stdout.splitlines()
        start = lines.index(f"GPUs of 127.0.0.1 [HEAD] {live_cluster.node_id('head')[:12]}:")
        assert lines[start + 1].endswith("used 5.0 GB  util 87%  shared with 1 other node"), lines[start + 1]
    finally:
        for agent in agents:
            agent.stop()
        head.stop()
