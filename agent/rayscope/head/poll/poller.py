"""The scheduler poll: one GCS read per interval in a thread, and the guard that restarts it."""

import logging
import threading
import time
from typing import Callable, Optional

from rayscope.head.poll.dashboard import DashboardWorker
from rayscope.head.poll.restarted import RestartedThread
from rayscope.head.store.state import FORGET_INTERVALS, HeadState
from rayscope.node.placed_agents import RayAgents
from rayscope.schema.report import SourceStatus
from rayscope.schema.status import RayNode
from rayscope.sinks.logs import LogThrottle
from rayscope.sources.gcs import reader as gcs

log = logging.getLogger("rayscope.head")


def poll_once(
    state: HeadState,
    reader: Optional[gcs.GcsReader],
    agents: Optional[RayAgents] = None,
    dashboard: Optional[DashboardWorker] = None,
) -> SourceStatus:
    """One read of the scheduler's view (the actor table, the pending demand), kept in
    ``state``; ``dashboard``: hand Ray's dashboard's read to its worker (its own thread and
    deadline; ``None``: never read); ``agents``: keep one node agent on every alive node of
    that view."""
    views: list[RayNode] = []
    if reader is None:
        status = SourceStatus(name="gcs", ok=False, reason="no GCS address")
    else:
        views, status = reader.read()
        state.ray_versions = reader.versions
        if status.ok:
            state.set_actors(*reader.read_actors())
            state.set_pending(*reader.read_pending())
    state.poller.read(status)
    state.set_view(views, status)
    if dashboard is not None and status.ok:
        dashboard.offer_round(reader)  # never waits on the dashboard
    if agents is not None and status.ok:
        agents.reconcile(v.node_id for v in views if v.alive)
    for node_id in state.forget_gone(time.monotonic()):
        log.info(
            "forgot node %s: unknown to the scheduler, silent for %d intervals", node_id, FORGET_INTERVALS
        )
    if status.ok:
        log.debug("GCS %s: %d nodes", status.detail, len(views))
    state.fold_usage(time.monotonic())  # last: a failure here costs the round nothing else
    return status


def poll_gcs(
    state: HeadState,
    reader: Optional[gcs.GcsReader],
    stop: threading.Event,
    agents: Optional[RayAgents] = None,
    dashboard: Optional[DashboardWorker] = None,
) -> None:
    """Read the scheduler's view once per interval; log only when reachability changes.
    ``agents``: keep one node agent on every alive node of that view (``--agents ray``);
    ``dashboard``: offer Ray's dashboard's read to its worker, for nodes no agent measures
    (:func:`poll_once`). A
    round that raises is counted (``/healthz``) and logged once per kind per 10 s (the
    traceback with ``--verbose``), and the next one runs."""
    was_ok: Optional[bool] = None
    throttle = LogThrottle(log)  # a round that fails every interval: one line per kind per 10 s
    while not stop.is_set():
        try:
            status = poll_once(state, reader, agents, dashboard)
        except Exception as err:
            state.poller.failed(f"{type(err).__name__}: {err}")
            throttle.note(
                f"poller:{type(err).__name__}",
                "GCS poller: round failed (%s: %s); the scheduler view ages until a round succeeds",
                type(err).__name__,
                str(err)[:200],
                level=logging.ERROR,
            )
            log.debug("GCS poller: where the round failed", exc_info=True)
        else:
            if status.ok != was_ok:
                if status.ok:
                    log.info("GCS %s: reading every %g s", status.detail, state.interval_s)
                else:
                    log.warning("GCS: %s", status.reason)
                was_ok = status.ok
        state.poller.round_done()
        stop.wait(state.interval_s)


class PollerGuard(RestartedThread):
    """Runs :func:`poll_gcs` in a thread and starts a new one when it has died (a bug, or a
    ``BaseException`` from a library): the view would otherwise be served, ageing, for good."""

    def __init__(
        self,
        state: HeadState,
        reader: Optional[gcs.GcsReader],
        stop: threading.Event,
        agents: Optional[RayAgents] = None,
        target: Callable[..., None] = poll_gcs,
        dashboard: Optional[DashboardWorker] = None,
    ) -> None:
        self._state, self._reader, self._target = state, reader, target
        self._agents, self._dashboard = agents, dashboard
        super().__init__("rayscope-gcs-poller", stop, state.poller.set_alive)

    def _run(self) -> None:
        try:
            self._target(self._state, self._reader, self._stop, self._agents, self._dashboard)
        except BaseException as err:
            self._state.poller.failed(f"poller died: {type(err).__name__}: {err}")
            log.error("GCS poller died (%s: %s); it is restarted", type(err).__name__, err)
        finally:
            self._state.poller.set_alive(False)
