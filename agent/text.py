"""How rayscope names things to an operator: one rule each, shared by every output."""

from typing import Optional

SHORT_ID_CHARS = 12
"""A Ray id shown in a line: 12 hex digits tell nodes apart in any cluster an operator reads."""


def node_label(node_ip: Optional[str], node_id: str, hostname: Optional[str] = None) -> str:
    """A node as a line names it: its IP, else its host name, else its id's first 12 digits."""
    return node_ip or hostname or node_id[:SHORT_ID_CHARS]
