"""Record what a Ray release's dashboard answers, for the parser's tests (tests/data/dashboard/).

``python -m tests.tools.record_dashboard --python VENV/bin/python --out FILE [--scenario two_gpus]``:
starts ``ray start --head --block`` from the venv of ``--python`` (a ``ray[default]``
install) on 127.0.0.1 with its dashboard on and the project's fake NVML
(``tests/fake_nvml``) first on the loader's path, then writes FILE, one JSON document:

* ``ray``: the release (``ray.__version__`` of that venv);
* ``kv``: the GCS internal KV keys of namespace ``dashboard`` (``webui:url``,
  ``dashboard``), read with Ray's ``GcsClient`` the way rayscope's GCS read does;
* ``first``: the first ``GET /nodes?view=summary`` answer once the dashboard listens (before
  the node's dashboard agent has reported: a node without ``now`` or ``gpus``);
* ``summary``: the first answer whose every node lists its GPUs;
* ``bad_view``: the status and body of ``GET /nodes?view=nonsense``; ``no_user_agent``: of
  the summary asked without a ``User-Agent`` header (every other request sends one);
* ``api_version``: ``GET /api/version``;
* ``auth`` (Ray 2.52 and later, where ``RAY_AUTH_MODE=token`` exists): a second head started
  with token auth, and per way of sending the token, the status of the same GET.

Every string that names this machine (its host name, a path under the venv, the temp dir or
the home directory) is replaced before writing (the repository never names them). Every
process is stopped by pid: the ``ray start`` process's tree, never ``ray stop``.
"""

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import psutil

from tests import fake_nvml
from tests.support.ports import free_port_for_ray

REPO = Path(__file__).resolve().parents[2]
SUMMARY = "/nodes?view=summary"
START_TIMEOUT_S = 180.0
TOKEN = "0123456789abcdef0123456789abcdef"
AUTH_WAYS: dict[str, dict[str, str]] = {
    "none": {},
    "authorization_bearer": {"Authorization": f"Bearer {TOKEN}"},
    "authorization_raw": {"Authorization": TOKEN},
    "x_ray_authorization_bearer": {"X-Ray-Authorization": f"Bearer {TOKEN}"},
    "x_ray_authorization_raw": {"X-Ray-Authorization": TOKEN},
    "authorization_wrong": {"Authorization": "Bearer 0000"},
    "cookie": {"Cookie": f"ray-authentication-token={TOKEN}"},
}
"""Each way of sending the token that a client could use, and a wrong one."""

KV_SCRIPT = """
import json, sys
from rayscope.sources.gcs import read as gcs_read
gcs_read.prepare_auth_env(__import__("os").environ)
client = gcs_read.connect(sys.argv[1])
out = {}
for key in ("webui:url", "dashboard"):
    raw = client.internal_kv_get(key.encode(), b"dashboard", timeout=10)
    out[key] = raw.decode() if raw is not None else None
print(json.dumps(out))
"""


def scenario_text(name: str, pid: int) -> str:
    """``two_gpus``: the fake's two RTX 3090s, plus a utilisation sample of the process that
    holds 1.2 GiB on GPU 0: SM 30 %, memory bus busy 50 % of the time (Ray 2.50-2.56 read the
    50 % as half the GPU's memory: ray-project/ray#61456)."""
    if name == "two_gpus":
        return fake_nvml.two_gpus(pid) + fake_nvml.process_utilization("gpu0", pid, 30, 50)
    raise SystemExit(f"unknown scenario {name}")


class Head:
    """``ray start --head --block`` with the dashboard, stopped by pid."""

    def __init__(self, ray: Path, env: dict[str, str], root: Path, num_gpus: int) -> None:
        # Ray's own ports, numbers in every supported release (free_port_for_ray says why)
        self.port, self.dashboard_port = free_port_for_ray(), free_port_for_ray()
        self.root = root
        self.log = open(root / "ray-start.log", "a")  # noqa: SIM115 - closed in stop()
        args = [
            str(ray),
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={root / 'ray'}",
            "--num-cpus=1",
            f"--num-gpus={num_gpus}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            "--disable-usage-stats",
            f"--ray-client-server-port={free_port_for_ray()}",
            f"--dashboard-agent-listen-port={free_port_for_ray()}",
            f"--dashboard-agent-grpc-port={free_port_for_ray()}",
            f"--runtime-env-agent-port={free_port_for_ray()}",
            f"--metrics-export-port={free_port_for_ray()}",
        ]
        self.process = subprocess.Popen(
            args, cwd=root, env=env, stdout=self.log, stderr=self.log, start_new_session=True
        )
        self.seen: dict[int, float] = {}

    def remember(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.process.pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    self.seen.setdefault(proc.pid, proc.create_time())

    def stop(self) -> None:
        self.remember()
        for pid, created in sorted(self.seen.items(), reverse=True):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == created:
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=60)
        self.log.close()


USER_AGENT = {"User-Agent": "rayscope-recorder"}
"""Sent with every request but one: Ray 2.33's dashboard answers 500 to a request without it."""


def get(port: int, target: str, headers: Optional[dict[str, str]] = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", target, headers=USER_AGENT if headers is None else headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def read_kv(python: str, gcs: str, env: dict[str, str]) -> dict[str, Optional[str]]:
    done = subprocess.run(
        [python, "-c", KV_SCRIPT, gcs],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise ValueError(f"KV read failed: {done.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def published(python: str, gcs: str, env: dict[str, str]) -> Optional[dict[str, Optional[str]]]:
    """The KV keys once both are there."""
    kv = read_kv(python, gcs, env)
    return kv if all(kv.values()) else None


def wait_for(what: str, check: Any, head: Head, timeout_s: float = START_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        head.remember()
        if head.process.poll() is not None:
            tail = (head.root / "ray-start.log").read_text().strip().splitlines()[-5:]
            raise SystemExit(f"ray start exited {head.process.returncode} waiting for {what}: {tail}")
        try:
            found = check()
            if found is not None:
                return found
        except (OSError, ValueError, KeyError, http.client.HTTPException) as err:
            last = f"{type(err).__name__}: {err}"
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what} ({last})")


def every_node_has_gpus(port: int) -> Optional[dict[str, Any]]:
    status, body = get(port, SUMMARY)
    doc = json.loads(body)
    nodes = doc["data"]["summary"]
    return doc if status == 200 and nodes and all(n.get("gpus") for n in nodes) else None


def scrub(value: Any, host: str, paths: dict[str, str]) -> Any:
    """``value`` with every string (keys too) that names this machine replaced: its host name
    (the whole string), any string holding one of ``paths``."""
    if isinstance(value, dict):
        return {scrub(k, host, paths): scrub(v, host, paths) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, host, paths) for v in value]
    if isinstance(value, str):
        if value == host:
            return "<host>"
        for found, placeholder in paths.items():
            if found.lower() in value.lower():  # Ray camel-cases dict keys, paths included
                return placeholder
    return value


@contextlib.contextmanager
def running(python: str, env: dict[str, str], root: Path, num_gpus: int) -> Iterator[Head]:
    head = Head(Path(python).with_name("ray"), env, root, num_gpus)
    try:
        yield head
    finally:
        head.stop()


def record(python: str, scenario: str) -> dict[str, Any]:
    version = subprocess.run(
        [python, "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    root = Path(tempfile.mkdtemp(prefix="rsd-", dir="/tmp"))  # short: Unix socket paths
    sleeper = subprocess.Popen(["sleep", "3600"])
    try:
        lib = fake_nvml.build(root)
        scenario_file = root / "scenario"
        scenario_file.write_text(scenario_text(scenario, sleeper.pid))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHON", "RAYSCOPE_"))}
        env.update(
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            RAY_USAGE_STATS_ENABLED="0",
            LD_LIBRARY_PATH=str(lib.lib_dir),
            RAYSCOPE_FAKE_NVML_SCENARIO=str(scenario_file),
            # Ray 2.45+ start the dashboard's modules as processes, each given 30 s by default:
            # on a loaded 2-core host they took longer and the dashboard gave up.
            RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT="300",
            # And `ray start` waits 60 s for the dashboard by default, then fails.
            RAY_DASHBOARD_STARTUP_TIMEOUT_S="300",
        )
        out: dict[str, Any] = {"ray": version, "scenario": scenario_file.read_text()}
        with running(python, {**env, "RAY_AUTH_MODE": "disabled"}, root, 2) as head:
            gcs = f"127.0.0.1:{head.port}"
            plain_env = {**env, "RAY_AUTH_MODE": "disabled"}
            out["kv"] = wait_for(
                "the dashboard's KV keys",
                lambda: published(python, gcs, plain_env),
                head,
            )
            out["first"] = wait_for(
                "a first summary", lambda: json.loads(get(head.dashboard_port, SUMMARY)[1]), head
            )
            out["summary"] = wait_for(
                "every node's GPUs", lambda: every_node_has_gpus(head.dashboard_port), head
            )
            status, body = get(head.dashboard_port, "/nodes?view=nonsense")
            out["bad_view"] = {"status": status, "body": body.decode("utf-8", "replace")[:400]}
            status, body = get(head.dashboard_port, "/api/version")
            out["api_version"] = {"status": status, "body": body.decode("utf-8", "replace")[:400]}
            out["summary_bytes"] = len(get(head.dashboard_port, SUMMARY)[1])
            status, body = get(head.dashboard_port, SUMMARY, {})
            out["no_user_agent"] = {"status": status, "body": body.decode("utf-8", "replace")[:120]}
        if tuple(int(p) for p in version.split(".")[:2]) >= (2, 52):
            token_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
            shutil.rmtree(root / "ray", ignore_errors=True)
            with running(python, token_env, root, 2) as head:
                gcs = f"127.0.0.1:{head.port}"
                wait_for(
                    "the dashboard's KV keys (token auth)",
                    lambda: published(python, gcs, token_env),
                    head,
                )
                auth: dict[str, Any] = {}
                for way, headers in AUTH_WAYS.items():
                    status, body = get(head.dashboard_port, SUMMARY, {**USER_AGENT, **headers})
                    auth[way] = {"status": status, "body": body.decode("utf-8", "replace")[:120]}
                out["auth"] = auth
        paths = {
            str(root): "<temp>",
            "/tmp/rsd-": "<temp>",  # the temp dir as Ray camel-cases it (an "_" in its name goes)
            str(Path(python).parent.parent): "<venv>",
            os.path.expanduser("~"): "<home>",
        }
        return dict(scrub(out, socket.gethostname(), paths))
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a venv's Python with ray[default]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", default="two_gpus")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    doc = record(args.python, args.scenario)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
