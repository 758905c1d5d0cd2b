"""Cron-safe files: a reader never sees half a document.

``write_atomic``: a temporary file in the target's own directory (same file system, so the
rename is atomic), written, flushed and fsynced, then renamed over the target, then the
directory fsynced so the rename survives a crash. A writer killed at any point leaves the old
file or the new one, never a mix; at worst a ``.NAME.*.tmp`` file stays behind — hidden, and
never named ``*.prom``, so node_exporter's textfile collector does not read it.

``append_line``: one line per ``write()`` on an ``O_APPEND`` descriptor, then fsync —
appends from several writers do not interleave. A writer killed inside that one ``write()``
(a full disk, a signal on a huge line) can leave a last line without its newline: readers of
NDJSON skip a final line that does not end in ``\\n``.
"""

import contextlib
import os
import tempfile

from agent.errors import AgentError

EXIT_CANNOT_WRITE = 3


def _new_mode(path: str) -> int:
    """The target's own mode if it exists, else 0o666 minus the umask — what ``open()`` would
    create (mkstemp's 0600 would hide a textfile from node_exporter running as another user)."""
    try:
        return os.stat(path).st_mode & 0o7777
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


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` by ``text`` atomically; :class:`AgentError` (exit 3) if it cannot."""
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
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
    """Append ``line`` plus a newline in one ``write()``; :class:`AgentError` (exit 3) if it cannot."""
    data = (line.rstrip("\n") + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as err:
        raise AgentError(f"cannot append to {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    try:
        written = os.write(fd, data)
        if written != len(data):  # only on a full disk: say so rather than leave it silent
            raise AgentError(f"cannot append to {path}: short write (disk full?)", EXIT_CANNOT_WRITE)
        os.fsync(fd)
    except OSError as err:
        raise AgentError(f"cannot append to {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    finally:
        os.close(fd)
