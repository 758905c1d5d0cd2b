"""Faults injected into live parts, each outcome asserted, each a row of RELIABILITY.md.

* the GCS of a Ray cluster of its own SIGKILLed, then a head started on the same port;
* a raylet SIGKILLed and left a zombie (and one stopped with SIGSTOP);
* a hung NVML call, and an NVML that starts before the driver is loaded (the fake NVML);
* two hosts without a raylet, each in its own UTS and pid namespace (``unshare``).

Agents report every second; conditions are polled with generous deadlines, never slept for.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from tests import fake_nvml as fake
from tests.conftest import (
    REPO,
    Daemon,
    HeadDaemon,
    LiveCluster,
    base_env,
    push_agent,
    run_rayscope,
)
from tests.raynode import RayHead
from tests.reliability_plugin import FaultRecord
from tests.schemas import parsed
from tests.support.ports import free_port_for_ray, refused_port
from tests.waiting import eventually, timed

pytestmark = [pytest.mark.live, pytest.mark.fault]

INTERVAL_S = 1.0


def status_head(head: HeadDaemon, token_file: Path, *extra: str) -> "subprocess.CompletedProcess[str]":
    env = base_env(RAY_AUTH_MODE="disabled")
    return run_rayscope("status", "--head", head.url, "--token-file", str(token_file), *extra, env=env)


def node_json(head: HeadDaemon, node_id: str) -> Optional[dict[str, Any]]:
    code, body = head.get("/v1/status?all=1")
    assert code == 200
    node: Optional[dict[str, Any]] = parsed(body, "status")["nodes"].get(node_id)
    return node


# --- the GCS ------------------------------------------------------------------------------


def bindable(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:``port`` now (as a restarted GCS will)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_gcs_killed_then_restarted_on_the_same_port(
    fault: FaultRecord, tmp_path: Path, wire_token: Path
) -> None:
    """Positive control: take ``scheduler_stale`` out of ``rollup.scheduler_view`` and
    the first wait times out: the head keeps serving its last view with exit 0."""
    fault.expect(
        "GCS SIGKILLed, then a head restarted on the same port",
        "within 3 intervals + the GCS deadline: `status --head` exits 1, says how old the view"
        " is, marks node lines, /metrics stale 1; after the restart it heals by itself (exit 0)",
    )
    env = base_env(RAY_AUTH_MODE="disabled")
    port = free_port_for_ray()  # Ray's GCS port: needed before start, the restart takes it again
    ray = RayHead(port, env, tmp_path / "ray1.log")
    head: Optional[HeadDaemon] = None
    try:
        ray.pid_of("raylet")
        head = HeadDaemon(
            env, tmp_path / "head.log", ["--gcs", ray.address, "--interval", str(INTERVAL_S)], wire_token
        )
        h = head

        def complete() -> Optional["subprocess.CompletedProcess[str]"]:
            done = status_head(h, wire_token)
            return done if done.returncode == 0 else None

        eventually(complete, 120.0, "a first scheduler view with the node")
        fault.observe("before: exit 0")

        ray.kill_gcs()

        def partial() -> Optional["subprocess.CompletedProcess[str]"]:
            done = status_head(h, wire_token)
            return done if done.returncode == 1 else None

        done, waited = timed(partial, 60.0, "status exit 1 after the GCS died")
        assert "the scheduler view is" in done.stderr and "s old" in done.stderr, done.stderr
        assert "only the agents' reports are shown" not in done.stderr
        node_lines = [line for line in done.stdout.splitlines() if line.startswith("  ")]
        assert node_lines and all("scheduler view" in line for line in node_lines), done.stdout
        metrics = head.get("/metrics")[1].decode()
        assert "rayscope_scheduler_view_stale 1" in metrics
        health = json.loads(head.get("/healthz")[1])
        assert health["scheduler_view_stale"] is True and health["gcs_poller"]["alive"] is True
        fault.observe(f"exit 1 {waited:.1f} s after the kill: {done.stderr.strip()}")

        assert ray.wait_exit() != 0  # ray start --block ends when its GCS died
        for attempt in range(3):  # the port may take a moment to be free for a new GCS
            eventually(lambda: bindable(port), 30.0, f"port {port} free for a new GCS")
            ray = RayHead(port, env, tmp_path / f"ray2-{attempt}.log")
            try:
                ray.pid_of("raylet")
                break
            except RuntimeError:
                ray.stop()
        else:
            raise AssertionError(f"no new Ray head on port {port} after 3 tries (see ray2-*.log)")

        def healed() -> Optional["subprocess.CompletedProcess[str]"]:
            done = status_head(h, wire_token, "--json")
            if done.returncode != 0:
                return None
            return done if parsed(done.stdout, "status")["scheduler_age_s"] < 3 * INTERVAL_S else None

        try:
            done, waited = timed(healed, 180.0, "the view healed after the restart")
        except AssertionError as err:  # say what the head saw
            raise AssertionError(f"{err}\nhead log:\n{head.log_text()[-3000:]}") from None
        document = parsed(done.stdout, "status")
        assert not document["scheduler_stale"] and document["cluster"]["nodes_alive"] == 1
        fault.observe(f"healed {waited:.1f} s after the new head's raylet ran: exit 0, view fresh")
    finally:
        if head is not None:
            head.stop()
        ray.stop()


# --- the raylet ---------------------------------------------------------------------------


def fake_raylet(tmp_path: Path, node_id: str) -> "subprocess.Popen[bytes]":
    """A process named ``raylet`` with a raylet's command line (a Python that sleeps, started
    through a link named ``raylet``: the kernel takes the process name from it)."""
    link = tmp_path / "raylet"
    if not link.exists():
        link.symlink_to(os.path.realpath(sys.executable))
    argv = ["raylet", "-c", "import time; time.sleep(600)", f"--node_id={node_id}"]
    argv += ["--node_ip_address=127.0.0.1", "--static_resource_list=CPU,1"]
    return subprocess.Popen(argv, executable=str(link))


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def local_raylet_ids() -> set[str]:
    done = run_rayscope("node", "--json", "--gcs", f"127.0.0.1:{refused_port()}")
    return {r["node_id"] for r in parsed(done.stdout, "node")["raylets"]}


def test_a_sigkilled_raylet_left_a_zombie_counts_as_not_running(
    fault: FaultRecord, tmp_path: Path, head_daemon: HeadDaemon, wire_token: Path
) -> None:
    """Positive control: drop the status check from ``raylet.still_running`` and the agent
    never logs the loss: a zombie's create time still matches."""
    fault.expect(
        "raylet SIGKILLed and left a zombie (not reaped); another SIGSTOPped",
        "both count as not running: `node` lists neither, the node agent pinned to the killed"
        " one logs that its raylet is gone within a few intervals",
    )
    killed_id, stopped_id = "5a" * 28, "5b" * 28
    raylet = fake_raylet(tmp_path, killed_id)
    stopped = fake_raylet(tmp_path, stopped_id)
    agent = push_agent(head_daemon.listen_port, killed_id, base_env(), tmp_path / "push.log", wire_token)
    try:
        eventually(lambda: local_raylet_ids() >= {killed_id, stopped_id}, 60.0, "the fake raylets listed")
        eventually(lambda: "reporting for Ray node" in agent.log_text(), 60.0, "the agent on its raylet")
        os.kill(raylet.pid, signal.SIGKILL)
        os.kill(stopped.pid, signal.SIGSTOP)
        eventually(lambda: proc_state(raylet.pid) == "Z", 30.0, "a zombie")
        eventually(lambda: proc_state(stopped.pid) in ("T", "t"), 30.0, "a stopped raylet")
        listed = local_raylet_ids()
        assert killed_id not in listed and stopped_id not in listed
        gone = f"no local raylet has node id {killed_id}"
        _, waited = timed(lambda: gone in agent.log_text(), 60.0, "the agent saw its raylet go")
        assert proc_state(raylet.pid) == "Z"  # still a zombie: the agent judged a zombie
        fault.observe(
            f"zombie and stopped raylet not listed by `node`; agent logged the loss after {waited:.1f} s"
        )
    finally:
        agent.stop()
        os.kill(stopped.pid, signal.SIGKILL)
        for proc in (raylet, stopped):
            proc.wait(timeout=15)


# --- NVML ---------------------------------------------------------------------------------


StartAgent = Callable[[str, str], Daemon]
"""Starts ``rayscope push`` as a node id (the second argument) on the fake NVML playing a
scenario (the first), reporting to ``head_daemon``."""


@pytest.fixture
def nvml_agent(
    fake_nvml_lib: fake.FakeNvml, tmp_path: Path, head_daemon: HeadDaemon, wire_token: Path
) -> StartAgent:
    def start(scenario: str, node_id: str) -> Daemon:
        path = tmp_path / "scenario.txt"
        path.write_text(scenario)
        env = fake_nvml_lib.env(base_env(), path)
        return push_agent(head_daemon.listen_port, node_id, env, tmp_path / "push.log", wire_token)

    return start


def one_gpu() -> str:
    return (
        fake.HEADER
        + "count 1\n"
        + fake.gpu(0, fake.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=5)
    )


def nvml_source(node: dict[str, Any]) -> dict[str, Any]:
    source: dict[str, Any] = next(s for s in node["sources"] if s["name"] == "nvml")
    return source


def test_a_hung_nvml_call_is_a_timed_out_source_and_the_loop_goes_on(
    fault: FaultRecord, head_daemon: HeadDaemon, nvml_agent: StartAgent
) -> None:
    """Positive control: call ``nvml.read_gpus`` directly in ``collect.local_report`` and the
    agent sends nothing for the first 60 s (the first report never arrives in time)."""
    fault.expect(
        "NVML call hangs (nvmlDeviceGetCount sleeps 60 s)",
        "the NVML source reports a timeout; reports keep arriving every interval (never stale)",
    )
    node_id = "6a" * 28
    agent = nvml_agent(one_gpu() + "hang 60\n", node_id)
    try:
        eventually(lambda: node_json(head_daemon, node_id), 60.0, "a first report")

        def nvml_timed_out() -> Optional[dict[str, Any]]:
            node = node_json(head_daemon, node_id)
            return node if node and "timed out" in nvml_source(node)["reason"] else None

        timed_out = eventually(nvml_timed_out, 60.0, "a timed-out NVML source")
        ages = []
        end = time.monotonic() + 10.0
        while time.monotonic() < end:  # 10 intervals: the loop is not blocked by the hung call
            now = node_json(head_daemon, node_id)
            assert now is not None and not now["stale"], now
            ages.append(now["report_age_s"])
            time.sleep(0.5)
        assert max(ages) < 3 * INTERVAL_S
        fault.observe(f"nvml: {nvml_source(timed_out)['reason']}; report age ≤ {max(ages):.1f} s over 10 s")
    finally:
        agent.stop()


def test_nvml_found_after_the_driver_loads(
    fault: FaultRecord, tmp_path: Path, head_daemon: HeadDaemon, nvml_agent: StartAgent
) -> None:
    """Positive control: make ``nvml.NvmlInit.ensure`` remember its first failure (the old code)
    and the GPU never appears."""
    fault.expect(
        "node agent started before the NVIDIA driver loaded",
        "NVML init is retried with backoff; the GPU appears once the driver is there",
    )
    node_id = "6b" * 28
    driver = tmp_path / "driver-loaded"
    scenario = one_gpu() + f"init_requires {driver}\n"
    agent = nvml_agent(scenario, node_id)
    try:
        node = eventually(lambda: node_json(head_daemon, node_id), 60.0, "a first report")
        assert "driver not loaded" in nvml_source(node)["reason"], node["sources"]
        driver.touch()
        node, waited = timed(
            lambda: (n := node_json(head_daemon, node_id)) and n["total_gpu_memory_bytes"] and n,
            90.0,
            "the GPU after the driver loaded",
        )
        assert node["total_gpu_memory_bytes"] == 24 * fake.GIB and nvml_source(node)["ok"]
        # A host the scheduler does not know gives Ray no GPU: BioEngine's key says 0 there.
        assert node["in_scheduler"] is False and node["total_gpu_memory"] == 0
        fault.observe(f"'driver not loaded' at first; GPU reported {waited:.1f} s after the driver appeared")
    finally:
        agent.stop()


# --- hosts without a raylet ---------------------------------------------------------------


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


class HostAgent:
    """``rayscope push`` in its own UTS and pid namespace, named ``hostname`` (no raylet)."""

    def __init__(self, hostname: str, listen_port: int, token: Path, log_path: Path) -> None:
        self._log = open(log_path, "a")  # noqa: SIM115 - closed in stop()
        script = f'hostname {hostname} && exec "$0" -m rayscope push "$@"'
        args = [
            "--head",
            f"127.0.0.1:{listen_port}",
            "--interval",
            str(INTERVAL_S),
            "--token-file",
            str(token),
        ]
        # sh -c SCRIPT NAME ARGS...: $0 is the interpreter, "$@" the push arguments.
        command = ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child"]
        command += ["sh", "-c", script, sys.executable, *args]
        self.process = subprocess.Popen(command, cwd=REPO, env=base_env(), stdout=self._log, stderr=self._log)

    def stop(self) -> None:
        self.process.kill()  # --kill-child: the namespace's processes go with it
        self.process.wait(timeout=15)
        self._log.close()


@pytest.fixture
def login_hosts(
    tmp_path: Path, wire_token: Path, live_cluster: LiveCluster
) -> Iterator[tuple[HeadDaemon, list[str]]]:
    if not can_unshare():
        pytest.skip("this kernel or sandbox allows no UTS and pid namespaces (unshare)")
    env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(live_cluster.root))
    head = HeadDaemon(
        env,
        tmp_path / "head.log",
        ["--gcs", live_cluster.gcs_address, "--interval", str(INTERVAL_S)],
        wire_token,
    )
    names = [f"login-{socket.gethostname()[:8]}-a", f"login-{socket.gethostname()[:8]}-b"]
    agents = [HostAgent(n, head.listen_port, wire_token, tmp_path / f"{n}.log") for n in names]
    try:
        yield head, names
    finally:
        for agent in agents:
            agent.stop()
        head.stop()


def test_two_hosts_without_a_raylet_are_two_entries_under_every_view(
    fault: FaultRecord, login_hosts: tuple[HeadDaemon, list[str]], wire_token: Path
) -> None:
    """Positive control: key unknown nodes by ``report.node_id`` in ``rollup.merge`` and the
    two hosts collapse into one entry ``""``; ``--gpus`` then fails with exit 2."""
    fault.expect(
        "two node agents on hosts without a raylet (own UTS and pid namespaces)",
        "one entry per host under status, --json, --gpus and /metrics; exit 0",
    )
    head, names = login_hosts
    keys = {f"host:{n}" for n in names}

    def both() -> Optional[dict[str, Any]]:
        # exit 0 too: a head that has not read the scheduler yet rightly says "partial" (1)
        done = status_head(head, wire_token, "--json")
        document: dict[str, Any] = parsed(done.stdout, "status") if done.stdout else {}
        return document if done.returncode == 0 and keys <= set(document.get("nodes", {})) else None

    document = eventually(both, 90.0, "both hosts at the head, its scheduler view read")
    assert {document["nodes"][k]["hostname"] for k in keys} == set(names)
    gpus = status_head(head, wire_token, "--gpus")
    assert gpus.returncode == 0, gpus.stderr
    text = status_head(head, wire_token)
    assert text.returncode == 0, text.stderr
    metrics = head.get("/metrics")[1].decode()
    for name in names:
        assert name in text.stdout and name in gpus.stdout
        assert f'node_id="host:{name}"' in metrics
    fault.observe(f"entries {sorted(keys)}; status, --gpus exit 0; both in /metrics")
