"""What the head's HTTP port answers, path by path: a complete request in, a response out.

No sockets here (:mod:`rayscope.head.serve.http` reads requests under a deadline and writes the
answers): each answer runs in one of the port's worker threads. First, a request whose
``Host`` does not name the head is refused (421, :mod:`rayscope.head.access.origin`: DNS rebinding).
``/v1/status``, ``/v1/usage`` and ``/metrics`` need a bearer token when the head has one (the
agents' token or the read-only one); ``/`` (the page, :mod:`rayscope.render.page.document`) takes the
bearer token or the session header of a ``POST /login`` (:mod:`rayscope.head.access.session`), and
answers a login form without either; ``/healthz`` answers everyone, with counters only. A
client that keeps offering wrong tokens is answered 429, unchecked (:mod:`rayscope.head.access.guesses`).
``/v1/status?format=lines`` is the text ``status`` prints, ``?indent=1`` the JSON ``status
--json`` prints; every status answer carries the exit code and notes ``status`` would give as
``X-Rayscope-*`` headers, and comes from :mod:`rayscope.head.serve.answers` (rendered once per
change; gzip on request). A bug in one answer is a 500 with a reason, logged once per kind,
and the head keeps serving.
"""

import enum
import hmac
import logging
import math
import time
from email.message import Message
from typing import NamedTuple, Optional, Union
from urllib.parse import parse_qs, urlsplit

import msgspec

from rayscope.core.isolation import per_node, recording
from rayscope.core.usage.summary import DEFAULT_HEADROOM_PCT, checked_headroom, parse_window
from rayscope.defaults import HEADER_INDENT
from rayscope.head.access import session
from rayscope.head.access.guesses import Guesses
from rayscope.head.access.origin import REFUSAL, Hosts
from rayscope.head.serve.answers import Answers, Render, Rendered, Spare, accepts_gzip, status_headers
from rayscope.head.store.state import HeadState
from rayscope.render.metrics import metrics_text
from rayscope.render.page.assets import PAGE_HEADERS
from rayscope.render.page.document import login_html, page_html, page_query, session_html
from rayscope.render.status import status_json_bytes, status_json_into, status_text_lines
from rayscope.render.usage import usage_metrics
from rayscope.schema.status import ClusterStatus
from rayscope.sinks.logs import LogThrottle
from rayscope.units import parse_amount

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
    peer: str = ""
    """The client's address (wrong tokens are counted per address)."""


class Response(NamedTuple):
    status: int
    content_type: str
    body: Union[bytes, bytearray]
    headers: tuple[tuple[str, str], ...] = ()
    """More headers (this module's constants, or values it encoded: never a client's text)."""


def text(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, TEXT, message.encode() + b"\n", headers)


class Credential(enum.Enum):
    """What a request offers to read with."""

    OPEN = "a right token, or none needed"
    NONE = "no token offered"
    WRONG = "a wrong token"
    WAIT = "not checked: too many wrong tokens from its address"


class Routes:
    """The head's answers; ``read_tokens``: the tokens that may read (none: everyone may);
    ``hosts``: the names it answers to (:class:`rayscope.head.access.origin.Hosts`)."""

    def __init__(
        self,
        state: HeadState,
        read_tokens: tuple[bytes, ...],
        throttle: LogThrottle,
        tls: bool = False,
        hosts: Optional[Hosts] = None,
        guesses: Optional[Guesses] = None,
    ) -> None:
        self.state, self.read_tokens, self.throttle, self.tls = state, read_tokens, throttle, tls
        self.hosts = hosts or Hosts()
        self.guesses = guesses or Guesses()
        self.answers = Answers(state)
        self.misdirected = 0
        self.unchecked = 0

    def counters(self) -> dict[str, int]:
        """For ``/healthz``: requests refused for their ``Host``; tokens left unchecked (429)."""
        return {"http_misdirected": self.misdirected, "http_tokens_unchecked": self.unchecked}

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
        if not self.hosts.allows(request.headers):
            self.misdirected += 1
            host = ascii(str(request.headers.get("Host", ""))[:80])
            self.throttle.note("http:host", "HTTP port: a request for another host (Host %s): 421", host)
            return text(421, REFUSAL)
        url = urlsplit(request.target)
        if url.path == "/login":
            return self.login(request)
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed: the head answers GET")
        if url.path == "/":
            return self.page(request, url.query)
        if url.path == "/healthz":
            return Response(200, JSON, msgspec.json.encode(self.state.health(time.monotonic())))
        return self.document(request, url.path, url.query)

    def document(self, request: Request, path: str, query_text: str) -> Response:
        """``/v1/status``, ``/v1/usage`` and ``/metrics``, for a bearer token when the head has one."""
        if path not in ("/v1/status", "/metrics", "/v1/usage"):
            return text(404, "not found: try /, /v1/status, /v1/usage, /metrics, /healthz")
        credential = self.credential(request, page=False)
        if isinstance(credential, float):
            return self.too_many(credential, None)
        if credential is not Credential.OPEN:
            return text(401, "bearer token required")
        if path == "/v1/usage":
            return self.usage(parse_qs(query_text))
        return self._status(path, parse_qs(query_text), request.headers)

    def _status(self, path: str, query: dict[str, list[str]], headers: Message) -> Response:
        """``/metrics``, ``/v1/status`` (JSON) or ``/v1/status?format=lines``, from the cache."""
        gpus = query.get("gpus", ["0"])[0] in YES
        gzipped = accepts_gzip(", ".join(str(v) for v in headers.get_all("Accept-Encoding") or []))
        if path == "/metrics":
            metrics = self.answers.get(("metrics", gpus), self._metrics, gpus, gzipped)
            return Response(200, PROMETHEUS_TEXT, metrics.body, metrics.headers)
        include_dead = query.get("all", ["0"])[0] in YES
        if query.get("format", ["json"])[0] == "lines":
            render = _lines(include_dead, gpus)
            lines = self.answers.get(("lines", gpus, include_dead), render, gpus, gzipped)
            return Response(200, TEXT, lines.body, lines.headers)
        indent = query.get("indent", ["0"])[0] in YES
        key = ("json", gpus, include_dead, indent)
        document = self.answers.get(key, _json(include_dead, indent), gpus, gzipped)
        return Response(200, JSON, document.body, document.headers)

    def _metrics(self, status: ClusterStatus, spare: Spare) -> Rendered:
        """The status families, then the usage history's per-app ones (cached with them)."""
        usage = usage_metrics(self.answers.usage_document())
        return Rendered((metrics_text(status) + usage).encode(), ())

    def usage(self, query: dict[str, list[str]]) -> Response:
        """``/v1/usage?window=SPAN&headroom=PCT``: the usage document (400 for a bad query)."""
        try:
            window_s = parse_window(query["window"][0]) if "window" in query else None
            given = query.get("headroom", [f"{DEFAULT_HEADROOM_PCT:g}"])[0]
            headroom = checked_headroom(parse_amount(given, "headroom"))
        except ValueError as err:
            return text(400, f"bad query: {err}")
        return Response(200, JSON, self.answers.usage(window_s, headroom).body)

    def page(self, request: Request, query_text: str) -> Response:
        """``GET /``: the page (or its refresh) for a bearer token or a session header, else
        the login form (401); without tokens, for everyone, as ``/v1/status``."""
        refresh_s = max(5.0, self.state.interval_s)
        credential = self.credential(request, page=True)
        if isinstance(credential, float):
            return self.too_many(credential, refresh_s)
        if credential is not Credential.OPEN:
            return Response(401, HTML, login_html(refresh_s=refresh_s).encode(), PAGE_HEADERS)
        status = self.state.status(time.monotonic(), gpus=True, wall_now=time.time())
        usage = self.answers.usage_document()
        with recording(self.state.failures):
            body = per_node(page_html)(status, page_query(parse_qs(query_text)), refresh_s, usage)
        return Response(200, HTML, body.encode(), PAGE_HEADERS)

    def login(self, request: Request) -> Response:
        """``POST /login`` from the head's own form: for a good token, a page whose script
        keeps the session in its tab and opens ``/`` with it (:mod:`rayscope.head.access.session`).
        Never on ``GET``, never for another site's form (session.same_origin)."""
        if request.method != "POST":
            return text(405, "method not allowed: log in with the form on / (POST)")
        if not self.read_tokens:
            return Response(303, TEXT, b"no token needed\n", (("Location", "/"),))
        if not session.same_origin(request.headers):
            return text(403, "refused: a login must come from the head's own page")
        offered = session.form_token(request.body, str(request.headers.get("Content-Type", "")))
        wait_s = self.guesses.wait_s(request.peer) if offered is not None else 0.0
        if wait_s > 0:
            return self.too_many(wait_s, 5.0)
        if offered is None or not any(hmac.compare_digest(offered, t) for t in self.read_tokens):
            if offered is not None:  # a form without a token guessed nothing
                self.guesses.wrong(request.peer)
            self.throttle.note("http:login", "HTTP port: a login with a wrong token")
            return Response(401, HTML, login_html("wrong token").encode(), PAGE_HEADERS)
        value = session.session_value(offered, time.monotonic())
        forget = session.FORGET_COOKIE + ("; Secure" if self.tls else "")
        return Response(200, HTML, session_html(value).encode(), (*PAGE_HEADERS, ("Set-Cookie", forget)))

    def credential(self, request: Request, page: bool) -> Union[Credential, float]:
        """What ``request`` offers: a bearer token, or for the page (``page``) its session
        header too. A wrong one is charged to its address; once that address has been wrong
        too often, nothing it offers is checked: the seconds until it is
        (:mod:`rayscope.head.access.guesses`)."""
        if not self.read_tokens:
            return Credential.OPEN
        headers = request.headers
        bearer = headers.get("Authorization") is not None
        has_session = page and headers.get(session.HEADER) is not None
        if not (bearer or has_session):
            return Credential.NONE
        wait_s = self.guesses.wait_s(request.peer)
        if wait_s > 0:
            return wait_s
        if bearer and self.authorized(headers):
            return Credential.OPEN
        if has_session and session.session_ok(headers, self.read_tokens):
            return Credential.OPEN
        self.guesses.wrong(request.peer)
        self.throttle.note("http:wrong-token", "HTTP port: a wrong token")
        return Credential.WRONG

    def too_many(self, wait_s: float, page_refresh_s: Optional[float]) -> Response:
        """``429`` with ``Retry-After`` (whole seconds): the login form for the page
        (``page_refresh_s``), one line for the API."""
        self.unchecked += 1
        seconds = str(max(1, math.ceil(wait_s)))
        said = f"too many wrong tokens from this address: try again in {seconds} s"
        if page_refresh_s is None:
            return text(429, said, (("Retry-After", seconds),))
        form = login_html(said, page_refresh_s).encode()
        return Response(429, HTML, form, (*PAGE_HEADERS, ("Retry-After", seconds)))

    def authorized(self, headers: Message) -> bool:
        """``Bearer TOKEN``, the scheme in any case (RFC 9110); every token compared in
        constant time. The header arrives latin-1 decoded: encoded back, byte for byte."""
        scheme, _, offered = str(headers.get("Authorization", "")).strip().partition(" ")
        offered_bytes = offered.strip().encode("latin-1", "replace")
        matches = [hmac.compare_digest(offered_bytes, token) for token in self.read_tokens]
        return scheme.lower() == "bearer" and any(matches)


def _json(include_dead: bool, indent: bool) -> Render:
    """The document, compact (into the previous render's buffer when it is free); or
    (``indent``, ``?indent=1``) the bytes ``status --json`` prints for the same options, so
    that ``status --head --json`` copies them (79 MB at 10,000 nodes of 8 GPUs: indenting
    them in the client was most of its time)."""

    def render(status: ClusterStatus, spare: Spare) -> Rendered:
        if not indent:
            document = status_json_into(status, spare or bytearray(), include_dead)
            return Rendered(document, status_headers(status))
        indented = msgspec.json.format(status_json_bytes(status, include_dead), indent=2) + b"\n"
        return Rendered(indented, (*status_headers(status), (HEADER_INDENT, "2")))

    return render


def _lines(include_dead: bool, gpus: bool) -> Render:
    """What ``status`` prints on stdout for the same options (``format=lines``)."""

    def render(status: ClusterStatus, spare: Spare) -> Rendered:
        lines = status_text_lines(status, include_dead, gpus)
        return Rendered(("\n".join(lines) + "\n").encode(), status_headers(status))

    return render
