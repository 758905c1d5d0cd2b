"""Cron output as root on a shared node: ``--output`` and ``--append`` never follow a symlink
(SECURITY.md rule 1), and an ``--append`` line is written whole or not at all (issue 11).
"""

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import output
from agent.errors import AgentError
from tests.reliability_plugin import FaultRecord

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting as another uid and mounting need root")


@pytest.fixture
def planted() -> Iterator[tuple[Path, Path]]:
    """(symlink, victim): uid 65534's world-writable directory holds ``status.out``, a
    symlink it planted to a file only root may write."""
    base = Path(tempfile.mkdtemp(prefix="rayscope-symlink-"))
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    os.chown(shared, NOBODY, NOBODY)
    victim = base / "victim"
    victim.write_text("root's data\n")
    victim.chmod(0o600)
    link = shared / "status.out"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    yield link, victim
    shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_append_never_follows_a_planted_symlink(planted: tuple[Path, Path]) -> None:
    """Positive control: drop ``O_NOFOLLOW`` in ``output.append_line`` and root's line lands
    in the victim."""
    link, victim = planted
    with pytest.raises(AgentError) as caught:
        output.append_line(str(link), '{"a": 1}')
    assert caught.value.exit_code == output.EXIT_CANNOT_WRITE
    assert "is a symlink" in str(caught.value) and "\n" not in str(caught.value)
    assert victim.read_text() == "root's data\n"


@needs_root
def test_output_never_replaces_or_follows_a_planted_symlink(planted: tuple[Path, Path]) -> None:
    """Positive control: drop the ``lstat`` check in ``output.write_atomic``: the symlink is
    replaced by a file that took the victim's mode."""
    link, victim = planted
    with pytest.raises(AgentError) as caught:
        output.write_atomic(str(link), "new\n")
    assert "is a symlink" in str(caught.value)
    assert link.is_symlink() and victim.read_text() == "root's data\n"
    assert not [p for p in link.parent.iterdir() if p.name.endswith(".tmp")]


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    mount_point = Path(tempfile.mkdtemp(prefix="rayscope-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        mount_point.rmdir()


@needs_root
@pytest.mark.fault
def test_a_full_disk_never_leaves_a_fragment_in_append(fault: FaultRecord) -> None:
    """Lines of 10 kB appended to a 64 kB tmpfs until the disk is full: every line in the file
    is whole (one JSON document and its newline), and the file ends at a line's end.
    Positive control: drop the ``ftruncate`` in ``output.append_line``: the seventh line's
    first 5,536 bytes stay behind, and the file no longer parses line by line."""
    fault.expect(
        "disk fills during --append (a 64 KiB tmpfs)",
        "every line in the file is whole, the failed write is one line on stderr, the next line starts clean",
    )
    with small_tmpfs("64k") as disk:
        path = disk / "status.ndjson"
        written = 0
        failures: list[str] = []
        for i in range(12):
            try:
                output.append_line(str(path), json.dumps({"n": i, "pad": "x" * 10_000}))
                written += 1
            except AgentError as err:
                failures.append(str(err))
        data = path.read_bytes()
        fragment = data.rpartition(b"\n")[2]
        assert not fragment, f"a fragment of {len(fragment)} bytes was left"
        lines = data.decode().splitlines()
        assert [json.loads(line)["n"] for line in lines] == list(range(written))
        assert failures and all("\n" not in f and "no space" in f.lower() for f in failures)
        # The next good line after the disk frees up is not glued to anything.
        path.write_bytes(data[: len(data) // 2].rpartition(b"\n")[0] + b"\n")
        output.append_line(str(path), '{"n": "after"}')
        assert json.loads(path.read_text().splitlines()[-1]) == {"n": "after"}
        fault.observe(f"{written} whole lines, {len(failures)} refused ({failures[0]}); no fragment")
