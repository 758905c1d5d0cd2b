"""What reaches an operator's terminal, a log line or a label: one printable rule, and the
names rayscope gives things in lines, one rule each, shared by every output."""

import unicodedata
from typing import Optional

SHORT_ID_CHARS = 12
"""A Ray id shown in a line: 12 hex digits tell nodes apart in any cluster an operator reads."""


def node_label(node_ip: Optional[str], node_id: str, hostname: Optional[str] = None) -> str:
    """A node as a line names it: its IP, else its host name, else its id's first 12 digits."""
    return node_ip or hostname or node_id[:SHORT_ID_CHARS]


def label_pairs(labels: "dict[str, str]") -> str:
    """``ray.io/accelerator-type=A100 zone=b``: labels (or a selector in Ray's syntax) as a line
    names them, in their order."""
    return " ".join(f"{key}={value}" for key, value in labels.items())


_CONTROL = frozenset({"Cc", "Cf", "Zl", "Zp", "Co"})
"""The Unicode categories no terminal, log line or label gets: controls (C0, DEL, C1: escape
sequences, NEL), format characters (bidirectional marks and overrides, zero-width joiners and
spaces, the BOM, the Arabic letter mark, soft hyphens, tag characters), line and paragraph
separators (U+2028, U+2029: line breaks to terminals, editors and ``str.splitlines``), and
private-use characters (a font's glyphs, anything)."""


def printable(text: str) -> str:
    """``text`` without the characters of the categories in :data:`_CONTROL`: what a terminal,
    a log line or a Prometheus label may show.

    Fast path: ``str.isprintable`` is false for every code point of those categories (checked
    on every code point, Python 3.9 to 3.13: tests/test_report_bounds.py), so a string it
    passes has none. It is false for more (non-ASCII spaces, surrogates, unassigned code
    points): the slow path asks each character's category and keeps those."""
    if text.isprintable():
        return text
    return "".join(c for c in text if c.isprintable() or unicodedata.category(c) not in _CONTROL)


def printable_lines(lines: list[str]) -> list[str]:
    return [printable(line) for line in lines]
