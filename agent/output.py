"""Cron-safe files: a reader never sees half a document.

``write_atomic``: a temporary file in the target's own directory (same file system, so the
rename is atomic), written, flushed and fsynced, then renamed over the target, then the
directory fsynced so the rename survives a crash. A writer killed at any point leaves the old
file or the new one, never a mix; at worst a ``.NAME.*.tmp`` file stays behind — hidden, and
never named ``*.prom``, so node_exporter's textfile collector does not read it.

``append_line``: one line per ``write()`` on an ``O_APPEND`` descriptor, then fsync —
appends from several writers do not interleave. A line is written whole or not at all: on a
short write (a full disk) the file is truncated back to its size before the write, under an
exclusive ``flock`` so that the truncation cuts only this writer's bytes.

Neither follows a symlink at FILE (SECURITY.md, rule 1): root's cron job must not be turned
onto another file by a link planted in a directory others can write. ``write_atomic`` refuses
one; ``append_line`` opens with ``O_NOFOLLOW``.
"""

import contextlib
import errno
import fcntl
import os
import stat
import sys
import tempfile
from typing import TYPE_CHECKING, Optional

from agent.errors import EXIT_CANNOT_WRITE, EXIT_NO_DATA, AgentError, say

if TYPE_CHECKING:  # the writers stand alone (their tests run them under a bare Python)
    from agent.schema.status import ClusterStatus

__all__ = ["EXIT_CANNOT_WRITE", "append_line", "deliver_status", "to_stdout", "write_atomic"]


def _new_mode(path: str) -> int:
    """The target's own mode if it exists, else 0o666 minus the umask — what ``open()`` would
    create (mkstemp's 0600 would hide a textfile from node_exporter running as another user)."""
    try:
        return os.lstat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _symlink_refusal(path: str, verb: str) -> AgentError:
    return AgentError(
        f"cannot {verb} {path}: it is a symlink, and rayscope never follows one (name the real file)",
        EXIT_CANNOT_WRITE,
    )


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` by ``text`` atomically; :class:`AgentError` (exit 3) if it cannot."""
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise _symlink_refusal(path, "write")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise AgentError(f"cannot write {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), _new_mode(path))
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise AgentError(f"cannot write {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_line(path: str, line: str) -> None:
    """Append ``line`` plus a newline in one ``write()``, whole or not at all;
    :class:`AgentError` (exit 3) if it cannot."""
    data = (line.rstrip("\n") + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _symlink_refusal(path, "append to") from None
        raise AgentError(f"cannot append to {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size_before = os.fstat(fd).st_size
        written = os.write(fd, data)
        if written != len(data):  # a full disk: take the fragment back
            os.ftruncate(fd, size_before)
            raise AgentError(
                f"cannot append to {path}: no space left on device (short write; the line was not written)",
                EXIT_CANNOT_WRITE,
            )
        os.fsync(fd)
    except OSError as err:
        raise AgentError(f"cannot append to {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    finally:
        os.close(fd)


# -- where a status goes: stdout, --output, --append (the status command's routing) -------

FORMATS = ("text", "json", "prom")


def status_format(json_out: bool, format_: Optional[str]) -> str:
    """``--json`` and ``--format`` as one choice; a conflict is a usage error (exit 2)."""
    if json_out and format_ not in (None, "json"):
        raise AgentError(f"--json and --format {format_} ask for different outputs", EXIT_NO_DATA)
    return "json" if json_out else (format_ or "text")


def render_status(result: "ClusterStatus", fmt: str, include_dead: bool, gpus: bool) -> str:
    """The status as ``fmt`` (``text``: the lines, and with ``gpus`` the per-GPU block)."""
    from agent.render.status import status_json

    if fmt == "json":
        return status_json(result, include_dead=include_dead) + "\n"
    if fmt == "prom":
        from agent.render.metrics import metrics_text

        return metrics_text(result)
    return "\n".join(status_text_lines(result, include_dead, gpus)) + "\n"


def status_text_lines(result: "ClusterStatus", include_dead: bool, gpus: bool) -> list[str]:
    from agent.render.status import status_lines

    lines = status_lines(result, include_dead=include_dead)
    if not gpus:
        return lines
    from agent.render.gpus import status_gpu_lines

    return lines + status_gpu_lines(result, include_dead=include_dead)


def deliver_status(
    result: "ClusterStatus",
    fmt: str,
    include_dead: bool = False,
    gpus: bool = False,
    output_file: Optional[str] = None,
    append_file: Optional[str] = None,
) -> int:
    """Print or write ``result`` as asked; the exit code its completeness gives (0, 1).

    Never an empty document over a good one: with no data nothing is written and
    :class:`AgentError` (exit 2) says why. The completeness note goes to stderr.
    """
    from agent.completeness import assess
    from agent.render.status import status_ndjson

    code, note = assess(result)
    if code == EXIT_NO_DATA:
        raise AgentError(note or "no data", code)
    text = render_status(result, fmt, include_dead, gpus)
    if output_file:
        write_atomic(output_file, text)
    if append_file:
        append_line(append_file, status_ndjson(result, include_dead=include_dead))
    if not output_file and not append_file:
        to_stdout(text)
    if note:
        say(note)
    return code


def to_stdout(text: str) -> None:
    """``text`` on stdout; a reader that went away (``status | head -1``) is not an error:
    the rest is dropped quietly and the command keeps the exit code it would have had."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit: point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
