"""The options of ``rayscope usage`` and the head's usage history (``--usage-window``,
``--usage-state``), checked at parse time like :mod:`rayscope.cli.options`' (a usage error names
the option): the headroom by :mod:`rayscope.core.limits`, as every number; a window (``30m``) by
:mod:`rayscope.core.usage.summary`'s parser, imported when used:
``status --head`` pays for every import of the CLI."""

from typing import Annotated, Optional

import typer

from rayscope.cli.options import as_given, within
from rayscope.core import limits


def _window(text: "str | float") -> float:
    from rayscope.core.usage.summary import parse_window

    if isinstance(text, float):  # the default, not typed by anyone
        return text
    try:
        return parse_window(text)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


UsageWindowOption = Annotated[
    float,
    typer.Option(
        "--usage-window",
        metavar="SPAN",
        parser=_window,
        show_default=False,
        help=(
            "How long the head remembers each actor's GPU memory (rayscope usage):"
            " 3600, 30m, 1h (the default), 7d."
        ),
    ),
]
UsageStateOption = Annotated[
    Optional[str],
    typer.Option(
        "--usage-state",
        metavar="FILE",
        help="Keep that history in FILE (written atomically every minute) so a restart keeps it.",
    ),
]
WindowOption = Annotated[
    Optional[float],
    typer.Option(
        "--window",
        metavar="SPAN",
        parser=_window,
        help="The last SPAN only (default: the head's whole window).",
    ),
]
HeadroomOption = Annotated[
    float,
    typer.Option(
        "--headroom",
        metavar="PCT",
        callback=within(limits.HEADROOM),
        parser=as_given,
        help="Suggested booking = peak + PCT %, rounded up to 256 MiB.",
    ),
]
