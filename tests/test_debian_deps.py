"""``make test``'s Debian packages (tests/debian_deps.py): nothing runs when all are here, the
missing one is named by package, and a test that needs it fails saying how to get it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import debian_deps

REPO = Path(__file__).resolve().parent.parent
FAKES = ("apt-get", "sudo", "systemctl")


def bin_without(root: Path, *absent: str) -> Path:
    """A folder of links to every command of the table (and ``env``) but ``absent``."""
    folder = root / "bin"
    folder.mkdir()
    for command in [*debian_deps.PACKAGES, "env"]:
        found = shutil.which(command, path=debian_deps._search(None))
        assert found, f"this host lacks {command}, which the rest of the suite needs"
        if command not in absent:
            (folder / command).symlink_to(found)
    return folder


def recorders(root: Path) -> tuple[Path, Path]:
    """A folder whose apt-get, sudo and systemctl only append their argv to the log."""
    folder, log = root / "fakes", root / "calls.log"
    folder.mkdir()
    for name in FAKES:
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        script.chmod(0o755)
    return folder, log


def run(path: str, *args: str) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        [sys.executable, "-m", "tests.debian_deps", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_path_without_bwrap_misses_bubblewrap_only(tmp_path: Path) -> None:
    assert debian_deps.missing(str(bin_without(tmp_path, "bwrap"))) == ["bubblewrap"]
    assert debian_deps.missing(str(tmp_path / "empty")) == list(dict.fromkeys(debian_deps.PACKAGES.values()))


def test_with_every_package_here_nothing_is_installed(tmp_path: Path) -> None:
    fakes, log = recorders(tmp_path)
    done = run(f"{fakes}{os.pathsep}{os.environ['PATH']}")
    assert (done.returncode, done.stderr) == (0, "")
    assert not log.exists(), log.read_text()  # no apt-get, no sudo: no network


def test_a_missing_package_is_installed_and_named_where_it_cannot_be(tmp_path: Path) -> None:
    fakes, log = recorders(tmp_path)
    path = f"{fakes}{os.pathsep}{bin_without(tmp_path, 'bwrap')}"
    done = run(path)
    calls = log.read_text().splitlines()
    apt = [call.replace("sudo -n ", "").replace("sudo ", "") for call in calls]
    assert "apt-get install -y -qq --no-install-recommends bubblewrap" in apt, calls
    assert done.returncode == 1  # the fake installed nothing: make debian-deps fails
    assert "still missing bubblewrap" in done.stderr
    assert "sudo apt-get install -y --no-install-recommends bubblewrap" in done.stderr
    assert run(path, "--keep-going").returncode == 0  # make test goes on; the tests say it


def test_a_test_that_needs_a_missing_command_fails_naming_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(bin_without(tmp_path, "bwrap")))
    monkeypatch.setattr(debian_deps, "SBIN", ())
    with pytest.raises(pytest.fail.Exception) as failed:
        debian_deps.need("bwrap")
    assert "Debian's bubblewrap package" in str(failed.value)
    assert "apt-get install -y --no-install-recommends bubblewrap" in str(failed.value)
    assert debian_deps.need("promtool") == str(tmp_path / "bin" / "promtool")
