"""Cron-safe files: a reader never sees half a document (``status --output``, ``--append``,
the head's ``--usage-state``).

``write_atomic``: a temporary file in the target's own directory (same file system, so the
rename is atomic), written, flushed and fsynced, then renamed over the target, then the
directory fsynced so the rename survives a crash. A writer killed at any point leaves the old
file or the new one, never a mix; at worst a ``.NAME.*.tmp`` file stays behind — hidden, and
never named ``*.prom``, so node_exporter's textfile collector does not read it.

``append_line``: one line per ``write()`` on an ``O_APPEND`` descriptor, then fsync —
appends from several writers do not interleave. A line is written whole or not at all: on a
short write (a full disk) the file is truncated back to its size before the write, under an
exclusive ``flock`` so that the truncation cuts only this writer's bytes.

Files in shared directories (SECURITY.md, rule 1): root's cron job writes where other users
can plant things, so neither function follows a symlink at FILE, writes anything but a
regular file, writes into a file another user owns (root or the user running rayscope must
own it), writes a file with more than one hard link (another user's second name, in the
shared directory, for root's file elsewhere), or waits for ever: ``append_line`` opens with
``O_NOFOLLOW | O_NONBLOCK`` (a FIFO without a reader is an error at once, not a wait) and
checks what it opened (``fstat``: its kind, owner and links) before writing a byte, and
waits at most :data:`LOCK_WAIT_S` for the lock (anyone who can read the file can ``flock``
it); ``write_atomic`` never opens the target at all (it renames
over it), checks it with ``lstat``, and gives the new file this user's mode: the old file's
permission bits when it was this user's, else what the umask gives a new file, never set-uid,
set-gid or sticky bits.
"""

import contextlib
import errno
import fcntl
import os
import stat
import time
from typing import Optional

from rayscope.errors import EXIT_CANNOT_WRITE, AgentError

__all__ = ["EXIT_CANNOT_WRITE", "append_line", "write_atomic"]

LOCK_WAIT_S = 10.0
"""How long ``append_line`` waits for another writer's lock; a writer holds it for one write
and one fsync, so a longer wait means someone is holding it on purpose."""
_LOCK_POLL_S = 0.05

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def _fail(path: str, verb: str, why: str) -> AgentError:
    return AgentError(f"cannot {verb} {path}: {why}", EXIT_CANNOT_WRITE)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refusal(path: str, verb: str, st: os.stat_result, me: int) -> Optional[AgentError]:
    """Why rayscope must not write ``path`` (its ``lstat``/``fstat``): not a regular file,
    another user's, or one with more than one name (hard links); ``None`` when it may."""
    if stat.S_ISLNK(st.st_mode):
        return _fail(path, verb, "it is a symlink, and rayscope never follows one (name the real file)")
    if not stat.S_ISREG(st.st_mode):
        return _fail(
            path, verb, f"it is {_kind(st.st_mode)}, not a regular file (rayscope writes regular files only)"
        )
    if st.st_uid not in (0, me):
        return _fail(
            path,
            verb,
            f"it belongs to uid {st.st_uid}, not to root or uid {me} (remove it, or name a file of your own)",
        )
    if st.st_nlink > 1:  # a hard link another user made to root's file elsewhere: no symlink to see
        return _fail(
            path,
            verb,
            f"it has {st.st_nlink} hard links, so it is also a file of another name elsewhere"
            " (rayscope writes a file of one name only: remove it, or name a new file)",
        )
    return None


def _new_mode(existing: Optional[os.stat_result]) -> int:
    """The mode of the file ``write_atomic`` creates: the permission bits of the file it
    replaces (this user's or root's: others' are refused), else 0o666 minus the umask — what
    ``open()`` would create (mkstemp's 0600 would hide a textfile from node_exporter running
    as another user); never set-uid, set-gid or sticky."""
    if existing is not None:
        return existing.st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, text: str, mode: Optional[int] = None) -> None:
    """Replace ``path`` by ``text`` atomically; :class:`AgentError` (exit 3) if it cannot.
    The new file gets ``mode`` where given, else the mode ``_new_mode`` says.

    The target is never opened, only renamed over: a check of it by ``lstat`` leaves no gap
    that matters (whatever is at the path when the rename happens is replaced, not followed
    or written to; in a sticky directory only its owner, root or this user, can put it back).
    """
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    existing: Optional[os.stat_result] = None
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise _fail(path, "write", err.strerror or type(err).__name__) from None
    refusal = _refusal(path, "write", existing, os.geteuid()) if existing is not None else None
    if refusal is not None:
        raise refusal
    try:
        import tempfile  # here: status --head's fast path prints through this module, and pays its imports

        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise AgentError(f"cannot write {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), _new_mode(existing) if mode is None else mode)
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


def _lock(fd: int, path: str, wait_s: float) -> None:
    """An exclusive ``flock`` on ``fd``, waiting at most ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise _fail(
                    path, "append to", f"another process has held its lock for {wait_s:g} s (nothing written)"
                ) from None
            time.sleep(_LOCK_POLL_S)


OPEN_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
)


def append_line(path: str, line: str, lock_wait_s: float = LOCK_WAIT_S) -> None:
    """Append ``line`` plus a newline in one ``write()``, whole or not at all;
    :class:`AgentError` (exit 3) if it cannot (see the module's docstring for what it refuses)."""
    data = (line.rstrip("\n") + "\n").encode()
    try:
        fd = os.open(path, OPEN_FLAGS, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _fail(
                path, "append to", "it is a symlink, and rayscope never follows one (name the real file)"
            ) from None
        if err.errno == errno.ENXIO:  # a FIFO nobody reads (or a device without its driver)
            with contextlib.suppress(OSError):
                refusal = _refusal(path, "append to", os.lstat(path), os.geteuid())
                if refusal is not None:
                    raise refusal from None
        raise AgentError(f"cannot append to {path}: {err.strerror}", EXIT_CANNOT_WRITE) from None
    try:
        refusal = _refusal(path, "append to", os.fstat(fd), os.geteuid())  # what was opened
        if refusal is not None:
            raise refusal
        _lock(fd, path, lock_wait_s)
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
