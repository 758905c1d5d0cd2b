"""The one exception domain code raises, the exit codes, and how the CLI says a failure:
one line on stderr and the exit code, never a traceback (``--verbose`` adds one); nor does
a thread of ours print one (:class:`Worker`)."""

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, Optional

EXIT_FAILED = 1
"""rayscope failed, or (status) the answer is partial, or (fit) it does not fit."""
EXIT_NO_DATA = 2
"""The cluster could not be read at all."""
EXIT_USAGE = 2
"""Bad usage: an option or its value, or a file or setting one names, is wrong (click's code
for usage errors; the same number as :data:`EXIT_NO_DATA`, as the CLI contract has it)."""
EXIT_CANNOT_WRITE = 3
"""``status``: the ``--output`` or ``--append`` file could not be written."""
EXIT_INTERNAL = 70
"""An internal error of rayscope: a bug, memory exhausted, something it read and could not
handle. ``EX_SOFTWARE`` of sysexits.h, so that a cron job never reads it as an answer
("partial" is 1, "no data" 2)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C, as a shell reports it (128 + SIGINT)."""


class AgentError(Exception):
    """A failure the operator can act on: ``str(err)`` is the whole message.

    ``exit_code`` follows the CLI contract: 1 = failed / partial, 2 = no data
    (the cluster could not be read at all) or bad usage, 3 = an output file not written;
    anything else raised is an internal error, 70.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RayscopeError(AgentError):
    """What the Python API (``rayscope.cluster_state``, ``fit``, ``usage``) raises, for every
    failure: ``str(err)`` is the one line the command line would print for it, ``exit_code``
    the exit code it would end with (2: the cluster could not be read, or a bad argument)."""


def say(message: str) -> None:
    """``rayscope: <message>`` on stderr, through the one printable rule."""
    from rayscope.labels import printable

    sys.stderr.write(f"rayscope: {printable(message)}\n")


@contextmanager
def one_line_errors(verbose: bool) -> Iterator[None]:
    """AgentError → ``rayscope: <message>`` and its exit code; anything else (a bug of
    ours, MemoryError) → one line and :data:`EXIT_INTERNAL`; Ctrl-C → exit 130.
    ``verbose``: the traceback too."""
    try:
        yield
    except AgentError as err:
        if verbose:
            _print_traceback()
        say(str(err))
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Exception as err:
        if verbose:
            _print_traceback()
        said = f": {err}" if str(err) else ""
        say(f"internal error: {type(err).__name__}{said} (--verbose shows where)")
        raise SystemExit(EXIT_INTERNAL) from None


def _print_traceback() -> None:
    """``--verbose``'s traceback of the exception being handled; ``traceback`` (tokenize,
    ``re``: ~10 ms) imported only then, off every command's start."""
    import traceback

    traceback.print_exc()


class Worker(threading.Thread):
    """``target()`` in a daemon thread named ``name``; whatever it raises is kept in
    :attr:`error` (``BaseException`` too), for whoever joins or checks it. The one way
    rayscope starts a thread.

    A one-shot command (``status``, or a ``--watch`` left with Ctrl-C) exits while reads it gave
    up at their deadline may still run in daemon threads: a GCS call, NVML, the dashboard's GET,
    the port probe. Python's default ``threading.excepthook`` writes a traceback to stderr. A
    thread that does so while the interpreter shuts down can hold stderr's lock when the main
    thread flushes it, and Python aborts (``Fatal Python error: _enter_buffered_busy``, exit
    134: seen on 3.13 after Ctrl-C on ``--watch``). Nor is a traceback ever how rayscope says
    what went wrong: the owner reads :attr:`error` and says it its own way.
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._work: Optional[Callable[[], object]] = target
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            if self._work is not None:
                self._work()
        except BaseException as err:  # kept, never printed: see the class's docstring
            self.error = err
        finally:
            self._work = None  # what the target holds is not kept alive by a finished thread


def start_worker(target: Callable[[], object], name: str) -> Worker:
    """A started :class:`Worker`."""
    worker = Worker(target, name)
    worker.start()
    return worker
