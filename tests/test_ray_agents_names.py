"""An agent's name held by an actor the head did not create is said, in
``/healthz`` (``agents_name_held``) and in ``status`` (the ``ray_agents`` source), not fought
over every interval. The controller against a stand-in for Ray's calls; the same on a real
cluster: tests/test_live_ray_agents.py.

Before: a Ray user re-creating ``rayscope-agent:<node>`` whenever it was gone made the head
remove it at every interval and never place its own, while ``/healthz`` counted nothing
failing and ``status`` named nothing.
"""

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from rayscope.node.placed_agents import (
    LOOK_WAIT_S,
    NAMESPACE,
    RETRY_AFTER_INTERVALS,
    RayAgents,
    agent_name,
    node_of,
)
from rayscope.sources.placed_agent_calls import NameTaken, RayCluster
from tests.support.ports import refused_port

INTERVAL_S = 1.0
GCS = f"127.0.0.1:{refused_port()}"
"""The stand-in's GCS: never dialled (its ``connect`` does nothing), refused if it were."""


class Ref:
    def __init__(self, name: str) -> None:
        self.name = name

    def hex(self) -> str:
        return self.name


class StandIn(RayCluster):
    """Ray's calls, answered from a set of names. ``squatted``: nodes whose agent name a Ray
    user re-creates as soon as it is gone; ``taken_on_place``: names someone creates between
    the head's listing and its placement."""

    def __init__(self, squatted: Iterable[str] = (), taken_on_place: Iterable[str] = ()) -> None:
        super().__init__(GCS, NAMESPACE, [])
        self._connected = True
        self.squatted = set(squatted)
        self.taken_on_place = {agent_name(n) for n in taken_on_place}
        self.names = {agent_name(n) for n in self.squatted}
        self.kills: list[str] = []
        self.placed: list[str] = []

    def connect(self) -> None:
        pass

    def named_actors(self) -> list[str]:
        return sorted(self.names)

    def node_ip(self) -> str:
        return "127.0.0.1"

    def place(self, actor_class: type, name: str, node_id: str, args: Sequence[Any], env: Any) -> Any:
        if name in self.names or name in self.taken_on_place:
            self.names.add(name)
            raise NameTaken(name)
        self.names.add(name)
        self.placed.append(name)
        return name

    def call(self, handle: Any, method: str, *args: Any) -> Any:
        return Ref(str(handle))

    def kill(self, name: str) -> None:
        self.kills.append(name)
        self.names.discard(name)
        if node_of(name) in self.squatted:  # the user's loop: back at once
            self.names.add(name)

    def finished(self, refs: Iterable[Any]) -> set[str]:
        return {ref.hex() for ref in refs}

    def result(self, ref: Any, timeout_s: float) -> Any:
        return 4242

    def shutdown(self) -> None:
        pass


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


def agents_for(cluster: StandIn, clock: list[float]) -> RayAgents:
    return RayAgents(GCS, ("127.0.0.1", 7531), b"t" * 32, INTERVAL_S, cluster, lambda: clock[0])


def test_a_name_someone_keeps_re_creating_is_said_not_fought_over(clock: list[float]) -> None:
    """Positive control: drop ``_remove_others``' memory of what it removed (remove every
    holder each time, as before) and the kills grow by one per interval while
    ``agents_name_held`` stays 0."""
    cluster = StandIn(squatted={"b"})
    agents = agents_for(cluster, clock)
    agents.reconcile({"a", "b"})  # b's holder may be an earlier head's agent: removed once
    assert cluster.placed == [agent_name("a")] and cluster.kills == [agent_name("b")]
    assert agents.health()["agents_name_held"] == 0 and agents.status().ok
    for _ in range(RETRY_AFTER_INTERVALS - 1):
        clock[0] += INTERVAL_S
        agents.reconcile({"a", "b"})
    assert cluster.kills == [agent_name("b")]  # not removed again within the retry delay
    health = agents.health()
    assert (health["agents_name_held"], health["agents_placed"], health["agents_running"]) == (1, 1, 1)
    status = agents.status()
    assert not status.ok
    assert status.reason == (
        f"agent name held by another actor on 1 node(s) ({agent_name('b')}): an actor this head did"
        f" not create, re-created in namespace {NAMESPACE} when removed; those nodes have no agent"
    )
    clock[0] += INTERVAL_S
    agents.reconcile({"a", "b"})  # the retry delay passed: removed once more, still held
    assert cluster.kills == [agent_name("b")] * 2 and agents.health()["agents_name_held"] == 1
    cluster.squatted.clear()  # the user stops: the holder goes at the next removal, then ours
    clock[0] += RETRY_AFTER_INTERVALS * INTERVAL_S
    agents.reconcile({"a", "b"})
    clock[0] += INTERVAL_S
    agents.reconcile({"a", "b"})
    assert cluster.placed == [agent_name("a"), agent_name("b")]
    assert agents.health()["agents_name_held"] == 0 and agents.status().ok


def test_an_earlier_heads_agent_is_replaced_and_not_called_held(clock: list[float]) -> None:
    cluster = StandIn()
    cluster.names.add(agent_name("a"))  # left by an earlier head
    agents = agents_for(cluster, clock)
    agents.reconcile({"a"})
    clock[0] += INTERVAL_S
    agents.reconcile({"a"})
    assert cluster.kills == [agent_name("a")] and cluster.placed == [agent_name("a")]
    assert agents.health()["agents_name_held"] == 0 and agents.status().ok


def test_a_name_taken_when_placing_is_held_and_the_rest_still_placed(clock: list[float]) -> None:
    """Before: Ray's "already taken" failed the whole reconcile (the nodes after it got no
    agent) and the source said only ``ValueError``."""
    cluster = StandIn(taken_on_place={"a"})
    agents = agents_for(cluster, clock)
    agents.reconcile({"a", "b", "c"})
    assert cluster.placed == [agent_name("b"), agent_name("c")]
    assert agents.health()["agents_name_held"] == 1
    assert "agent name held by another actor on 1 node(s)" in agents.status().reason
    clock[0] += INTERVAL_S
    agents.reconcile({"a", "b", "c"})  # held, and not removed within the retry delay
    assert cluster.kills == []
    agents.reconcile({"b", "c"})  # the node left: nothing held any more
    assert agents.health()["agents_name_held"] == 0


class SlowRay(StandIn):
    """Ray's listing takes as long as the test says (a busy GCS)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def named_actors(self) -> list[str]:
        self.release.wait(30)
        return super().named_actors()


def test_healthz_and_status_never_wait_behind_a_reconcile(clock: list[float]) -> None:
    """A reconcile held up in Ray's calls: ``/healthz``'s figures and the ``ray_agents``
    source answer within :data:`LOOK_WAIT_S`, with what they saw last. Before: both took the
    reconcile's lock and waited as long as Ray did (here 30 s). Positive control: take the
    lock with ``with self._lock`` in ``health`` again and the first assertion fails."""
    cluster = SlowRay()
    agents = agents_for(cluster, clock)
    cluster.release.set()
    agents.reconcile({"a"})
    assert agents.health()["agents_placed"] == 1
    cluster.release.clear()
    stuck = threading.Thread(target=agents.reconcile, args=({"a", "b"},))
    stuck.start()
    try:
        time.sleep(0.2)  # the reconcile holds the lock, waiting in Ray's listing
        started = time.monotonic()
        health, status = agents.health(), agents.status()
        took = time.monotonic() - started
        assert took < 2 * LOOK_WAIT_S + 0.5
        assert health["agents_placed"] == 1 and status.ok
    finally:
        cluster.release.set()
        stuck.join(10)
    assert agents.health()["agents_placed"] == 2
