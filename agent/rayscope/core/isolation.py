"""One node's bad data is that node's problem: its failure is counted and named, the rest shown.

A report the head took can still hold something no merge or renderer foresaw (the last one:
``int('²')`` on a node's address took every view of the head down with HTTP 500). So the
work done per node is isolated, in one place:

* :func:`guarded` runs one node's share of the merge (``rollup.merge``, per report;
  ``attribution.attribute_cluster``, per node): a node whose share raises becomes
  :func:`unreadable` and the others are merged;
* :func:`per_node` wraps a renderer (the status lines, ``--gpus``, the JSON document,
  ``/metrics``, the page): it renders the whole status as before; only when that raises does
  it render each node alone, replace the nodes that raise by :func:`unreadable` ones, and
  render again. Nothing is paid while nothing fails.

An unreadable node keeps the scheduler's numbers and its identity; its report's parts (GPUs,
attribution, placement, sources) are gone and ``unreadable`` says why, printable and
bounded: its line ends ``report unreadable: ValueError: ...``. Each failure is counted by the
:class:`Recorder` recording in the thread (the head's ``NodeFailures``, shown in
``/healthz`` and logged there, throttled). A failure that is no node's (the whole status
fails with no node at all) is raised as before.
"""

import contextvars
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional, Protocol, TypeVar

from msgspec import UNSET
from msgspec.structs import replace

from rayscope.labels import printable
from rayscope.schema.status import NA, ClusterStatus, NodeStatus

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

UNREADABLE = "report unreadable"
"""How a node's line says its report could not be merged or rendered (then why)."""
MAX_REASON_CHARS = 160
"""How much of an exception's text a node's line and ``/healthz`` show."""


def reason_of(err: BaseException) -> str:
    """``ValueError: invalid literal ...``: printable, at most :data:`MAX_REASON_CHARS`."""
    try:
        text = f"{type(err).__name__}: {err}"
    except Exception:  # an exception whose str() raises says its class only
        text = type(err).__name__
    return printable(text)[:MAX_REASON_CHARS]


class Recorder(Protocol):
    """Who counts node failures (the head's :class:`rayscope.head.store.failures.NodeFailures`)."""

    def note(self, stage: str, node_id: str, reason: str) -> None: ...


_RECORDING: contextvars.ContextVar[Optional[Recorder]] = contextvars.ContextVar(
    "rayscope_node_failures", default=None
)


@contextmanager
def recording(failures: Recorder) -> Iterator[None]:
    """Count the node failures of the merges and renders run in this block (this thread)."""
    token = _RECORDING.set(failures)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def guarded(stage: str, node_id: str, instead: Callable[[str], T], work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``, or, when it raises, ``instead(reason)`` with the failure counted: one
    node's share of a merge or a render (``stage``: ``merge`` or ``render``)."""
    try:
        return work(*args)
    except Exception as err:  # anything one node's data can cause; MemoryError and RecursionError too
        reason = reason_of(err)
        failures = _RECORDING.get()
        if failures is not None:
            failures.note(stage, node_id, reason)
        return instead(reason)


def unreadable(node: Optional[NodeStatus], node_id: str, reason: str, identity: bool = True) -> NodeStatus:
    """What is shown of a node whose report could not be merged or rendered: the scheduler's
    numbers (``node``, when there is one), ``unreadable`` (why), and nothing from its report.
    ``identity``: keep its address and host name (else it is named by its id only)."""
    if node is None:
        return NodeStatus(
            node_ip=None, head=False, total_cpu=0.0, used_cpu=0.0, total_gpu=0.0, used_gpu=0.0,
            total_gpu_memory=0, used_gpu_memory=0, total_vram_mb=0.0, used_vram_mb=0.0,
            total_memory=0.0, used_memory=0.0, total_object_store_memory=0.0,
            used_object_store_memory=0.0, accelerator_type=NA, slurm_job_id=None,
            node_id=node_id, in_scheduler=False, unreadable=reason,
        )  # fmt: skip
    return replace(
        node,
        node_ip=node.node_ip if identity else None,
        hostname=node.hostname if identity else None,
        total_gpu_memory=0 if node.total_gpu == 0 else NA,
        used_gpu_memory=0 if node.total_gpu == 0 else NA,
        accelerator_type=node.accelerator_type
        if identity and node.in_scheduler
        else (NA if node.total_gpu == 0 else None),
        slurm_job_id=None,
        agent="none",
        agent_started_by="",
        report_age_s=None,
        stale=False,
        driver_version=None,
        gpus=None,
        sources=[],
        attribution=None,
        placement=None,
        collected_at=None,
        received_at=None,
        gpus_unmeasured=0,
        total_gpu_memory_bytes=None,
        used_gpu_memory_bytes=None,
        used_gpu_memory_source=None,
        used_gpu_memory_age_s=None,
        used_gpu_memory_reason="report unreadable",
        nvml_memory_used_bytes=None,
        shared_gpus=UNSET,
        gpus_source=UNSET,
        unreadable=reason,
    )


def unreadable_as(node: Optional[NodeStatus], node_id: str) -> Callable[[str], NodeStatus]:
    """:func:`guarded`'s ``instead`` for a node's share of a merge: :func:`unreadable`."""
    return functools.partial(unreadable, node, node_id)


def per_node(render: F) -> F:
    """``render(status, ...)`` isolated per node (see the module's docstring)."""

    @functools.wraps(render)
    def isolated(status: ClusterStatus, *args: Any, **kwargs: Any) -> Any:
        try:
            return render(status, *args, **kwargs)
        except Exception:
            render(replace(status, nodes={}), *args, **kwargs)  # no node at all: not a node's problem
        bad: dict[str, str] = {}
        work = functools.partial(render, **kwargs)
        for node_id, node in status.nodes.items():
            alone = replace(status, nodes={node_id: node})
            guarded("render", node_id, functools.partial(bad.__setitem__, node_id), work, alone, *args)
        for identity in (True, False):  # a node's address may be what broke it: then its id names it
            nodes = {
                k: unreadable(n, k, bad[k], identity) if k in bad else n for k, n in status.nodes.items()
            }
            try:
                return render(replace(status, nodes=nodes), *args, **kwargs)
            except Exception:
                if not identity:
                    raise
        raise AssertionError("unreachable")

    return isolated  # type: ignore[return-value]
