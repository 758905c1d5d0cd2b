"""Local trust: what rayscope may run or follow on a node where other users run processes.

rayscope runs as root from cron on shared nodes, and everything it reads there can be planted
by a local user: a process named ``raylet``, the "Python" its command line names, a module in
the working directory, variables in the environment. The rule (SECURITY.md, rule 1): run
nothing unless root or the user running rayscope owns it, and nobody else can replace it.

Pure checks on ``stat`` results and uids, plus :func:`raylet_python_refusal`, which reads them
for one raylet; its one caller is :func:`agent.sources.raylet.find_raylets`. A refusal is a
sentence naming the object and the reason; ``None`` means trusted.

Also the environment of a child process (:func:`child_env`): only what Ray's client needs.
"""

import importlib.util
import os
import stat
from collections.abc import Mapping, Sequence
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
