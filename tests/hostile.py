"""Reports a token holder may send to break a view: every string field of the report, filled,
then its digits written in other scripts (``'²'``, ``'٢'``, ``'５'``: ``str.isdigit()`` is
true for each, ``int()`` refuses the first). Shared by tests/test_hostile_input.py and the
fuzz run (tests/tools/fuzz_wire.py).

:func:`full_report` sets every string field the schema has (:func:`string_fields` lists them
from the Structs, so a new field fails the test until it is filled here); :func:`foreign`
rewrites its digits; :func:`all_foreign` replaces every string with foreign digits only.
"""

from typing import Any

import msgspec
import msgspec.inspect as mi

from rayscope.schema.report import (
    GpuDevice,
    GpuHealth,
    GpuProcess,
    HostInfo,
    NodeReport,
    ProcessInfo,
    RayletInfo,
    SourceStatus,
)

DIGITS = {
    "superscript": "⁰¹²³⁴⁵⁶⁷⁸⁹",  # isdigit() true, isdecimal() false, int() refuses
    "arabic-indic": "٠١٢٣٤٥٦٧٨٩",  # isdecimal() true, int() takes them
    "fullwidth": "０１２３４５６７８９",  # the same
}
"""Digit sets that pass ``str.isdigit()`` and are no ASCII digit."""

GIB = 1024**3


def _gpu(index: int, node_ip: str) -> GpuDevice:
    return GpuDevice(
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
        memory_total_bytes=80 * GIB,
        memory_used_bytes=(index + 3) * GIB,
        memory_info_version=2,
        utilization_gpu_pct=40,
        errors={"power_limit_mw": "Error 3: Not Supported"},
        pci_bus_id=f"00000000:{index + 1:02x}:00.0",
        processes=[GpuProcess(pid=5100 + index, used_memory_bytes=GIB, kinds=["compute", "mps"])],
        health=GpuHealth(xid_errors=0),
        virtualization_mode="none",
        compute_mode="default",
        mps_serving=False,
        nvml_memory_used_bytes=(index + 3) * GIB,
        memory_used_source="nvml",
        memory_used_age_s=0.0,
        memory_used_reason="vGPU guest 2: NVML used not trusted",
        health_flags=["XID 79 (9 since start)"],  # the head's to judge: replaced where it merges
    )


def full_report(node_id: str, node_ip: str, hostname: str = "gpu-07") -> NodeReport:
    """A two-GPU node's report with every string field the schema has set, digits in most."""
    return NodeReport(
        node_id=node_id,
        collected_at=1_796_000_000.0,
        raylet=RayletInfo(
            pid=4242,
            node_id=node_id,
            node_ip=node_ip,
            gcs_address="10.0.0.1:6379",
            session_dir="/tmp/ray/session_2026-12-03_18-16-08_123456_4242",
            temp_dir="/tmp/ray2",
            static_resources={
                f"node:{node_ip}": 1.0,
                "GPU": 2.0,
                "accelerator_type:A100": 1.0,
                "VRAM_MB": 16384.0,
            },
            labels={"ray.io/node-id": node_id, "rack": "12", "slot3": "4"},
            python_executable="/opt/python3.11/bin/python3.11",
            cuda_visible_devices="2,3",
            cuda_device_order="PCI_BUS_ID",
            environ_read=True,
            ray_version="2.40.0",
        ),
        host=HostInfo(hostname=hostname, cpu_count=64),
        driver_version="550.54.14",
        gpus=[_gpu(0, node_ip), _gpu(1, node_ip)],
        sources=[SourceStatus(name="nvml2", ok=True, reason="retry 3", detail="v2 API, 2 GPUs")],
        interval_s=5.0,
        processes=[
            ProcessInfo(
                pid=5100,
                name="python3.11",
                title="ray::Trainer3.train",
                worker_pid=5100,
                raylet_pid=4242,
                node_id=node_id,
                job_id="02000000",
                actor_id="0123456789abcdef0123456702000000",
            )
        ],
        started_by="systemd2",
    )


def _rewrite(value: Any, change: Any) -> Any:
    """``value`` (a report or a part of one) with ``change`` applied to every string in it,
    a dict's keys too; field names stay."""
    if isinstance(value, msgspec.Struct):
        fields = {name: _rewrite(getattr(value, name), change) for name in value.__struct_fields__}
        return type(value)(**fields)
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_rewrite(v, change) for v in value]
    if isinstance(value, dict):
        return {_rewrite(k, change): _rewrite(v, change) for k, v in value.items()}
    return value


def _rebuilt(report: NodeReport, change: Any, keep_node_id: bool) -> NodeReport:
    out: NodeReport = _rewrite(report, change)
    if keep_node_id:
        out.node_id = report.node_id
    return out


def foreign(report: NodeReport, digits: str, keep_node_id: bool = False) -> NodeReport:
    """``report`` with every ASCII digit of every string (dict keys too) in ``digits``;
    ``keep_node_id``: the node id as it was (a node the scheduler knows)."""
    table = str.maketrans("0123456789", digits)
    return _rebuilt(report, lambda s: s.translate(table), keep_node_id)


def all_foreign(report: NodeReport, digits: str, keep_node_id: bool = False) -> NodeReport:
    """``report`` with every string made of ``digits`` only (``"²,³"`` shapes: a list, an
    address), dict keys kept apart."""
    counter = [0]

    def change(_: str) -> str:
        counter[0] += 1
        n = counter[0]
        return f"{digits[n % 10]},{digits[(n + 1) % 10]}" if n % 2 else digits[n % 10] * (n % 5 + 1)

    return _rebuilt(report, change, keep_node_id)


HEAD_ONLY = ("gpus[].attribution",)
"""What only the head computes (a report that sets it is refused): no string to fill."""


def string_fields(cls: type, prefix: str = "") -> set[str]:
    """Dotted paths of every string a report of Struct ``cls`` can hold (``{}`` for a key),
    less :data:`HEAD_ONLY`."""
    out: set[str] = set()
    for field in mi.type_info(cls).fields:  # type: ignore[attr-defined]
        out |= _paths(field.type, f"{prefix}{field.name}", {cls})
    return {p for p in out if not p.startswith(HEAD_ONLY)}


def _paths(kind: Any, path: str, seen: set[type]) -> set[str]:
    if isinstance(kind, mi.UnionType):
        return set().union(*(_paths(t, path, seen) for t in kind.types))
    if isinstance(kind, mi.StrType):
        return {path}
    if isinstance(kind, mi.ListType):
        return _paths(kind.item_type, path + "[]", seen)
    if isinstance(kind, mi.DictType):
        return _paths(kind.key_type, path + "{}", seen) | _paths(kind.value_type, path + "[]", seen)
    if isinstance(kind, mi.StructType) and kind.cls not in seen:
        return {
            p
            for f in mi.type_info(kind.cls).fields  # type: ignore[attr-defined]
            for p in _paths(f.type, f"{path}.{f.name}", seen | {kind.cls})
        }
    return set()


def filled_strings(value: Any, path: str = "") -> set[str]:
    """Dotted paths (as :func:`string_fields` names them) where ``value`` holds a non-empty string."""
    if isinstance(value, msgspec.Struct):
        return {
            p
            for name in value.__struct_fields__
            for p in filled_strings(getattr(value, name), f"{path}.{name}" if path else name)
        }
    if isinstance(value, str):
        return {path} if value else set()
    if isinstance(value, list):
        return set().union(set(), *(filled_strings(v, path + "[]") for v in value))
    if isinstance(value, dict):
        keys = {path + "{}" for k in value if isinstance(k, str) and k}
        return keys.union(*(filled_strings(v, path + "[]") for v in value.values()))
    return set()


def hostile_reports(digits: str, known: tuple[str, str]) -> list[NodeReport]:
    """Four reports with ``digits`` in every string: two for nodes the scheduler does not
    know (their ids and ``10.0.0.²`` rewritten too), two for the nodes ``known`` (``²,³``)."""
    unknown = full_report("07" * 28, "10.0.0.5", "gpu-07")
    return [
        foreign(unknown, digits),
        all_foreign(unknown, digits),
        foreign(full_report(known[0], "10.0.8.1", "gpu-18"), digits, keep_node_id=True),
        all_foreign(full_report(known[1], "10.0.8.2", "gpu-28"), digits, keep_node_id=True),
    ]
