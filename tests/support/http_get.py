"""One HTTP GET for the tests, whose socket is closed on every path.

``urllib`` raises an error answer (4xx, 5xx) as ``HTTPError``, which holds the response and so
the socket. Dropped unclosed, or kept in a retry loop's "last error", it reaches the collector
later and pytest (unclosed sockets are errors here) blames whatever test is running then: the
CI of stop 45 failed a Ray-agents test for Prometheus's ``503`` while it started.
"""

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Optional


def get(url: str, headers: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """The status and body of ``GET url``, error answers included; ``OSError`` (``URLError``)
    when nothing answered."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return int(err.code), bytes(err.read())
