"""``rayscope node``: this host's diagnostics (``node --json``)."""

from typing import Optional, Union

import msgspec

from rayscope.schema.report import UNSET, GpuDevice, HostInfo, ProcessInfo, RayletInfo, SourceStatus, Unset
from rayscope.schema.status import DOCUMENT_SCHEMA, NodeAttribution, NodeStatus


class AgentProcess(msgspec.Struct, kw_only=True, gc=False):
    """A rayscope node agent running on this host, as its process shows it (``rayscope node``)."""

    pid: int
    user: str = ""
    started_by: str
    """``ray`` (a Ray worker titled ``ray::RayscopeAgent``), ``systemd`` (its cgroup is a
    ``.service`` unit) or ``manual``, as ``status --head`` words it."""
    head: Optional[str] = None
    """The ``--head`` on its command line; ``None`` for an agent placed through Ray."""
    unit: Optional[str] = None
    """The systemd unit it runs in, if any."""


class NodeDiagnostics(msgspec.Struct, kw_only=True):
    """What ``rayscope node`` prints: this host's raylets, GPUs and host, and their booking."""

    schema: int = DOCUMENT_SCHEMA
    generated_at: float
    gcs_address: Optional[str] = None
    raylets: list[RayletInfo] = []
    host: Optional[HostInfo] = None
    driver_version: Optional[str] = None
    gpus: Optional[list[GpuDevice]] = None
    booking: dict[str, NodeStatus] = {}
    """The local raylets' nodes as the scheduler sees them (empty if the GCS was not read)."""
    sources: list[SourceStatus] = []
    processes: Optional[list[ProcessInfo]] = None
    attribution: Optional[NodeAttribution] = None
    """This host's GPUs attributed to the local raylets' actors (``node --gpus``)."""
    gpu_raylets: Union[list[str], Unset] = UNSET
    """``node --gpus`` with the GCS read: the node ids of the local raylets whose actors may
    hold this host's GPUs (a raylet measured on devices of its own, by Ray's dashboard, is
    not one); absent otherwise (every local raylet's actors are then matched)."""
    agents: Optional[list[AgentProcess]] = None
    """rayscope node agents running on this host (``None``: not looked for)."""
