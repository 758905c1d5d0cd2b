"""Node agents placed through Ray: one per alive node, kept there as nodes come and go.

Placed the way Ray Serve places its per-node proxies: one detached, named actor per node
(``rayscope-agent:<node_id>`` in the ``rayscope`` namespace), pinned with
``NodeAffinitySchedulingStrategy(node_id, soft=False)``, ``num_cpus=0``, no GPU and no
custom resource — a custom-resource pin keeps Serve's idle nodes from scaling down in Ray,
and a zero booking leaves every scheduler sum as it was.

The head agent reconciles once per interval from the scheduler view it already read: a node
without an agent gets one, an agent whose node left is forgotten (one log line), an agent
that vanished from a live node (crashed, killed) is replaced. The actor runs the ordinary
push loop (:class:`rayscope.node.push.Pusher`) pinned to its node's id. The head's token reaches it
as the argument of one direct actor call (``start``), never in the actor's creation task,
options or runtime environment, which the GCS actor table keeps and ``ray list actors
--detail`` and the dashboard show; the actor holds it in memory only.

The package travels as a ``py_modules`` runtime environment: rayscope's ``rayscope`` package
plus the three libraries the push loop needs and Ray's own install lacks (msgspec, psutil,
nvidia-ml-py), taken from the head's environment — Ray runs one Python version across a
cluster, so the same files load on every node. Ray uploads them to the GCS once (by content
hash) and each node caches them.

This module decides (the plan is pure); :mod:`rayscope.sources.placed_agent_calls` makes Ray's calls.
A reconcile that fails is a source status (``ray_agents``) in every status the head serves.

Anyone who can reach the cluster can create an actor named ``rayscope-agent:<node>`` in the
``rayscope`` namespace. One this head did not create is removed once (an earlier head's agent,
whose token or address may differ); if the name is held by another actor again within
:data:`RETRY_AFTER_INTERVALS` intervals, or is taken when this head places its agent,
someone keeps re-creating it: the node is counted as ``agents_name_held`` in ``/healthz``
and named in the ``ray_agents`` source (``agent name held by another actor``), and the head
removes the holder again only once per retry delay instead of fighting for the name.
"""

import contextlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from rayscope import errors
from rayscope.net.addresses import is_loopback
from rayscope.schema.report import STARTED_BY_RAY, SourceStatus
from rayscope.sources.placed_agent_calls import NameTaken, RayCluster, this_worker

log = logging.getLogger("rayscope.agents")

NAMESPACE = "rayscope"
NAME_PREFIX = "rayscope-agent:"
SLOW_START_S = 60.0
"""A placed agent whose push loop has not started after this long counts as failing (Ray may
take tens of seconds to start a worker with a new runtime environment on a busy node)."""
RETRY_AFTER_INTERVALS = 10
"""An agent whose start failed is retried after this many intervals (no placement storm)."""
SHIPPED = ("rayscope", "msgspec", "psutil", "pynvml")
"""What the actor imports beyond Ray: rayscope's package and the push loop's libraries."""
REMOVE_TIMEOUT_S = 30.0
LOOK_WAIT_S = 0.2
"""How long ``/healthz`` and a status render wait for a reconcile in progress (Ray's calls
can take seconds) before answering with what they saw the last time they could look."""
NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}
"""The agent reads NVML, which never opens a device context; with no CUDA device visible
either (Ray 2.60 leaves the variable unset for ``num_gpus=0``), nothing in its process can
become a GPU user, so it never shows among NVML's processes or as ``unbooked``."""


def agent_name(node_id: str) -> str:
    return NAME_PREFIX + node_id


def node_of(name: str) -> Optional[str]:
    """The node id in an agent's actor name; ``None`` for any other name."""
    return name[len(NAME_PREFIX) :] if name.startswith(NAME_PREFIX) else None


@dataclass
class Plan:
    """One reconcile step, decided from names alone (pure, so it is unit-tested)."""

    place: list[str] = field(default_factory=list)
    """Alive nodes with no agent: place one."""
    replace: list[str] = field(default_factory=list)
    """Alive nodes whose agent this head placed and which vanished (crashed, killed): place again."""
    forget: list[str] = field(default_factory=list)
    """Nodes that left the scheduler's alive set: their agent went with them."""
    adopt_none: list[str] = field(default_factory=list)
    """Agents named for alive nodes that this head did not place (an earlier head's, whose
    token or address may differ): removed, then placed again."""


def plan(
    alive: Iterable[str], existing: Iterable[str], placed: Iterable[str], waiting: Iterable[str]
) -> Plan:
    """What to do, given the alive node ids, the nodes whose agent actor exists, the nodes
    this head placed an agent on, and nodes waiting out a retry delay."""
    alive_set, existing_set, placed_set, waiting_set = set(alive), set(existing), set(placed), set(waiting)
    step = Plan()
    step.forget = sorted(placed_set - alive_set)
    step.adopt_none = sorted((existing_set & alive_set) - placed_set)
    step.replace = sorted((placed_set & alive_set) - existing_set)
    step.place = sorted(alive_set - existing_set - placed_set - waiting_set)
    return step


def shipped_modules() -> list[str]:
    """Paths for ``py_modules``: package directories, or the file of a one-file module."""
    paths = []
    for name in SHIPPED:
        module = importlib.import_module(name)
        path = str(module.__file__)
        paths.append(os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path)
    return paths


class RayscopeAgent:
    """The actor: the push loop for the node it is pinned to (``ray.remote`` at placement)."""

    def __init__(self, node_id: str, head_host: str, head_port: int, interval_s: float) -> None:
        self.node_id, self.head, self.interval_s = node_id, (head_host, head_port), interval_s
        self._thread: Optional[errors.Worker] = None
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    def start(self, token: bytes) -> int:
        """Start the push loop with the head's token (held in memory only); the worker's pid."""
        from rayscope.node.push import Pusher  # the node's imports, in the actor's worker only

        pusher = Pusher(self.head, token, self.interval_s, self.node_id)
        pusher.started_by = STARTED_BY_RAY

        def loop() -> None:
            try:
                pusher.run(handle_signals=False)  # Ray owns this worker's signals
            finally:  # a loop that ended is a crash: let Ray see a dead actor, the head replaces it
                os._exit(1)

        self._thread = errors.start_worker(loop, "rayscope-push")
        return os.getpid()

    def probe(self) -> dict[str, Any]:
        """What the tests check: the worker's pid, node and GPU visibility."""
        return {
            "pid": os.getpid(),
            **this_worker(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pushing": self._thread is not None and self._thread.is_alive(),
        }


class RayAgents:
    """Keeps one :class:`RayscopeAgent` on every alive node; owned by the head agent."""

    def __init__(
        self,
        gcs_address: str,
        head: tuple[str, int],
        token: bytes,
        interval_s: float,
        cluster: Optional[RayCluster] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``cluster``: Ray's calls (default: a driver of the cluster at ``gcs_address``,
        connected on first use, carrying :func:`shipped_modules`); ``clock``: monotonic
        seconds (placement ages, retry delays)."""
        self.gcs_address, self.head, self.interval_s = gcs_address, head, interval_s
        if is_loopback(head[0]):
            log.info(
                "agents report to %s:%d, which only nodes on this host reach: on a cluster of"
                " several hosts, --listen 0.0.0.0:%d (with --token-file)",
                *head,
                head[1],
            )
        self._token = token
        self._cluster = cluster
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._placed: dict[str, float] = {}  # node id -> when placed (monotonic)
        self._starting: dict[str, Any] = {}  # node id -> ObjectRef of start()
        self._running: set[str] = set()
        self._retry_at: dict[str, float] = {}  # node id -> monotonic time of the next try
        self._removed_at: dict[str, float] = {}  # node id -> when a holder not ours was removed
        self._held: set[str] = set()  # nodes whose agent name another actor keeps holding
        self._state = ""
        self._last_health: dict[str, int] = {}
        self._last_status = SourceStatus(name="ray_agents", ok=True)
        # Ray's C++ handler would print a stack dump at every SIGTERM the head takes; Ray
        # reads this when first imported, so before the head's GCS reader imports it.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

    def _ray(self) -> RayCluster:
        """Ray, reached lazily: the head imports ray only when agents are placed through it."""
        if self._cluster is None:
            self._cluster = RayCluster(self.gcs_address, NAMESPACE, shipped_modules())
        self._cluster.connect()
        return self._cluster

    def _existing(self) -> set[str]:
        """Nodes whose agent actor exists."""
        return {node for name in self._ray().named_actors() if (node := node_of(name)) is not None}

    def head_address_for_agents(self) -> tuple[str, int]:
        """Where agents connect: the listen address, or this node's IP when listening on all."""
        host, port = self.head
        if host in ("", "0.0.0.0", "::"):
            host = self._ray().node_ip()
        return host, port

    def _place(self, node_id: str) -> None:
        host, port = self.head_address_for_agents()
        cluster = self._ray()
        handle = cluster.place(
            RayscopeAgent, agent_name(node_id), node_id, (node_id, host, port, self.interval_s), NO_GPU_ENV
        )
        self._placed[node_id] = self._clock()
        self._held.discard(node_id)
        self._starting[node_id] = cluster.call(handle, "start", self._token)  # the token: a direct call only

    def _check_starts(self) -> None:
        """Collect finished ``start`` calls: running, or failed (killed, retried later)."""
        if not self._starting:
            return
        cluster = self._ray()
        done = cluster.finished(self._starting.values())
        for node_id, ref in list(self._starting.items()):
            if ref.hex() not in done:
                continue
            del self._starting[node_id]
            try:
                cluster.result(ref, timeout_s=5)
                self._running.add(node_id)
            except Exception as err:
                reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
                log.warning("agent on node %s failed to start: %s; retrying later", node_id, reason)
                cluster.kill(agent_name(node_id))
                self._placed.pop(node_id, None)
                self._retry_at[node_id] = self._clock() + RETRY_AFTER_INTERVALS * self.interval_s

    def reconcile(self, alive: Iterable[str]) -> None:
        """One step towards one agent per alive node; logs, never raises (a failure is the
        ``ray_agents`` source's status: :meth:`status`)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._reconcile(set(alive))
                self._note("")
            except Exception as err:
                self._note(f"cannot place agents through Ray: {type(err).__name__}: {err}")

    def _reconcile(self, alive: set[str]) -> None:
        self._check_starts()
        now = self._clock()
        waiting = {n for n, at in self._retry_at.items() if at > now}
        self._retry_at = {n: at for n, at in self._retry_at.items() if n in waiting}
        step = plan(alive, self._existing(), self._placed, waiting)
        self._held &= alive
        self._removed_at = {n: at for n, at in self._removed_at.items() if n in alive}
        for node_id in step.forget:
            log.info("node %s left the cluster: its agent went with it", node_id)
            self._drop(node_id)
        self._remove_others(step.adopt_none, now)
        for node_id in step.replace:
            log.warning("agent on node %s is gone (crashed or killed): placing a new one", node_id)
            self._drop(node_id)
        for node_id in step.place + step.replace:
            try:
                self._place(node_id)
            except NameTaken:  # created by someone else since the names were listed
                self._name_held(node_id, now)
        if step.place:
            log.info("placed agents on %d node(s)", len(step.place))

    def _remove_others(self, nodes: list[str], now: float) -> None:
        """Remove the actors holding these nodes' agent names that this head did not create,
        unless one was removed within the retry delay: then someone re-creates it."""
        retry_s = RETRY_AFTER_INTERVALS * self.interval_s
        again = [n for n in nodes if n in self._removed_at and now - self._removed_at[n] < retry_s]
        for node_id in again:
            self._name_held(node_id, None)
        others = [n for n in nodes if n not in again]
        if others:
            log.info("replacing %d agent(s) this head did not place (an earlier head's?)", len(others))
        for node_id in others:
            self._removed_at[node_id] = now
            self._ray().kill(agent_name(node_id))

    def _name_held(self, node_id: str, now: Optional[float]) -> None:
        """``node_id``'s agent name is held by an actor this head did not create, again."""
        if node_id not in self._held:
            log.warning(
                "agent name %s is held by another actor (not placed by this head), again: someone"
                " keeps creating it in namespace %s; no agent on that node",
                agent_name(node_id),
                NAMESPACE,
            )
        self._held.add(node_id)
        if now is not None:
            self._removed_at[node_id] = now

    def _drop(self, node_id: str) -> None:
        self._held.discard(node_id)
        self._placed.pop(node_id, None)
        self._starting.pop(node_id, None)
        self._running.discard(node_id)

    def _note(self, state: str) -> None:
        if state != self._state:
            if state:
                log.warning("%s", state)
            self._state = state

    def health(self) -> dict[str, int]:
        """For ``/healthz``: agents placed (by this head, on alive nodes), running (push loop
        started), starting, and failing (start failed and waiting to be retried, or not
        started after SLOW_START_S), and nodes whose agent name another actor holds. Never
        waits behind a reconcile longer than :data:`LOOK_WAIT_S`."""
        if not self._lock.acquire(timeout=LOOK_WAIT_S):
            return dict(self._last_health)
        try:
            if self._cluster is not None and self._cluster.connected and not self._closed:
                with contextlib.suppress(Exception):  # a health check never fails on Ray's account
                    self._check_starts()
            now = self._clock()
            slow = sum(1 for n in self._starting if now - self._placed.get(n, now) > SLOW_START_S)
            self._last_health = {
                "agents_placed": len(self._placed),
                "agents_running": len(self._running),
                "agents_starting": len(self._starting) - slow,
                "agents_failing": slow + len(self._retry_at),
                "agents_name_held": len(self._held),
            }
            return dict(self._last_health)
        finally:
            self._lock.release()

    def status(self) -> SourceStatus:
        """The ``ray_agents`` source: ok unless the last reconcile failed, or an agent's name
        is held by an actor this head did not create (then why). Never waits behind a
        reconcile longer than :data:`LOOK_WAIT_S`."""
        if not self._lock.acquire(timeout=LOOK_WAIT_S):
            return self._last_status
        try:
            reasons = [self._state] if self._state else []
            if self._held:
                names = ", ".join(agent_name(n) for n in sorted(self._held)[:3])
                more = f" and {len(self._held) - 3} more" if len(self._held) > 3 else ""
                reasons.append(
                    f"agent name held by another actor on {len(self._held)} node(s) ({names}{more}):"
                    f" an actor this head did not create, re-created in namespace {NAMESPACE}"
                    " when removed; those nodes have no agent"
                )
            reason = "; ".join(reasons)
            self._last_status = SourceStatus(name="ray_agents", ok=not reason, reason=reason)
            return self._last_status
        finally:
            self._lock.release()

    def remove_all(self) -> int:
        """Remove every rayscope agent in the cluster (this head's and any earlier one's) and
        wait until the GCS has none; the number removed. Later reconciles do nothing."""
        with self._lock:
            self._closed = True
            cluster = self._ray()
            existing = self._existing()
            for node_id in existing:
                cluster.kill(agent_name(node_id))
            deadline = time.monotonic() + REMOVE_TIMEOUT_S
            while self._existing() and time.monotonic() < deadline:
                time.sleep(0.1)
            left = self._existing()
            if left:
                log.warning("%d agent(s) still listed after %g s", len(left), REMOVE_TIMEOUT_S)
            log.info("removed %d agent(s) placed through Ray", len(existing))
            for node_id in list(self._placed):
                self._drop(node_id)
            return len(existing)

    def close(self) -> None:
        """Disconnect from Ray (after :meth:`remove_all`)."""
        with self._lock:
            self._closed = True
            if self._cluster is not None:
                self._cluster.shutdown()
