"""A new operator's first hour, live: ``make demo KEEP=1``, and the README's
multi-node quick start typed as it is on a real two-node Ray cluster whose nodes are network,
pid, host-name and ``/etc`` namespaces (tests/netns.py): the head node at 10.213.N.1, a worker
at 10.213.N.2, each running ``ray start --block`` and seeing only its own raylet.

The README's block is read from README.md (between ``quickstart:begin`` and ``quickstart:end``)
and run line by line, on the nodes its comments name, with one substitution: ``HEAD_IP``, the
placeholder an operator fills in. Two commands reach outside a node and are stood in for:
``scp`` copies the file from the head node's ``/etc`` (its overlay layer) to the node's, and
``ufw`` records its arguments (no firewall runs in the namespaces). ``rayscope head`` and
``rayscope push`` are left running, as in the operator's terminals.

Positive controls: drop ``--listen 0.0.0.0:7531`` from the README's head line (the quick start
before) and the worker's agent never reports (``push`` logs "connection refused"); take the
``say_goodbye()`` call out of ``Pusher.run`` and the SIGTERM case shows ``stale`` after three
intervals instead of ``no agent`` within one.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, TypeVar

import pytest

from tests import netns
from tests.conftest import REPO, base_env
from tests.support.ports import HEAD_ON_PORT_0, wait_started

pytestmark = pytest.mark.live

README = REPO / "README.md"
HEAD_INTERVAL_S = 5.0
"""The head's default interval, which the quick start keeps: "within one interval" is this."""
T = TypeVar("T")

FAKE_SCP = """#!/bin/sh
# scp as the quick start uses it (scp -p HOST:/etc/PATH DEST), between namespaced nodes:
# HOST's /etc is the overlay layer named in $RAYSCOPE_TEST_HOSTS/HOST.
while [ "${1#-}" != "$1" ]; do shift; done
host=${1%%:*}; path=${1#*:}
case $path in /etc/*) ;; *) echo "fake scp: only /etc/ paths" >&2; exit 1;; esac
exec cp -p "$(cat "$RAYSCOPE_TEST_HOSTS/$host")/${path#/etc/}" "$2"
"""
FAKE_UFW = """#!/bin/sh
echo "$@" >> "$RAYSCOPE_TEST_FIREWALL"
"""


def eventually(what: str, probe: Callable[[], Optional[T]], timeout_s: float) -> tuple[T, float]:
    start = time.monotonic()
    while True:
        found = probe()
        if found is not None:
            return found, time.monotonic() - start
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.2)


class Step(NamedTuple):
    where: str
    """``head`` or ``others`` (every node but the head)."""
    command: str


def quickstart_steps(text: str) -> list[Step]:
    """The README's quick start: each command line with the nodes its comment names."""
    block = text.split("<!-- quickstart:begin -->", 1)[1].split("<!-- quickstart:end -->", 1)[0]
    lines = block.strip().removeprefix("```sh").removesuffix("```").strip().splitlines()
    steps: list[Step] = []
    where = ""
    for line in lines:
        if line.startswith("# On the head node"):
            where = "head"
        elif line.startswith("# On every other node"):
            where = "others"
        elif line.startswith("#"):
            raise AssertionError(f"a comment the test does not know names no node: {line}")
        elif line.strip():
            assert where, f"a command before any '# On ...' comment: {line}"
            steps.append(Step(where, line))
    return steps


def test_the_quick_start_parses_into_the_steps_an_operator_types() -> None:
    steps = quickstart_steps(README.read_text())
    commands = [s.command.split("#")[0].strip() for s in steps]
    assert [s.where for s in steps] == ["head", "head", "head", "others", "others", "head", "head"]
    assert commands[2] == "rayscope head --listen 0.0.0.0:7531 --token-file /etc/rayscope/token"
    assert commands[4] == commands[5] == "rayscope push --head HEAD_IP:7531 --token-file /etc/rayscope/token"


# --- make demo KEEP=1 ---------------------------------------------------------------------


def test_demo_keep_stays_up_prints_commands_that_work_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    """``make demo KEEP=1`` (``livecluster.py demo --keep``): the cluster stays up, the printed
    commands work when pasted (one of each kind is run here through ``sh``), Ctrl-C stops
    it and removes its directory."""
    env = base_env(RAY_AUTH_MODE="disabled")
    out = tmp_path / "demo.out"
    with open(out, "w") as sink:
        demo = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "livecluster.py"), "demo", "--keep"],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually("the commands to try", lambda: "rayscope status --head" in out.read_text() or None, 240)
        text = out.read_text()
        lines = [line.strip() for line in text.splitlines() if line.startswith("  ")]
        export = next(line for line in lines if line.startswith("export "))
        root = re.search(r"RAY_TMPDIR=(\S+)", export)
        assert root is not None and Path(root.group(1)).is_dir()
        tried = [c for c in lines if c.startswith(("rayscope status --gcs", "rayscope fit", "rayscope node"))]
        assert len(tried) == 6
        for command in [c for c in tried if "--watch" not in c]:
            done = subprocess.run(
                ["sh", "-c", f"{export} && {command}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode in (0, 1), (command, done.stderr)  # fit 5120 does not fit: 1
            assert done.stdout.strip() and "Traceback" not in done.stderr
        assert_the_agents_lines_measure_each_node_s_own_gpus(lines, export, env, tmp_path / "head.log")
        assert demo.poll() is None  # still up after being used
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=90) == 0
        assert "Stopping the cluster" in out.read_text()
        assert not Path(root.group(1)).exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=30)


def assert_the_agents_lines_measure_each_node_s_own_gpus(
    lines: list[str], export: str, env: dict[str, str], head_log: Path
) -> None:
    """The demo's agent lines, pasted (the head's ports taken from the OS instead of 7531 and
    7532): ``status --head`` shows each node's own fake GPU, the T4 at 4.5/15.0 GB, and no
    GPU shared. Before, every ``push`` read the head's scenario from the ``export`` line: the
    T4 node at ``18.8/24.0 GB``, ``shared with 1 other node`` under ``--gpus``."""
    head = next(c for c in lines if c.startswith("rayscope head ")) + " " + " ".join(HEAD_ON_PORT_0)
    with open(head_log, "w") as log:
        agents = [subprocess.Popen(["sh", "-c", f"{export} && exec env {head}"], env=env, stderr=log)]
    try:
        report_port, http_port = wait_started(head_log.read_text, agents[0], timeout_s=60)

        def ported(command: str) -> str:
            command = command.replace("127.0.0.1:7531", f"127.0.0.1:{report_port}")
            return command.replace("127.0.0.1:7532", f"127.0.0.1:{http_port}")

        pushes = [ported(c) for c in lines if " rayscope push " in f" {c}"]
        status = ported(next(c for c in lines if c.startswith("rayscope status --head")))
        assert len(pushes) == 2, lines
        for command in pushes:
            shell = ["sh", "-c", f"{export} && exec env {command}"]
            agents.append(subprocess.Popen(shell, env=env, stderr=subprocess.DEVNULL))

        def both_reported() -> Optional[str]:
            done = subprocess.run(
                ["sh", "-c", f"{export} && {status} --gpus"],
                env=env,
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            worker = [line for line in done.stdout.splitlines() if "[worker] T4" in line]
            return (
                done.stdout
                if worker and "agent: manual" in worker[0] and "no agent" not in done.stdout
                else None
            )

        text, _ = eventually("both agents reporting", both_reported, 90)
        worker = next(line for line in text.splitlines() if "[worker] T4" in line)
        assert "VRAM: 4.5/15.0 GB" in worker, text
        assert "shared with" not in text, text
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            agent.wait(timeout=30)


# --- the multi-node quick start -------------------------------------------------------------


class Cluster:
    """Two namespaced nodes running Ray, and what the quick start left running on them."""

    def __init__(self, lan: netns.Lan, root: Path) -> None:
        self.root = root
        self.head = lan.node("head")
        self.worker = lan.node("node1")
        self.nodes = {"head": self.head, "node1": self.worker}
        hosts = root / "hosts"
        hosts.mkdir()
        fakes = root / "bin"
        fakes.mkdir()
        for name, script in (("scp", FAKE_SCP), ("ufw", FAKE_UFW)):
            (fakes / name).write_text(script)
            (fakes / name).chmod(0o755)
        for node in self.nodes.values():
            (hosts / node.ip).write_text(str(node.upper))
        self.firewall = root / "firewall.log"
        bin_dir = os.path.dirname(sys.executable)
        # Real addresses: without the loopback setting (Ray's `ray start --address` refuses under it).
        loopback_only = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
        self.env = {
            **{k: v for k, v in base_env(RAY_AUTH_MODE="disabled").items() if k != loopback_only},
            "PATH": f"{fakes}:{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "RAYSCOPE_TEST_HOSTS": str(hosts),
            "RAYSCOPE_TEST_FIREWALL": str(self.firewall),
        }
        self.ray: list[netns.Process] = []
        self.agents: dict[str, netns.Process] = {}
        """``head``, and ``push@NODE`` for each node agent."""
        self.last_status = ""
        """The quick start's ``rayscope status`` line, as typed on the head node."""

    def start_ray(self) -> None:
        head_ip = self.head.ip
        common = "--block --num-cpus=1 --num-gpus=1"
        self.ray.append(
            self.head.start(
                f"ray start --head --port=6379 --node-ip-address={head_ip} {common} --include-dashboard=false"
                f""" --resources='{{"VRAM_MB": 24576}}' --temp-dir={self.root}/ray-head""",
                self.env,
                self.root / "ray-head.log",
            )
        )
        eventually("the Ray head", lambda: self._nodes_alive(self.ray[-1]) >= 1 or None, 120)
        self.ray.append(
            self.worker.start(
                f"ray start --address={head_ip}:6379 --node-ip-address={self.worker.ip} {common}"
                f""" --resources='{{"accelerator_type:T4": 1}}' --temp-dir={self.root}/ray-node1""",
                self.env,
                self.root / "ray-node1.log",
            )
        )
        eventually("the Ray worker", lambda: self._nodes_alive(self.ray[-1]) >= 2 or None, 120)

    def _nodes_alive(self, starting: netns.Process) -> int:
        assert starting.nsenter.poll() is None, f"{starting.shell}: exited\n{starting.text()[-2000:]}"
        done = self.head.run(f"rayscope status --json --gcs {self.head.ip}:6379", self.env, timeout=60)
        if done.returncode != 0:
            return 0
        return int(json.loads(done.stdout)["cluster"]["nodes_alive"])

    def type(self, step: Step) -> None:
        """One line of the quick start, as typed on each node its comment names."""
        command = step.command.replace("HEAD_IP", self.head.ip)
        targets = [self.head] if step.where == "head" else [self.worker]
        for node in targets:
            if command.startswith(("rayscope head", "rayscope push")):
                name = "head" if command.startswith("rayscope head") else f"push@{node.name}"
                self.agents[name] = node.start(command, self.env, self.root / f"{name}.log")
                if name == "head":  # the operator sees its first line before going on
                    eventually(
                        "the head's first line",
                        lambda: "head agent: reports on" in self.log("head") or None,
                        60,
                    )
            elif command.startswith("rayscope status"):
                self.last_status = command
            else:
                done = node.run(command, self.env)
                assert done.returncode == 0, (node.name, command, done.stderr)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def status(self, *extra: str) -> "subprocess.CompletedProcess[str]":
        """The quick start's last line (``rayscope status --head ...``) on the head node."""
        return self.head.run(" ".join([self.last_status, *extra]), self.env, timeout=60)

    def worker_node(self) -> dict[str, Any]:
        done = self.status("--json")
        assert done.returncode in (0, 1), done.stderr
        nodes = json.loads(done.stdout)["nodes"]
        (worker,) = [n for n in nodes.values() if n["node_ip"] == self.worker.ip]
        return dict(worker)

    def stop(self) -> None:
        for process in [*self.agents.values(), *reversed(self.ray)]:
            process.signal(signal.SIGTERM)
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Ray on two namespaced nodes, then the README's quick start typed on them."""
    why_not = netns.missing()
    if why_not:
        pytest.skip(f"namespaced nodes: {why_not}")
    root = Path(tmp_path_factory.mktemp("qs"))
    with netns.lan(root) as lan:
        cluster = Cluster(lan, root)
        try:
            cluster.start_ray()
            for step in quickstart_steps(README.read_text()):
                cluster.type(step)
            # The head's first scheduler read takes up to an interval: until then, no data.
            eventually("the head's first GCS read", lambda: cluster.status().returncode != 2 or None, 60)
            yield cluster
        finally:
            cluster.stop()


def test_the_readme_quick_start_works_across_nodes_as_typed(quickstart: Cluster) -> None:
    """The worker's own agent reports to the head over the node network, fresh; every node
    line says how it is covered; the token file is the owner's only, on both nodes."""

    def complete() -> Optional["subprocess.CompletedProcess[str]"]:
        done = quickstart.status()
        lines = [line for line in done.stdout.splitlines() if line.lstrip().startswith(quickstart.worker.ip)]
        return done if done.returncode == 0 and lines and lines[0].endswith("agent: manual") else None

    done, _ = eventually("every node reporting through the head", complete, 90)
    assert done.stderr == ""
    for node in quickstart.nodes.values():
        line = next(ln for ln in done.stdout.splitlines() if ln.lstrip().startswith(node.ip + " "))
        assert line.endswith("agent: manual") and "no agent" not in line and "stale" not in line, line
    worker = quickstart.worker_node()
    assert worker["agent"] == "reporting" and worker["report_age_s"] < 2 * HEAD_INTERVAL_S
    assert "connected to head" in quickstart.log("push@node1")
    for node in quickstart.nodes.values():
        token = node.etc("/etc/rayscope/token")
        assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) == 64
    assert quickstart.firewall.read_text().splitlines() == ["allow 7531/tcp"]


def test_a_clean_stop_is_no_agent_at_once_and_a_crash_is_stale(quickstart: Cluster) -> None:
    """SIGTERM: the agent says goodbye and the head shows ``no agent`` within one interval
    (before: ``stale`` after three, for good). SIGKILL: no goodbye, ``stale`` after three
    intervals and ``status`` exits 1. The agent is started again after each."""
    push_line = next(
        s.command
        for s in quickstart_steps(README.read_text())
        if s.where == "others" and s.command.startswith("rayscope push")
    )
    push = push_line.replace("HEAD_IP", quickstart.head.ip)

    def restart() -> None:
        quickstart.agents["push@node1"] = quickstart.worker.start(
            push, quickstart.env, quickstart.root / "push@node1.log"
        )
        eventually(
            "the agent reporting again", lambda: quickstart.worker_node()["agent"] == "reporting" or None, 60
        )

    eventually("the agent reporting", lambda: quickstart.worker_node()["agent"] == "reporting" or None, 90)
    agent = quickstart.agents["push@node1"]
    agent.signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    _, took = eventually(
        "no agent after SIGTERM", lambda: quickstart.worker_node()["agent"] == "none" or None, 30
    )
    print(f"no agent {took:.2f} s after SIGTERM")
    assert took < HEAD_INTERVAL_S, f"no agent after {took:.1f} s"
    assert agent.wait() == 0
    assert time.monotonic() - stopped_at < HEAD_INTERVAL_S + 10
    line = next(ln for ln in quickstart.status().stdout.splitlines() if quickstart.worker.ip in ln)
    assert line.endswith("no agent"), line

    restart()
    crashed = quickstart.agents["push@node1"]
    crashed.signal(signal.SIGKILL)
    crashed.wait()
    seen: set[str] = set()

    def stale() -> Optional[bool]:
        state = quickstart.worker_node()["agent"]
        seen.add(state)
        return True if state == "stale" else None

    _, took = eventually("stale after SIGKILL", stale, 3 * HEAD_INTERVAL_S + 30)
    print(f"stale {took:.2f} s after SIGKILL (agent states seen meanwhile: {sorted(seen)})")
    assert "none" not in seen  # a crash says no goodbye
    done = quickstart.status()
    assert done.returncode == 1 and done.stderr.startswith("rayscope: partial: stale report from 1 node(s)")
    assert re.search(
        r" stale \d+s$", next(ln for ln in done.stdout.splitlines() if quickstart.worker.ip in ln)
    )
    restart()


def test_the_wrong_port_from_another_node_is_named(quickstart: Cluster) -> None:
    """From the worker, against the head node's real ports: the report port read as HTTP,
    the GCS read as a head agent and a head's port read as a GCS each say what answered;
    ``--gcs HEAD_IP`` alone means Ray's 6379."""
    head, env = quickstart.head.ip, quickstart.env
    token = "--token-file /etc/rayscope/token"
    report_port = "a rayscope head's report port (node agents push to it; 7531 by default)"
    wants_http = "status --head wants the head's --http address (7532 by default)"
    grpc = "a gRPC port (Ray's GCS listens on 6379 by default)"
    cases = {
        f"rayscope status --head http://{head}:7531 {token}": (
            f"rayscope: http://{head}:7531 is {report_port}, not its HTTP port: {wants_http}"
        ),
        f"rayscope status --head {head}:6379": (
            f"rayscope: http://{head}:6379 is {grpc}, not a head agent: {wants_http}"
        ),
        f"rayscope status --gcs {head}:7531 --timeout 3": (
            f"rayscope: no GCS at {head}:7531: it is {report_port}; Ray's GCS listens on 6379 by default"
        ),
    }
    for command, line in cases.items():
        done = quickstart.worker.run(command, env)
        assert (done.returncode, done.stderr) == (2, line + "\n"), command
    done = quickstart.worker.run(f"rayscope status --gcs {head}", env)
    assert done.returncode == 0 and f"{quickstart.worker.ip} [worker]" in done.stdout, done.stderr


def test_a_mistyped_node_id_on_a_ray_node_is_refused_naming_the_option(quickstart: Cluster) -> None:
    """Before: ``push --node-id deadbeef`` on a node that runs a raylet logged one
    INFO line ("no local raylet has node id deadbeef: reporting it without one") and then
    reported a phantom node for good (``vm [worker] VRAM: NA/NA GB  agent: manual, no
    raylet``) while ``status`` exited 0. Now it is refused at start, naming ``--node-id`` and
    the raylet this node runs (the worker sees only its own: its pid namespace)."""
    head = quickstart.head.ip
    done = quickstart.worker.run(
        f"rayscope push --head {head}:7531 --token-file /etc/rayscope/token --node-id deadbeef",
        quickstart.env,
        timeout=60,
    )
    worker_id = quickstart.worker_node()["node_id"]
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert re.fullmatch(
        rf"rayscope: --node-id deadbeef: no raylet on this host has that id \(here: {worker_id[:12]}"
        r" \(pid \d+\); a prefix is enough\): pass one of them, or leave --node-id out"
        r" \(`rayscope node` lists them\)\n",
        done.stderr,
    ), done.stderr
    taken = quickstart.worker.run(
        f"timeout -s TERM 3 rayscope push --head {head}:7531 --token-file /etc/rayscope/token"
        f" --node-id {worker_id[:8]} --interval 1",
        quickstart.env,
        timeout=60,
    )
    # A prefix of its raylet's id is taken: the agent runs, for that node (the head then turns
    # it away: the quick start's own agent reports the node already).
    assert taken.returncode == 124 and f"reporting for Ray node {worker_id}" in taken.stderr, taken.stderr
