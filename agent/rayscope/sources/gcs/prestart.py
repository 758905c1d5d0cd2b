"""The GCS child of ``status``, started before the CLI knows the address it will read.

``import ray`` is most of an embedded ``status``'s time, and the child that pays it needs
nothing from the parent until it reads: so ``rayscope.__main__`` starts it first, and it
imports ray while the parent imports its own modules, scans the raylets and resolves the
address. The read then hands it its words (``ADDRESS TIMEOUT_S [actors] [pending]``) on
stdin (:func:`finish`); a child the read does not take (another interpreter chosen, no read
at all: ``--help``, a usage error, ``--head``) is killed at exit (:func:`discard`).

Nothing here changes what runs or where it connects (SECURITY.md, rule 1): the child is this
interpreter, as a read under this interpreter always was, isolated the same way (``-I``,
``/``, :func:`trust.child_env`); it learns the address only from the read, after the rules
that choose it; and the read takes it only when it would have started exactly this child.
Standard library only, so that starting it costs the parent almost nothing.
"""

import atexit
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import IO, Optional

from rayscope import errors
from rayscope.sources import trust
from rayscope.sources.gcs import raycompat
from rayscope.sources.gcs import read as gcs_read

_started: list["subprocess.Popen[str]"] = []
"""The child started and not yet taken (at most one)."""
DISCARD_WAIT_S = 5.0


def child_script() -> str:
    """``raycompat`` then ``gcs_read``, one script for ``python -c`` (both are standalone)."""
    return "\n".join(
        module.__loader__.get_source(module.__name__)  # type: ignore[union-attr]
        for module in (raycompat, gcs_read)
    )


def script_for(python: str) -> str:
    """The script as ``python -I -c`` runs it: under this interpreter, with the directories
    this process finds ray in (``-I`` drops ``PYTHONPATH`` and the user site)."""
    source = child_script()
    if python == sys.executable:
        source = trust.with_import_path(source, trust.parent_import_path("ray"))
    return source


def start(python: Optional[str] = None) -> None:
    """Start the child under ``python`` (this interpreter) if it can import ray; it waits on
    stdin for its words once ray is imported. Never raises: a child that cannot start is
    the read's to start, and to report."""
    python = python or sys.executable
    if _started or importlib.util.find_spec("ray") is None:
        return
    try:
        child = subprocess.Popen(  # isolated (SECURITY.md rule 1): -I, cwd /, Ray's variables only
            [python, "-I", "-c", script_for(python), "-"],
            cwd="/",
            env=trust.child_env(os.environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError:
        return
    _started.append(child)
    atexit.register(discard)


def take(python: str, source: str) -> Optional["subprocess.Popen[str]"]:
    """The started child, when it runs ``source`` under ``python`` (what the read would
    start); else ``None``, and a child that does not fit is killed."""
    if not _started:
        return None
    child = _started.pop()
    if list(child.args) == [python, "-I", "-c", source, "-"] and child.poll() is None:  # type: ignore[arg-type]
        return child
    _kill(child)
    return None


def spawn(python: str, source: str, words: Sequence[str]) -> "subprocess.Popen[str]":
    """The child under ``python`` with its words on its command line (no early start),
    isolated as :func:`start`'s."""
    return subprocess.Popen(  # isolated (SECURITY.md rule 1): -I, cwd /, Ray's variables only
        [python, "-I", "-c", source, *words],
        cwd="/",
        env=trust.child_env(os.environ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _pump(stream: "Optional[IO[str]]", into: list[str], on_line: Optional[Callable[[str], None]]) -> None:
    """Read ``stream`` to its end into ``into``, each line handed to ``on_line`` as it comes."""
    for line in stream or ():
        into.append(line)
        if on_line is not None:
            on_line(line)


def finish(
    child: "subprocess.Popen[str]",
    words: Optional[Sequence[str]],
    timeout_s: float,
    on_line: Optional[Callable[[str], None]] = None,
) -> "subprocess.CompletedProcess[str]":
    """Hand ``child`` its words (``None``: it has them on its command line) and wait at
    most ``timeout_s`` for its answer, as ``subprocess.run`` would: killed at the deadline,
    ``TimeoutExpired`` carrying what it wrote (its stderr says whether it had imported ray).
    Each line of its stderr goes to ``on_line`` as it is written (the dashboard's address
    comes early, so that its read starts beside this one: ``rayscope.sources.dashboard.parallel``)."""
    out: list[str] = []
    err: list[str] = []
    pumps = [
        errors.Worker(lambda: _pump(child.stdout, out, None), "rayscope-gcs-out"),
        errors.Worker(lambda: _pump(child.stderr, err, on_line), "rayscope-gcs-err"),
    ]
    for pump in pumps:
        pump.start()
    if words is not None and child.stdin is not None:
        with contextlib.suppress(OSError):  # a child that died: its answer says why
            child.stdin.write(json.dumps(list(words)) + "\n")
            child.stdin.close()
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        _drained(child, pumps)
        raise subprocess.TimeoutExpired(child.args, timeout_s, "".join(out), "".join(err)) from None
    except BaseException:  # Ctrl-C on a --watch: the child does not outlive the read
        child.kill()
        raise
    _drained(child, pumps)
    return subprocess.CompletedProcess(child.args, child.returncode, "".join(out), "".join(err))


def _drained(child: "subprocess.Popen[str]", pumps: Sequence[threading.Thread]) -> None:
    """The pumps at the end of their pipes (a process the child left holding them is not
    waited for beyond :data:`DISCARD_WAIT_S`), then the pipes closed."""
    for pump in pumps:
        pump.join(DISCARD_WAIT_S)
    for stream in (child.stdin, child.stdout, child.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _kill(child: "subprocess.Popen[str]") -> None:
    child.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.communicate(timeout=DISCARD_WAIT_S)  # reaped, its pipes closed


def discard() -> None:
    """Kill a child no read took (at exit)."""
    while _started:
        _kill(_started.pop())
