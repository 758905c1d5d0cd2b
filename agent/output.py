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
import tempfile

from agent.errors import AgentError

EXIT_CANNOT_WRITE = 3


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
