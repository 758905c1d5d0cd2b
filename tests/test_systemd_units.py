"""deploy/systemd/: the units docs/deploy.md shows, checked by systemd's own
analyzer, then run under their own sandboxes against the live Ray cluster.

* The page shows each file verbatim; ``systemd-analyze verify`` finds nothing to say about
  any of them; every service's overall exposure in ``systemd-analyze security --offline=yes``
  is at most 4.0 ("OK"); every option an ``ExecStart`` passes is one rayscope has.
* The sandbox (tests/unit_sandbox.py: the unit's own lines, applied by bubblewrap, setpriv
  and libseccomp, since no systemd runs as PID 1 here or in CI) lets the head and the node
  agent do their work on the seed cluster, and refuses every write outside the unit's
  directories. User= is the user the seed's raylets run as (root here, with no capability
  left: a refusal can only come from the sandbox, never from file modes), and uid 65534 for
  a raylet of its own.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest

from rayscope.sources.raylet import find_raylets
from tests import debian_deps, unit_sandbox
from tests import fake_nvml as fake
from tests.conftest import LOOPBACK_ENV, REPO, LiveCluster, run_rayscope
from tests.support.ports import ANY_PORT, refused_port, wait_started
from tests.waiting import eventually

UNITS_DIR = REPO / "deploy" / "systemd"
UNITS = sorted(p.name for p in UNITS_DIR.iterdir())
SERVICES = [name for name in UNITS if name.endswith(".service")]
PAGE = REPO / "docs" / "deploy.md"
MAX_EXPOSURE = 4.0
SANDBOX_MARK = "# The sandbox:"
"""The line in each service above which nothing restricts it (what runs, as whom)."""
TOKEN = "0123456789abcdef0123456789abcdef"
NOBODY = 65534
INTERVAL = "1"


def systemd_analyze(*args: str) -> "subprocess.CompletedProcess[str]":
    """``systemd-analyze ARGS``; a failure (not a skip) where it is not installed."""
    path = debian_deps.need("systemd-analyze")
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120, check=False)


def unit(name: str) -> dict[str, list[str]]:
    return unit_sandbox.parse_unit(UNITS_DIR / name)


def exec_start(name: str) -> list[str]:
    return shlex.split(unit_sandbox.expand(unit(name)["ExecStart"][-1]))


# -- the files, the page, systemd's analyzer ---------------------------------------------


def test_the_deploy_page_shows_every_unit_file_verbatim() -> None:
    """Each ```ini block of docs/deploy.md that names a unit is that file, byte for byte, and
    every file in deploy/systemd/ is shown and linked."""
    page = PAGE.read_text()
    shown = {}
    for block in re.findall(r"```ini\n(.*?)```", page, re.S):
        first = block.splitlines()[0]
        assert first.startswith("# /etc/systemd/system/"), first
        shown[first.rsplit("/", 1)[1]] = block
    assert sorted(shown) == UNITS
    for name in UNITS:
        assert shown[name] == (UNITS_DIR / name).read_text(), f"docs/deploy.md shows another {name}"
        assert f"](../deploy/systemd/{name})" in page


def verify_root(tmp_path: Path, units: Mapping[str, str]) -> Path:
    """A root for ``systemd-analyze verify --root``: systemd's own units, an executable
    stand-in for each unit's program (``/opt/ray/bin/python`` is a Ray node's), and ours."""
    root = tmp_path / "root"
    system = next(p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir())
    shutil.copytree(system, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for name, text in units.items():
        (root / "etc/systemd/system" / name).write_text(text)
        if name.endswith(".service"):
            program = root / shlex.split(unit_sandbox.parse_unit(UNITS_DIR / name)["ExecStart"][-1])[
                0
            ].lstrip("/")
            program.parent.mkdir(parents=True, exist_ok=True)
            program.write_text("#!/bin/sh\n")
            program.chmod(0o755)
    return root


def verify(tmp_path: Path, units: Mapping[str, str]) -> "subprocess.CompletedProcess[str]":
    root = verify_root(tmp_path, units)
    return systemd_analyze("verify", f"--root={root}", *units)


def test_every_unit_verifies_clean(tmp_path: Path) -> None:
    done = verify(tmp_path, {name: (UNITS_DIR / name).read_text() for name in UNITS})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_verify_speaks_up_about_a_misspelt_line(tmp_path: Path) -> None:
    """Positive control: a typo systemd would ignore (the service then runs unprotected) is
    not silent."""
    text = (UNITS_DIR / "rayscope-push.service").read_text().replace("ProtectSystem=", "ProtectSytem=")
    done = verify(tmp_path, {"rayscope-push.service": text})
    assert "Unknown key 'ProtectSytem' in section [Service]" in done.stderr


def exposure(path: Path) -> float:
    done = systemd_analyze("security", "--offline=yes", str(path))
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d)", done.stdout)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_is_ok_for_systemds_security_review(name: str) -> None:
    assert exposure(UNITS_DIR / name) <= MAX_EXPOSURE


@pytest.mark.parametrize("name", SERVICES)
def test_without_its_sandbox_lines_a_service_is_unsafe(name: str, tmp_path: Path) -> None:
    """Positive control for the score: the same unit cut above its sandbox lines scores as
    the units docs/deploy.md showed before (9.2, "UNSAFE")."""
    text = (UNITS_DIR / name).read_text()
    service, _, _ = text.partition(SANDBOX_MARK)
    bare = tmp_path / name
    bare.write_text(service + ("\n[Install]\nWantedBy=multi-user.target\n" if "[Install]" in text else ""))
    assert exposure(bare) > 9.0


@pytest.mark.parametrize("name", SERVICES)
def test_every_option_an_exec_start_passes_is_one_rayscope_has(name: str) -> None:
    words = exec_start(name)
    command, args = words[2], words[3:]  # PYTHON rayscope.pyz COMMAND ARGS
    done = run_rayscope(command, "--help")
    assert done.returncode == 0, done.stderr
    for option in (a for a in args if a.startswith("--")):
        assert re.search(rf"{re.escape(option)}\b", done.stdout), f"{command} has no {option}"


@pytest.mark.parametrize("name", SERVICES)
def test_the_sandbox_applies_every_line_of_the_unit(name: str) -> None:
    """A hardening line added to a unit and not to tests/unit_sandbox.py fails here, not
    silently untested in the live tests below."""
    unit_sandbox.check_covered(unit(name))


# -- the sandbox, live ----------------------------------------------------------------------


class StandIns:
    """A directory of what a node keeps outside ``/tmp`` (the single file, the token), the
    fake NVML, and each sandbox's state and cache directories; world-readable (0755), so a
    sandbox as uid 65534 reaches it too."""

    def __init__(self, pyz: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rs-units-", dir="/tmp"))
        self.runs = 0
        try:
            self.root.chmod(0o755)
            self.pyz = self.root / "rayscope.pyz"
            shutil.copyfile(pyz, self.pyz)
            self.pyz.chmod(0o644)
            (self.root / "nvml").mkdir(mode=0o755)
            self.nvml = fake.build(self.root / "nvml")
        except BaseException:
            self.close()
            raise

    def token(self, uid: int) -> Path:
        path = self.root / f"token-{uid}"
        path.write_text(TOKEN + "\n")
        path.chmod(0o600)
        os.chown(path, uid, -1)
        return path

    def directories(self, uid: int) -> dict[str, Path]:
        """A new StateDirectory and CacheDirectory, the user's, 0700 (as systemd makes them)."""
        self.runs += 1
        found = {}
        for key in unit_sandbox.UNIT_DIRS:
            path = self.root / f"{key}-{self.runs}"
            path.mkdir(mode=0o700)
            os.chown(path, uid, -1)
            found[key] = path
        return found

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def stand_ins(pyz: Path) -> Iterator[StandIns]:
    with contextlib.closing(StandIns(pyz)) as files:
        yield files


class Sandboxed:
    """One unit's command (its ``ExecStart``, the test's paths put in) under its sandbox."""

    def __init__(
        self,
        name: str,
        files: StandIns,
        uid: int,
        replace: Mapping[str, str],
        extra: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
        properties: Optional[Mapping[str, list[str]]] = None,
        command: Optional[Sequence[str]] = None,
    ) -> None:
        why_not = unit_sandbox.missing()
        if why_not:
            pytest.fail(f"the units' sandbox: {why_not}")
        self.properties = dict(properties or unit(name))
        words = shlex.split(unit_sandbox.expand(self.properties["ExecStart"][-1]))
        replace = {"/opt/rayscope.pyz": str(files.pyz), **replace}
        unused = set(replace) - set(words)
        assert not unused, f"{name}'s ExecStart has none of {unused}: update this test"
        self.command = list(command) if command else [replace.get(w, w) for w in words] + list(extra)
        self.dirs = files.directories(uid)
        self.log = files.root / f"{name}-{files.runs}.log"
        spec = files.root / f"seccomp-{files.runs}.json"
        self.argv = unit_sandbox.sandbox_argv(
            self.properties,
            self.command,
            uid,
            uid if uid == 0 else NOBODY,
            self.dirs,
            spec,
            stand_ins=[files.root],
            python=sys.executable if uid == 0 else "/usr/bin/python3",
        )
        home = "/root" if uid == 0 else "/nonexistent"
        self.env = unit_sandbox.unit_environment(self.properties, home, "root" if uid == 0 else "nobody")
        self.env.update(LOOPBACK_ENV, RAY_AUTH_MODE="disabled", **(env or {}))

    def run(self, timeout_s: float = 120.0) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            self.argv, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def start(self) -> "SandboxedDaemon":
        return SandboxedDaemon(self)

    def state(self, name: str) -> Path:
        return self.dirs["StateDirectory"] / name


class SandboxedDaemon:
    """A sandboxed agent left running; stopped as systemd stops it (SIGTERM to the agent,
    which is bwrap's child: prlimit, setpriv and the filter step each exec the next)."""

    def __init__(self, sandboxed: Sandboxed) -> None:
        self.sandboxed = sandboxed
        self._log = open(sandboxed.log, "a")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(sandboxed.argv, env=sandboxed.env, stdout=self._log, stderr=self._log)

    def log_text(self) -> str:
        return self.sandboxed.log.read_text()

    def agent(self) -> psutil.Process:
        def found() -> Optional[psutil.Process]:
            if self.process.poll() is not None:
                raise AssertionError(f"the sandbox exited {self.process.returncode}:\n{self.log_text()}")
            children = psutil.Process(self.process.pid).children()
            if children and str(self.sandboxed.command[1]) in children[0].cmdline():
                return children[0]
            return None

        return eventually(found, 30, "the sandboxed agent", detail=self.log_text)

    def stop(self) -> int:
        """The agent's exit code (SIGTERM: it must exit cleanly); bwrap is killed if it hangs."""
        code = -1
        if self.process.poll() is None:
            with contextlib.suppress(psutil.Error, AssertionError):
                self.agent().send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()  # --die-with-parent takes the sandbox with it
                self.process.wait(timeout=15)
        else:
            code = self.process.returncode
        self._log.close()
        return code


def raylet_uid(node_id: str) -> int:
    """The user the seed cluster's raylet of ``node_id`` runs as: the units' ``User=``."""
    raylets, _ = find_raylets()
    pid = next(r.pid for r in raylets if r.node_id == node_id)
    return int(psutil.Process(pid).uids().real)


def gpu_scenario(files: StandIns, cluster: LiveCluster) -> dict[str, str]:
    """The fake NVML's environment: one RTX 3090 whose processes are the seed's actors."""
    text = (
        fake.HEADER
        + "count 1\n"
        + fake.gpu(0, fake.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=9)
    )
    for actor in cluster.state["actors"]:
        text += fake.process("gpu0", actor["pid"], 1.0)
    path = files.root / "scenario.txt"
    path.write_text(text)
    path.chmod(0o644)
    return {"LD_LIBRARY_PATH": str(files.nvml.lib_dir), fake.SCENARIO_ENV: str(path)}


@pytest.mark.live
def test_the_sandboxed_head_and_node_agent_report_the_seed_cluster(
    live_cluster: LiveCluster, stand_ins: StandIns
) -> None:
    """rayscope-head.service and rayscope-push.service, each under its own sandbox: the node
    agent finds the head node's raylet and the GPU, the head reads the GCS in process and
    takes the report; both stop cleanly on SIGTERM, the head saving its usage state in its
    StateDirectory, private to its user (UMask=0077); the single file unpacked in the
    CacheDirectory."""
    head_id = live_cluster.node_id("head")
    uid = raylet_uid(head_id)
    token = stand_ins.token(uid)
    head = Sandboxed(
        "rayscope-head.service",
        stand_ins,
        uid,
        {
            "/opt/ray/bin/python": sys.executable,  # the Ray environment's Python: this one imports ray
            "0.0.0.0:7531": ANY_PORT,  # the OS's ports, read from the head's start-up line
            "127.0.0.1:7532": ANY_PORT,
            "/etc/rayscope/token": str(token),
        },
        ["--gcs", live_cluster.gcs_address, "--interval", INTERVAL],  # other clusters may run here
    ).start()
    push = None
    try:
        listen, http = wait_started(head.log_text, head.process, timeout_s=60)
        push = Sandboxed(
            "rayscope-push.service",
            stand_ins,
            uid,
            {"HEAD_IP:7531": f"127.0.0.1:{listen}", "/etc/rayscope/token": str(token)},
            ["--node-id", head_id, "--interval", INTERVAL],  # the seed runs three raylets on one host
            gpu_scenario(stand_ins, live_cluster),
        ).start()

        def reporting() -> Optional[dict[str, Any]]:
            done = run_rayscope(
                "status", "--head", f"http://127.0.0.1:{http}", "--token-file", str(token), "--json", "--all"
            )
            if done.returncode not in (0, 1):
                return None
            node: dict[str, Any] = json.loads(done.stdout)["nodes"].get(head_id, {})
            return (
                node
                if node.get("agent") == "reporting" and node.get("gpus") and node.get("in_scheduler")
                else None
            )

        node = eventually(
            reporting,
            90,
            "the sandboxed agent's report at the sandboxed head",
            retry=(OSError,),
            detail=lambda: head.log_text() + push.log_text() if push else "",
        )
        assert node["total_gpu_memory"] == 24 * fake.GIB
        assert node["total_vram_mb"] == 24576  # the head's GCS read: Europa's VRAM_MB
    finally:
        push_code = push.stop() if push else 0
        head_code = head.stop()
    assert (push_code, head_code) == (0, 0), head.log_text()
    saved = head.sandboxed.state("usage.json")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    cache = head.sandboxed.dirs["CacheDirectory"]
    assert any((p / "site-packages").is_dir() for p in cache.iterdir()), "the single file did not unpack"


def node_json(
    sandboxed: Optional[Sandboxed], command: Sequence[str], env: Mapping[str, str]
) -> dict[str, Any]:
    done = (
        sandboxed.run()
        if sandboxed
        else subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=120, check=False)
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def seen(doc: Mapping[str, Any], node_id: str) -> dict[str, Any]:
    """What `node --json --gpus` says the node agent sees: the raylet, the GPU processes as
    Ray's (job, actor), the GPUs, which sources answered."""
    raylet = next(r for r in doc["raylets"] if r["node_id"] == node_id)
    return {
        "raylet": {k: v for k, v in raylet.items() if k != "started_at"},
        "processes": sorted((p["pid"], p["node_id"], p["job_id"], p["actor_id"]) for p in doc["processes"]),
        "gpus": [(g["uuid"], g["memory_total_bytes"], len(g["processes"])) for g in doc["gpus"]],
        "sources": {s["name"]: s["ok"] for s in doc["sources"]},
    }


@pytest.mark.live
def test_the_sandboxed_node_agent_sees_what_it_sees_unsandboxed(
    live_cluster: LiveCluster, stand_ins: StandIns
) -> None:
    """`node --json --gpus` from the push unit's interpreter and single file, inside its
    sandbox and outside it, as the same user: the same raylet, GPU, processes (job and actor
    from Ray's session logs) and sources. One difference: the raylet's environment, which
    the kernel shows only to a reader holding every capability the raylet holds (root's
    raylet: CAP_SYS_PTRACE, dropped here). And the reason the unit has no PrivateTmp: with
    it, the session logs are gone and no GPU process is Ray's."""
    head_id = live_cluster.node_id("head")
    uid = raylet_uid(head_id)
    words = exec_start("rayscope-push.service")  # its interpreter, the single file, `node`
    command = [words[0], str(stand_ins.pyz), "node", "--json", "--gpus", "--gcs", live_cluster.gcs_address]
    gpu = gpu_scenario(stand_ins, live_cluster)
    inside = Sandboxed("rayscope-push.service", stand_ins, uid, {}, env=gpu, command=command)
    cache = tempfile.mkdtemp(prefix="rs-units-cache-", dir="/tmp")
    try:
        outside_env = {**inside.env, "RAYSCOPE_CACHE": cache}
        outside = seen(node_json(None, command, outside_env), head_id)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    sandboxed = seen(node_json(inside, command, inside.env), head_id)
    assert outside["raylet"]["environ_read"] is True  # root's raylet, read with every capability
    assert sandboxed["raylet"].pop("environ_read") is False
    outside["raylet"].pop("environ_read")
    assert sandboxed == outside
    assert len(sandboxed["processes"]) == len(live_cluster.state["actors"])
    assert all(job and actor for _pid, _node, job, actor in sandboxed["processes"])

    private_tmp = {**inside.properties, "PrivateTmp": ["yes"]}
    hidden = Sandboxed(
        "rayscope-push.service", stand_ins, uid, {}, env=gpu, properties=private_tmp, command=command
    )
    without_logs = seen(node_json(hidden, command, hidden.env), head_id)
    assert [(job, actor) for _pid, _node, job, actor in without_logs["processes"]] == [(None, None)] * len(
        live_cluster.state["actors"]
    )


@contextlib.contextmanager
def raylet_of_nobody(files: StandIns, node_id: str) -> Iterator[int]:
    """A process named ``raylet`` (``python3`` by another name, sleeping) with a raylet's
    command line and ``CUDA_VISIBLE_DEVICES=1``, run by uid 65534 with no capability."""
    link = files.root / "bin" / "raylet"
    link.parent.mkdir(exist_ok=True)
    link.parent.chmod(0o755)
    with contextlib.suppress(FileExistsError):
        link.symlink_to("/usr/bin/python3")
    argv = [
        str(link),
        "-c",
        "import time; time.sleep(300)",
        f"--node_id={node_id}",
        "--static_resource_list=GPU,1",
    ]
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]
    proc = subprocess.Popen(
        [*setpriv, *argv], env={"CUDA_VISIBLE_DEVICES": "1", "PATH": "/usr/bin:/bin"}, cwd="/"
    )
    try:
        eventually(lambda: psutil.Process(proc.pid).name() == "raylet", 10, "the raylet of uid 65534")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_as_the_raylets_own_user_the_sandboxed_agent_reads_its_gpu_environment(stand_ins: StandIns) -> None:
    """The unit's ``User=`` is the user the raylet runs as: then the agent, holding no
    capability at all, still reads the raylet's CUDA_VISIBLE_DEVICES (``/proc/PID/environ``),
    which decides which of the node's GPUs are Ray's GPU 0, 1, ..."""
    node_id = "ab" * 28
    words = exec_start("rayscope-push.service")
    closed = f"127.0.0.1:{refused_port()}"
    command = [words[0], str(stand_ins.pyz), "node", "--json", "--gcs", closed, "--timeout", "1"]
    with raylet_of_nobody(stand_ins, node_id) as pid:
        inside = Sandboxed("rayscope-push.service", stand_ins, NOBODY, {}, command=command)
        done = inside.run()
    assert done.returncode == 0, done.stderr
    raylet = next(r for r in json.loads(done.stdout)["raylets"] if r["node_id"] == node_id)
    assert (raylet["pid"], raylet["environ_read"], raylet["cuda_visible_devices"]) == (pid, True, "1")


PROBE = r"""
import ctypes, json, os, socket, sys
found = {"status": {}, "writes": {}, "calls": {}}
for line in open("/proc/self/status"):
    key, _, value = line.partition(":")
    if key in ("CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"):
        found["status"][key] = value.strip()
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        found["writes"][path] = oct(os.stat(path).st_mode & 0o777)
    except OSError as err:
        found["writes"][path] = err.strerror
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
def call(name, fn):
    try:
        result = fn()
        found["calls"][name] = "ok" if result not in (-1, 2**64 - 1) else os.strerror(ctypes.get_errno())
    except OSError as err:
        found["calls"][name] = err.strerror
call("socket AF_INET", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
call("socket AF_UNIX", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
call("socket AF_NETLINK", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close())
call("socket AF_PACKET", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close())
call("unshare user namespace", lambda: libc.unshare(0x10000000))
call("mmap write+exec", lambda: libc.mmap(None, 4096, 7, 0x22, -1, 0))
call("sched_setaffinity", lambda: os.sched_setaffinity(0, {0}))
call("chmod set-uid", lambda: os.chmod(sys.argv[-1], 0o4700))
print(json.dumps(found))
"""


@pytest.mark.parametrize("name", SERVICES)
def test_the_sandbox_refuses_writes_outside_the_units_directories(name: str, stand_ins: StandIns) -> None:
    """Inside each service's sandbox, as its user (root without capabilities: only the
    sandbox can refuse), writes land in the unit's StateDirectory/CacheDirectory only, mode
    0600; everywhere else the file system is read-only (a private /tmp is the head's own,
    never the host's). The filters are in force: no capability, no new privileges, no
    socket of another family, no namespace, no writable+executable memory, no CPU pinning,
    no set-uid file."""
    properties = unit(name)
    outside = [
        "/etc/rayscope-probe",
        "/usr/rayscope-probe",
        "/var/lib/rayscope-probe",
        "/var/cache/rayscope-probe",
        "/root/rayscope-probe",
        str(REPO / "rayscope-probe"),
        str(stand_ins.root / "rayscope-probe"),
    ]
    tmp = f"/tmp/rayscope-probe-{os.getpid()}"
    own = [
        f"{parent}/{properties[key][0]}/probe"
        for key, parent in unit_sandbox.UNIT_DIRS.items()
        if key in properties
    ]
    command = [sys.executable, "-I", "-c", PROBE, *outside, tmp, *own]
    sandboxed = Sandboxed(name, stand_ins, 0, {}, command=command)
    done = sandboxed.run()
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["status"] == {
        "NoNewPrivs": "1",
        **{k: "0000000000000000" for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")},
    }
    assert {p: found["writes"][p] for p in outside} == {p: "Read-only file system" for p in outside}
    private_tmp = properties.get("PrivateTmp") == ["yes"]
    assert found["writes"][tmp] == ("0o600" if private_tmp else "Read-only file system")
    assert not os.path.exists(tmp)
    assert {p: found["writes"][p] for p in own} == {p: "0o600" for p in own}
    assert found["calls"] == {
        "socket AF_INET": "ok",
        "socket AF_UNIX": "ok",
        "socket AF_NETLINK": "Address family not supported by protocol",
        "socket AF_PACKET": "Address family not supported by protocol",
        "unshare user namespace": "Operation not permitted",
        "mmap write+exec": "Operation not permitted",
        "sched_setaffinity": "Operation not permitted",
        "chmod set-uid": "Operation not permitted",
    }


@pytest.mark.live
def test_the_status_timer_writes_its_snapshot_under_its_sandbox(
    live_cluster: LiveCluster, stand_ins: StandIns
) -> None:
    """rayscope-status.service (started by rayscope-status.timer, the cron line's
    replacement): `status --json --output` under the sandbox, with a python3 that lacks ray
    (the GCS read then runs under the Ray node's own Python, a child the sandbox lets run),
    writes the seed cluster into its StateDirectory, private to its user."""
    uid = raylet_uid(live_cluster.node_id("head"))
    sandboxed = Sandboxed("rayscope-status.service", stand_ins, uid, {}, ["--gcs", live_cluster.gcs_address])
    assert sandboxed.command[0] == "/usr/bin/python3"
    done = sandboxed.run()
    assert done.returncode == 0, done.stderr
    snapshot = sandboxed.state("status.json")
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    nodes = json.loads(snapshot.read_text())["nodes"]
    assert {live_cluster.node_id(n) for n in ("head", "denbi", "cpu")} <= set(nodes)
