"""Who may read the head's page (SECURITY.md, *The page*): the bearer token, or the session
header that the page's script sends after a ``POST /login`` with a token; nobody else, nothing
a login sets opens anything alone, and no other site's page can make a browser log in. Unit
tests on the routes, then the same over a real head's port."""

import hmac
import re
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from hashlib import sha256
from typing import Optional

import pytest

from rayscope.head.access import session
from rayscope.head.serve.routes import Request, Response, Routes
from rayscope.head.store.state import HeadState
from rayscope.render.page.assets import CSP
from rayscope.sinks.logs import LogThrottle
from tests.conftest import HeadDaemon
from tests.livecluster import open_url

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


def session_of(response: Response) -> Optional[str]:
    """The session value a login's answer hands its script (``data-value``)."""
    found = re.search(rb'id="session" data-value="([^"]*)"', response.body)
    return found.group(1).decode() if found else None


def replayed_cookies(response: Response) -> str:
    """Every cookie an answer sets, as a browser would send them back (``Cookie``)."""
    return "; ".join(v.split(";", 1)[0] for k, v in response.headers if k == "Set-Cookie")


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


def test_a_login_hands_its_script_a_session_that_opens_the_page_only_and_sets_no_cookie() -> None:
    """``POST /login`` from the head's own form: 200, a page holding the session for its
    script (sessionStorage, sent back in ``X-Rayscope-Session``); that header opens ``/``
    and not ``/v1/status`` or ``/metrics``; it holds no token. The only cookie is the old
    one's deletion: replayed, what the login set opens nothing (a browser sends a
    host's cookies to every port of it). Positive control: set the session as a cookie again
    and read it in ``Routes.page`` (the replay gets 200)."""
    r = routes()
    answer = login(r, READ, Origin="http://127.0.0.1:7532", Sec_Fetch_Site="same-origin")
    assert answer.status == 200 and ("Content-Security-Policy", CSP) in answer.headers
    value = session_of(answer)
    assert value is not None and READ.decode() not in value and READ not in answer.body
    assert cookie_of(answer) == f"{session.OLD_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
    assert r.answer(request("/", Cookie=replayed_cookies(answer))).status == 401
    assert r.answer(request("/", Cookie=f"{session.OLD_COOKIE}={value}")).status == 401
    for target in ("/", "/?fragment=1"):
        assert r.answer(request(target, X_Rayscope_Session=value)).status == 200, target
    for path in ("/v1/status", "/metrics", "/v1/usage"):
        assert r.answer(request(path, X_Rayscope_Session=value)).status == 401, path
    secure = cookie_of(login(routes(tls=True), READ))
    assert secure is not None and secure.endswith("; Secure") and "Max-Age=0" in secure
    wrong = login(r, b"not-the-token-0123456789")
    assert wrong.status == 401 and session_of(wrong) is None and b"wrong token" in wrong.body


def test_a_cross_site_get_or_post_cannot_log_in() -> None:
    """Another site can make a browser send a GET (a link, an image) or post a form. None
    logs in: ``GET /login`` is 405, a token in the query opens nothing, a POST whose
    ``Origin`` is another site (or ``null``) or whose ``Sec-Fetch-Site`` is not same-origin
    is 403. Positive control: accept a ``token`` query parameter, or drop the origin check."""
    r = routes()
    token = READ.decode()
    for target in (f"/login?token={token}", f"/?token={token}"):
        answer = r.answer(request(target, Sec_Fetch_Site="cross-site"))
        assert session_of(answer) is None and answer.status in (401, 405), target
    assert r.answer(request(f"/login?token={token}")).status == 405
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:7532.evil.example"},
        {"Sec_Fetch_Site": "cross-site"},
        {"Sec_Fetch_Site": "same-site", "Origin": "http://127.0.0.1:7532"},
    ):
        answer = login(r, READ, **headers)
        assert (answer.status, session_of(answer)) == (403, None), headers
    assert session_of(login(r, READ)) is not None  # curl: no Origin, no Sec-Fetch-Site
    assert session_of(login(r, READ, Origin="null", Sec_Fetch_Site="same-origin")) is not None


def test_a_session_is_refused_when_forged_expired_or_of_another_token() -> None:
    tokens = (AGENTS, READ)
    now = 1_000_000.0

    def ok(value: str, at: float = now) -> bool:
        headers = Message()
        headers[session.HEADER] = value
        return session.session_ok(headers, tokens, at)

    good = session.session_value(READ, now)
    assert ok(good) and ok(good, now + session.SESSION_S)
    assert not ok(good, now + session.SESSION_S + 1)  # 12 h later
    assert not ok(good, now - 10)  # issued "in the future": another boot's clock
    assert not ok(session.session_value(b"another-token-0123456789", now))
    issued, mac = good.split(".")
    assert not ok(f"{int(issued) + 1}.{mac}")  # the issue time is under the MAC
    assert not ok(f"{issued}.{'0' * 64}") and not ok("") and not ok("garbage") and not ok(f"{issued}.")
    old_cookie_mac = hmac.new(READ, f"rayscope page {issued}".encode(), sha256).hexdigest()
    assert not ok(f"{issued}.{old_cookie_mac}")  # a cookie another port kept is no session
    assert not session.session_ok(Message(), tokens, now)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Cookie", f'{session.OLD_COOKIE}="\\262.abc"'),
        ("Cookie", f"{session.OLD_COOKIE}=\u00b2.abc"),
        ("X-Rayscope-Session", "\u00b2.abc"),
        ("X-Rayscope-Session", "\u0662\u0663.abc"),
        ("X-Rayscope-Session", "1" * 5000 + ".abc"),
        ("X-Rayscope-Session", "-5.abc"),
        ("X-Rayscope-Session", " 1_0.abc"),
    ],
)
def test_an_unreadable_session_is_the_login_form_never_a_500(name: str, value: str) -> None:
    """An unauthenticated cookie ``"\\262.abc"`` (``²`` once unquoted) passed
    ``isdigit()`` and ``int()`` raised: 500. Positive control: ``isdigit()`` and ``int()``
    back in ``session.session_ok``."""
    headers = Message()
    headers[name] = value
    answer = routes().answer(Request("GET", "/", headers))
    assert answer.status == 401 and b'<form class="login"' in answer.body


@pytest.mark.parametrize("page", ["%C2%B2", "%D9%A2", "-1", "1_0", "99999999999999999999999", "", "x"])
def test_a_page_number_that_is_no_number_is_the_first_page(page: str) -> None:
    """``?page=%C2%B2`` with a token got 500 (``'²'.isdigit()``). Positive control:
    ``isdigit()`` and ``int()`` back in ``page.page_query``."""
    answer = routes().answer(request(f"/?page={page}", Authorization=f"Bearer {READ.decode()}"))
    assert answer.status == 200 and b'<main id="view"' in answer.body


def test_every_html_answer_carries_the_policy() -> None:
    r = routes()
    for answer in (r.answer(request("/")), r.answer(request("/", Authorization=f"Bearer {READ.decode()}"))):
        assert ("Content-Security-Policy", CSP) in answer.headers
        assert ("X-Content-Type-Options", "nosniff") in answer.headers
        assert ("Cache-Control", "no-store") in answer.headers


def test_the_login_over_a_real_heads_port(head_daemon: HeadDaemon) -> None:
    """The same on the wire: the form, the login's answer as a browser receives it, the page
    for its session header and not for its cookie, a cross-site post refused."""
    url = head_daemon.url
    status, headers, body = open_url(url + "/")
    assert status == 401 and b"<form" in body and headers["Content-Security-Policy"] == CSP
    form = urllib.parse.urlencode({"token": head_daemon.token}).encode()
    host = url.removeprefix("http://")
    status, headers, _ = open_url(url + "/login", form, Origin="https://evil.example")
    assert status == 403 and "Set-Cookie" not in headers
    status, headers, body = open_url(url + "/login", form, Origin=f"http://{host}")
    found = re.search(rb'id="session" data-value="([^"]*)"', body)
    assert status == 200 and found is not None and headers["Content-Security-Policy"] == CSP
    value = found.group(1).decode()
    cookie = headers["Set-Cookie"].split(";", 1)[0]
    assert cookie == f"{session.OLD_COOKIE}="  # the old cookie's deletion, nothing else
    assert open_url(url + "/", Cookie=cookie)[0] == 401
    assert open_url(url + "/", Cookie=f"{session.OLD_COOKIE}={value}")[0] == 401
    status, headers, body = open_url(url + "/", None, **{session.HEADER: value})
    assert status == 200 and b'<main id="view"' in body and b"<form" not in body
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert open_url(url + "/v1/status", None, **{session.HEADER: value})[0] == 401


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x", ""])
def test_a_login_that_is_no_form_is_refused(content_type: str) -> None:
    r = routes()
    body = b"token=" + READ
    answer = r.answer(request("/login", "POST", body, Content_Type=content_type))
    assert answer.status == 401 and cookie_of(answer) is None and session_of(answer) is None
