"""The daemons' logs: one format, and one line per event kind per interval (a flood of
connections cannot flood the head's log)."""

import logging
import sys
import time
from typing import Any

THROTTLE_S = 10.0


class LogThrottle:
    """One log line per event kind per interval; the repeats are counted and reported with
    the next line of that kind (or by :meth:`flush`)."""

    def __init__(self, logger: logging.Logger, interval_s: float = THROTTLE_S) -> None:
        self._log, self._interval_s = logger, interval_s
        self._windows: dict[str, tuple[float, int]] = {}  # kind -> (window start, suppressed)

    def note(self, kind: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        start, suppressed = self._windows.get(kind, (float("-inf"), 0))
        if now - start < self._interval_s:
            self._windows[kind] = (start, suppressed + 1)
            return
        self._windows[kind] = (now, 0)
        more = f" (and {suppressed} more like it in the last {now - start:.0f} s)" if suppressed else ""
        self._log.log(level, message + "%s", *args, more)

    def flush(self) -> None:
        """Say how many lines were held back in windows that have ended."""
        now = time.monotonic()
        for kind, (start, suppressed) in list(self._windows.items()):
            if suppressed and now - start >= self._interval_s:
                self._log.warning("%s: %d more in the last %.0f s", kind, suppressed, now - start)
                self._windows[kind] = (now, 0)


def daemon_logging(verbose: bool) -> None:
    """``head`` and ``push`` log to stderr, one line per event: time, logger, level, message
    (``--verbose``: debug lines too)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
