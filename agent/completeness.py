"""How complete a :class:`ClusterStatus` is, as the exit code of ``rayscope status``. Pure.

* 0 = complete: the scheduler's view, and every agent that reports is fresh;
* 1 = partial: an alive node's agent was reporting but its report is stale, or the
  scheduler's view is missing while agent reports are there;
* 2 = no data: neither (raised earlier by the collector when the GCS cannot be read).

A node that simply runs no agent (the embedded default, or a node never set up) is not
partial data: its booking is complete, its NVML numbers are ``NA`` and say so.
"""

from agent.errors import EXIT_FAILED, EXIT_NO_DATA
from agent.model import ClusterStatus, NodeStatus
from agent.rollup import schedulable_nodes, scheduler_view_ok

EXIT_COMPLETE = 0
EXIT_PARTIAL = EXIT_FAILED


def stale_nodes(status: ClusterStatus) -> list[NodeStatus]:
    """Alive scheduler nodes whose agent was reporting and stopped (a stale report is kept,
    marked). A stale report for a node the scheduler does not know is a node that is gone,
    not missing data: the head agent forgets it after a while."""
    return [n for n in schedulable_nodes(status) if n.stale]


def reporting_nodes(status: ClusterStatus) -> list[NodeStatus]:
    """Nodes with an agent's (or this host's own) measurement attached."""
    return [n for n in status.nodes.values() if n.agent != "none"]


def status_exit_code(status: ClusterStatus) -> int:
    """0 complete, 1 partial, 2 no data — see the module docstring."""
    if not status.nodes:
        return EXIT_NO_DATA
    if not scheduler_view_ok(status):
        return EXIT_PARTIAL if reporting_nodes(status) else EXIT_NO_DATA
    return EXIT_PARTIAL if stale_nodes(status) else EXIT_COMPLETE
