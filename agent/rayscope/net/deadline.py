"""One deadline for a whole exchange with a peer: connect, TLS handshake, request, status
line, headers, body, and the probe that names a wrong port, all within one ``--timeout``.

A socket's own timeout bounds each call (each ``recv``), not the exchange: a peer that sends
one byte every 2 s keeps a client with a 3 s timeout for ever. So every wait on a peer asks
the deadline how long it may still be (:meth:`Deadline.left`) and sets that as the socket's
timeout first (:meth:`Deadline.bound`). CPython bounds ``sendall``, ``do_handshake`` and an
SSL ``recv`` by the socket's timeout as a whole, not per byte, so the total is bounded too.

Standard library only (``time``): the fast path imports it before anything else.
"""

import time
from typing import Optional, Protocol


class _Timed(Protocol):
    def settimeout(self, value: Optional[float], /) -> None: ...


class Deadline:
    """A point on the monotonic clock, ``timeout_s`` after it was made; what waits on a
    peer asks it how long it may still wait."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        """What the operator gave (``--timeout``), for the messages."""
        self.at = time.monotonic() + timeout_s

    def left(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return self.left() <= 0.0

    def within(self, wait_s: float) -> float:
        """``wait_s``, or less when the deadline comes first (never below 0)."""
        return min(wait_s, self.left())

    def need(self) -> float:
        """Seconds left; :class:`TimeoutError` when none are (a wait of 0 would not block)."""
        left = self.left()
        if left <= 0.0:
            raise TimeoutError("timed out")
        return left

    def bound(self, sock: _Timed) -> None:
        """Set ``sock``'s timeout to what is left; :class:`TimeoutError` when nothing is."""
        sock.settimeout(self.need())


_carried: Optional[tuple[str, Deadline]] = None


def carry(url: str, deadline: Deadline) -> None:
    """The fast path asked ``url`` and hands the command to the CLI, which asks again: the
    next read of ``url`` in this process (:func:`carried`) runs under the same deadline (one
    ``--timeout`` for the command, not one per request)."""
    global _carried
    _carried = (url, deadline)


def forget_carried() -> None:
    global _carried
    _carried = None


def carried(url: str, timeout_s: float) -> Deadline:
    """The deadline a read of ``url`` runs under: the one :func:`carry` left for it (once),
    else ``timeout_s`` from now."""
    global _carried
    if _carried is not None and _carried[0] == url and _carried[1].timeout_s == timeout_s:
        deadline, _carried = _carried[1], None
        return deadline
    return Deadline(timeout_s)
