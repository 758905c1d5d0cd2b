"""Waiting in tests: one poll, so that every wait has a deadline, names what it waits for,
and a test never passes because a fixed sleep happened to be long enough.

``eventually(check)`` calls ``check`` until it returns a true value and returns that value;
:func:`timed` also says how long it took. An exception in ``retry`` (by default ``KeyError``:
a node not in the document yet) counts as "not yet". Past the deadline it fails with
``what`` and the last value seen (or the last exception), so a failure says how far it got,
followed by ``detail()`` where given (a daemon's log).
"""

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

NOT_YET: tuple[type[BaseException], ...] = (KeyError,)
LAST_SHOWN_CHARS = 300


def timed(
    check: Callable[[], Optional[T]],
    timeout_s: float = 20.0,
    what: str = "the condition",
    every_s: float = 0.1,
    retry: tuple[type[BaseException], ...] = NOT_YET,
    detail: Optional[Callable[[], str]] = None,
) -> tuple[T, float]:
    """The first true value of ``check()`` and the seconds it took; AssertionError past
    ``timeout_s`` (it is checked once more at the deadline, so a slow check still gets a
    last try)."""
    start = time.monotonic()
    deadline = start + timeout_s
    last: object = None
    while True:
        try:
            value = check()
        except retry as err:
            last = err
        else:
            if value:
                return value, time.monotonic() - start
            last = value
        now = time.monotonic()
        if now >= deadline:
            shown = repr(last)[:LAST_SHOWN_CHARS]
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"not within {timeout_s:g} s: {what} (last: {shown}){more}")
        time.sleep(min(every_s, deadline - now))


def eventually(
    check: Callable[[], Optional[T]],
    timeout_s: float = 20.0,
    what: str = "the condition",
    every_s: float = 0.1,
    retry: tuple[type[BaseException], ...] = NOT_YET,
    detail: Optional[Callable[[], str]] = None,
) -> T:
    """The first true value of ``check()`` (see :func:`timed`)."""
    return timed(check, timeout_s, what, every_s, retry, detail)[0]
