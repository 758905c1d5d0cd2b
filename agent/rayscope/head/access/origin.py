"""The head's origin: the names a request may give in its ``Host`` header.

A browser keeps sites apart by origin, so another site's page cannot read the head's answers,
unless its own name is made to resolve to the head's address (DNS rebinding): the browser
then takes the head for that site, sends the site's name as ``Host``, and lets its page read
every answer the head gives without a token (a token-less head on loopback, ``/healthz``) or
post to the login. So the HTTP port answers only a request whose ``Host`` names the head:

* an IP address (IPv4, or IPv6 in brackets): a browser that dialled an address by its number
  was not rebound, whatever the number (the head's own, loopback, a tunnel's);
* ``localhost``, which browsers resolve to loopback themselves;
* the host of ``head --http`` when it is a name, and each ``head --http-host NAME``: the
  names clients use for the head (a DNS name, a proxy's name).

The port is not compared: an ssh tunnel or a proxy in front changes it, and rebinding is a
matter of the name. A request without ``Host`` is no browser's (every browser sends it);
two ``Host`` headers, or one that is not ``NAME[:PORT]``, are refused like a wrong name:
``421 Misdirected Request``, one line (:data:`REFUSAL`), before any other check.
"""

import ipaddress
import re
from collections.abc import Iterable
from email.message import Message
from typing import Optional

from rayscope.units import is_count

REFUSAL = (
    "misdirected request: this head answers to its IP addresses, localhost and the names given"
    " with head --http-host NAME"
)
"""The body of a 421 (it quotes nothing of the request)."""

_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
MAX_NAME = 253
"""The longest DNS name."""
_WILDCARDS = ("", "0.0.0.0", "::")


def check_name(text: str) -> str:
    """A ``--http-host`` value as compared: lower case, no trailing dot; ``ValueError`` (one
    line) for what is not a host name or an IP address."""
    name = text.strip().lower().removesuffix(".")
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    if _is_address(bare) or (len(name) <= MAX_NAME and _NAME.fullmatch(name)):
        return bare
    raise ValueError(f"{text[:80]!r} is not a host name or an IP address (no port, no scheme)")


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class Hosts:
    """Which ``Host`` values the head's HTTP port answers: :meth:`allows`."""

    def __init__(self, names: Iterable[str] = (), http_host: str = "") -> None:
        chosen = {check_name(n) for n in names}
        if http_host not in _WILDCARDS and not _is_address(http_host):
            chosen.add(check_name(http_host))  # `--http NAME:PORT`: its own name
        self.names = frozenset(chosen | {"localhost"})

    def allows(self, headers: Message) -> bool:
        """Whether the request's ``Host`` names the head (see the module's rule)."""
        values = headers.get_all("Host") or []
        if not values:
            return True  # HTTP/1.0 tools; every browser sends Host
        if len(values) > 1:
            return False
        name = self.name_of(str(values[0]))
        return name is not None and (name in self.names or _is_address(name))

    @staticmethod
    def name_of(value: str) -> Optional[str]:
        """The host of a ``Host`` value (``NAME``, ``NAME:PORT``, ``[V6]:PORT``), lower
        case and without a trailing dot; ``None`` when the value is not of that form. An
        IPv6 address counts only in brackets, an IPv4 one only without."""
        text = value.strip().lower()
        if text.startswith("["):
            end = text.find("]")
            name, rest = text[1:end], text[end + 1 :]
            if end < 0 or ":" not in name:
                return None
        else:
            name, colon, port = text.partition(":")
            rest = colon + port
        if rest and not (rest.startswith(":") and is_count(rest[1:])):
            return None
        return name.removesuffix(".") or None
