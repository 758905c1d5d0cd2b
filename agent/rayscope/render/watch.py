"""``status --watch``: watch(1)'s header, screen fitting, changed values highlighted."""

import difflib
import re
import time
from collections.abc import Sequence
from typing import Optional

from rayscope.units import number

HIGHLIGHT_ON = "\x1b[7m"  # reverse video: readable on any palette, no colour assumed
HIGHLIGHT_OFF = "\x1b[27m"
_TOKEN_SPLIT = re.compile(r"([\s/,:()\[\]]+)")


def watch_header(interval_s: float, generated_at: float) -> str:
    """``Every 2s: rayscope status    14:03:07`` — watch(1)'s header, the data's own time."""
    clock = time.strftime("%H:%M:%S", time.localtime(generated_at))
    return f"Every {number(interval_s)}s: rayscope status    {clock}"


CUT_MARKER = "\u2026"
"""Ends a line cut to the terminal's width (``…``; ``>`` where the terminal cannot show it)."""
_FIELD_START = re.compile(r"  +| (?=[A-Za-z_]+: )")
"""Where a field of a status line begins: after two spaces, or before ``Label: ``."""
_WORD_START = re.compile(r" ")


def cut_line(line: str, columns: int, marker: str = CUT_MARKER) -> str:
    """``line`` if it fits in ``columns``; else cut before the last field that does not fit
    (``... VRAM: 5.8/24.0 GB …``, never ``CPU: 8/``), at a word where no field boundary
    keeps half the width, mid-word only in a line without a space, and ``marker`` after."""
    if len(line) <= columns:
        return line
    room = columns - len(marker) - 1  # a space before the marker
    if room < 1:
        return marker[: max(columns, 0)]

    def last_cut(boundary: "re.Pattern[str]") -> int:
        cuts = [m.start() for m in boundary.finditer(line) if m.start() <= room and line[: m.start()].strip()]
        return max(cuts, default=0)

    end = last_cut(_FIELD_START)
    if end < columns // 2:
        end = last_cut(_WORD_START) or room
    return line[:end].rstrip() + " " + marker


def fit_screen(lines: Sequence[str], columns: int, rows: int, marker: str = CUT_MARKER) -> list[str]:
    """The lines that fit the terminal, each cut by :func:`cut_line`, so a redraw in place
    never wraps or scrolls."""
    return [cut_line(line, max(columns, 1), marker) for line in lines[: max(rows, 1)]]


def wrap_to(text: str, columns: int) -> list[str]:
    """``text`` (an error line) wrapped at words to ``columns``: said whole, never cut."""
    import textwrap

    return textwrap.wrap(text, max(columns, 20), break_on_hyphens=False) or [""]


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
