"""Cron output as root on a shared node: ``--output`` and ``--append`` never follow a symlink
(SECURITY.md rule 1), and an ``--append`` line is written whole or not at all.
"""

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayscope.errors import AgentError
from rayscope.sinks import files
from tests.conftest import REPO
from tests.reliability_plugin import FaultRecord
from tests.support import dirs

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
    """Positive control: drop ``O_NOFOLLOW`` in ``files.append_line`` and root's line lands
    in the victim."""
    link, victim = planted
    with pytest.raises(AgentError) as caught:
        files.append_line(str(link), '{"a": 1}')
    assert caught.value.exit_code == files.EXIT_CANNOT_WRITE
    assert "is a symlink" in str(caught.value) and "\n" not in str(caught.value)
    assert victim.read_text() == "root's data\n"


@needs_root
def test_output_never_replaces_or_follows_a_planted_symlink(planted: tuple[Path, Path]) -> None:
    """Positive control: drop the ``lstat`` check in ``files.write_atomic``: the symlink is
    replaced by a file that took the victim's mode."""
    link, victim = planted
    with pytest.raises(AgentError) as caught:
        files.write_atomic(str(link), "new\n")
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
    Positive control: drop the ``ftruncate`` in ``files.append_line``: the seventh line's
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
                files.append_line(str(path), json.dumps({"n": i, "pad": "x" * 10_000}))
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
        files.append_line(str(path), '{"n": "after"}')
        assert json.loads(path.read_text().splitlines()[-1]) == {"n": "after"}
        fault.observe(f"{written} whole lines, {len(failures)} refused ({failures[0]}); no fragment")


# --- files another user planted in a shared directory ---------------------------

APPEND_IN_CHILD = """
import sys
from rayscope.sinks import files
from rayscope.errors import AgentError
try:
    files.append_line(sys.argv[1], '{"a": 1}', lock_wait_s=float(sys.argv[2]))
except TypeError:  # the code before this had no lock_wait_s
    files.append_line(sys.argv[1], '{"a": 1}')
except AgentError as err:
    print(err.exit_code, err)
    sys.exit(0)
print("appended")
"""


def _append_in_child(path: Path, lock_wait_s: float = 1.0, timeout_s: float = 10.0) -> str:
    """``append_line`` in a child process (a blocked ``open`` cannot be interrupted in a
    thread): what it printed, or ``"blocked"`` when it was still waiting at ``timeout_s``."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", APPEND_IN_CHILD, str(path), str(lock_wait_s)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "blocked"
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like /tmp: world-writable and sticky, where uid 65534 plants things."""
    with dirs.open_dir("rayscope-shared-", 0o1777) as base:
        yield base


def _plant_fifo(path: Path) -> None:
    os.mkfifo(path, 0o666)
    os.chown(path, NOBODY, NOBODY)


@needs_root
def test_append_never_blocks_on_a_planted_fifo(shared: Path) -> None:
    """uid 65534 makes a FIFO at the ``--append`` path: root's cron job must not wait for a
    reader (for ever, and the next one too). Positive control: drop ``O_NONBLOCK`` in
    ``files.append_line``: the child is still blocked in ``open`` after 10 s."""
    fifo = shared / "status.ndjson"
    _plant_fifo(fifo)
    said = _append_in_child(fifo)
    assert (
        said
        == f"3 cannot append to {fifo}: it is a FIFO, not a regular file (rayscope writes regular files only)"
    )


@needs_root
def test_append_writes_nothing_into_a_fifo_someone_reads(shared: Path) -> None:
    """With the planter reading the FIFO, a non-blocking open succeeds: what was opened is
    checked before a byte is written. Positive control: drop the ``fstat`` check."""
    fifo = shared / "status.ndjson"
    _plant_fifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(AgentError) as caught:
            files.append_line(str(fifo), '{"a": 1}')
        try:
            came_through = os.read(reader, 100)
        except BlockingIOError:  # a writer still has it open, and wrote nothing
            came_through = b""
        assert came_through == b""
    finally:
        os.close(reader)
    assert caught.value.exit_code == files.EXIT_CANNOT_WRITE and "is a FIFO" in str(caught.value)


@needs_root
def test_output_refuses_a_fifo_and_appends_refuse_a_device(shared: Path) -> None:
    """``--output`` never replaces what is not a regular file; ``--append`` to a character
    device (``/dev/null`` named directly, or a node planted) is refused, not written."""
    fifo = shared / "status.prom"
    _plant_fifo(fifo)
    with pytest.raises(AgentError) as caught:
        files.write_atomic(str(fifo), "x\n")
    assert str(caught.value) == (
        f"cannot write {fifo}: it is a FIFO, not a regular file (rayscope writes regular files only)"
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(AgentError) as caught:
        files.append_line("/dev/null", "x")
    assert "it is a character device, not a regular file" in str(caught.value)


@needs_root
def test_output_never_takes_the_mode_of_a_file_another_user_planted(shared: Path) -> None:
    """uid 65534 plants a 6777 file at the ``--output`` path. Before: root's file replaced it
    and kept 6777 (set-uid root, writable by everyone). Now it is refused, untouched."""
    target = shared / "status.prom"
    target.write_text("planted\n")
    os.chown(target, NOBODY, NOBODY)
    target.chmod(0o6777)
    with pytest.raises(AgentError) as caught:
        files.write_atomic(str(target), "root's\n")
    assert caught.value.exit_code == files.EXIT_CANNOT_WRITE
    assert str(caught.value) == (
        f"cannot write {target}: it belongs to uid {NOBODY}, not to root or uid 0"
        " (remove it, or name a file of your own)"
    )
    st = os.lstat(target)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), target.read_text()) == (NOBODY, 0o6777, "planted\n")
    assert not [p for p in shared.iterdir() if p.name.endswith(".tmp")]


@needs_root
def test_append_refuses_a_file_another_user_owns(shared: Path) -> None:
    """The same rule for ``--append``: a file uid 65534 owns is theirs to rewrite, so root's
    lines in it prove nothing. Positive control: drop the owner check: the line is appended."""
    target = shared / "status.ndjson"
    target.write_text("")
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(AgentError) as caught:
        files.append_line(str(target), '{"a": 1}')
    assert f"it belongs to uid {NOBODY}, not to root or uid 0" in str(caught.value)
    assert target.read_text() == ""


@needs_root
def test_a_lock_held_by_another_user_does_not_hang_append(shared: Path) -> None:
    """Anyone who can read root's 0644 ``--append`` file can ``flock`` it and never let go.
    Before: root's append waited for the lock for ever. Now it gives up after its wait."""
    target = shared / "status.ndjson"
    target.write_text("")
    target.chmod(0o644)
    holder = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "flock", "--shared", str(target), "-c", "echo held; sleep 60"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        said = _append_in_child(target, lock_wait_s=1.0)
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
    assert said == f"3 cannot append to {target}: another process has held its lock for 1 s (nothing written)"
    assert target.read_text() == ""


def test_output_keeps_the_permissions_of_its_own_file_but_never_set_uid(tmp_path: Path) -> None:
    """A file of this user's keeps its permission bits (an operator's ``chmod 640``), never
    set-uid, set-gid or sticky bits."""
    target = tmp_path / "status.prom"
    target.write_text("old\n")
    target.chmod(0o6755)
    files.write_atomic(str(target), "new\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755 and target.read_text() == "new\n"


# --- a hard link planted in the output directory -------------------------------------------
# A hard link is not a symlink: O_NOFOLLOW and lstat see a regular file root owns, and the
# name in the shared directory is one more name of root's file elsewhere (/etc/..., a log).


@pytest.fixture
def linked(shared: Path) -> Iterator[tuple[Path, Path]]:
    """(link, target): ``target`` is root's file outside ``shared``; ``link`` its second
    name in ``shared``, where the cron job writes."""
    with dirs.open_dir("rayscope-elsewhere-", 0o700) as elsewhere:
        target = elsewhere / "passwd-like"
        target.write_text("root:x:0:0::/root:/bin/sh\n")
        target.chmod(0o644)
        link = shared / "status.ndjson"
        os.link(target, link)
        yield link, target


def _status_through_fake_head(*words: str) -> "subprocess.CompletedProcess[str]":
    from tests import scenarios
    from tests.conftest import run_rayscope
    from tests.support.fake_head import fake_head

    with fake_head(scenarios.seed_status()) as head:
        return run_rayscope("status", "--json", "--head", head.url, *words, timeout=30)


@pytest.mark.parametrize("option", ["--append", "--output"])
def test_status_never_writes_through_a_planted_hard_link(option: str, linked: tuple[Path, Path]) -> None:
    """``status --json --append LINK`` (and ``--output``) where LINK is a second name of a
    file elsewhere: refused in one line naming the path and the reason, exit 3, the target
    untouched and LINK still its second name. Before: ``--append`` added root's line to the
    target, and ``--output`` replaced LINK (exit 0)."""
    link, target = linked
    before = target.read_bytes()
    done = _status_through_fake_head(option, str(link))
    verb = "append to" if option == "--append" else "write"
    assert done.returncode == files.EXIT_CANNOT_WRITE, done.stderr
    assert done.stderr == (
        f"rayscope: cannot {verb} {link}: it has 2 hard links, so it is also a file of another name"
        " elsewhere (rayscope writes a file of one name only: remove it, or name a new file)\n"
    )
    assert target.read_bytes() == before and done.stdout == ""
    assert os.lstat(link).st_ino == os.stat(target).st_ino and os.stat(target).st_nlink == 2


@pytest.mark.parametrize("option", ["--append", "--output"])
def test_status_writes_a_file_of_one_name(option: str, tmp_path: Path) -> None:
    """Positive control for the hard-link refusal: a file with one link (and a new one) is
    written."""
    for target in (tmp_path / "new", tmp_path / "old"):
        if target.name == "old":
            target.write_text("")
        done = _status_through_fake_head(option, str(target))
        assert done.returncode in (0, 1), done.stderr
        assert json.loads(target.read_text().splitlines()[0] if option == "--append" else target.read_text())


def test_append_checks_the_links_of_what_it_opened(shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: nothing is at the path when rayscope looks, a hard link is there when it
    opens. A check by path before the open (``lstat``) passes; the check of the opened
    descriptor (``fstat``) refuses."""
    with dirs.open_dir("rayscope-elsewhere-", 0o700) as elsewhere:
        target = elsewhere / "log"
        target.write_text("kept\n")
        link = shared / "status.ndjson"
        real_open = os.open

        def plant_then_open(path: "str | os.PathLike[str]", *args: object, **kwargs: object) -> int:
            if os.fspath(path) == str(link) and not os.path.lexists(link):
                os.link(target, link)  # the planter wins the race
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", plant_then_open)
        with pytest.raises(AgentError) as caught:
            files.append_line(str(link), '{"a": 1}')
        monkeypatch.undo()
        assert "it has 2 hard links" in str(caught.value)
        assert target.read_text() == "kept\n"


def test_the_heads_usage_state_refuses_a_hard_link(linked: tuple[Path, Path]) -> None:
    """``head --usage-state FILE`` is written as ``--output`` is: a FILE that is a second name
    of a file elsewhere stops the head at its start (the first save), the file untouched."""
    from rayscope.head.store.usage_store import open_store

    link, target = linked
    before = target.read_bytes()
    with pytest.raises(AgentError) as caught:
        open_store(3600.0, 5.0, str(link), 0.0, 1_800_000_000.0)
    assert caught.value.exit_code == files.EXIT_CANNOT_WRITE and "it has 2 hard links" in str(caught.value)
    assert target.read_bytes() == before and os.stat(target).st_nlink == 2
