"""Ray's own dashboard as a source: every node's GPU memory, as the dashboard agent Ray runs on
each node measured it, where no rayscope agent reports the node.

One folder, one read: :mod:`.address` (where the dashboard is, whether Ray's token may go
there), :mod:`.get` (the one ``GET <dashboard>/nodes?view=summary`` under one deadline),
:mod:`.parse` (its answer, bounded and checked), :mod:`.read` (the three together, never
raising), :mod:`.parallel` (the CLI's read beside the GCS read). The head's poll
(:mod:`rayscope.head.poll.dashboard`) reads it through :func:`read_nodes`. The dashboard is a
peer like any other (SECURITY.md, *Ray's dashboard*).
"""

from rayscope.defaults import DASHBOARD_ENV
from rayscope.sources.dashboard.address import (
    NO_DASHBOARD_FIX,
    OFF,
    Address,
    choose_address,
    parse_url,
    ray_token,
    token_withheld,
)
from rayscope.sources.dashboard.parse import believes_processes, failed, parse_summary
from rayscope.sources.dashboard.read import Fetched, fetch, parsed, read_nodes, refused_token

__all__ = [
    "DASHBOARD_ENV",
    "NO_DASHBOARD_FIX",
    "OFF",
    "Address",
    "Fetched",
    "believes_processes",
    "choose_address",
    "failed",
    "fetch",
    "parse_summary",
    "parse_url",
    "parsed",
    "ray_token",
    "read_nodes",
    "refused_token",
    "token_withheld",
]
