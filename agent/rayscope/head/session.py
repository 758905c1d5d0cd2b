"""The page's login: a read token typed once into a form becomes a cookie for ``GET /``.

Browsers cannot send a ``Bearer`` header on a plain navigation, so ``POST /login`` with the
head's read token (or its agents' token) sets a cookie that opens the page, nothing else
(``/v1/status`` and ``/metrics`` keep their bearer tokens). SECURITY.md says why it is safe:

* the cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page
  makes the browser send it), ``Path=/``, ``Max-Age`` 12 h, ``Secure`` on a TLS head;
* it holds no token: ``ISSUED.MAC``, the MAC an HMAC-SHA256 keyed by the token over the issue
  time (the head's monotonic clock), so it ends with its 12 h, with a change of token, and
  with the host's reboot; the head keeps no session state;
* only a ``POST`` whose ``Origin`` (or ``Sec-Fetch-Site``) is the head itself sets it: no
  ``GET`` ever does, and a form on another site posting a token is refused (login CSRF).
"""

import hmac
import time
from email.message import Message
from hashlib import sha256
from http.cookies import CookieError, SimpleCookie
from typing import Optional
from urllib.parse import parse_qs, urlsplit

COOKIE = "rayscope_page"
SESSION_S = 12 * 3600
"""How long a login lasts."""
FORM = "application/x-www-form-urlencoded"


def _mac(token: bytes, issued: int) -> str:
    return hmac.new(token, f"rayscope page {issued}".encode(), sha256).hexdigest()


def cookie_value(token: bytes, now: float) -> str:
    """The cookie for ``token`` issued at ``now`` (the monotonic clock)."""
    issued = int(now)
    return f"{issued}.{_mac(token, issued)}"


def set_cookie(token: bytes, now: float, secure: bool) -> str:
    """The ``Set-Cookie`` header value of a login."""
    attributes = f"; Path=/; Max-Age={SESSION_S}; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
    return f"{COOKIE}={cookie_value(token, now)}{attributes}"


def cookie_ok(headers: Message, tokens: tuple[bytes, ...], now: Optional[float] = None) -> bool:
    """Whether the request carries a page cookie of one of ``tokens`` younger than
    :data:`SESSION_S` (every MAC compared in constant time)."""
    now = time.monotonic() if now is None else now
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(str(headers.get("Cookie", "")))
    except CookieError:
        return False
    morsel = jar.get(COOKIE)
    issued_text, _, mac = (morsel.value if morsel is not None else "").partition(".")
    if not issued_text.isdigit() or len(issued_text) > 15:
        return False
    issued = int(issued_text)
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
