"""``make bench-agents``: how fast a node that joins gets reported by an agent placed through Ray.

On a real Ray cluster (tests/livecluster.py, raylets on this host) with ``rayscope head
--agents ray --interval 1``, five times: ``add_node``, then the time until the head holds a
fresh report from that node's Ray-placed agent. The peer, measured in the same run on the
same cluster: ``add_node``, then the time until a plain actor pinned to the new node
(``num_cpus=0``, node affinity) answers a call — what Ray itself needs to start a process
there. Also the scheduler's cluster sums with and without the agents.

Writes its section of BENCHMARKS.md between markers; ``make bench`` keeps it.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import REPO, HeadDaemon, LiveCluster, base_env, run_rayscope, start_cluster, write_token

BEGIN, END = "<!-- bench-agents -->", "<!-- /bench-agents -->"
INTERVAL_S = 1.0
NEW_NODE = {"num_cpus": 1, "num_gpus": 0}
ATTEMPTS = 3
SUM_KEYS = ("used_cpu", "total_cpu", "used_gpu", "total_gpu", "used_vram_mb", "used_memory")


def keep_marked(path: Path) -> str:
    """This benchmark's section of an existing BENCHMARKS.md (``make bench`` rewrites the rest)."""
    text = path.read_text() if path.exists() else ""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] + "\n" if 0 <= start < end else ""


def write_section(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start, end = text.find(BEGIN), text.find(END)
    block = f"{BEGIN}\n{section}{END}\n"
    if 0 <= start < end:
        text = text[:start] + block + text[end + len(END) :].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def cluster_sums(cluster: LiveCluster, env: dict[str, str]) -> dict[str, float]:
    done = run_rayscope("status", "--json", "--gcs", cluster.gcs_address, "--timeout", "30", env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    cluster_doc = json.loads(done.stdout)["cluster"]
    return {k: cluster_doc[k] for k in SUM_KEYS}


def add_node(cluster: LiveCluster, name: str) -> str:
    """``add_node``; on a loaded machine Ray may give up on a raylet after its fixed 30 s,
    then the next try starts another (the failed one is cleaned up with the cluster)."""
    for attempt in range(ATTEMPTS):
        try:
            return str(cluster.request(op="add_node", name=name, args=NEW_NODE)["node_id"])
        except RuntimeError:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def first_fresh_report_s(head: HeadDaemon, cluster: LiveCluster, name: str, timeout_s: float = 120) -> float:
    """``add_node``, then seconds until the head holds a report from the node's Ray agent."""
    node_id = add_node(cluster, name)
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        node = json.loads(head.get("/v1/status")[1])["nodes"].get(node_id, {})
        if node.get("agent") == "reporting" and node.get("agent_started_by") == "ray":
            return time.monotonic() - start
        time.sleep(0.05)
    raise TimeoutError(f"node {name} never reported")


def plain_actor_s(cluster: LiveCluster, name: str) -> float:
    """``add_node``, then seconds until a plain actor pinned there answers (Ray's own start)."""
    add_node(cluster, name)
    start = time.monotonic()
    cluster.request(op="actor", name=f"plain-{name}", node=name, options={"num_cpus": 0})
    elapsed = time.monotonic() - start
    cluster.request(op="kill_actor", name=f"plain-{name}")
    return elapsed


def measure(runs: int, logs: Path, token_file: Path) -> dict[str, Any]:
    for attempt in range(ATTEMPTS):
        try:
            cluster = start_cluster("single", {"RAY_AUTH_MODE": "disabled"})
            break
        except RuntimeError:
            if attempt == ATTEMPTS - 1:
                raise
    try:
        env = base_env(RAY_AUTH_MODE="disabled", RAY_TMPDIR=str(cluster.root))
        without = cluster_sums(cluster, env)
        extra = ["--gcs", cluster.gcs_address, "--interval", str(INTERVAL_S), "--agents", "ray"]
        head = HeadDaemon(env, logs / "head.log", extra, token_file)
        try:
            agent_s, peer_s = [], []
            for i in range(runs):
                agent_s.append(first_fresh_report_s(head, cluster, f"a{i}"))
                cluster.request(op="remove_node", name=f"a{i}")
                peer_s.append(plain_actor_s(cluster, f"p{i}"))
                cluster.request(op="remove_node", name=f"p{i}")
            time.sleep(2 * INTERVAL_S)  # the head's own node keeps its agent; sums settle
            with_agents = cluster_sums(cluster, env)
        finally:
            head.stop(timeout_s=60)
        return {"agent_s": agent_s, "peer_s": peer_s, "without": without, "with": with_agents}
    finally:
        cluster.stop()


def section(result: dict[str, Any], runs: int) -> str:
    agent, peer = statistics.median(result["agent_s"]), statistics.median(result["peer_s"])
    same = "identical" if result["with"] == result["without"] else "DIFFERENT"
    sums = ", ".join(f"{k} {v:g}" for k, v in result["without"].items())
    return "\n".join(
        [
            "## Agents placed through Ray (`make bench-agents`)",
            "",
            f"Measured on {time.strftime('%Y-%m-%d')}, same machine; `rayscope head --agents ray"
            f" --interval {INTERVAL_S:g}`, {runs} nodes added one at a time with `add_node`.",
            "",
            "| what | rayscope | peer | ratio | target |",
            "| --- | --- | --- | --- | --- |",
            f"| `add_node` → first fresh report from its Ray-placed agent, median of {runs} |"
            f" {agent:.2f} s | `add_node` → a plain pinned actor answers: {peer:.2f} s |"
            f" {peer / agent:.2f}× | ≤ peer + 2 intervals ({peer + 2 * INTERVAL_S:.2f} s) |",
            "",
            "Each run, agent / peer (s): "
            + ", ".join(f"{a:.2f} / {p:.2f}" for a, p in zip(result["agent_s"], result["peer_s"])),
            "",
            f"Scheduler's cluster sums without agents and with them: {same} ({sums}).",
            "The agent's time is the peer's (Ray starting a worker there) plus the wait for the",
            "head's next reconcile (at most one interval), the py_modules runtime environment and",
            "the first push.",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = parser.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"rayscope-bench-agents-{os.getpid()}"
    logs.mkdir(parents=True)
    token_file = write_token(logs / "token", "bench-agents-token-0123456789abcdef")
    result = measure(args.runs, logs, token_file)
    text = section(result, args.runs)
    write_section(Path(args.output), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
