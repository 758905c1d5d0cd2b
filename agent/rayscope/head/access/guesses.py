"""Wrong tokens, per client: a token bucket per peer address on the head's HTTP port.

Every token the port checks (a login form's, a ``Bearer`` header's, the page's session value) is
a guess when it is wrong, and guesses are bounded per client: each peer may be wrong
:data:`BURST` times in a row, then once per :data:`REFILL_S`; past that, what it offers is not
checked at all and the answer is ``429`` with ``Retry-After`` until its bucket refills. A right
token costs nothing, and a request that offers none is no guess. A peer is an IPv4 address, or
an IPv6 /64 (one host's share of a network: an attacker's host has millions of addresses in it).

The table holds at most :data:`MAX_PEERS` peers, the least recently wrong forgotten first (a
forgotten peer starts full again); one lock around it, since the port's workers share it. A
check and its charge are not one step: at most the port's 16 workers' worth of guesses pass
an empty bucket at once.
"""

import ipaddress
import threading
import time
from collections import OrderedDict
from typing import Callable, NamedTuple

BURST = 10
"""Wrong tokens a peer may send in a row (an operator mistyping a few times is never held)."""
REFILL_S = 1.0
"""Then one more per second: 86,400 guesses a day per peer, against tokens of at least
:data:`rayscope.net.tokens.MIN_TOKEN_BYTES` bytes (``openssl rand -hex 32``: 2**128 of them)."""
MAX_PEERS = 4096
"""Peers remembered; each entry is a few hundred bytes."""


class _Bucket(NamedTuple):
    left: float
    at: float


def peer_key(peer: str) -> str:
    """The peer a bucket belongs to: the address, an IPv6 one as its /64 (an IPv4-mapped one
    as its IPv4 address)."""
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class Guesses:
    """The buckets: :meth:`wait_s` before a check, :meth:`wrong` after a wrong one."""

    def __init__(
        self,
        burst: int = BURST,
        refill_s: float = REFILL_S,
        max_peers: int = MAX_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst, self.refill_s, self.max_peers, self.clock = burst, refill_s, max_peers, clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # least recently wrong first
        self._lock = threading.Lock()

    def _left(self, key: str, now: float) -> float:
        bucket = self._buckets.get(key)
        if bucket is None:
            return float(self.burst)
        return min(float(self.burst), bucket.left + max(0.0, now - bucket.at) / self.refill_s)

    def wait_s(self, peer: str) -> float:
        """0 when ``peer``'s credentials may be checked now; else the seconds until they may."""
        with self._lock:
            left = self._left(peer_key(peer), self.clock())
            return 0.0 if left >= 1.0 else (1.0 - left) * self.refill_s

    def wrong(self, peer: str) -> None:
        """``peer`` offered a wrong token: one guess taken from its bucket."""
        key = peer_key(peer)
        with self._lock:
            now = self.clock()
            self._buckets[key] = _Bucket(max(0.0, self._left(key, now) - 1.0), now)
            self._buckets.move_to_end(key)
            while len(self._buckets) > self.max_peers:
                self._buckets.popitem(last=False)
