"""The options only the daemons take: the head agent's ports, names, tokens and caps
(``rayscope head``) and the node agent's head and node (``rayscope push``), declared once
like :mod:`rayscope.cli.options`' and checked at parse time the same way."""

from enum import Enum
from typing import Annotated, Optional

import typer

from rayscope.cli.options import as_given, endpoint, within
from rayscope.core import limits
from rayscope.defaults import DEFAULT_HTTP_PORT, DEFAULT_REPORT_PORT, READ_TOKEN_FILE_ENV

ListenOption = Annotated[
    str,
    typer.Option(
        "--listen",
        metavar="HOST:PORT",
        callback=endpoint(DEFAULT_REPORT_PORT, any_port=True),
        help="Where node agents connect. Port 0: one the OS picks, named in the start-up log line.",
    ),
]

HttpOption = Annotated[
    str,
    typer.Option(
        "--http",
        metavar="HOST:PORT",
        callback=endpoint(DEFAULT_HTTP_PORT, any_port=True),
        help=(
            "GET /v1/status, /v1/usage, /metrics, /healthz."
            " Port 0: one the OS picks, named in the start-up log line."
        ),
    ),
]


def _host_names(values: Optional[list[str]]) -> list[str]:
    """``--http-host NAME``: each a host name or an IP address (agent/head/access/origin.py).

    Unset, typer 0.18 hands the callback None and then takes ``len()`` of what it returns:
    an empty list, never None, is what every typer in the declared range accepts.
    """
    if not values:
        return []
    from rayscope.head.access.origin import check_name

    try:
        return [check_name(v) for v in values]
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


HttpHostOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--http-host",
        metavar="NAME",
        callback=_host_names,
        help=(
            "A name clients use for the HTTP port (a DNS name, a proxy's; repeatable). The port"
            " answers only requests whose Host is an IP address, localhost, --http's name or one"
            " of these (421 otherwise: DNS rebinding)."
        ),
    ),
]

ReadTokenFileOption = Annotated[
    Optional[str],
    typer.Option(
        "--read-token-file",
        metavar="FILE",
        envvar=READ_TOKEN_FILE_ENV,
        help=(
            "A read-only token: GET /v1/status and /metrics only (dashboards, status --head),"
            " never accepted for reports. Must differ from --token-file."
        ),
    ),
]

MaxPendingOption = Annotated[
    int,
    typer.Option(
        "--max-pending",
        metavar="N",
        callback=within(limits.CONNECTIONS),
        parser=as_given,
        help="Connections per source address before their first good frame.",
    ),
]


class Agents(str, Enum):
    """``--agents``: none, or one agent per node placed through Ray."""

    none = "none"
    ray = "ray"


AgentsOption = Annotated[
    Agents,
    typer.Option(
        "--agents",
        metavar="none|ray",
        help="ray: keep a node agent on every alive node, placed through Ray (removed at shutdown).",
    ),
]

RemoveOption = Annotated[
    bool,
    typer.Option("--remove", help="With --agents ray: remove every agent placed through Ray, then exit."),
]

PushHeadOption = Annotated[
    str,
    typer.Option(
        "--head",
        metavar="HOST:PORT",
        callback=endpoint(DEFAULT_REPORT_PORT),
        help=f"The head agent's report port (its --listen; {DEFAULT_REPORT_PORT} when not given).",
    ),
]

NodeIdOption = Annotated[
    Optional[str],
    typer.Option("--node-id", metavar="ID", help="The Ray node to report for (default: the local raylet's)."),
]
