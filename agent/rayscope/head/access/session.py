"""The page's login: a read token typed once into a form becomes a session the page's own
script keeps, in its tab, for the head's origin only.

Browsers cannot send a ``Bearer`` header on a plain navigation, so ``POST /login`` with the
head's read token (or its agents' token) answers a small page holding a session value
(:func:`session_html`). Its script keeps the value in the tab's ``sessionStorage``, which the
browser scopes to the head's origin (scheme, host *and port*), and sends it in the
:data:`HEADER` header of the requests it makes for the page (``/``, ``/?fragment=1``); a
header a script adds goes only where that script sends it. A cookie would not do: a browser
sends a host's cookies to every port of that host, so Ray's dashboard or Grafana on the head's
host received the old login cookie and could replay it for its 12 h. Nothing the login sets
opens anything alone: the answer sets no cookie (it deletes the old one, :data:`FORGET_COOKIE`),
and ``GET /`` without the header is the login form. SECURITY.md says why the rest is safe:

* the value holds no token: ``ISSUED.MAC``, the MAC an HMAC-SHA256 keyed by the token over the
  issue time (the head's monotonic clock), so it ends with its 12 h, with a change of token,
  and with the host's reboot; the head keeps no session state; the MAC's message differs from
  the old cookie's, so a cookie some other port kept is no session either;
* it opens the page only (``/v1/status`` and ``/metrics`` keep their bearer tokens);
* only a ``POST`` whose ``Origin`` (or ``Sec-Fetch-Site``) is the head itself gets one: no
  ``GET`` ever does, and a form on another site posting a token is refused (login CSRF).
"""

import hmac
import time
from email.message import Message
from hashlib import sha256
from typing import Optional
from urllib.parse import parse_qs, urlsplit

from rayscope.defaults import HEADER_SESSION
from rayscope.units import parse_count

HEADER = HEADER_SESSION
"""The header the page's script sends the session in."""
SESSION_S = 12 * 3600
"""How long a login lasts."""
FORM = "application/x-www-form-urlencoded"
OLD_COOKIE = "rayscope_page"
"""The cookie earlier releases' logins set; the head reads no cookie."""
FORGET_COOKIE = f"{OLD_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
"""Sent with a login: the browser drops a cookie an earlier release set."""


def _mac(token: bytes, issued: int) -> str:
    return hmac.new(token, f"rayscope page session {issued}".encode(), sha256).hexdigest()


def session_value(token: bytes, now: float) -> str:
    """The session for ``token`` issued at ``now`` (the monotonic clock)."""
    issued = int(now)
    return f"{issued}.{_mac(token, issued)}"


def session_ok(headers: Message, tokens: tuple[bytes, ...], now: Optional[float] = None) -> bool:
    """Whether the request's :data:`HEADER` is a session of one of ``tokens`` younger than
    :data:`SESSION_S` (every MAC compared in constant time). The header arrives latin-1
    decoded; the issue time is read by the one number parser (ASCII digits only)."""
    now = time.monotonic() if now is None else now
    issued_text, _, mac = str(headers.get(HEADER, "")).strip().partition(".")
    try:
        issued = parse_count(issued_text, "session issue time")
    except ValueError:
        return False
    if not 0 <= now - issued <= SESSION_S:
        return False
    offered = mac.encode("latin-1", "replace")
    matches = [hmac.compare_digest(offered, _mac(t, issued).encode()) for t in tokens]
    return any(matches)


def same_origin(headers: Message) -> bool:
    """A ``POST`` the head's own page sent. ``Sec-Fetch-Site`` (a header no page's script can
    set) decides where the browser sends it: ``same-origin`` only. Else ``Origin``, which
    browsers send on every cross-site POST, must name the ``Host`` it was sent to (``null``
    never does). A request with neither (curl) is no browser's cross-site request."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return bool(site == "same-origin")
    origin = headers.get("Origin")
    if origin is None:
        return True
    return bool(origin != "null" and urlsplit(origin).netloc == str(headers.get("Host", "")))


def form_token(body: bytes, content_type: str) -> Optional[bytes]:
    """The ``token`` field of a login form; ``None`` when the body is no such form."""
    if content_type.split(";", 1)[0].strip().lower() != FORM:
        return None
    try:
        fields = parse_qs(body.decode("ascii"), max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        return None
    values = fields.get("token", [])
    return values[0].strip().encode("latin-1", "replace") if len(values) == 1 else None
