"""The machine itself: hostname, CPU count, load and memory (psutil and the kernel)."""

import os
import socket
from typing import Optional

import psutil

from rayscope.schema.report import HostInfo, SourceStatus


def read_host() -> tuple[HostInfo, SourceStatus]:
    """Host facts; a part the kernel does not give is left ``None`` and named in the status."""
    missing = []
    load: tuple[Optional[float], Optional[float], Optional[float]] = (None, None, None)
    try:
        load = os.getloadavg()
    except OSError:
        missing.append("load")
    total: Optional[int] = None
    available: Optional[int] = None
    try:
        memory = psutil.virtual_memory()
        total, available = int(memory.total), int(memory.available)
    except (OSError, psutil.Error):
        missing.append("memory")
    host = HostInfo(
        hostname=socket.gethostname(),
        cpu_count=psutil.cpu_count(logical=True),
        load_1m=load[0],
        load_5m=load[1],
        load_15m=load[2],
        memory_total_bytes=total,
        memory_available_bytes=available,
    )
    reason = ("not readable: " + ", ".join(missing)) if missing else ""
    return host, SourceStatus(name="host", ok=not missing, reason=reason)
