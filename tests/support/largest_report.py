"""A node report at every bound the head's decoder admits at once: the most one report can
make the head hold (SECURITY.md, "Report bounds"). For the decoded-size test and for the
head's memory at its unknown-node cap (``tests/tools/measure_unknown_cap.py``)."""

from typing import Any

from rayscope.schema import report as schema

WORDS_PER_REPORT = 30_000
"""More than the distinct words one report holds: ``first_word`` steps of this keep every
report's strings its own (no decoder's string cache shares them across reports)."""


def largest_report(node_id: str, first_word: int = 0) -> schema.NodeReport:
    """A report at every bound at once for ``node_id``; its words count up from ``first_word``
    (8 digits each while under 10**8)."""
    letters = iter(range(first_word, 10**9))
    used = 0

    def word(chars: int = 8) -> str:
        nonlocal used
        used += 1
        return f"{next(letters):0{chars}d}"

    per_device = schema.MAX_PROCESSES // schema.MAX_DEVICES
    devices_per_gpu = schema.MAX_MIG_DEVICES
    gpus_with_mig = schema.MAX_DEVICES // (devices_per_gpu + 1)

    def device(index: int, parent: Any = None) -> schema.GpuDevice:
        return schema.GpuDevice(
            index=index,
            parent_index=parent,
            name=word(),
            uuid=word(),
            errors={word(): word() for _ in range(schema.MAX_ERRORS)},
            processes=[
                schema.GpuProcess(pid=p, used_memory_bytes=p, kinds=["compute", "graphics", "mps", "x"])
                for p in range(per_device)
            ],
        )

    gpus = []
    for g in range(gpus_with_mig):
        parent = device(g)
        parent.mig_devices = [device(m, g) for m in range(devices_per_gpu)]
        gpus.append(parent)
    items = schema.MAX_ITEMS
    report = schema.NodeReport(
        node_id=node_id,
        collected_at=1.0,
        gpus=gpus,
        raylet=schema.RayletInfo(
            pid=1,
            node_id=node_id,
            node_ip="10.0.0.5",
            static_resources={word(): 1.0 for _ in range(items)},
            labels={word(): word() for _ in range(items)},
        ),
        host=schema.HostInfo(hostname="h"),
        sources=[schema.SourceStatus(name=word(), ok=False, reason=word()) for _ in range(items)],
        processes=[schema.ProcessInfo(pid=p, name=word(), title=word()) for p in range(schema.MAX_PROCESSES)],
    )
    assert used < WORDS_PER_REPORT, used
    budget = schema.MAX_REPORT_CHARS - 8 * 20_000  # the strings above, give or take
    report.host = schema.HostInfo(hostname="h" * min(4096, max(1, budget // 64)))
    return report
