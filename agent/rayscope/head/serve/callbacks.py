"""What the head does when one of its asyncio protocols' callbacks raises (``MemoryError``
above all, under a memory limit): that connection is closed, the failure is counted for
``/healthz`` and logged once per kind per :data:`rayscope.sinks.logs.THROTTLE_S`, and the head serves on.

Every callback the event loop calls on a protocol of the report port
(:mod:`rayscope.head.serve.ingest`) and of the HTTP port (:mod:`rayscope.head.serve.http`),
its timers included, is wrapped by :func:`guarded`. What still reaches the event loop's
exception handler (:func:`loop_exception_handler`: asyncio's own code on a connection, a
callback of anything else) is logged the same way, one line without a traceback; a
``MemoryError`` there outside any connection means the head cannot go on: it stops and exits
70 with one line (:mod:`rayscope.head.daemon`).
"""

import asyncio
import errno
import functools
import logging
from typing import Any, Callable, Optional, TypeVar, cast

from rayscope.sinks.logs import LogThrottle

log = logging.getLogger("rayscope.head")

F = TypeVar("F", bound=Callable[..., Any])


class ProtocolErrors:
    """Callbacks that raised, by exception class, for ``/healthz`` (touched from the event
    loop only; each value a plain int)."""

    def __init__(self) -> None:
        self.by_kind: dict[str, int] = {}

    def count(self, kind: str) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def as_dict(self) -> dict[str, int]:
        counts = dict(self.by_kind)
        return {
            "protocol_errors": sum(counts.values()),
            **{f"protocol_errors_{k}": n for k, n in counts.items()},
        }


class Guarded:
    """What :func:`guarded` needs of a protocol: where to log and count (set by the
    protocol), who the peer is, and how to hang up."""

    port_name = "?"
    host = "?"
    log_throttle: LogThrottle
    protocol_errors: ProtocolErrors

    def abort(self) -> None:
        raise NotImplementedError

    def callback_failed(self, callback: str, err: Exception) -> None:
        """``callback`` raised ``err``: counted, one line per kind per interval, the
        connection aborted; never raises (under a memory limit each step may fail again)."""
        kind = type(err).__name__
        try:
            self.protocol_errors.count(kind)
            self.log_throttle.note(
                f"{self.port_name}:{callback}:{kind}",
                "%s port: %s%s in %s (peer %s); connection closed",
                self.port_name,
                kind,
                f": {str(err)[:200]}" if str(err) else "",
                callback,
                self.host,
                level=logging.ERROR,
            )
        except Exception:  # nothing left to say it with; the hang-up still matters
            pass
        finally:
            self._hang_up()

    def _hang_up(self) -> None:
        try:
            self.abort()
        except Exception as err:  # a transport already gone
            log.debug("%s port: hang-up failed: %s", self.port_name, err)


def guarded(method: F) -> F:
    """A protocol callback (a method of a :class:`Guarded`) that never raises into the event
    loop: what it raises is :meth:`Guarded.callback_failed`'s, and it returns ``None`` (for
    ``eof_received``: close)."""

    @functools.wraps(method)
    def call(self: Guarded, *args: Any) -> Any:
        try:
            return method(self, *args)
        except Exception as err:
            self.callback_failed(method.__name__, err)
            return None

    return cast(F, call)


def _on_a_connection(context: dict[str, Any]) -> bool:
    """Whether the loop's report concerns one connection (asyncio closes it itself)."""
    return "transport" in context or "protocol" in context or "socket" in context


def loop_exception_handler(
    throttle: LogThrottle, fatal: Optional[Callable[[str], None]] = None
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The head's event-loop exception handler: what a flood makes asyncio report (``accept``
    out of file descriptors above all) and every other report, one line per kind per
    :data:`rayscope.sinks.logs.THROTTLE_S`, never a traceback; a ``MemoryError`` outside any connection is
    ``fatal``'s (the head cannot go on)."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))[:120]
        try:
            if isinstance(exc, OSError) and exc.errno in (
                errno.EMFILE,
                errno.ENFILE,
                errno.ENOBUFS,
                errno.ENOMEM,
            ):
                throttle.note(
                    f"accept:{errno.errorcode.get(exc.errno, exc.errno)}", "report port: %s", exc.strerror
                )
                return
            if isinstance(exc, (ConnectionError, TimeoutError)) or "SSL" in type(exc).__name__:
                throttle.note("connection error", "report port: %s", message or exc)
                return
            if isinstance(exc, MemoryError) and not _on_a_connection(context) and fatal is not None:
                fatal(f"MemoryError in the event loop ({message or 'no message'})")
                return
            kind = type(exc).__name__ if exc is not None else "no exception"
            throttle.note(
                f"loop:{kind}:{message[:40]}",
                "event loop: %s: %s%s",
                message or "error",
                kind,
                f": {str(exc)[:200]}" if exc is not None and str(exc) else "",
                level=logging.ERROR,
            )
        except MemoryError:
            if fatal is not None:
                fatal("MemoryError in the event loop's exception handler")

    return handle
