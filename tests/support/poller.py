"""The head's poller in this process: a base for stand-in GCS readers that answer node views
only, and ``/healthz`` read from a :class:`HeadState` through the head's own routes."""

import json
import logging
from email.message import Message
from typing import Any

from rayscope.head.serve.routes import Request, Routes
from rayscope.head.store.state import HeadState
from rayscope.schema.report import SourceStatus
from rayscope.sinks.logs import LogThrottle


class ViewsOnly:
    """A GCS reader's actor and pending reads, not asked for: a subclass answers ``read()``."""

    def read_actors(self) -> tuple[None, SourceStatus]:
        return None, SourceStatus(name="gcs_actors", ok=False, reason="not asked")

    def read_pending(self) -> tuple[None, SourceStatus]:
        return None, SourceStatus(name="pending", ok=False, reason="not asked")


def healthz(state: HeadState) -> dict[str, Any]:
    """The head's ``/healthz`` document for ``state`` (answered 200)."""
    routes = Routes(state, (), LogThrottle(logging.getLogger("test")))
    response = routes.answer(Request("GET", "/healthz", Message()))
    assert response.status == 200
    document: dict[str, Any] = json.loads(response.body)
    return document
