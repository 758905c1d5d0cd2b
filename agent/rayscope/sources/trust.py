"""Local trust: what rayscope may run or follow on a node where other users run processes.

rayscope runs as root from cron on shared nodes, and everything it reads there can be planted
by a local user: a process named ``raylet``, the "Python" its command line names, a module in
the working directory, variables in the environment. The rule (SECURITY.md, rule 1): run
nothing unless root or the user running rayscope owns it, and nobody else can replace it.

Pure checks on ``stat`` results and uids; :func:`raylet_python_refusal`, which reads them for
one raylet, and :func:`process_refusal`, which :func:`rayscope.sources.raylet.find_raylets` and
:mod:`rayscope.sources.procs` apply to every raylet process (another user's raylet is no source
of anything: GCS address, node id, session directory, Python); :func:`open_trusted`, which
opens a file such as ``ray_current_cluster`` only through directories nobody else can change;
:func:`listener_refusal`, which :func:`rayscope.sources.dashboard.token_withheld` applies to
the sockets listening at a published dashboard address before Ray's token goes there.
A refusal is a sentence naming the object and the reason; ``None`` means trusted.

Also the environment of a child process (:func:`child_env`): only what Ray's client needs.
"""

import importlib.util
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

CHILD_ENV_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
CHILD_ENV_PREFIXES = ("RAY_",)
"""Ray's own settings (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``, ``RAY_TMPDIR``...) pass; no
``PYTHON*``, ``LD_*`` or anything else a caller's environment may carry into the child."""


def _trusted_uid(uid: int, me: int) -> bool:
    return uid in (0, me)


def file_refusal(path: str, st: os.stat_result, me: int) -> Optional[str]:
    """Why ``path`` (a file or a directory, its ``lstat``/``stat``) cannot be trusted.

    Owned by root or ``me``, and not writable by group or others; a directory that is
    writable by others but sticky (``/tmp``) is fine: nobody can replace another's file in it.
    """
    if not _trusted_uid(st.st_uid, me):
        return f"{path} is owned by uid {st.st_uid}, not by root or uid {me}"
    if stat.S_ISLNK(st.st_mode):
        return None  # a symlink's own mode means nothing; its directory and target are checked
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
        return f"{path} is writable by group or others"
    return None


def process_refusal(pid: int, uids: Sequence[int], me: int) -> Optional[str]:
    """Why the process ``pid`` (its real, effective, ... uids) cannot be trusted."""
    for uid in uids:
        if not _trusted_uid(uid, me):
            return f"pid {pid} runs as uid {uid}, not as root or uid {me}"
    return None


def listener_refusal(where: str, uids: Iterable[int], me: int) -> Optional[str]:
    """Why what listens at ``where`` (the owners of its listening sockets) cannot be
    trusted with a secret: one is neither root nor ``me``."""
    for uid in sorted(uids):
        if not _trusted_uid(uid, me):
            return f"{where} is listened on by uid {uid}, not by root or uid {me}"
    return None


class Refused(Exception):
    """A file that must not be trusted; ``str()`` names it and says why."""


MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _parts(path: str) -> list[str]:
    """The names of ``path`` as a stack: the next one last."""
    return [part for part in path.split("/") if part][::-1]


def open_trusted(path: str, me: int, *, directory: bool = False) -> int:
    """A read-only descriptor of the regular file ``path`` (of the directory, when
    ``directory``), opened only if it and every directory from ``/`` down to it pass
    :func:`file_refusal` (root's or ``me``'s, not writable by group or others; directories
    that are may be sticky, since everything under them must be root's or ``me``'s too); a
    symlink on the way is followed when it is root's or ``me``'s, at most :data:`MAX_SYMLINKS`.

    Checked on what was opened: each directory is ``os.open(name, O_DIRECTORY|O_NOFOLLOW,
    dir_fd=parent)`` then ``fstat``, the file ``O_NOFOLLOW|O_NONBLOCK`` (a FIFO does not
    block the open) then ``fstat``, so no rename between a check and the next step changes
    what is read. :class:`Refused` when a rule is broken; ``OSError`` when the path cannot be
    walked (``FileNotFoundError``: there is no such file).
    """
    if not os.path.isabs(path):
        raise Refused(f"{path} is not an absolute path")
    walk = _Walk(path, me, directory)
    try:
        while True:
            reason = file_refusal(walk.where, os.fstat(walk.fd), me)
            if reason:
                raise Refused(reason)
            if not walk.todo:  # the path named a directory
                if directory:
                    return walk.fd
                raise Refused(f"{path} is not a regular file")
            found = walk.step(walk.todo.pop())
            if found is not None:
                return found
    except BaseException:
        os.close(walk.fd)
        raise


class _Walk:
    """Where :func:`open_trusted` is: the descriptor it holds (``fd``, the directory named
    ``where``; at the end the file), the names still to walk (a stack), the symlinks followed."""

    def __init__(self, path: str, me: int, directory: bool = False) -> None:
        self.path, self.me, self.directory = path, me, directory
        self.fd, self.where, self.todo, self.hops = os.open("/", _DIR_FLAGS), "/", _parts(path), 0

    def _hold(self, fd: int, where: str) -> None:
        """``fd`` (named ``where``) in place of the descriptor held, which is closed."""
        os.close(self.fd)
        self.fd, self.where = fd, where

    def step(self, name: str) -> Optional[int]:
        """One name of the path from the directory held: the file's descriptor at the end
        (checked), else ``None`` with the walk moved on (into a directory, or to a symlink's
        target names)."""
        if name in (".", ".."):  # the walk holds no symlink: ".." is lexical
            parent = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
            self._hold(parent, os.path.normpath(os.path.join(self.where, name)))
            return None
        here = os.path.join(self.where, name)
        link = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if stat.S_ISLNK(link.st_mode):
            self._follow(name, here, link)
            return None
        if self.todo or self.directory:
            self._hold(os.open(name, _DIR_FLAGS, dir_fd=self.fd), here)
            return None
        self._hold(os.open(name, _FILE_FLAGS, dir_fd=self.fd), here)
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{here} is not a regular file")
        reason = file_refusal(here, st, self.me)
        if reason:
            raise Refused(reason)
        return self.fd

    def _follow(self, name: str, here: str, link: os.stat_result) -> None:
        """A symlink root's or ``me``'s: its target's names next, from ``/`` if absolute."""
        self.hops += 1
        reason = file_refusal(here, link, self.me)
        if reason or self.hops > MAX_SYMLINKS:
            raise Refused(reason or f"{self.path}: more than {MAX_SYMLINKS} symlinks")
        target = os.readlink(name, dir_fd=self.fd)
        self.todo.extend(_parts(target))
        if target.startswith("/"):
            self._hold(os.open("/", _DIR_FLAGS), "/")


def _chain(path: str) -> list[str]:
    """``path``, then each symlink target in turn (at most 40 hops, as the kernel allows)."""
    hops = [path]
    for _ in range(40):
        if not os.path.islink(hops[-1]):
            break
        target = os.readlink(hops[-1])
        hops.append(os.path.normpath(os.path.join(os.path.dirname(hops[-1]), target)))
    return hops


def interpreter_refusal(path: str, me: int) -> Optional[str]:
    """Why the executable ``path`` cannot be trusted: each hop of its symlink chain and the
    directory holding each hop must pass :func:`file_refusal`."""
    if not os.path.isabs(path):
        return f"{path} is not an absolute path"
    try:
        for hop in _chain(path):
            for item in (hop, os.path.dirname(hop)):
                reason = file_refusal(item, os.lstat(item), me)
                if reason:
                    return reason
    except OSError as err:
        return f"cannot stat {path}: {err.strerror}"
    return None


def raylet_python_refusal(pid: int, process_uids: Sequence[int], python: str) -> Optional[str]:
    """Why the Python a raylet's command line names must not be run by this rayscope: the
    raylet process and the interpreter file must both be root's or this user's."""
    me = os.geteuid()
    reason = process_refusal(pid, process_uids, me) or interpreter_refusal(python, me)
    return f"refused {python} named by raylet pid {pid}: {reason}" if reason else None


def parent_import_path(module: str) -> list[str]:
    """The directories this process finds ``module`` in, for a child under this same
    interpreter run with ``-I`` (no ``PYTHONPATH``, no user site) to search too; only those
    root or this user owns and nobody else can write."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    locations = spec.submodule_search_locations if spec is not None else None
    directories = sorted({os.path.dirname(path) for path in locations or []})
    return [d for d in directories if _trusted_directory(d)]


def _trusted_directory(path: str) -> bool:
    try:
        return file_refusal(path, os.stat(path), os.geteuid()) is None
    except OSError:
        return False


def with_import_path(source: str, paths: Sequence[str]) -> str:
    """``source`` (a ``-c`` program) that first appends ``paths`` to ``sys.path``: after the
    interpreter's own directories, so they can add ray but never shadow the standard library."""
    return f"import sys; sys.path.extend({list(paths)!r})\n{source}" if paths else source


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a child process gets: the names Ray needs, nothing else."""
    return {k: v for k, v in environ.items() if k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)}
