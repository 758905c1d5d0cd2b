"""What a head's usage history costs: 1,000 actors over a full window, through the head's own
path (reports decoded by ``HeadState.ingest``, attributed by ``fold_usage`` once per
interval), on a clock that is a parameter, in a process of its own so that its RSS is its.

``python tests/usage_memory.py [ACTORS]`` prints one JSON line: the RSS before and after,
the bytes the window's slot arrays hold, the state file's size and how long a fold and a
``/v1/usage`` document take. tests/test_usage_memory.py holds it to docs/usage.md's bound.
"""

import json
import os
import sys
import tempfile
import time

import msgspec

from rayscope.head.store.state import HeadState
from rayscope.head.store.usage_store import UsageStore
from rayscope.schema.report import GpuDevice, GpuProcess, NodeReport, ProcessInfo, SourceStatus
from rayscope.schema.status import ActorBooking

GIB = 1024**3
PER_NODE = 100
"""Actors per node (one GPU each node, a process per actor)."""
INTERVAL_S = 5.0
WINDOW_S = 3600.0


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def node_id(n: int) -> str:
    return f"{n:056x}"


def report(n: int, tick: int) -> bytes:
    pids = range(10_000 + n * PER_NODE, 10_000 + (n + 1) * PER_NODE)
    processes = [
        GpuProcess(pid=pid, used_memory_bytes=(pid % 7 + tick % 11 + 1) * 100_000_000, kinds=["compute"])
        for pid in pids
    ]
    gpu = GpuDevice(
        index=0,
        uuid=f"GPU-{n:08x}-0000-0000-0000-000000000000",
        memory_total_bytes=80 * GIB,
        memory_used_bytes=60 * GIB,
        processes=processes,
    )
    infos = [ProcessInfo(pid=pid, worker_pid=pid, node_id=node_id(n), title="ray::Replica") for pid in pids]
    return msgspec.msgpack.encode(
        NodeReport(node_id=node_id(n), collected_at=float(tick), gpus=[gpu], processes=infos)
    )


def main() -> int:
    actors_wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    nodes = actors_wanted // PER_NODE
    actors = [
        ActorBooking(
            actor_id=f"{pid:032x}",
            node_id=node_id(n),
            pid=pid,
            name=f"replica-{pid}",
            class_name=f"ServeReplica:app{n % 5}:Model",
            required={"GPU": 0.01, "VRAM_MB": 4096.0},
            gpu_ids=[0],
        )
        for n in range(nodes)
        for pid in range(10_000 + n * PER_NODE, 10_000 + (n + 1) * PER_NODE)
    ]
    state = HeadState(INTERVAL_S, None, UsageStore(WINDOW_S, INTERVAL_S, 0.0, time.time()))
    state.set_actors(actors, SourceStatus(name="gcs_actors", ok=True))
    before = rss_bytes()
    slots = state.usage.window.n
    fold_s = 0.0
    for tick in range(slots + 1):  # a full window, and one interval more
        now = tick * INTERVAL_S
        for n in range(nodes):
            state.ingest(report(n, tick), received_at=now)
        started = time.perf_counter()
        state.fold_usage(now)
        fold_s = max(fold_s, time.perf_counter() - started)
    after = rss_bytes()
    window = state.usage.window
    arrays = sum(
        ring.values.itemsize * len(ring.values) + ring.counts.itemsize * len(ring.counts)
        for series in window.actors.values()
        for ring in series.devices.values()
    )
    started = time.perf_counter()
    doc = state.usage.document(slots * INTERVAL_S)
    document_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        state.usage.state_file = os.path.join(tmp, "usage.json")
        started = time.perf_counter()
        state.usage.save(slots * INTERVAL_S)
        save_s = time.perf_counter() - started
        file_bytes = os.path.getsize(state.usage.state_file)
    result = {
        "actors": len(window.actors),
        "slots": slots,
        "samples_per_actor": doc.actors[0].samples,
        "rss_before": before,
        "rss_after": after,
        "rss_growth": after - before,
        "slot_array_bytes": arrays,
        "state_file_bytes": file_bytes,
        "fold_max_s": round(fold_s, 4),
        "document_s": round(document_s, 4),
        "save_s": round(save_s, 4),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
