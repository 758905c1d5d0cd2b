"""Who may read the head's page (SECURITY.md, *The page*): the bearer token, or the cookie a
``POST /login`` with a token sets; nobody else, and no other site's page can make a browser
log in or send that cookie. Unit tests on the routes, then the same over a real head's port."""

import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import Optional

import pytest

from rayscope.head import session
from rayscope.head.routes import Request, Response, Routes
from rayscope.head.state import HeadState
from rayscope.logs import LogThrottle
from rayscope.render.page.assets import CSP
from tests.conftest import HeadDaemon

READ = b"read-token-0123456789abcdef"
AGENTS = b"agents-token-0123456789abcdef"


def routes(tokens: tuple[bytes, ...] = (AGENTS, READ), tls: bool = False) -> Routes:
    import logging

    return Routes(HeadState(5.0, None), tokens, LogThrottle(logging.getLogger("test")), tls=tls)


def request(target: str, method: str = "GET", body: bytes = b"", **headers: str) -> Request:
    message = Message()
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    return Request(method, target, message, body)


def login(r: Routes, token: bytes, **headers: str) -> Response:
    body = urllib.parse.urlencode({"token": token.decode()}).encode()
    headers = {"Content_Type": session.FORM, "Host": "127.0.0.1:7532", **headers}
    return r.answer(request("/login", "POST", body, **headers))


def cookie_of(response: Response) -> Optional[str]:
    values = [v for k, v in response.headers if k == "Set-Cookie"]
    return values[0] if values else None


def test_the_page_without_a_token_is_refused_with_the_login_form() -> None:
    """With a read token configured, ``GET /`` without one is a 401 with the form and no
    cluster data; the page's refresh too. Positive control: serve ``/`` before the check."""
    r = routes()
    for target in ("/", "/?fragment=1", "/?page=2&marked=1"):
        answer = r.answer(request(target))
        assert answer.status == 401, target
        assert b'<form class="login" method="post" action="/login">' in answer.body
        assert b"data-gpu" not in answer.body and b"Cluster:" not in answer.body
    assert r.answer(request("/", Authorization="Bearer wrong")).status == 401
    for token in (READ, AGENTS):  # the read token opens the page as it opens /v1/status
        answer = r.answer(request("/", Authorization=f"Bearer {token.decode()}"))
        assert answer.status == 200 and b"Cluster:" in answer.body
    assert routes(tokens=()).answer(request("/")).status == 200  # no token on the head: open, as /v1/status


def test_a_login_sets_an_http_only_same_site_strict_cookie_that_opens_the_page_only() -> None:
    """``POST /login`` from the head's own form: 303 to ``/`` with the cookie; the cookie
    opens ``/`` and not ``/v1/status`` or ``/metrics``; it holds no token. ``Secure`` on TLS."""
    r = routes()
    answer = login(r, READ, Origin="http://127.0.0.1:7532", Sec_Fetch_Site="same-origin")
    assert answer.status == 303 and ("Location", "/") in answer.headers
    cookie = cookie_of(answer)
    assert cookie is not None
    attributes = [a.strip() for a in cookie.split(";")]
    assert {"HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={session.SESSION_S}"} <= set(attributes)
    assert "Secure" not in attributes and READ.decode() not in cookie
    jar = attributes[0]
    assert r.answer(request("/", Cookie=jar)).status == 200
    assert r.answer(request("/?fragment=1", Cookie=jar)).status == 200
    for path in ("/v1/status", "/metrics"):
        assert r.answer(request(path, Cookie=jar)).status == 401, path
    secure = cookie_of(login(routes(tls=True), READ))
    assert secure is not None and "Secure" in [a.strip() for a in secure.split(";")]
    wrong = login(r, b"not-the-token")
    assert wrong.status == 401 and cookie_of(wrong) is None and b"wrong token" in wrong.body


def test_a_cross_site_get_or_post_cannot_set_the_cookie() -> None:
    """Another site can make a browser send a GET (a link, an image) or post a form. None
    sets the cookie: ``GET /login`` is 405, a token in the query opens nothing, a POST whose
    ``Origin`` is another site (or ``null``) or whose ``Sec-Fetch-Site`` is not same-origin
    is 403. Positive control: accept a ``token`` query parameter, or drop the origin check."""
    r = routes()
    token = READ.decode()
    for target in (f"/login?token={token}", f"/?token={token}"):
        answer = r.answer(request(target, Sec_Fetch_Site="cross-site"))
        assert cookie_of(answer) is None and answer.status in (401, 405), target
    assert r.answer(request(f"/login?token={token}")).status == 405
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:7532.evil.example"},
        {"Sec_Fetch_Site": "cross-site"},
        {"Sec_Fetch_Site": "same-site", "Origin": "http://127.0.0.1:7532"},
    ):
        answer = login(r, READ, **headers)
        assert (answer.status, cookie_of(answer)) == (403, None), headers
    assert cookie_of(login(r, READ)) is not None  # curl: no Origin, no Sec-Fetch-Site
    assert cookie_of(login(r, READ, Origin="null", Sec_Fetch_Site="same-origin")) is not None


def test_a_cookie_is_refused_when_forged_expired_or_of_another_token() -> None:
    tokens = (AGENTS, READ)
    now = 1_000_000.0

    def ok(value: str, at: float = now) -> bool:
        headers = Message()
        headers["Cookie"] = f"{session.COOKIE}={value}"
        return session.cookie_ok(headers, tokens, at)

    good = session.cookie_value(READ, now)
    assert ok(good) and ok(good, now + session.SESSION_S)
    assert not ok(good, now + session.SESSION_S + 1)  # 12 h later
    assert not ok(good, now - 10)  # issued "in the future": another boot's clock
    assert not ok(session.cookie_value(b"another-token", now))
    issued, mac = good.split(".")
    assert not ok(f"{int(issued) + 1}.{mac}")  # the issue time is under the MAC
    assert not ok(f"{issued}.{'0' * 64}") and not ok("") and not ok("garbage") and not ok(f"{issued}.")
    broken = Message()
    broken["Cookie"] = 'a="\\'
    assert not session.cookie_ok(broken, tokens, now)


def test_every_html_answer_carries_the_policy() -> None:
    r = routes()
    for answer in (r.answer(request("/")), r.answer(request("/", Authorization=f"Bearer {READ.decode()}"))):
        assert ("Content-Security-Policy", CSP) in answer.headers
        assert ("X-Content-Type-Options", "nosniff") in answer.headers
        assert ("Cache-Control", "no-store") in answer.headers


def _open(url: str, data: Optional[bytes] = None, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """One request, redirects not followed: status, headers, body."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with opener.open(req, timeout=10) as response:
            return int(response.status), dict(response.headers), bytes(response.read())
    except urllib.error.HTTPError as err:
        with err:  # its response holds the socket: closed, not left to the collector
            return int(err.code), dict(err.headers), bytes(err.read())


def test_the_login_over_a_real_heads_port(head_daemon: HeadDaemon) -> None:
    """The same on the wire: the form, the cookie's header as a browser receives it, the
    page for the cookie, a cross-site post refused."""
    url = head_daemon.url
    status, headers, body = _open(url + "/")
    assert status == 401 and b"<form" in body and headers["Content-Security-Policy"] == CSP
    form = urllib.parse.urlencode({"token": head_daemon.token}).encode()
    host = url.removeprefix("http://")
    status, headers, _ = _open(url + "/login", form, Origin="https://evil.example")
    assert status == 403 and "Set-Cookie" not in headers
    status, headers, _ = _open(url + "/login", form, Origin=f"http://{host}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, headers, body = _open(url + "/", Cookie=cookie.split(";", 1)[0])
    assert status == 200 and b'<main id="view"' in body
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert _open(url + "/v1/status", Cookie=cookie.split(";", 1)[0])[0] == 401


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x", ""])
def test_a_login_that_is_no_form_is_refused(content_type: str) -> None:
    r = routes()
    body = b"token=" + READ
    answer = r.answer(request("/login", "POST", body, Content_Type=content_type))
    assert answer.status == 401 and cookie_of(answer) is None
