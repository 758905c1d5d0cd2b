"""``fit --label-selector``, declared once (the option, its help; the checks are
``rayscope.core.capacity.fit_labels``'s)."""

from typing import Annotated, Optional

import typer

LabelSelectorOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--label-selector",
        metavar="KEY=VALUE",
        help=(
            "Only nodes whose Ray labels match, as Ray's label_selector: VALUE is v, !v,"
            " in(a,b) or !in(a,b); repeat for more keys (all must hold). Labels came in Ray 2.49."
        ),
    ),
]
