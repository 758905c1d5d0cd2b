"""``make bench``'s figures at scale and on Ray's dashboard, each beside a peer measured in the
same run, in turn with it (tests/tools/bench.py writes them into BENCHMARKS.md):

    dashboard read at 1,000 nodes   the head's read (``sources.dashboard.read_nodes``) of a fake
                                    dashboard answering Ray 2.60's recorded summary for 1,000
                                    nodes; peers: ``curl`` of the same answer, ``json.loads`` of it
    usage at 1,000 actors           a head started on a full window (``--usage-state``), and
                                    ``/v1/usage`` from its cache; peers: the same head started
                                    without one, ``json.loads`` of the state file, ``/healthz``
    status on a dashboard cluster   the embedded ``status`` on a live cluster with Ray's dashboard
                                    up, and the dashboard's own answer; peer: ``ray status``

``python -m tests.tools.bench_scale dashboard-server BODY_FILE`` serves BODY_FILE to every GET (the
fake dashboard, in a process of its own so that it takes no CPU from the reader measured).
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from rayscope.sources import dashboard
from tests import fake_nvml
from tests.conftest import REPO, LiveCluster, base_env, running_dashboard_cluster
from tests.support.ports import HEAD_ON_PORT_0, refused_port, started_ports
from tests.support.usage_state import full_window

DASHBOARD_NODES = 1000
USAGE_ACTORS = 1000
RECORDED = REPO / "tests" / "data" / "dashboard" / "ray-2.60.0.json"
RECORDED_NODE_ID = "f99dd08d98d135b608eb24a485caf60e7a5a341fb1669907c74b12af"
HEAD_INTERVAL_S = 5.0
"""The head's default interval: the dashboard's read is priced per interval at it, and the
usage history's state file (tests/test_live_usage_load.py ``full_window``) has its slots."""


def dashboard_summary(nodes: int = DASHBOARD_NODES) -> bytes:
    """Ray 2.60's recorded ``/nodes?view=summary`` answer (one node of two GPUs, 9.8 KB as
    the dashboard wrote it) for ``nodes`` nodes: each its own id, address and GPU UUIDs."""
    answer = json.loads(RECORDED.read_text())["summary"]
    entry = json.dumps(answer["data"]["summary"][0])
    assert RECORDED_NODE_ID in entry and "GPU-00000000-5f1c" in entry
    summary = []
    for i in range(nodes):
        ip = f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}"
        text = entry.replace(RECORDED_NODE_ID, f"{i:056x}").replace('"127.0.0.1"', f'"{ip}"')
        text = text.replace("GPU-00000000-5f1c", f"GPU-{2 * i:08x}-5f1c").replace(
            "GPU-00000001-5f1c", f"GPU-{2 * i + 1:08x}-5f1c"
        )
        summary.append(text)
    head = json.dumps({k: v for k, v in answer.items() if k != "data"})[:-1]
    return f'{head}, "data": {{"nodeLogicalResources": {{}}, "summary": [{", ".join(summary)}]}}}}'.encode()


def serve_file(body_file: str) -> None:
    """The fake dashboard: every GET answered with the file's bytes; prints its URL."""
    body = Path(body_file).read_bytes()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def interleaved(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """Each function's wall times, run in turn (a, b, a, b, ...): drift hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return times


def curl(url: str, token: Optional[str] = None) -> Callable[[], object]:
    command = ["curl", "-sf", "-o", os.devnull, url]
    command += ["-H", f"Authorization: Bearer {token}"] if token else []
    return lambda: subprocess.run(command, check=True, timeout=120)


def bench_dashboard_read(logs: Path, runs: int) -> dict[str, float]:
    """The head's read of a 1,000-node dashboard: wall time, and the CPU it takes of the head
    (the reading thread's own), per read; its share of one core at one read per interval."""
    body = dashboard_summary()
    body_file = logs / "dashboard-summary.json"
    body_file.write_bytes(body)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.tools.bench_scale", "dashboard-server", str(body_file)],
        cwd=REPO,
        env=base_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        address = dashboard.Address(url, "--dashboard")
        cpu: list[float] = []

        def read() -> None:
            started = time.thread_time()
            nodes, status = dashboard.read_nodes(address, 60.0, "2.60.0", environ={})
            cpu.append(time.thread_time() - started)
            assert status.ok and len(nodes) == DASHBOARD_NODES, status

        loads_cpu: list[float] = []

        def loads() -> None:
            started = time.thread_time()
            json.loads(body)
            loads_cpu.append(time.thread_time() - started)

        read()  # imports, and the server's first answer
        times = interleaved({"read": read, "curl": curl(url + "/nodes?view=summary"), "loads": loads}, runs)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return {
        "dashboard_bytes": float(len(body)),
        "dashboard_read_s": statistics.median(times["read"]),
        "dashboard_read_cpu_s": statistics.median(cpu[1:]),
        "dashboard_curl_s": statistics.median(times["curl"]),
        "dashboard_loads_s": statistics.median(loads_cpu),
    }


def healthz_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(
                f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
            )
            return conn.recv(16).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def head_start_s(
    state_file: Optional[Path], log: Path, interval_s: float = HEAD_INTERVAL_S
) -> tuple[float, int, subprocess.Popen[bytes]]:
    """``rayscope head`` from its start to its first ``/healthz`` answer (asked every 10 ms);
    the head is left running: (seconds, HTTP port, process). Its ports are the OS's, its HTTP
    port read from its start-up line (asked as often)."""
    command = [str(Path(sys.executable).parent / "rayscope"), "head", *HEAD_ON_PORT_0]
    command += ["--gcs", f"127.0.0.1:{refused_port()}", "--interval", str(interval_s)]
    command += ["--usage-state", str(state_file)] if state_file else []
    log_start = log.stat().st_size if log.exists() else 0  # the log is shared by every start
    http_port = 0
    with open(log, "ab") as out:
        started = time.perf_counter()
        head = subprocess.Popen(
            command, cwd=REPO, env=base_env(RAY_AUTH_MODE="disabled"), stdout=out, stderr=out
        )
        while not (http_port and healthz_answers(http_port)):
            if head.poll() is not None or time.perf_counter() - started > 120:
                head.kill()
                raise RuntimeError(f"the head did not start: {log.read_text()[-2000:]}")
            if not http_port:
                bound = started_ports(log.read_bytes()[log_start:].decode(errors="replace"))
                http_port = bound.http if bound else 0
            time.sleep(0.01)
        return time.perf_counter() - started, http_port, head


def fetch(port: int, path: str) -> Callable[[], object]:
    """One ``GET path`` from the head on ``port``, read to its end: the head's answer time
    without a client's start (a ``curl`` costs more than a cached answer)."""

    def get() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            answer = bytearray()
            while chunk := conn.recv(1 << 20):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), bytes(answer[:200])
        return bytes(answer)

    return get


def stopped(head: "subprocess.Popen[bytes]") -> None:
    head.terminate()
    head.wait(timeout=30)


def bench_usage(logs: Path, runs: int) -> dict[str, float]:
    """A head restarted on a full window of 1,000 actors, beside one started without a
    history and ``json.loads`` of the same file; then ``/v1/usage`` once (computed) and
    from its cache, beside ``/healthz``."""
    state = logs / "usage-state.json"
    full_window(state, USAGE_ACTORS)
    saved = state.read_bytes()
    starts: dict[str, list[float]] = {"with": [], "without": []}
    loads: list[float] = []
    for _ in range(max(3, runs // 3)):
        state.write_bytes(saved)  # the head writes it back at its start: each start reads the same
        for kind, took in starts.items():
            seconds, _, head = head_start_s(state if kind == "with" else None, logs / "head-usage.log")
            took.append(seconds)
            stopped(head)
        started = time.perf_counter()
        json.loads(saved)
        loads.append(time.perf_counter() - started)
    state.write_bytes(saved)
    _, port, head = head_start_s(state, logs / "head-usage.log")
    try:
        url = f"http://127.0.0.1:{port}"
        started = time.perf_counter()
        with urllib.request.urlopen(url + "/v1/usage", timeout=120) as answer:
            document = json.loads(answer.read())
        first_s = time.perf_counter() - started
        assert len(document["actors"]) == USAGE_ACTORS, len(document["actors"])
        times = interleaved({"usage": fetch(port, "/v1/usage"), "healthz": fetch(port, "/healthz")}, runs)
    finally:
        stopped(head)
    return {
        "state_file_bytes": float(len(saved)),
        "usage_start_s": statistics.median(starts["with"]),
        "usage_start_empty_s": statistics.median(starts["without"]),
        "usage_state_loads_s": statistics.median(loads),
        "usage_first_s": first_s,
        "usage_cached_s": statistics.median(times["usage"]),
        "usage_healthz_s": statistics.median(times["healthz"]),
    }


def bench_dashboard_status(logs: Path, runs: int, timed: Callable[..., dict[str, float]]) -> dict[str, float]:
    """The embedded ``status`` on a live 3-node cluster with Ray's dashboard up (every node's
    dashboard agent on the fake NVML), beside ``ray status``; and the dashboard's own answer
    to ``/nodes?view=summary`` there. ``timed``: tests/tools/bench.py's ``timed_commands``."""
    nvml = fake_nvml.build(Path(tempfile.mkdtemp(prefix="rs-nvml-", dir=str(logs))))
    scenarios = {"head": fake_nvml.two_gpus(os.getpid()), "denbi": fake_nvml.two_gpus(os.getpid())}
    with running_dashboard_cluster("seed", nvml, scenarios) as cluster:
        return _dashboard_figures(cluster, runs, timed)


def _dashboard_figures(
    cluster: LiveCluster, runs: int, timed: Callable[..., dict[str, float]]
) -> dict[str, float]:
    env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
    bin_dir = Path(sys.executable).parent
    url = str(cluster.state["dashboard_url"])
    summary = url if "://" in url else f"http://{url}"
    commands = {
        "dash_gcs": [str(bin_dir / "rayscope"), "status", "--gcs", cluster.gcs_address],
        "dash_ray": [str(bin_dir / "ray"), "status", "--address", cluster.gcs_address],
        "dash_summary": ["curl", "-sf", "-o", os.devnull, f"{summary}/nodes?view=summary"],
    }
    for command in commands.values():
        subprocess.run(command, env=env, cwd=REPO, capture_output=True, check=True, timeout=120)
    return timed(commands, env, runs)


if __name__ == "__main__":
    if sys.argv[1:2] != ["dashboard-server"] or len(sys.argv) != 3:
        sys.exit(__doc__)
    serve_file(sys.argv[2])
