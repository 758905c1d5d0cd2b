"""Ray's dashboard read beside the GCS read, never after it: the one read of
:mod:`rayscope.sources.dashboard.read` in a thread, started as soon as its address is known, and
taken when the GCS read is done, within the command's one deadline.

The address is known at once when the operator named it (``--dashboard``,
``$RAYSCOPE_DASHBOARD``); else it is what the cluster published in its GCS, which the GCS
child writes to its stderr as soon as the KV answered (``rayscope: dashboard "HOST:PORT"``,
:data:`rayscope.sources.gcs.read.DASHBOARD_MARK`), before it reads the nodes:
:meth:`ParallelRead.on_child_line` starts the GET from that line. A child whose line never came
(it failed first) leaves the address to its answer (:meth:`ParallelRead.result`).

The answer is parsed only at the end: which per-process figures are believed depends on the
cluster's Ray release, which the GCS read says.
"""

import os
import threading
from collections.abc import Mapping
from typing import Optional

from rayscope import errors
from rayscope.defaults import DASHBOARD_ENV
from rayscope.net import peer_json
from rayscope.net.deadline import Deadline
from rayscope.schema.dashboard import DASHBOARD_STATUS, DashboardRead
from rayscope.schema.report import SourceStatus
from rayscope.sources.dashboard import address as dashboard
from rayscope.sources.dashboard import read
from rayscope.sources.dashboard.parse import failed
from rayscope.sources.gcs import read as gcs_read

JOIN_GRACE_S = 0.05
"""Beyond the deadline, what the GET's thread is given to hand back a failure it has reached
(the GET itself stops at the deadline)."""


class ParallelRead:
    """One command's dashboard read (``status``, ``fit`` without a head agent)."""

    def __init__(
        self,
        option: Optional[str],
        deadline: Deadline,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        """``option``: ``--dashboard``'s value (``None``: not given); ``deadline``: the
        command's (Ray's token goes where :func:`dashboard.token_withheld` allows). A bad URL
        the operator named is a ``ValueError``, before anything starts."""
        self._deadline, self._environ = deadline, environ
        self._lock = threading.Lock()
        self._thread: Optional[errors.Worker] = None
        self._address: Optional[dashboard.Address] = None
        self._fetched: Optional[read.Fetched] = None
        self._why = ""
        self.off = ""
        """Why the source is not read (``--dashboard none``); ``""`` when it is."""
        named = any((given or "").strip() for given in (option, environ.get(DASHBOARD_ENV)))
        if named:
            address, why = dashboard.choose_address(option, environ, None, "")
            if address is None:
                self.off = why
            else:
                self._start(address)

    def _start(self, address: dashboard.Address) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._address = address
            self._thread = errors.start_worker(self._get, "rayscope-dashboard")

    def _get(self) -> None:
        assert self._address is not None
        left = self._deadline.left()
        if left <= 0:
            self._fetched = read.Fetched(failed=failed("not read: the command's deadline had passed"))
            return
        self._fetched = read.fetch(self._address, left, self._environ)

    def on_published(self, published: Optional[str], published_error: str = "") -> None:
        """The address the cluster published (the GCS child's early line, or its answer):
        the GET starts now, unless the operator named one or it has started."""
        if self.off or self._thread is not None:
            return
        address, why = dashboard.choose_address(None, {}, published, published_error)
        if address is None:
            self._why = why
        else:
            self._start(address)

    def on_child_line(self, line: str) -> None:
        """One line of the GCS child's stderr: the dashboard's address, when it is that line."""
        if not line.startswith(gcs_read.DASHBOARD_MARK):
            return
        try:
            published = peer_json.loads(line[len(gcs_read.DASHBOARD_MARK) :])
        except peer_json.PeerJsonError:
            return
        if published is None or isinstance(published, str):
            self.on_published(published)

    def result(
        self, cluster_ray_version: Optional[str], published: Optional[str], published_error: str
    ) -> Optional[DashboardRead]:
        """The read, once the GCS read is done (``published``: the address its answer names,
        for a child whose early line never came); ``None`` when the source is off."""
        if self.off:
            return None
        if self._thread is None:
            self.on_published(published, published_error)
        thread, address = self._thread, self._address
        if thread is None or address is None:
            reason = self._why or "no Ray dashboard address"
            return DashboardRead(status=failed(reason))
        thread.join(max(0.0, self._deadline.left()) + JOIN_GRACE_S)
        fetched = self._fetched
        if fetched is None and thread.error is not None:  # a bug of ours, said as the source's failure
            error = f"{type(thread.error).__name__}: {thread.error}"
            return DashboardRead(status=failed(f"reading the Ray dashboard at {address.url} failed: {error}"))
        if fetched is None:  # the GET's own deadline is the command's: not reached here
            return DashboardRead(status=failed(f"the Ray dashboard at {address.url} did not answer in time"))
        nodes, status = read.parsed(fetched, address, cluster_ray_version)
        if status.ok:
            status.detail += f"; address from {address.origin}"
        return DashboardRead(nodes=nodes, status=status)

    def off_status(self) -> SourceStatus:
        """What ``--verbose`` says of a source turned off."""
        return SourceStatus(name=DASHBOARD_STATUS, ok=True, detail=self.off)
