"""One read of Ray's dashboard: the GET with the token where it may go, then the answer parsed;
never raises (a failure is the source's ``SourceStatus``)."""

import os
from collections.abc import Mapping
from typing import NamedTuple, Optional

from rayscope.defaults import DASHBOARD_ENV
from rayscope.schema.dashboard import DashboardNode
from rayscope.schema.report import SourceStatus
from rayscope.sources.dashboard.address import Address, ray_token, token_withheld
from rayscope.sources.dashboard.get import Unanswered, get
from rayscope.sources.dashboard.parse import failed, parse_summary


def refused_token(status: int, url: str, token_source: str, withheld: str) -> Optional[str]:
    """The reason of a 401 or 403, naming the fix (``withheld``: why the token was not sent,
    :func:`token_withheld`); ``None`` for any other status."""
    if status in (401, 403) and withheld:
        return (
            f"the Ray dashboard at {url} requires a token: the one from {token_source} was withheld"
            f" ({withheld}); to send it, name this dashboard: --dashboard {url} (or ${DASHBOARD_ENV})"
        )
    if status == 401:
        return f"the Ray dashboard at {url} requires a token: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
    if status == 403:
        return f"the Ray dashboard at {url} rejected the token from {token_source or 'nowhere'}"
    return None


class Fetched(NamedTuple):
    """The dashboard's raw answer (:func:`fetch`): its HTTP status and body; or ``failed``,
    why there is none."""

    status: int = 0
    body: bytes = b""
    failed: Optional[SourceStatus] = None
    withheld: str = ""
    """Why Ray's token was not sent (:func:`token_withheld`); ``""``: sent, or none to send."""


def fetch(address: Address, timeout_s: float, environ: Mapping[str, str] = os.environ) -> Fetched:
    """The one GET under ``timeout_s``, with Ray's token where it may go
    (:func:`token_withheld`: else without it); a refused token is a failure naming its fix;
    never raises."""
    try:
        token, token_source = ray_token(environ)
    except ValueError as err:
        return Fetched(failed=failed(str(err)))
    withheld = token_withheld(address) if token is not None else ""
    try:
        status, body = get(address.url, None if withheld else token, timeout_s)
    except Unanswered as err:
        return Fetched(failed=failed(str(err)), withheld=withheld)
    refused = refused_token(status, address.url, token_source, withheld)
    if refused:
        return Fetched(failed=failed(refused), withheld=withheld)
    return Fetched(status, body, withheld=withheld)


def read_nodes(
    address: Address,
    timeout_s: float,
    cluster_ray_version: Optional[str],
    environ: Mapping[str, str] = os.environ,
) -> tuple[dict[str, DashboardNode], SourceStatus]:
    """One read of the dashboard at ``address`` under ``timeout_s``: its nodes by node id and
    the source's status; never raises."""
    return parsed(fetch(address, timeout_s, environ), address, cluster_ray_version)


def parsed(
    fetched: Fetched, address: Address, cluster_ray_version: Optional[str]
) -> tuple[dict[str, DashboardNode], SourceStatus]:
    """:func:`fetch`'s answer read (:func:`parse_summary`), or its failure."""
    if fetched.failed is not None:
        return {}, fetched.failed
    nodes, status = parse_summary(fetched.status, fetched.body, address.url, cluster_ray_version)
    if status.ok and fetched.withheld:
        status.detail += f"; Ray's token withheld: {fetched.withheld}"
    return nodes, status
