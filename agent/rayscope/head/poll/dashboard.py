"""The head's read of Ray's dashboard, in a thread of its own (:class:`DashboardWorker`), and
only while some alive GPU node has no fresh report of its own agent
(``rayscope.core.gpu.precedence``: then the page, ``/metrics``, ``/v1/status``, ``usage`` and
``fit --head`` show the dashboard's figures for it).

The GCS poller's round decides whether a node needs the dashboard and, unless the operator
named it (``head --dashboard`` / ``$RAYSCOPE_DASHBOARD``), reads the address the cluster
published on its own GCS client (:meth:`GcsReader.dashboard_url`: the client is not shared
across threads); it hands both to the worker (:meth:`DashboardWorker.offer`) and goes on. The
worker reads the dashboard under its own deadline: a dashboard that accepts and never answers
costs its own figures, never a GCS round (the scheduler view, ``/healthz``).
"""

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Callable, NamedTuple, Optional

from rayscope.head.poll.restarted import RestartedThread
from rayscope.head.store.dashboard_health import DashboardHealth
from rayscope.head.store.state import HeadState
from rayscope.schema.dashboard import DASHBOARD_STATUS, DashboardRead
from rayscope.schema.report import SourceStatus
from rayscope.sinks.logs import LogThrottle
from rayscope.sources import dashboard
from rayscope.sources.gcs import reader as gcs

log = logging.getLogger("rayscope.head")

WAKE_S = 0.25
"""How often an idle worker looks at the stop event (a round's offer wakes it at once)."""


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


class DashboardJob(NamedTuple):
    """What one GCS round hands the dashboard's reader: whether a node needs the dashboard,
    where it is (``None``: nowhere, ``why``), and what the read needs of the GCS reader
    (copied: strings and numbers, nothing of its client)."""

    needed: bool
    address: Optional[dashboard.Address] = None
    why: str = ""
    timeout_s: float = 0.0
    cluster_ray_version: Optional[str] = None


NOT_NEEDED = DashboardJob(needed=False)


def dashboard_job(
    state: HeadState, reader: Optional[gcs.GcsReader], setting: DashboardSetting
) -> DashboardJob:
    """The round's job, on the poller's thread (the published address is read on its
    reader's client, under the GCS deadline)."""
    if reader is None or setting.off or not state.needs_dashboard(time.monotonic()):
        return NOT_NEEDED
    address, why = setting.address, ""
    if address is None:
        published, published_error = reader.dashboard_url()
        address, why = dashboard.choose_address(None, {}, published, published_error)
    return DashboardJob(
        needed=True,
        address=address,
        why=why,
        timeout_s=reader.timeout_s,
        cluster_ray_version=reader.cluster_ray_version,
    )


def read_job(state: HeadState, job: DashboardJob, setting: DashboardSetting) -> Optional[DashboardRead]:
    """Do ``job`` (the dashboard read, under its deadline) and keep what it gave in ``state``
    (``None``: not read, no node needs it); what was kept."""
    read: Optional[DashboardRead] = None
    if not job.needed:
        pass
    elif job.address is None:
        read = DashboardRead(status=SourceStatus(name=DASHBOARD_STATUS, ok=False, reason=job.why))
    else:
        nodes, status = dashboard.read_nodes(
            job.address, job.timeout_s, job.cluster_ray_version, setting.environ
        )
        read = DashboardRead(nodes=nodes, status=status)
    state.set_dashboard(read)
    return read


def poll_dashboard(state: HeadState, reader: Optional[gcs.GcsReader], setting: DashboardSetting) -> None:
    """One read in the caller's thread (the job and its read), kept in ``state``."""
    read_job(state, dashboard_job(state, reader, setting), setting)


class DashboardWorker(RestartedThread):
    """Reads the dashboard in its own thread, once per job a GCS round offers (the latest
    one: a read that overran its interval skips the jobs offered meanwhile), until ``stop``;
    what it did goes to ``state.dashboard_health`` (``/healthz``'s ``dashboard``). Never
    raises to the poller; :meth:`check` starts a new thread when the last one died."""

    def __init__(
        self,
        state: HeadState,
        setting: DashboardSetting,
        stop: threading.Event,
        read: Callable[[HeadState, DashboardJob, DashboardSetting], Optional[DashboardRead]] = read_job,
        throttle: Optional[LogThrottle] = None,
    ) -> None:
        self.state, self.setting, self._read = state, setting, read
        self.health: DashboardHealth = state.dashboard_health
        super().__init__("rayscope-dashboard", stop, self.health.set_alive)
        self._throttle = throttle or LogThrottle(log)
        self._lock = threading.Lock()
        self._job: Optional[DashboardJob] = None
        self._wake = threading.Event()
        if setting.off:
            self.health.off(setting.off)

    def offer_round(self, reader: Optional[gcs.GcsReader]) -> None:
        """A GCS round that read the view: build its job here (the poller's thread, its
        reader) and hand it over; never raises, never waits on the dashboard."""
        if self.setting.off:
            return
        try:
            job = dashboard_job(self.state, reader, self.setting)
        except Exception as err:  # a bug here costs the dashboard's figures, not the round
            self._failed(f"{type(err).__name__}: {err}")
            return
        self.offer(job)

    def offer(self, job: DashboardJob) -> None:
        with self._lock:
            self._job = job
        self._wake.set()

    def _take(self) -> Optional[DashboardJob]:
        self._wake.wait(WAKE_S)
        self._wake.clear()
        with self._lock:
            job, self._job = self._job, None
        return job

    def _loop(self) -> None:
        while not self._stop.is_set():
            job = self._take()
            if job is None or self._stop.is_set():
                continue
            self.health.reading(time.monotonic())
            try:
                read = self._read(self.state, job, self.setting)
            except Exception as err:
                self._failed(f"{type(err).__name__}: {err}")
                continue
            if read is None:
                self.health.not_needed(time.monotonic())
            elif read.status.ok:
                self.health.answered(time.monotonic())
            else:
                self.health.failing(read.status.reason, time.monotonic())

    def _failed(self, what: str) -> None:
        self.health.failing(what, time.monotonic(), error=True)
        self._throttle.note(
            "dashboard worker", "dashboard read failed (%s); the GCS view is unaffected", what
        )

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:
            self.health.failing(f"worker died: {type(err).__name__}: {err}", time.monotonic(), error=True)
            log.error("dashboard worker died (%s: %s); it is restarted", type(err).__name__, err)
        finally:
            self.health.set_alive(False)
