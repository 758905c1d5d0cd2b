"""The Debian packages the suite runs beside .venv: which command each gives, which are missing
on this PATH, and their install (apt-get, as root or with sudo; nothing at all when none is).

``python -m tests.debian_deps`` (``make debian-deps``) installs what is missing and fails where
it cannot; ``--keep-going`` (``make test``) says what it could not install and exits 0, so the
suite runs and each test that needs a missing command fails naming its package (:func:`need`).
Standard library only: it runs under the system Python before ``.venv`` exists.
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Optional

PACKAGES = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "chromium": "chromium",
    "systemd-analyze": "systemd",
    "bwrap": "bubblewrap",
    "setpriv": "util-linux",
    "prlimit": "util-linux",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
    "cc": "gcc",
}
"""Each command a test runs that .venv does not give → the Debian package that gives it."""

APT_TIMEOUT_S = 900
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
"""Searched after $PATH: a user's PATH lacks them, and ``ip`` lives there."""


def install_command(packages: Sequence[str]) -> str:
    return f"sudo apt-get install -y --no-install-recommends {' '.join(packages)}"


def _search(path: Optional[str]) -> str:
    return path if path is not None else os.pathsep.join([os.environ.get("PATH", ""), *SBIN])


def why_missing(command: str, path: Optional[str] = None) -> str:
    """``""`` when ``command`` is on ``path`` (default: $PATH, then the sbin folders), else the
    line that names its package and how to install it."""
    if shutil.which(command, path=_search(path)) is not None:
        return ""
    package = PACKAGES[command]
    return (
        f"{command} not found on PATH: Debian's {package} package gives it; "
        f"`make debian-deps` or `{install_command([package])}` installs it"
    )


def need(command: str) -> str:
    """The path of ``command``; the calling test fails naming its package when it is missing."""
    import pytest

    why = why_missing(command)
    if why:
        pytest.fail(why)
    found = shutil.which(command, path=_search(None))
    assert found is not None
    return found


def missing(path: Optional[str] = None) -> list[str]:
    """The packages some of whose commands are not on ``path``, each once, in table order."""
    return list(dict.fromkeys(package for command, package in PACKAGES.items() if why_missing(command, path)))


def _privilege() -> Optional[list[str]]:
    """The prefix that runs apt-get as root: none as root, sudo where there is one."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") is None:
        return None
    return ["sudo"] if sys.stdin.isatty() else ["sudo", "-n"]


def _run(argv: list[str]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        return subprocess.run(argv, env=env, timeout=APT_TIMEOUT_S, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"debian-deps: {' '.join(argv)}: {error}", file=sys.stderr)
        return False


def install(packages: Sequence[str]) -> bool:
    """apt-get update and install ``packages``; False where that cannot be done here."""
    prefix = _privilege()
    if prefix is None:
        print("debian-deps: not root and no sudo", file=sys.stderr)
        return False
    apt = [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    if not (
        _run([*apt, "update", "-qq"])
        and _run([*apt, "install", "-y", "-qq", "--no-install-recommends", *packages])
    ):
        return False
    if "prometheus" in packages and os.path.isdir("/run/systemd/system"):
        _run([*prefix, "systemctl", "disable", "--now", "prometheus"])  # the tests start their own
    return True


def main(argv: Sequence[str]) -> int:
    keep_going = "--keep-going" in argv
    wanted = missing()
    if not wanted:
        return 0
    print(f"debian-deps: installing {' '.join(wanted)}", file=sys.stderr)
    install(wanted)
    left = missing()
    if not left:
        return 0
    print(
        f"debian-deps: still missing {' '.join(left)}; the tests that need them fail until "
        f"`{install_command(left)}` runs",
        file=sys.stderr,
    )
    return 0 if keep_going else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
