"""The head's read of Ray's dashboard: once per round of the GCS poller, and only while some
alive GPU node has no fresh report of its own agent (``rayscope.core.gpu.precedence``: then
the page, ``/metrics``, ``/v1/status``, ``usage`` and ``fit --head`` show the dashboard's
figures for it). The address: ``head --dashboard`` / ``$RAYSCOPE_DASHBOARD``, else the one the
cluster published, read on the poller's own GCS client (:meth:`GcsReader.dashboard_url`).
"""

import os
import time
from collections.abc import Mapping
from typing import Optional

from rayscope.head.store.state import HeadState
from rayscope.schema.dashboard import DASHBOARD_STATUS, DashboardRead
from rayscope.schema.report import SourceStatus
from rayscope.sources import dashboard
from rayscope.sources.gcs import reader as gcs


class DashboardSetting:
    """Where the head reads the dashboard, as the operator set it (checked at start)."""

    def __init__(self, option: Optional[str], environ: Mapping[str, str] = os.environ) -> None:
        """``ValueError`` for an address the operator named that is not one."""
        self.environ = environ
        self.named = any((given or "").strip() for given in (option, environ.get(dashboard.DASHBOARD_ENV)))
        self.address: Optional[dashboard.Address] = None
        self.off = ""
        if self.named:
            self.address, self.off = dashboard.choose_address(option, environ, None, "")


def poll_dashboard(state: HeadState, reader: Optional[gcs.GcsReader], setting: DashboardSetting) -> None:
    """One round's read, kept in ``state`` (``None`` there: not read, because it is off or
    no node needs it); never raises."""
    if reader is None or setting.off or not state.needs_dashboard(time.monotonic()):
        state.set_dashboard(None)
        return
    address, why = setting.address, ""
    if address is None:
        published, published_error = reader.dashboard_url()
        address, why = dashboard.choose_address(None, {}, published, published_error)
    if address is None:
        state.set_dashboard(DashboardRead(status=SourceStatus(name=DASHBOARD_STATUS, ok=False, reason=why)))
        return
    nodes, status = dashboard.read_nodes(
        address, reader.timeout_s, reader.cluster_ray_version, setting.environ
    )
    state.set_dashboard(DashboardRead(nodes=nodes, status=status))
