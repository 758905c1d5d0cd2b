"""``status --watch``: watch(1)'s header, screen fitting, changed values highlighted."""

import difflib
import re
import time
from collections.abc import Sequence
from typing import Optional

from agent.render.fmt import number

HIGHLIGHT_ON = "\x1b[7m"  # reverse video: readable on any palette, no colour assumed
HIGHLIGHT_OFF = "\x1b[27m"
_TOKEN_SPLIT = re.compile(r"([\s/,:()\[\]]+)")


def watch_header(interval_s: float, generated_at: float) -> str:
    """``Every 2s: rayscope status    14:03:07`` — watch(1)'s header, the data's own time."""
    clock = time.strftime("%H:%M:%S", time.localtime(generated_at))
    return f"Every {number(interval_s)}s: rayscope status    {clock}"


def fit_screen(lines: Sequence[str], columns: int, rows: int) -> list[str]:
    """Cut lines to the terminal, so a redraw in place never wraps or scrolls."""
    return [line[: max(columns, 1)] for line in lines[: max(rows, 1)]]


def _highlight_pair(before: str, after: str) -> str:
    old, new = _TOKEN_SPLIT.split(before), _TOKEN_SPLIT.split(after)
    if len(old) != len(new):
        return HIGHLIGHT_ON + after + HIGHLIGHT_OFF
    return "".join(
        f"{HIGHLIGHT_ON}{b}{HIGHLIGHT_OFF}" if a != b and not _TOKEN_SPLIT.fullmatch(b) else b
        for a, b in zip(old, new)
    )


def highlight_changes(previous: Optional[Sequence[str]], current: Sequence[str]) -> list[str]:
    """``current`` with every value that differs from ``previous`` in reverse video.

    Lines are aligned as a diff aligns them (a node appearing shifts the rest, it does not
    light them all up); paired lines are compared word by word, so ``0.33/1`` → ``0.58/1``
    marks only ``0.58``. New lines are marked whole.
    """
    if previous is None:
        return list(current)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(a=list(previous), b=list(current), autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            out += current[j1:j2]
        elif op in ("replace", "insert"):
            for k in range(j2 - j1):
                after = current[j1 + k]
                if op == "replace" and i1 + k < i2:
                    out.append(_highlight_pair(previous[i1 + k], after))
                elif after:
                    out.append(HIGHLIGHT_ON + after + HIGHLIGHT_OFF)
                else:
                    out.append(after)
    return out
