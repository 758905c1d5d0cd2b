"""The launcher inside rayscope.pyz (``_rayscope_launch.py`` there): unpack the bundled
libraries once per build into a per-user cache, put them on ``sys.path``, run the CLI.

Runs from the zip before any bundled package is importable, so it uses the standard
library only, plus shiv's ``_bootstrap`` (beside it in the zip) for the locked, atomic
unpacking of a new build. ``__main__.py`` has already refused Pythons older than 3.9.

The cache: ``$RAYSCOPE_CACHE``, else ``$XDG_CACHE_HOME/rayscope``, else
``~/.cache/rayscope``; one directory per build (``<build id>/site-packages``), shared by
every Python and every copy of the same file. Each running rayscope holds a shared lock on
its build's ``.in-use`` file for its lifetime; any run prunes the other builds that no
process holds (a ``push`` agent still running an old build keeps it).

The cache holds code this process runs, so it must be this user's (or root's) and writable by
nobody else, and so must every directory above it, or someone could rename it away and put
theirs in its place (SECURITY.md, rule 1): such a cache is refused in one line that names the
directory and the fix, before anything in it is used. The check walks down from ``/`` on
opened directories (:func:`open_cache`).
"""

import contextlib
import fcntl
import importlib
import importlib.machinery
import json
import os
import stat
import sys
from collections.abc import Mapping
from typing import Any, Optional

CACHE_ENV = "RAYSCOPE_CACHE"
BUILD_INFO = "_rayscope_build.json"
SITE_PACKAGES = "site-packages"
ARCH_DIR = "_arch"
IN_USE = ".in-use"
TRASH_PREFIX = ".trash-"
BUILD_ID_CHARS = 16
REMEDY = (
    f"set {CACHE_ENV} to a writable directory on a filesystem that allows executables,"
    f" e.g. {CACHE_ENV}=/var/tmp/rayscope-$USER"
)


EXIT_CANNOT_START = 2
"""A launch that failed reads nothing: rayscope's "no data" (``rayscope.errors.EXIT_NO_DATA``;
a test holds them equal), never status' 1, which means a partial answer."""


class LaunchError(Exception):
    """Why rayscope.pyz cannot start here; ``str()`` is the operator's one line."""


def cache_root(environ: Mapping[str, str], home: str) -> str:
    """Where builds are unpacked: ``$RAYSCOPE_CACHE``, else ``$XDG_CACHE_HOME/rayscope``
    (an absolute one: the XDG spec says to ignore a relative value), else
    ``~/.cache/rayscope``."""
    explicit = environ.get(CACHE_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "rayscope")
    if not os.path.isabs(home):
        raise LaunchError(f"no home directory to hold the cache: {REMEDY}")
    return os.path.join(home, ".cache", "rayscope")


def build_dir(root: str, build_id: str) -> str:
    return os.path.join(root, build_id[:BUILD_ID_CHARS])


def check_supported(info: Mapping[str, Any], extension_suffix: str, machine: str) -> None:
    """Refuse, in one line, an interpreter or machine the bundled native libraries do not fit.

    ``extension_suffix`` is this interpreter's (``.cpython-311-x86_64-linux-gnu.so``): it
    names the Python version, the machine, the C library and a free-threaded build at once.
    """
    if extension_suffix in info["extension_suffixes"] and machine in info["machines"]:
        return
    pythons = info["pythons"]
    raise LaunchError(
        f"rayscope.pyz bundles native libraries for CPython {pythons[0]}-{pythons[-1]} on Linux"
        f" ({', '.join(info['machines'])}, glibc), not for this Python"
        f" ({sys.implementation.name} {sys.version.split()[0]}, {machine}, {extension_suffix})"
    )


def prepare_root(root: str) -> None:
    """Create the cache root (private to this user) and make sure builds can live and run there."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        flags = os.statvfs(root).f_flag
    except OSError as err:
        raise LaunchError(f"cannot create its cache {root} ({err.strerror}): {REMEDY}") from None
    if flags & os.ST_NOEXEC:
        raise LaunchError(
            f"its cache {root} is on a filesystem mounted noexec, where native libraries"
            f" cannot load: {REMEDY}"
        )
    if flags & os.ST_RDONLY or not os.access(root, os.W_OK | os.X_OK):
        raise LaunchError(f"its cache {root} is read-only: {REMEDY}")


MAX_SYMLINKS = 40
"""Symlinks followed on the way to the cache, as the kernel allows."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _trusted_owner(uid: int, me: int) -> bool:
    return uid in (0, me)


def _dir_refusal(root: str, where: str, st: os.stat_result, me: int, is_cache: bool) -> Optional[str]:
    """Why the directory ``where`` (its ``fstat``), on the way down to the cache ``root`` or
    the cache itself, makes the cache untrusted; ``None`` if it does not."""
    if is_cache:
        if not _trusted_owner(st.st_uid, me):
            return (
                f"its cache {root} belongs to uid {st.st_uid}, not to you (uid {me}), so its code"
                f" cannot be trusted: remove it, or `chown -R {me} {root}` if it is yours, or {REMEDY}"
            )
        if st.st_mode & 0o022:
            return (
                f"its cache {root} is writable by group or others, so its code cannot be trusted:"
                f" `chmod go-w {root}`, or {REMEDY}"
            )
        return None
    if not _trusted_owner(st.st_uid, me):
        return (
            f"its cache {root} is under {where}, which belongs to uid {st.st_uid}, not to you"
            f" (uid {me}) or root, so its code cannot be trusted: {REMEDY}"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (
            f"its cache {root} is under {where}, which is writable by group or others and not"
            f" sticky, so its code cannot be trusted: {REMEDY}"
        )
    return None  # sticky (/tmp): nobody but its owner, root or you, renames what is next


def open_cache(root: str) -> int:
    """A descriptor of the cache directory ``root``, once every directory from ``/`` down to
    it is trusted: root's or this user's, and not writable by group or others (a sticky one
    such as ``/tmp`` may be: then only the owner of what comes next, root's or this user's
    too, can rename it); the cache itself not writable by group or others at all. What is
    missing is created (mode 0700) and checked like the rest.

    Checked on the opened directories: each step is ``os.open(name, O_DIRECTORY | O_NOFOLLOW,
    dir_fd=parent)`` then ``fstat`` of what was opened, so no rename between a check and the
    next step can put another directory under the walk. A symlink on the way is followed
    when it is root's or this user's (it lives in a directory already checked), its target
    walked the same way. Once the whole chain is trusted, nobody else can change what the
    path names: callers may use the path (:func:`run` checks it still names this directory).
    :class:`LaunchError` names the directory that broke the rule.
    """
    if not os.path.isabs(root):
        raise LaunchError(f"its cache {root} is not an absolute path: {REMEDY}")
    walk = _Walk(root)
    try:
        while True:
            reason = _dir_refusal(root, walk.where, os.fstat(walk.fd), walk.me, is_cache=not walk.todo)
            if reason:
                raise LaunchError(reason)
            if not walk.todo:
                return walk.fd
            walk.step(walk.todo.pop())
    except OSError as err:
        walk.close()
        raise LaunchError(
            f"cannot open its cache {root} ({err.strerror} at {walk.where}): {REMEDY}"
        ) from None
    except BaseException:
        walk.close()
        raise


def _parts(path: str) -> list[str]:
    """The names of ``path``, as a stack: the next one last."""
    return [part for part in path.split("/") if part][::-1]


class _Walk:
    """:func:`open_cache`'s position: the opened directory ``fd`` (at ``where``, a path
    without symlinks) and the names still to walk."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.me = os.geteuid()
        self.fd = os.open("/", _DIR_FLAGS)
        self.where = "/"
        self.todo = _parts(root)
        self.hops = 0

    def close(self) -> None:
        os.close(self.fd)

    def _move(self, fd: int, where: str) -> None:
        os.close(self.fd)
        self.fd, self.where = fd, where

    def step(self, name: str) -> None:
        """One name down (or up, or through a symlink); the caller checks where it lands."""
        if name == ".":
            return
        if name == "..":  # the walk has no symlinks left in it: ".." is lexical
            self._move(os.open("..", _DIR_FLAGS, dir_fd=self.fd), os.path.dirname(self.where))
            return
        link = self._entry(name)
        if stat.S_ISLNK(link.st_mode):
            self._follow(name, link)
            return
        self._move(os.open(name, _DIR_FLAGS, dir_fd=self.fd), os.path.join(self.where, name))

    def _entry(self, name: str) -> os.stat_result:
        """``name``'s own ``lstat`` in the current directory; created (0700) when missing."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
            except FileExistsError:  # another rayscope starting at the same moment
                pass
            except OSError as err:
                raise LaunchError(f"cannot create its cache {self.root} ({err.strerror}): {REMEDY}") from None
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def _follow(self, name: str, link: os.stat_result) -> None:
        """A symlink in a directory already checked: its target is walked when the link is
        root's or this user's (in a sticky directory, anyone else's could be theirs)."""
        self.hops += 1
        if self.hops > MAX_SYMLINKS:
            raise LaunchError(
                f"its cache {self.root} is reached through more than {MAX_SYMLINKS} symlinks: {REMEDY}"
            )
        if not _trusted_owner(link.st_uid, self.me):
            raise LaunchError(
                f"its cache {self.root} is reached through {os.path.join(self.where, name)}, a symlink"
                f" of uid {link.st_uid}, not yours (uid {self.me}) or root's, so its code cannot be"
                f" trusted: {REMEDY}"
            )
        target = os.readlink(name, dir_fd=self.fd)
        self.todo.extend(_parts(target))
        if target.startswith("/"):
            self._move(os.open("/", _DIR_FLAGS), "/")


def check_cache(root: str) -> None:
    """:func:`open_cache`, then the path checked to name the directory that was checked."""
    fd = open_cache(root)
    try:
        if not os.path.samestat(os.fstat(fd), os.stat(root)):
            raise LaunchError(f"its cache {root} was replaced while rayscope checked it: {REMEDY}")
    finally:
        os.close(fd)


def unpack(archive_path: str, build: str) -> None:
    """shiv's extraction: under a file lock, into ``<build>.tmp``, then one rename — so
    copies started at once unpack once, and none ever sees half a build."""
    import zipfile
    from pathlib import Path

    from _bootstrap import extract_site_packages  # type: ignore[import-not-found]

    try:
        with zipfile.ZipFile(archive_path) as archive:
            extract_site_packages(archive, Path(build))
    except OSError as err:
        raise LaunchError(f"cannot unpack into {build} ({err.strerror}): {REMEDY}") from None


def hold(build: str) -> Optional[int]:
    """A shared lock on a complete build, kept open for this process's life (a pruner then
    leaves the build alone); ``None`` if the build is missing or was pruned while we waited."""
    try:
        fd = os.open(os.path.join(build, IN_USE), os.O_RDONLY)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    if os.path.isdir(os.path.join(build, SITE_PACKAGES)):
        return fd
    os.close(fd)
    return None


def open_build(archive_path: str, root: str, build: str) -> Optional[int]:
    """The build unpacked and held: the lock's fd, or ``None`` for a complete build in a
    cache this user cannot write (run it unlocked)."""
    site_packages = os.path.join(build, SITE_PACKAGES)
    for _ in range(3):  # again only if a pruner took the build away between two steps
        fd = hold(build)
        if fd is not None:
            return fd
        if not os.path.isdir(site_packages):
            prepare_root(root)
            unpack(archive_path, build)
        try:
            os.close(os.open(os.path.join(build, IN_USE), os.O_WRONLY | os.O_CREAT, 0o644))
        except OSError:
            if os.path.isdir(site_packages):
                return None
    raise LaunchError(f"the cache {build} keeps disappearing while rayscope starts: {REMEDY}")


def prune(root: str, keep: str) -> list[str]:
    """Remove every build in ``root`` but ``keep`` that no running rayscope holds.

    A build is taken out of the way by one rename while its lock is held exclusively, so a
    rayscope starting it at that moment either holds it first or unpacks it afresh.
    Returns the names removed.
    """
    removed: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(TRASH_PREFIX):  # left by a pruner that died halfway
            _remove_tree(path)
            continue
        if name == keep or name.startswith(".") or name.endswith(".tmp"):
            continue
        try:
            fd = os.open(os.path.join(path, IN_USE), os.O_RDONLY)
        except OSError:  # not a build, or one being unpacked right now
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            trash = os.path.join(root, f"{TRASH_PREFIX}{name}-{os.getpid()}")
            os.rename(path, trash)
        except OSError:  # in use (or gone already)
            continue
        finally:
            os.close(fd)
        _remove_tree(trash)
        removed.append(name)
    return removed


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def import_paths(site_packages: str, machine: str) -> list[str]:
    """The unpacked tree, then this machine's copies of abi3 extensions (psutil's)."""
    return [site_packages, os.path.join(site_packages, ARCH_DIR, machine)]


def run(info: Mapping[str, Any], archive_path: str, environ: Mapping[str, str]) -> None:
    machine = os.uname().machine
    check_supported(info, importlib.machinery.EXTENSION_SUFFIXES[0], machine)
    root = cache_root(environ, os.path.expanduser("~"))
    build = build_dir(root, info["build_id"])
    check_cache(root)
    fd = open_build(archive_path, root, build)
    if fd is not None:
        with contextlib.suppress(OSError):  # housekeeping: never a reason not to answer
            prune(root, keep=os.path.basename(build))
    sys.path[0:0] = import_paths(os.path.join(build, SITE_PACKAGES), machine)
    module, _, attr = info["entry_point"].partition(":")
    entry = getattr(importlib.import_module(module), attr)
    sys.exit(entry())


def main() -> None:
    """Run from the zip: its loader gives the archive's path and the build facts."""
    loader: Any = globals().get("__loader__")
    archive_path = getattr(loader, "archive", None) or sys.argv[0]
    info = json.loads(loader.get_data(os.path.join(archive_path, BUILD_INFO)))
    try:
        run(info, archive_path, os.environ)
    except LaunchError as err:
        sys.stderr.write(f"rayscope: {err}\n")
        sys.exit(EXIT_CANNOT_START)
    except KeyboardInterrupt:  # Ctrl-C while unpacking or importing: no traceback
        sys.exit(130)
