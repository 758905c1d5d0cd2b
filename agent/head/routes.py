"""What the head's HTTP port answers, path by path: a complete request in, a response out.

No sockets here (:mod:`agent.head.http` reads requests under a deadline and writes the
answers): each answer runs in one of the port's worker threads. ``/v1/status``,
``/v1/usage`` and ``/metrics`` need a bearer token when the head has one (the agents' token
or the read-only one); ``/healthz`` answers everyone, with counters only. A bug in one
answer is a 500 with a reason, logged once per kind, and the head keeps serving.
"""

import hmac
import logging
import time
from email.message import Message
from typing import NamedTuple
from urllib.parse import parse_qs, urlsplit

import msgspec

from agent.head.state import HeadState
from agent.logs import LogThrottle
from agent.render.metrics import metrics_text
from agent.render.status import status_json
from agent.render.usage import usage_json, usage_metrics
from agent.usage_summary import DEFAULT_HEADROOM_PCT, checked_headroom, parse_window

log = logging.getLogger("rayscope.head")

TEXT = "text/plain; charset=utf-8"
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


def text(status: int, message: str) -> Response:
    return Response(status, TEXT, message.encode() + b"\n")


class Routes:
    """The head's answers; ``read_tokens``: the tokens that may read (none: everyone may)."""

    def __init__(self, state: HeadState, read_tokens: tuple[bytes, ...], throttle: LogThrottle) -> None:
        self.state, self.read_tokens, self.throttle = state, read_tokens, throttle

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
        if request.method not in ("GET", "HEAD"):
            return text(405, "method not allowed: the head answers GET")
        url = urlsplit(request.target)
        if url.path == "/healthz":
            health = self.state.health(time.monotonic())
            ok = bool(health["gcs_poller"]["ok"])
            return Response(200, JSON, msgspec.json.encode({"ok": ok, **health}))
        if url.path not in ("/v1/status", "/metrics", "/v1/usage"):
            return text(404, "not found: try /v1/status, /v1/usage, /metrics, /healthz")
        if self.read_tokens and not self.authorized(request.headers):
            return text(401, "bearer token required")
        query = parse_qs(url.query)
        return self.usage(query) if url.path == "/v1/usage" else self.status(url.path, query)

    def status(self, path: str, query: dict[str, list[str]]) -> Response:
        """``/v1/status`` (``?gpus=1``, ``?all=1``) or ``/metrics`` (with the usage families)."""
        gpus = query.get("gpus", ["0"])[0] in YES
        status = self.state.status(time.monotonic(), gpus=gpus, wall_now=time.time())
        if path == "/metrics":
            usage = usage_metrics(self.state.usage.document(time.monotonic()))
            return Response(200, PROMETHEUS_TEXT, (metrics_text(status) + usage).encode())
        include_dead = query.get("all", ["0"])[0] in YES
        return Response(200, JSON, status_json(status, include_dead, indent=0).encode())

    def usage(self, query: dict[str, list[str]]) -> Response:
        """``/v1/usage?window=SPAN&headroom=PCT``: the usage document (400 for a bad query)."""
        try:
            window_s = parse_window(query["window"][0]) if "window" in query else None
            headroom = checked_headroom(float(query.get("headroom", [DEFAULT_HEADROOM_PCT])[0]))
        except ValueError as err:
            return text(400, f"bad query: {err}")
        usage = self.state.usage.document(time.monotonic(), window_s, headroom)
        return Response(200, JSON, usage_json(usage).encode())

    def authorized(self, headers: Message) -> bool:
        """``Bearer TOKEN``, the scheme in any case (RFC 9110); every token compared in
        constant time. The header arrives latin-1 decoded: encoded back, byte for byte."""
        scheme, _, offered = str(headers.get("Authorization", "")).strip().partition(" ")
        offered_bytes = offered.strip().encode("latin-1", "replace")
        matches = [hmac.compare_digest(offered_bytes, token) for token in self.read_tokens]
        return scheme.lower() == "bearer" and any(matches)
