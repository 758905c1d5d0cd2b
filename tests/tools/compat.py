"""``make compat``: the built single file against every Ray release of the matrix.

For each (Ray, Python) pair: a venv with that Ray from the package registry (cached under
``~/.cache/rayscope-compat/``), the seed cluster started with that Ray
(``tests/livecluster.py``), then ``dist/rayscope.pyz`` run by that venv's Python as an
operator on a node of that Ray runs it: ``status``, ``status --gpus``, ``status --json``,
``node``, ``fit``, and ``head`` + ``push`` read by ``status --head``, then the head stopped
by SIGTERM with its agents connected (it must be gone within 5 s). Every check asserts the
Europa and deNBI lines exactly. The results table goes to stdout and, with ``--readme``,
between the compat markers of docs/ray-releases.md.

``python -m tests.tools.compat [--ends] [--readme] [--pyz dist/rayscope.pyz]``; exit 1 when any
check fails. ``--ends``: the oldest and newest Ray only (what CI runs on every change).
"""

import argparse
import contextlib
import glob
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from tests import fake_nvml
from tests.support.ports import HEAD_ON_PORT_0, wait_started

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RAYSCOPE_COMPAT_CACHE", "~/.cache/rayscope-compat")).expanduser()
# (Ray, Python): 2.33.0 the oldest supported, its actor table only through the
# GlobalStateAccessor; 2.40 where the GCS client gained its async actor call (NewGcsClient);
# 2.44 where that client became InnerGcsClient; 2.60 the newest, with NodeState.labels (2.50+).
# Each under a Python its wheels exist for: 3.9 up to Ray 2.51, 3.13 from Ray 2.45.
MATRIX: list[tuple[str, str]] = [
    ("2.33.0", "3.9"),
    ("2.40.0", "3.10"),
    ("2.44.1", "3.12"),
    ("2.60.0", "3.13"),
]
ENDS = [MATRIX[0], MATRIX[-1]]
PIP_TIMEOUT_S = 1200
RUN_TIMEOUT_S = 120
START_TIMEOUT_S = 300
STOP_LIMIT_S = 5.0

DEADLINE = (
    "--timeout",
    "60",
)  # a deadline for function, not speed: `import ray` alone took 14 s on a loaded CI host

EUROPA = "  127.0.0.1 [HEAD] G GPU: 0.04/1 booked: 20480/24576 MB  VRAM: NA/NA GB  CPU: 8/8"
DENBI = "  127.0.0.1 [worker] T4 GPU: 0.33/1 VRAM: NA/NA GB  CPU: 1/8"
EUROPA_SCHEDULER = "  scheduler: GPU: 0.04/1 booked: 20480/24576 MB  CPU: 8/8"
COMMANDS = [
    "status",
    "status --gpus",
    "status --json",
    "node",
    "fit",
    "labels",
    "head + push",
    "SIGTERM",
    "Ray 2.60 reader",
]
BEGIN, END = "<!-- compat:begin -->", "<!-- compat:end -->"


class Failed(Exception):
    """One check's one-line reason."""


class Row(NamedTuple):
    ray: str
    python: str
    results: dict[str, str]  # command -> "" (passed) or the reason it failed


def find_python(version: str) -> Optional[str]:
    """CPython ``version`` (``3.9``): pyenv's, else ``pythonX.Y`` on PATH."""
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    return found[-1] if found else shutil.which(f"python{version}")


def ensure_venv(ray: str, python: str) -> Path:
    """A venv with ``ray==ray`` for CPython ``python``, built once and kept in the cache."""
    venv = CACHE / f"ray-{ray}-py{python}"
    stamp = venv / ".ready"
    if stamp.exists():
        return venv
    interpreter = find_python(python)
    if interpreter is None:
        raise Failed(f"no CPython {python} on this host (pyenv or PATH)")
    shutil.rmtree(venv, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, f"ray=={ray}"], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise Failed(f"pip install ray=={ray}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    stamp.touch()
    return venv


@contextlib.contextmanager
def seed_cluster(python: str, root: Path) -> Iterator[dict[str, Any]]:
    """The seed cluster started by ``python`` (its Ray); yields livecluster's state."""
    env = {
        **base_env(),
        "RAY_TMPDIR": str(root),
        # livecluster waits for bookings with rayscope.sources.gcs.read
        "PYTHONPATH": f"{REPO / 'agent'}:{REPO}",
    }
    state_file = root / "state.json"
    with open(root / "launcher.log", "w") as log:
        launcher = subprocess.Popen(
            [python, str(REPO / "tests" / "livecluster.py"), "serve", "--state", str(state_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            cwd=root,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not state_file.exists():
                if launcher.poll() is not None or time.monotonic() > deadline:
                    tail = (root / "launcher.log").read_text().strip().splitlines()[-1:]
                    raise Failed(f"seed cluster did not start: {tail[0] if tail else 'no output'}")
                time.sleep(0.5)
            yield json.loads(state_file.read_text())
        finally:
            stop_launcher(launcher)


def stop_launcher(launcher: "subprocess.Popen[bytes]") -> None:
    """Close its stdin (it shuts the cluster down); SIGKILL our own child if it will not."""
    if launcher.stdin is not None:
        with contextlib.suppress(OSError):
            launcher.stdin.close()
    try:
        launcher.wait(timeout=90)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait(timeout=30)


_no_driver: list[Path] = []


def base_env() -> dict[str, str]:
    """A user's environment on a node without an NVIDIA driver (hidden if this host has one)."""
    if not _no_driver:
        _no_driver.append(fake_nvml.no_driver(CACHE / "no-driver").lib_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYSCOPE_", "RAY_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        RAYSCOPE_CACHE=str(CACHE / "pyz-cache"),
        LD_LIBRARY_PATH=str(_no_driver[0]),
    )
    return env


class Runner:
    """``python rayscope.pyz ...`` against one cluster."""

    def __init__(self, python: str, pyz: Path, state: dict[str, Any], root: Path) -> None:
        self.python, self.pyz, self.state, self.root = python, str(pyz), state, root
        self.env = {**base_env(), "RAY_TMPDIR": str(root)}
        self.gcs = str(state["gcs_address"])

    def node_id(self, name: str) -> str:
        return str(self.state["nodes"][name]["node_id"])

    def run(
        self, *args: str, env: Optional[Mapping[str, str]] = None, expect: int = 0
    ) -> "subprocess.CompletedProcess[str]":
        done = subprocess.run(
            [self.python, self.pyz, *args],
            env=dict(env or self.env),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        if done.returncode != expect:
            last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise Failed(f"exit {done.returncode}: {last}")
        return done

    def popen(self, *args: str, log: Path) -> "subprocess.Popen[bytes]":
        with open(log, "w") as out:
            return subprocess.Popen([self.python, self.pyz, *args], env=self.env, stdout=out, stderr=out)


def expect_lines(text: str, *wanted: str) -> None:
    lines = text.splitlines()
    for line in wanted:
        if line not in lines:
            near = [got.strip() for got in lines if got[:24] == line[:24]]
            raise Failed(f"no line {line.strip()!r}" + (f", got {near[0]!r}" if near else ""))


def check_status(r: Runner) -> None:
    expect_lines(r.run("status", "--gcs", r.gcs, *DEADLINE).stdout, EUROPA, DENBI)


def check_json(r: Runner) -> None:
    doc = json.loads(r.run("status", "--json", "--gcs", r.gcs, *DEADLINE).stdout)
    head, denbi = doc["nodes"][r.node_id("head")], doc["nodes"][r.node_id("denbi")]
    got = (head["used_vram_mb"], head["total_vram_mb"], head["used_gpu"], denbi["used_gpu"])
    if got != (20480, 24576, 0.04, 0.33):
        raise Failed(f"Europa/deNBI numbers {got}")
    versions = {s["name"]: s for s in doc["sources"]}.get("ray", {})
    ray = r.state["ray_version"]
    if versions.get("detail") != f"cluster Ray {ray}, reader Ray {ray}" or versions.get("reason"):
        raise Failed(f"ray source {versions}")


def check_other_reader(r: Runner) -> None:
    """The single file run by a Python whose Ray (this harness's, 2.60) is another release
    than the cluster's hands the GCS read to the Ray node's own Python."""
    ray, reader = r.state["ray_version"], importlib.metadata.version("ray")
    done = subprocess.run(
        [sys.executable, r.pyz, "status", "--json", "--gcs", r.gcs, *DEADLINE],
        env=r.env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise Failed(f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}")
    sources = {s["name"]: s for s in json.loads(done.stdout)["sources"]}
    python = r.python if ray != reader else sys.executable
    if not sources["gcs"]["detail"].endswith(f"via {python}"):
        raise Failed(f"read by {sources['gcs']['detail']}, not {python}")
    if sources["ray"]["detail"] != f"cluster Ray {ray}, reader Ray {ray}":
        raise Failed(f"ray source {sources['ray']}")


def gpu_scenario(r: Runner) -> dict[str, str]:
    """The fake NVML: one RTX 3090 on this host held by the seed actors' own pids."""
    lib = fake_nvml.build(Path(tempfile.mkdtemp(prefix="nvml-", dir=r.root)))
    lines = fake_nvml.HEADER + "count 1\n"
    lines += fake_nvml.gpu(0, fake_nvml.RTX_3090, pci="00000000:01:00.0", total_gib=24, used_gib=12.0)
    for actor in r.state["actors"]:
        lines += fake_nvml.process("gpu0", actor["pid"], 2.0)
    scenario = r.root / "gpu-scenario.txt"
    scenario.write_text(lines)
    return lib.env(r.env, scenario)


def check_gpus(r: Runner) -> None:
    """The actor table (read differently per Ray release) names every seed actor on the GPU."""
    out = r.run("status", "--gpus", "--gcs", r.gcs, *DEADLINE, env=gpu_scenario(r)).stdout
    wanted = [
        f"    {a['name']}#{a['actor_id'][:4]} booked "
        + ("0.33 GPU" if a["name"] == "denbi-app" else "5120 MB")
        + " used 2.0 GB"
        for a in r.state["actors"]
    ]
    expect_lines(out, *wanted)


def check_node(r: Runner) -> None:
    out = r.run("node", "--gcs", r.gcs, *DEADLINE).stdout
    head = (
        f"Ray node 127.0.0.1 [HEAD] {r.node_id('head')}  raylet pid {r.state['nodes']['head']['raylet_pid']}"
    )
    expect_lines(out, head, EUROPA_SCHEDULER)


def check_fit(r: Runner) -> None:
    out = r.run("fit", "--gpu-memory-mb", "5120", "--gcs", r.gcs, *DEADLINE, expect=1).stdout
    head, denbi = r.node_id("head")[:8], r.node_id("denbi")[:8]
    expect_lines(
        out,
        "Fits: no, 0/1 replica(s) placed by booking",
        f"  127.0.0.1 [HEAD] G {head}: fits 0, gets 0 (VRAM_MB: 4096 MB free, needs 5120 MB)",
        f"  127.0.0.1 [worker] T4 {denbi}: fits 0, gets 0 (no VRAM_MB)",
    )


LABELS_SINCE = (2, 49)
"""The first Ray whose nodes carry labels of Ray's own (``ray.io/node-id``)."""


def check_labels(r: Runner) -> None:
    """Before Ray 2.49 the nodes carry no labels: ``status --json`` has no ``labels`` and
    ``fit --label-selector`` says the release has none (exit 2); from 2.49 the seed's nodes
    have labels (none but Ray's own) and ``zone=a`` admits no node (exit 1)."""
    ray = r.state["ray_version"]
    labelled = tuple(int(part) for part in ray.split(".")[:2]) >= LABELS_SINCE
    doc = json.loads(r.run("status", "--json", "--gcs", r.gcs, *DEADLINE).stdout)
    carried = ["labels" in doc["nodes"][r.node_id(name)] for name in ("head", "denbi")]
    if carried != [labelled, labelled]:
        raise Failed(f"labels in status --json: {carried}, Ray {ray}")
    selector = ("fit", "--gpu-memory-mb", "1024", "--label-selector", "zone=a", "--gcs", r.gcs, *DEADLINE)
    if labelled:
        expect_lines(
            r.run(*selector, expect=1).stdout, "Fits: no, no alive node has zone=a (no node has zone)"
        )
        return
    line = r.run(*selector, expect=2).stderr.strip()
    wanted = (
        f"rayscope: --label-selector: Ray {ray} gives its nodes no labels"
        " (labels and label selectors came in Ray 2.49)"
    )
    if line != wanted:
        raise Failed(f"fit --label-selector: {line!r}")


def check_head(r: Runner, stop_times: list[float]) -> None:
    """``head`` (its in-process GCS client) + one ``push`` per GPU node, read by
    ``status --head``; then SIGTERM with the agents connected."""
    head_log = r.root / "head.log"
    head = r.popen("head", "--gcs", r.gcs, *DEADLINE, *HEAD_ON_PORT_0, "--interval", "1", log=head_log)
    agents: list[subprocess.Popen[bytes]] = []
    try:
        try:
            listen, http = wait_started(head_log.read_text, head, timeout_s=RUN_TIMEOUT_S)
        except (AssertionError, RuntimeError) as err:
            raise Failed(f"head: {str(err).splitlines()[0]}") from None
        agents += [
            r.popen("push", "--head", f"127.0.0.1:{listen}", "--interval", "1", "--node-id", r.node_id(name),
                    log=r.root / f"push-{name}.log")
            for name in ("head", "denbi")
        ]  # fmt: skip
        url = f"http://127.0.0.1:{http}"
        # Through the head each node line ends with how its agent runs (`agent: manual` for a
        # push started by hand); until both agents report, a line ends with `no agent`.
        reporting = [EUROPA + "  agent: manual", DENBI + "  agent: manual"]
        last = poll(
            lambda: r.run("status", "--head", url, *DEADLINE).stdout,
            lambda out: all(line in out.splitlines() for line in reporting),
        )
        expect_lines(last, *reporting)
        with urllib.request.urlopen(f"{url}/healthz", timeout=10) as answer:
            if json.load(answer)["nodes_reporting"] != 2:
                raise Failed("the head does not hold both agents' reports")
        started = time.monotonic()
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise Failed("head still running 30 s after SIGTERM") from None
        stop_times.append(time.monotonic() - started)
    finally:
        for process in [head, *agents]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=15)


def poll(read: Callable[[], str], ready: Callable[[str], bool], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            out = read()
        except Failed:
            out = ""
        if ready(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def run_pair(ray: str, python: str, pyz: Path) -> Row:
    results = dict.fromkeys(COMMANDS, "not run")
    try:
        venv = ensure_venv(ray, python)
    except (Failed, subprocess.SubprocessError, OSError) as err:
        return Row(ray, python, {c: f"venv: {err}" for c in COMMANDS})
    interpreter = str(venv / "bin" / "python")
    for attempt in (1, 2):  # a cluster that did not start on a loaded host gets one more go
        root = Path(tempfile.mkdtemp(prefix="rsc-", dir="/tmp"))  # short: Ray's socket paths
        try:
            with seed_cluster(interpreter, root) as state:
                state["ray_version"] = ray
                results = run_checks(Runner(interpreter, pyz, state, root))
            break
        except Failed as err:  # only the cluster's start raises out of the checks
            results = {c: str(err) for c in COMMANDS}
            print(f"compat: Ray {ray}: {err} (attempt {attempt})", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return Row(ray, python, results)


def run_checks(r: Runner) -> dict[str, str]:
    """Every command's reason it failed, ``""`` where it passed."""
    stop_times: list[float] = []
    checks: list[tuple[str, Callable[[], None]]] = [
        ("status", lambda: check_status(r)),
        ("status --gpus", lambda: check_gpus(r)),
        ("status --json", lambda: check_json(r)),
        ("node", lambda: check_node(r)),
        ("fit", lambda: check_fit(r)),
        ("labels", lambda: check_labels(r)),
        ("head + push", lambda: check_head(r, stop_times)),
        ("Ray 2.60 reader", lambda: check_other_reader(r)),
    ]
    results = {name: outcome(check) for name, check in checks}
    if not stop_times:
        results["SIGTERM"] = "head not stopped (see head + push)"
    else:
        results["SIGTERM"] = "" if stop_times[0] <= STOP_LIMIT_S else f"stopped after {stop_times[0]:.1f} s"
        results["SIGTERM s"] = f"{stop_times[0]:.2f}"
    return results


def outcome(check: Callable[[], None]) -> str:
    try:
        check()
    except Failed as err:
        return str(err) or "failed"
    except Exception as err:  # a harness error is still a one-line ✗, never a lost row
        return f"{type(err).__name__}: {err}"
    return ""


def table(rows: list[Row], pyz: Path) -> str:
    header = ["Ray", "Python", *COMMANDS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.ray, row.python]
        for command in COMMANDS:
            reason = row.results.get(command, "not run")
            cell = "✓" if not reason else f"✗ {reason}"
            if command == "SIGTERM" and not reason:
                cell += f" {row.results['SIGTERM s']} s"
            cells.append(cell.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    when = time.strftime("%Y-%m-%d", time.gmtime())
    lines += [
        "",
        f"Generated by `make compat` on {when} from `{pyz.name}` (SIGTERM: head stop time, limit 5 s).",
    ]
    return "\n".join(lines)


def write_readme(text: str, readme: Path = REPO / "docs" / "ray-releases.md") -> None:
    content = readme.read_text()
    start, end = content.index(BEGIN) + len(BEGIN), content.index(END)
    readme.write_text(content[:start] + "\n" + text + "\n" + content[end:])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ends", action="store_true", help="oldest and newest Ray only (CI)")
    parser.add_argument("--readme", action="store_true", help="write the table into docs/ray-releases.md")
    parser.add_argument("--ray", action="append", help="only this Ray release (repeatable)")
    parser.add_argument("--pyz", type=Path, default=REPO / "dist" / "rayscope.pyz")
    args = parser.parse_args(argv)
    rows = []
    pairs = [(ray, python) for ray, python in (ENDS if args.ends else MATRIX) if ray in (args.ray or [ray])]
    for ray, python in pairs:
        print(f"compat: Ray {ray} under Python {python} ...", file=sys.stderr, flush=True)
        rows.append(run_pair(ray, python, args.pyz))
        failed = {c: why for c, why in rows[-1].results.items() if why and c in COMMANDS}
        print(f"compat: Ray {ray}: {failed or 'ok'}", file=sys.stderr, flush=True)
    text = table(rows, args.pyz)
    print(text)
    if args.readme:
        write_readme(text)
    return 0 if all(not row.results[c] for row in rows for c in COMMANDS) else 1


if __name__ == "__main__":
    sys.exit(main())
