"""``rayscope status --watch``: the status redrawn in place, changed values highlighted.

The terminal is the only thing this module owns: it switches to the alternate screen (the
shell's screen comes back untouched), hides the cursor, turns off echo so stray keys do not
smear the frame, and draws each frame in one write — cursor home, every line followed by
"clear to end of line", then "clear below" — so nothing is erased before it is redrawn (no
flicker). Ctrl-C, SIGTERM and SIGHUP leave through the same ``finally``: echo, cursor and the
shell's screen come back as they were. What a frame says, and what is highlighted, is
``render``'s work.
"""

import contextlib
import os
import shutil
import signal
import sys
import termios
import time
from collections.abc import Iterator
from types import FrameType
from typing import Callable, Optional, TextIO

from rayscope.errors import EXIT_USAGE, AgentError
from rayscope.labels import printable
from rayscope.render.watch import CUT_MARKER, fit_screen, highlight_changes, watch_header, wrap_to
from rayscope.schema.status import ClusterStatus

ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen on, cursor hidden
LEAVE = "\x1b[?25h\x1b[?1049l"  # cursor shown, alternate screen off
HOME = "\x1b[H"
CLEAR_EOL = "\x1b[K"
CLEAR_BELOW = "\x1b[J"


def _interrupt(signum: int, frame: Optional[FrameType]) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminal(stream: TextIO, keyboard_fd: Optional[int]) -> Iterator[None]:
    """Alternate screen, hidden cursor, no echo — and all of it undone on the way out."""
    saved_attrs = None
    if keyboard_fd is not None and os.isatty(keyboard_fd):
        saved_attrs = termios.tcgetattr(keyboard_fd)
        quiet = termios.tcgetattr(keyboard_fd)
        quiet[3] &= ~termios.ECHO  # lflags: keys typed do not land in the frame; ISIG stays on
        termios.tcsetattr(keyboard_fd, termios.TCSADRAIN, quiet)
    saved_handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        stream.write(ENTER)
        stream.flush()
        yield
    finally:
        stream.write(LEAVE)
        stream.flush()
        if saved_attrs is not None and keyboard_fd is not None:
            termios.tcsetattr(keyboard_fd, termios.TCSADRAIN, saved_attrs)
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)


def draw(stream: TextIO, lines: list[str]) -> None:
    """One frame in one write: over the last one, line by line, never a blank screen between."""
    stream.write(HOME + (CLEAR_EOL + "\n").join(lines) + CLEAR_EOL + CLEAR_BELOW)
    stream.flush()


def run(
    read: Callable[[], ClusterStatus],
    lines_of: Callable[[ClusterStatus], list[str]],
    interval_s: float,
    *,
    stream: TextIO = sys.stdout,
    keyboard_fd: Optional[int] = None,
    frames: Optional[int] = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    screen_size: Callable[[], "os.terminal_size"] = shutil.get_terminal_size,
) -> int:
    """Read, render and draw every ``interval_s`` until Ctrl-C (or ``frames`` frames); 0.

    A read that fails shows its one-line reason above the last good frame and is retried
    at the next tick: a watch outlives a GCS restart.
    """
    previous: Optional[list[str]] = None
    body: list[str] = []
    encoding = (getattr(stream, "encoding", None) or "ascii").lower()
    marker = CUT_MARKER if encoding.replace("-", "").startswith("utf") else ">"
    drawn = 0
    try:
        with terminal(stream, keyboard_fd):
            while frames is None or drawn < frames:
                started = clock()
                error = None
                generated_at = wall_clock()
                try:
                    status = read()
                    generated_at = status.generated_at
                    body = lines_of(status)
                except AgentError as err:
                    error = printable(f"rayscope: {err} (retrying every {interval_s:g} s)")
                columns, rows = screen_size()
                header = [watch_header(interval_s, generated_at), ""]
                if error is not None:
                    header += [*wrap_to(error, columns), ""]
                shown = fit_screen(body, columns, rows - len(header) - 1, marker)
                marked = shown if error is not None else highlight_changes(previous, shown)
                draw(stream, fit_screen(header, columns, rows, marker) + marked)
                if error is None:
                    previous = shown
                drawn += 1
                if frames is None or drawn < frames:
                    sleep(max(0.0, interval_s - (clock() - started)))
    except KeyboardInterrupt:
        pass
    return 0


def watch_status(
    read: Callable[[], ClusterStatus],
    lines_of: Callable[[ClusterStatus], list[str]],
    interval_s: float,
    plain_text: bool,
) -> int:
    """``status --watch``: :func:`run` on this terminal; a usage error (exit 2) when the output
    was asked for elsewhere (``plain_text`` false: --json, --format, --output, --append) or
    stdout is not a terminal."""
    if not plain_text:
        raise AgentError(
            "--watch draws on the terminal: it takes no --json, --format, --output or --append", EXIT_USAGE
        )
    if not sys.stdout.isatty():
        raise AgentError(
            "--watch needs a terminal on stdout (for files, use --output or --append)", EXIT_USAGE
        )
    keyboard = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
    return run(read, lines_of, interval_s, keyboard_fd=keyboard)
