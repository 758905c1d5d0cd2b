"""Soak: many simulated node agents push to one head agent on loopback (``make soak``).

``python -m tests.tools.soak --agents 2000 --seconds 60 --out FILE`` starts a one-node Ray cluster
of its own (for ``ray status`` and the head's GCS poll), a ``rayscope head``, and client
processes that each run hundreds of agents on one asyncio loop. Every agent keeps one
connection and sends one report per second (its first send spread over the first second);
each report's ``collected_at`` is strictly larger than its last, so it is the agent's
sequence number, and the head hands it back per node (``NodeStatus.collected_at``).

Measured, written as JSON to FILE:

* lost latest reports: nodes whose last sent ``collected_at`` is not the one the head holds
  after the clients stopped (must be 0);
* the head's CPU seconds per wall second and its peak RSS;
* ingest latency p50/p99: the head's ``received_at`` minus the agent's ``collected_at``
  (one host, one clock), over every node in every status sample;
* ``rayscope status --head`` latency under that load, beside ``ray status`` in the same run.

Frames come from :mod:`rayscope.net.wire` (the greeting's challenge, ``Sealer``; acks are read
and dropped), reports are :class:`rayscope.schema.report.NodeReport` encoded as the node agent encodes
them: the soak follows the wire, it does not restate it.
"""

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import msgspec

from rayscope.net import wire
from rayscope.schema.report import GpuDevice, HostInfo, NodeReport, SourceStatus

GIB = 1024**3


def soak_report(node_id: str, hostname: str, collected_at: float) -> NodeReport:
    """A small but real report: one GPU, the host, the sources."""
    gpu = GpuDevice(
        index=0,
        name="NVIDIA A100",
        memory_total_bytes=40 * GIB,
        memory_used_bytes=3 * GIB,
        utilization_gpu_pct=50,
    )
    return NodeReport(
        node_id=node_id,
        collected_at=collected_at,
        host=HostInfo(hostname=hostname, cpu_count=64),
        driver_version="550.54.14",
        gpus=[gpu],
        sources=[SourceStatus(name="nvml", ok=True), SourceStatus(name="host", ok=True)],
        interval_s=1.0,
    )


SEND_TIMEOUT_S = 5.0
"""A send (or the close) that takes longer counts as an error; nothing in the soak hangs."""


class SoakAgent:
    """One simulated node agent: one connection, one report per interval."""

    def __init__(self, node_id: str, token: bytes, interval_s: float) -> None:
        self.node_id, self.token, self.interval_s = node_id, token, interval_s
        self.encoder = msgspec.msgpack.Encoder()
        self.last_sent = 0.0
        self.sent = 0
        self.errors = 0

    def frame(self, sealer: wire.Sealer, collected_at: float) -> bytes:
        payload = self.encoder.encode(soak_report(self.node_id, f"soak-{self.node_id[:8]}", collected_at))
        return sealer.seal(payload)

    async def run(self, host: str, port: int, until: float) -> None:
        """Connect and send until ``until``; like the push agent, a failed connect or send
        is counted and retried after a backoff (1, 2, 4 s) on a new connection."""
        await asyncio.sleep(random.uniform(0, self.interval_s))
        backoff = 1.0
        while time.time() < until:
            if await self._session(host, port, until):
                return
            self.errors += 1
            await asyncio.sleep(min(backoff, max(0.0, until - time.time())))
            backoff = min(2 * backoff, 4.0)

    async def _session(self, host: str, port: int, until: float) -> bool:
        """One connection: True when it sent until ``until``, False on a failure."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SEND_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            return False
        drain_head: Optional[asyncio.Future[None]] = None
        try:
            # Wire v2: the head greets with a challenge; frames are numbered and bound to it.
            greeting = await asyncio.wait_for(reader.readexactly(wire.GREETING_BYTES), SEND_TIMEOUT_S)
            sealer = wire.Sealer(self.token, wire.parse_greeting(greeting))
            drain_head = asyncio.ensure_future(self._discard(reader))  # acks, if the head sends any
            next_at = time.time()
            while time.time() < until:
                collected_at = max(time.time(), self.last_sent + 1e-6)
                writer.write(self.frame(sealer, collected_at))
                await asyncio.wait_for(writer.drain(), timeout=SEND_TIMEOUT_S)
                self.last_sent, self.sent = collected_at, self.sent + 1
                # On a fixed schedule: a late wake-up does not push every later send back.
                next_at = max(next_at + self.interval_s, time.time() - self.interval_s)
                await asyncio.sleep(max(0.0, next_at - time.time()))
            return True
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, wire.FrameError):
            return False
        finally:
            if drain_head is not None:
                drain_head.cancel()
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), timeout=SEND_TIMEOUT_S)

    @staticmethod
    async def _discard(reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass


async def run_agents(
    first: int, count: int, host: str, port: int, token: bytes, seconds: float
) -> dict[str, Any]:
    agents = [SoakAgent(f"{first + i:056x}", token, 1.0) for i in range(count)]
    until = time.time() + seconds
    await asyncio.gather(*(a.run(host, port, until) for a in agents))
    return {
        "last_sent": {a.node_id: a.last_sent for a in agents},
        "sent": sum(a.sent for a in agents),
        "errors": sum(a.errors for a in agents),
    }


def client_main(args: argparse.Namespace) -> int:
    token = Path(args.token_file).read_bytes().strip()
    result = asyncio.run(run_agents(args.first, args.count, "127.0.0.1", args.port, token, args.seconds))
    Path(args.out).write_text(json.dumps(result))
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def timed(argv: list[str], env: dict[str, str], timeout_s: float = 60.0) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=timeout_s, check=False)
    return time.perf_counter() - start, done.returncode


def head_status(url: str, token: str) -> dict[str, Any]:
    import urllib.request

    request = urllib.request.Request(url + "/v1/status?all=1", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        document: dict[str, Any] = json.loads(response.read())
    return document


def soak(agents: int, seconds: float, clients: int, work: Path) -> dict[str, Any]:
    import psutil

    from tests.conftest import REPO, HeadDaemon, base_env
    from tests.raynode import RayHead
    from tests.support.ports import free_port_for_ray

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * agents + 1024)), hard))
    env = base_env(RAY_AUTH_MODE="disabled")
    token_file = work / "token"
    token_file.write_text("soak-" + os.urandom(16).hex() + "\n")
    token_file.chmod(0o600)
    ray = RayHead(free_port_for_ray(), env, work / "ray.log")
    head: Optional[HeadDaemon] = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ray.pid_of("raylet")
        # Every simulated agent dials from 127.0.0.1: allow them all to be new at once (the
        # per-address cap on connections before their first good frame is 256 by default).
        extra = ["--gcs", ray.address, "--interval", "1", "--max-pending", str(agents + 64)]
        head = HeadDaemon(env, work / "head.log", extra, token_file)
        head_proc = psutil.Process(head.process.pid)
        per = math.ceil(agents / clients)
        outs = []
        for c in range(clients):
            count = min(per, agents - c * per)
            out = work / f"client-{c}.json"
            outs.append(out)
            argv = [
                sys.executable,
                "-m",
                "tests.tools.soak",
                "client",
                "--first",
                str(c * per),
                "--count",
                str(count),
            ]
            argv += [
                "--port",
                str(head.listen_port),
                "--seconds",
                str(seconds),
                "--token-file",
                str(token_file),
            ]
            procs.append(subprocess.Popen([*argv, "--out", str(out)], cwd=REPO, env=env))
        cpu_start, wall_start = sum(head_proc.cpu_times()[:2]), time.monotonic()
        rss_peak = 0
        status_s: list[float] = []
        ray_status_s: list[float] = []
        ingest_s: list[float] = []
        status_argv = [
            sys.executable,
            "-m",
            "rayscope",
            "status",
            "--head",
            head.url,
            "--token-file",
            str(token_file),
        ]
        ray_argv = [str(REPO / ".venv" / "bin" / "ray"), "status", "--address", ray.address]
        deadline = time.monotonic() + seconds
        time.sleep(min(5.0, seconds / 4))  # let every agent connect first
        while time.monotonic() < deadline - 1:
            rss_peak = max(rss_peak, head_proc.memory_info().rss)
            elapsed, code = timed(status_argv, env)
            if code in (0, 1):
                status_s.append(elapsed)
            elapsed, code = timed(ray_argv, env)
            if code == 0:
                ray_status_s.append(elapsed)
            document = head_status(head.url, head.token)
            ingest_s += [
                n["received_at"] - n["collected_at"]
                for n in document["nodes"].values()
                if n.get("received_at") and n.get("collected_at")
            ]
            time.sleep(1.0)
        for proc in procs:
            proc.wait(timeout=seconds + 120)
        cpu_s = sum(head_proc.cpu_times()[:2]) - cpu_start
        wall_s = time.monotonic() - wall_start
        rss_peak = max(rss_peak, head_proc.memory_info().rss)
        time.sleep(1.0)  # the last frames are in the head's buffers
        held = {k: n.get("collected_at") for k, n in head_status(head.url, head.token)["nodes"].items()}
        sent: dict[str, float] = {}
        frames = errors = 0
        for out in outs:
            result = json.loads(out.read_text())
            sent.update(result["last_sent"])
            frames += result["sent"]
            errors += result["errors"]
        lost = sorted(node for node, last in sent.items() if last and held.get(node) != last)
        return {
            "agents": agents,
            "seconds": seconds,
            "client_processes": clients,
            "frames_sent": frames,
            "frames_scheduled": int(agents * seconds),
            "send_errors": errors,
            "agents_that_sent": sum(1 for last in sent.values() if last),
            "lost_latest_reports": len(lost),
            "lost_examples": lost[:5],
            "head_cpu_per_s": round(cpu_s / wall_s, 3),
            "head_rss_peak_mib": round(rss_peak / 2**20, 1),
            "ingest_latency_p50_ms": round(1000 * statistics.median(ingest_s), 2) if ingest_s else None,
            "ingest_latency_p99_ms": round(1000 * percentile(ingest_s, 0.99), 2) if ingest_s else None,
            "ingest_samples": len(ingest_s),
            "status_head_s": [round(s, 3) for s in status_s],
            "ray_status_s": [round(s, 3) for s in ray_status_s],
            "status_head_median_s": round(statistics.median(status_s), 3) if status_s else None,
            "ray_status_median_s": round(statistics.median(ray_status_s), 3) if ray_status_s else None,
            "cpus": os.cpu_count(),
            "load_1m_at_end": round(os.getloadavg()[0], 1),
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=15)
        if head is not None:
            head.stop()
        ray.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the soak: head, Ray, clients; JSON figures to --out")
    run.add_argument("--agents", type=int, default=2000)
    run.add_argument("--seconds", type=float, default=60.0)
    run.add_argument("--clients", type=int, default=2)
    run.add_argument("--out", required=True)
    client = sub.add_parser("client", help="one client process (started by run)")
    client.add_argument("--first", type=int, required=True)
    client.add_argument("--count", type=int, required=True)
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--seconds", type=float, required=True)
    client.add_argument("--token-file", required=True)
    client.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "client":
        return client_main(args)
    with tempfile.TemporaryDirectory(prefix="rs11-soak-") as work:
        figures = soak(args.agents, args.seconds, args.clients, Path(work))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if not isinstance(v, list)}, indent=2))
    return 0 if figures["lost_latest_reports"] == 0 and figures["agents_that_sent"] == args.agents else 1


if __name__ == "__main__":
    sys.exit(main())
