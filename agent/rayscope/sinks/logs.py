"""The daemons' logs: one format, and one line per event kind per interval (a flood of
connections cannot flood the head's log); and the head's stderr as a whole, native libraries
included (:func:`filtered_stderr`)."""

import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rayscope import errors
from rayscope.labels import printable
from rayscope.units import seconds

THROTTLE_S = 10.0


class LogThrottle:
    """One log line per event kind per interval; the repeats are counted and reported with
    the next line of that kind (or by :meth:`flush`). A kind is a key, never shown: what the
    log says of the repeats is the line they repeat."""

    def __init__(self, logger: logging.Logger, interval_s: float = THROTTLE_S) -> None:
        self._log, self._interval_s = logger, interval_s
        self._windows: dict[str, tuple[float, int, str]] = {}  # kind -> (start, suppressed, line)

    def note(self, kind: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        start, suppressed, line = self._windows.get(kind, (float("-inf"), 0, ""))
        if now - start < self._interval_s:
            self._windows[kind] = (start, suppressed + 1, line)
            return
        self._windows[kind] = (now, 0, message % args if args else message)
        more = f" (and {suppressed} more like it in the last {seconds(now - start)} s)" if suppressed else ""
        self._log.log(level, message + "%s", *args, more)

    def flush(self) -> None:
        """Say how many lines were held back in windows that have ended."""
        now = time.monotonic()
        for kind, (start, suppressed, line) in list(self._windows.items()):
            if suppressed and now - start >= self._interval_s:
                self._log.warning("%d more in the last %s s like: %s", suppressed, seconds(now - start), line)
                self._windows[kind] = (now, 0, line)


def daemon_logging(verbose: bool) -> None:
    """``head`` and ``push`` log to stderr, one line per event: time, logger, level, message
    (``--verbose``: debug lines too)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


NATIVE_LINE = re.compile(rb"^\[[0-9-]+ [0-9:,.]+ [DIWEF] [0-9]+ [0-9]+\] ([\w./-]+:[0-9]+):")
"""A line of Ray's C++ logger (``[2026-12-03 18:42:59,111 W 18129 18135] gcs_client.cc:210:
...``): throttled by its source location."""
MAX_LINE_BYTES = 4096
"""A longer line (a peer's error text can be anything) is cut."""
DRAIN_S = 2.0
"""How long the end of :func:`filtered_stderr` waits for the pipe to be written out (a child
that inherited fd 2 may hold it open: then it waits no longer)."""


class StderrFilter:
    """What reaches the real stderr from a pipe that stands for fd 2: each line printable
    (:func:`rayscope.labels.printable`), cut at :data:`MAX_LINE_BYTES`, and a native library's line
    once per source location per ``interval_s``, with how many were held back."""

    def __init__(self, write: Any, interval_s: float = THROTTLE_S) -> None:
        self._write, self._interval_s = write, interval_s
        self._windows: dict[bytes, tuple[float, int]] = {}
        self._partial = b""

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:  # no newline for that long: a line of its own
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self._line(line)

    def pending(self) -> bool:
        """Whether a line without its newline is held."""
        return bool(self._partial)

    def _line(self, line: bytes) -> None:
        native = NATIVE_LINE.match(line)
        more = ""
        if native is not None:
            now = time.monotonic()
            start, held = self._windows.get(native.group(1), (float("-inf"), 0))
            if now - start < self._interval_s:
                self._windows[native.group(1)] = (start, held + 1)
                return
            self._windows[native.group(1)] = (now, 0)
            more = f" (and {held} more like it in the last {now - start:.0f} s)" if held else ""
        text = printable(line[:MAX_LINE_BYTES].decode("utf-8", "replace")) + more
        self._write((text + "\n").encode("utf-8", "replace"))


@contextmanager
def filtered_stderr(interval_s: float = THROTTLE_S) -> Iterator[None]:
    """This process's fd 2 through :class:`StderrFilter` while in the block: the head's
    in-process GCS client (Ray's C++) writes raw error text there, where no Python code sees it.

    A thread copies the pipe to the real stderr (fd 2 is restored should it fail); on the way
    out what the pipe holds is written first. Unfiltered when fd 2 cannot be redirected."""
    sys.stderr.flush()
    try:
        real = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
    except OSError:
        yield
        return

    def write(data: bytes) -> None:
        while data:
            data = data[os.write(real, data) :]

    def copy() -> None:
        lines = StderrFilter(write, interval_s)
        try:
            while data := os.read(read_end, 65536):
                lines.feed(data)
            if lines.pending():
                lines.feed(b"\n")
        except Exception:  # the filter's own failure: stderr unfiltered rather than blocked
            os.dup2(real, 2)

    thread = errors.start_worker(copy, "rayscope-stderr")
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # the pipe's last write end: the thread drains it and ends
        thread.join(DRAIN_S)
        if not thread.is_alive():
            os.close(read_end)
            os.close(real)
