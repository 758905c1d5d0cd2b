"""How complete a :class:`ClusterStatus` is: the exit code of ``rayscope status`` and the
one line that says why, from one rule (:func:`assess`). Pure.

* 0 = complete: a scheduler's view no older than 3 intervals, and every alive scheduler
  node whose agent was reporting is fresh;
* 1 = partial: an alive scheduler node's agent was reporting but its report is stale, or a
  node's report could not be merged (``unreadable``, rayscope.core.isolation), or the scheduler's
  view is older than 3 intervals (the GCS stopped answering), or there is no scheduler view
  while agent reports are there;
* 2 = no data: neither a scheduler view nor an agent report.

A node that simply runs no agent (the embedded default, or a node never set up) is not
partial data: its booking is complete, its NVML numbers are ``NA`` and say so. A stale
report for a node the scheduler does not know is a node that is gone (or a host without a
raylet whose agent stopped): its line is marked, the head agent forgets it after a while,
and it does not make the answer partial.
"""

from typing import NamedTuple, Optional

from rayscope.core.rollup import SchedulerView, schedulable_nodes, scheduler_failure, scheduler_view
from rayscope.errors import EXIT_FAILED, EXIT_NO_DATA
from rayscope.labels import node_label, printable
from rayscope.schema.report import known
from rayscope.schema.status import ClusterStatus, NodeStatus

EXIT_COMPLETE = 0
EXIT_PARTIAL = EXIT_FAILED


class Completeness(NamedTuple):
    code: int
    note: Optional[str]
    """``no data: ...`` / ``partial: ...``; ``None`` when complete."""


def stale_nodes(status: ClusterStatus) -> list[NodeStatus]:
    """Alive scheduler nodes whose agent was reporting and stopped (a stale report is kept,
    marked). A stale report for a node the scheduler does not know is a node that is gone,
    not missing data: the head agent forgets it after a while."""
    return [n for n in schedulable_nodes(status) if n.stale]


def reporting_nodes(status: ClusterStatus) -> list[NodeStatus]:
    """Nodes with an agent's (or this host's own) measurement attached."""
    return [n for n in status.nodes.values() if n.agent != "none"]


def assess(status: ClusterStatus) -> Completeness:
    """The exit code and its reason, from the one rule in the module docstring."""
    view = scheduler_view(status)
    why = scheduler_failure(status)
    if not status.nodes or (view is SchedulerView.NONE and not reporting_nodes(status)):
        note = printable(f"no data: no node in the scheduler's view{why} and no agent report")
        return Completeness(EXIT_NO_DATA, note)
    reasons = []
    if view is SchedulerView.NONE:
        reasons.append(f"no scheduler view{why}: only the agents' reports are shown")
    elif view is SchedulerView.OLD:
        reasons.append(
            f"the scheduler view is {status.scheduler_age_s or 0:.0f}s old{why}: nodes, liveness"
            " and bookings are as of then"
        )
    stale = stale_nodes(status)
    if stale:
        ages = [
            f"{node_label(n.node_ip, n.node_id, n.hostname)} ({n.report_age_s or 0:.0f}s)"
            for n in stale[:NAMED]
        ]
        names = _named(ages, len(stale))
        reasons.append(f"stale report from {len(stale)} node(s): {names}")
    unreadable = [n for n in status.nodes.values() if known(n.unreadable) is not None]
    if unreadable:
        names = _named(
            [node_label(n.node_ip, n.node_id, n.hostname) for n in unreadable[:NAMED]], len(unreadable)
        )
        reasons.append(f"report unreadable from {len(unreadable)} node(s): {names}")
    if reasons:
        return Completeness(EXIT_PARTIAL, printable("partial: " + "; ".join(reasons)))
    return Completeness(EXIT_COMPLETE, None)


NAMED = 20
"""Nodes a note names; the rest are counted. The note is one line on stderr and a header of
the head's answers: 10,000 stale nodes named made it 310 KB, and a client refuses headers
over 64 KiB (``status --head`` failed, exit 2, where it should say partial, exit 1)."""


def _named(names: list[str], count: int) -> str:
    """The first :data:`NAMED` of ``count`` nodes by name, and how many more."""
    return ", ".join(names) + (f" and {count - len(names):,} more" if count > len(names) else "")


def status_exit_code(status: ClusterStatus) -> int:
    """0 complete, 1 partial, 2 no data — see the module docstring."""
    return assess(status).code


def completeness_note(status: ClusterStatus) -> Optional[str]:
    """Why ``status`` exits 2 (``no data: ...``) or 1 (``partial: stale report from 1
    node(s): 10.0.0.5 (42s)``); ``None`` when complete."""
    return assess(status).note
