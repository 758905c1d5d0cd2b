"""What the head's HTTP port answers, path by path: a complete request in, a response out.

No sockets here (:mod:`agent.head.http` reads requests under a deadline and writes the
answers): each answer runs in one of the port's worker threads. ``/v1/status``,
``/v1/usage`` and ``/metrics`` need a bearer token when the head has one (the agents' token or
the read-only one); ``/`` (the page, :mod:`agent.render.page`) takes the bearer token or the
cookie that ``POST /login`` sets (:mod:`agent.head.session`), and answers a login form
without either; ``/healthz`` answers everyone, with counters only. ``/v1/status?format=lines`` is the
text ``status`` prints; every status answer carries the exit code and notes ``status`` would
give as ``X-Rayscope-*`` headers, and comes from :mod:`agent.head.answers` (rendered once
per change; gzip on request). A bug in one answer is a 500 with a
reason, logged once per kind, and the head keeps serving.
"""

import hmac
import logging
import time
from email.message import Message
from typing import Callable, NamedTuple
from urllib.parse import parse_qs, urlsplit

import msgspec

from agent import output
from agent.head import session
from agent.head.answers import Answers, Rendered, status_headers
from agent.head.state import HeadState
from agent.logs import LogThrottle
from agent.render.metrics import metrics_text
from agent.render.page import login_html, page_html, page_query
from agent.render.page_assets import PAGE_HEADERS
from agent.render.status import status_json_bytes
from agent.render.usage import usage_metrics
from agent.schema.status import ClusterStatus
from agent.usage_summary import DEFAULT_HEADROOM_PCT, checked_headroom, parse_window

log = logging.getLogger("rayscope.head")

TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
JSON = "application/json"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
YES = ("1", "true", "yes")


class Request(NamedTuple):
    """One HTTP request, read whole: ``target`` is the path with its query."""

    method: str
    target: str
    headers: Message
    body: bytes = b""


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    """More headers (this module's constants, or values it encoded: never a client's text)."""


def text(status: int, message: str) -> Response:
    return Response(status, TEXT, message.encode() + b"\n")


class Routes:
    """The head's answers; ``read_tokens``: the tokens that may read (none: everyone may)."""

    def __init__(
        self, state: HeadState, read_tokens: tuple[bytes, ...], throttle: LogThrottle, tls: bool = False
    ) -> None:
        self.state, self.read_tokens, self.throttle, self.tls = state, read_tokens, throttle, tls
        self.answers = Answers(state)

    def answer(self, request: Request) -> Response:
        """The response to ``request``; never raises."""
        try:
            return self._answer(request)
        except Exception as err:  # a bug in one answer must not cost the caller its connection
            self.throttle.note(
                f"http:bug:{type(err).__name__}",
                "http %s: internal error: %s: %s",
                request.target[:200],
                type(err).__name__,
                err,
                level=logging.ERROR,
            )
            return text(500, "internal error in the head agent (its log says where)")

    def _answer(self, request: Request) -> Response:
        url = urlsplit(request.target)
        if url.path == "/login":
            return self.login(request)
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed: the head answers GET")
        if url.path == "/":
            return self.page(request, url.query)
        if url.path == "/healthz":
            health = self.state.health(time.monotonic())
            ok = bool(health["gcs_poller"]["ok"])
            return Response(200, JSON, msgspec.json.encode({"ok": ok, **health}))
        return self.document(request, url.path, url.query)

    def document(self, request: Request, path: str, query_text: str) -> Response:
        """``/v1/status``, ``/v1/usage`` and ``/metrics``, for a bearer token when the head has one."""
        if path not in ("/v1/status", "/metrics", "/v1/usage"):
            return text(404, "not found: try /, /v1/status, /v1/usage, /metrics, /healthz")
        if self.read_tokens and not self.authorized(request.headers):
            return text(401, "bearer token required")
        if path == "/v1/usage":
            return self.usage(parse_qs(query_text))
        return self._status(path, parse_qs(query_text), request.headers)

    def _status(self, path: str, query: dict[str, list[str]], headers: Message) -> Response:
        """``/metrics``, ``/v1/status`` (JSON) or ``/v1/status?format=lines``, from the cache."""
        gpus = query.get("gpus", ["0"])[0] in YES
        gzipped = "gzip" in str(headers.get("Accept-Encoding", "")).lower()
        if path == "/metrics":
            metrics = self.answers.get(("metrics", gpus), self._metrics, gpus, gzipped)
            return Response(200, PROMETHEUS_TEXT, metrics.body, metrics.headers)
        include_dead = query.get("all", ["0"])[0] in YES
        if query.get("format", ["json"])[0] == "lines":
            render = _lines(include_dead, gpus)
            lines = self.answers.get(("lines", gpus, include_dead), render, gpus, gzipped)
            return Response(200, TEXT, lines.body, lines.headers)
        document = self.answers.get(("json", gpus, include_dead), _json(include_dead), gpus, gzipped)
        return Response(200, JSON, document.body, document.headers)

    def _metrics(self, status: ClusterStatus) -> Rendered:
        """The status families, then the usage history's per-app ones (cached with them)."""
        usage = usage_metrics(self.answers.usage_document())
        return Rendered((metrics_text(status) + usage).encode(), ())

    def usage(self, query: dict[str, list[str]]) -> Response:
        """``/v1/usage?window=SPAN&headroom=PCT``: the usage document (400 for a bad query)."""
        try:
            window_s = parse_window(query["window"][0]) if "window" in query else None
            headroom = checked_headroom(float(query.get("headroom", [DEFAULT_HEADROOM_PCT])[0]))
        except ValueError as err:
            return text(400, f"bad query: {err}")
        return Response(200, JSON, self.answers.usage(window_s, headroom).body)

    def page(self, request: Request, query_text: str) -> Response:
        """``GET /``: the page (or its refresh) for a bearer token or a page cookie, else
        the login form (401); without tokens, for everyone, as ``/v1/status``."""
        if self.read_tokens and not (
            self.authorized(request.headers) or session.cookie_ok(request.headers, self.read_tokens)
        ):
            return Response(401, HTML, login_html().encode(), PAGE_HEADERS)
        status = self.state.status(time.monotonic(), gpus=True, wall_now=time.time())
        refresh_s = max(5.0, self.state.interval_s)
        usage = self.answers.usage_document()
        body = page_html(status, page_query(parse_qs(query_text)), refresh_s, usage)
        return Response(200, HTML, body.encode(), PAGE_HEADERS)

    def login(self, request: Request) -> Response:
        """``POST /login`` from the head's own form: a page cookie for a good token, then
        back to ``/``. Never on ``GET``, never for another site's form (session.same_origin)."""
        if request.method != "POST":
            return text(405, "method not allowed: log in with the form on / (POST)")
        if not self.read_tokens:
            return Response(303, TEXT, b"no token needed\n", (("Location", "/"),))
        if not session.same_origin(request.headers):
            return text(403, "refused: a login must come from the head's own page")
        offered = session.form_token(request.body, str(request.headers.get("Content-Type", "")))
        if offered is None or not any(hmac.compare_digest(offered, t) for t in self.read_tokens):
            self.throttle.note("http:login", "HTTP port: a login with a wrong token")
            return Response(401, HTML, login_html("wrong token").encode(), PAGE_HEADERS)
        cookie = session.set_cookie(offered, time.monotonic(), self.tls)
        return Response(303, TEXT, b"logged in\n", (("Location", "/"), ("Set-Cookie", cookie)))

    def authorized(self, headers: Message) -> bool:
        """``Bearer TOKEN``, the scheme in any case (RFC 9110); every token compared in
        constant time. The header arrives latin-1 decoded: encoded back, byte for byte."""
        scheme, _, offered = str(headers.get("Authorization", "")).strip().partition(" ")
        offered_bytes = offered.strip().encode("latin-1", "replace")
        matches = [hmac.compare_digest(offered_bytes, token) for token in self.read_tokens]
        return scheme.lower() == "bearer" and any(matches)


def _json(include_dead: bool) -> Callable[[ClusterStatus], Rendered]:
    def render(status: ClusterStatus) -> Rendered:
        return Rendered(status_json_bytes(status, include_dead), status_headers(status))

    return render


def _lines(include_dead: bool, gpus: bool) -> Callable[[ClusterStatus], Rendered]:
    """What ``status`` prints on stdout for the same options (``format=lines``)."""

    def render(status: ClusterStatus) -> Rendered:
        lines = output.status_text_lines(status, include_dead, gpus)
        return Rendered(("\n".join(lines) + "\n").encode(), status_headers(status))

    return render
