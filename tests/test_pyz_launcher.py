"""The zipapp launcher's rules, without building the zipapp: where the cache is, what
it refuses, which builds it prunes. (tests/test_pyz.py runs the real file.)"""

import fcntl
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO
from tests.support import dirs

LAUNCHER = REPO / "build" / "launcher.py"
INFO: dict[str, Any] = {
    "pythons": ["3.9", "3.10", "3.11", "3.12", "3.13"],
    "machines": ["x86_64", "aarch64"],
    "extension_suffixes": [
        f".cpython-3{minor}-{machine}-linux-gnu.so"
        for minor in range(9, 14)
        for machine in ("x86_64", "aarch64")
    ],
}


@pytest.fixture(scope="module")
def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rayscope_launcher", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cache_root_follows_rayscope_cache_then_xdg_then_home(launcher: ModuleType) -> None:
    home = "/home/op"
    assert launcher.cache_root({}, home) == "/home/op/.cache/rayscope"
    assert launcher.cache_root({"XDG_CACHE_HOME": "/xdg"}, home) == "/xdg/rayscope"
    # The XDG spec: a relative value is invalid and ignored.
    assert launcher.cache_root({"XDG_CACHE_HOME": "rel"}, home) == "/home/op/.cache/rayscope"
    both = {"XDG_CACHE_HOME": "/xdg", "RAYSCOPE_CACHE": "/var/tmp/rs"}
    assert launcher.cache_root(both, home) == "/var/tmp/rs"
    with pytest.raises(launcher.LaunchError, match="RAYSCOPE_CACHE"):
        launcher.cache_root({}, "~")


def test_supported_interpreters_are_named_by_extension_suffix(launcher: ModuleType) -> None:
    launcher.check_supported(INFO, ".cpython-39-x86_64-linux-gnu.so", "x86_64")
    launcher.check_supported(INFO, ".cpython-313-aarch64-linux-gnu.so", "aarch64")
    refusals = [
        (".cpython-314-x86_64-linux-gnu.so", "x86_64"),  # too new for the bundled msgspec
        (".cpython-313t-x86_64-linux-gnu.so", "x86_64"),  # free-threaded build
        (".cpython-311-x86_64-linux-musl.so", "x86_64"),  # Alpine
        (".cpython-311-powerpc64le-linux-gnu.so", "ppc64le"),
    ]
    for suffix, machine in refusals:
        with pytest.raises(launcher.LaunchError) as err:
            launcher.check_supported(INFO, suffix, machine)
        assert "CPython 3.9-3.13 on Linux (x86_64, aarch64, glibc)" in str(err.value)
        assert suffix in str(err.value) and "\n" not in str(err.value)


def make_build(root: Path, name: str) -> Path:
    build = root / name
    (build / "site-packages").mkdir(parents=True)
    (build / ".in-use").touch()
    return build


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """An old build that a running rayscope (here: this test) holds."""
    build = make_build(tmp_path, "1111111111111111")
    fd = os.open(build / ".in-use", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    yield build
    os.close(fd)


def test_prune_removes_unheld_builds_only(launcher: ModuleType, tmp_path: Path, held: Path) -> None:
    current = make_build(tmp_path, "cccccccccccccccc")
    old = make_build(tmp_path, "0000000000000000")
    foreign = tmp_path / "not-a-build"
    foreign.mkdir()
    half_unpacked = tmp_path / "2222222222222222.tmp"
    half_unpacked.mkdir()
    leftover = tmp_path / ".trash-3333333333333333-99"
    (leftover / "site-packages").mkdir(parents=True)
    removed = launcher.prune(str(tmp_path), keep=current.name)
    assert removed == [old.name]
    assert not old.exists() and not leftover.exists()
    assert current.exists() and held.exists() and foreign.exists() and half_unpacked.exists()


def test_hold_gives_up_on_a_build_pruned_while_waiting(launcher: ModuleType, tmp_path: Path) -> None:
    build = make_build(tmp_path, "4444444444444444")
    fd = launcher.hold(str(build))
    assert fd is not None
    os.close(fd)
    (build / "site-packages").rmdir()  # what a pruner's rename leaves behind at this path
    assert launcher.hold(str(build)) is None
    assert launcher.hold(str(tmp_path / "missing")) is None


def test_prepare_root_creates_a_private_directory(launcher: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "a" / "rayscope"
    launcher.prepare_root(str(root))
    assert root.is_dir() and root.stat().st_mode & 0o077 == 0


def test_guard_refuses_old_pythons_in_one_line() -> None:
    """The guard's logic under this interpreter, told it is 3.8.18 (tests/test_pyz.py runs
    the real old interpreters found on the machine)."""
    guard = (REPO / "build" / "zipmain.py").read_text()
    program = f"import sys\nsys.version_info = (3, 8, 18, 'final', 0)\nexec({guard!r})"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=False
    )
    expected = (2, "", "rayscope needs Python 3.9+, this is 3.8.18\n")  # before: exit 1 ("partial")
    assert (done.returncode, done.stdout, done.stderr) == expected


PLANTED = "rayscope_planted"


@pytest.mark.parametrize(
    ("owner", "mode"), [(65534, 0o755), (None, 0o777), (None, 0o770)], ids=["other-owner", "o+w", "g+w"]
)
def test_a_cache_someone_else_can_write_is_refused(
    launcher: ModuleType, tmp_path: Path, owner: Any, mode: int
) -> None:
    """The attack: another user pre-creates the cache (``RAYSCOPE_CACHE=/var/tmp/rayscope-root``
    is the remedy the launcher itself suggests) with a complete build whose entry point is
    theirs. Positive control: drop ``check_cache`` in ``launcher.run`` and the planted
    module runs (the marker appears).
    """
    if owner is not None and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    root = tmp_path / "cache"
    build = make_build(root, "a" * 16)
    marker = tmp_path / "planted-ran"
    (build / "site-packages" / f"{PLANTED}.py").write_text(
        f"def main():\n    with open({str(marker)!r}, 'w') as f:\n        f.write('ran')\n    return 0\n"
    )
    root.chmod(mode)
    if owner is not None:
        for path in (root, build, build / "site-packages"):
            os.chown(path, owner, owner)
    info = {**INFO, "build_id": "a" * 16, "entry_point": f"{PLANTED}:main"}
    saved_path = list(sys.path)
    try:
        with pytest.raises(launcher.LaunchError) as err:
            launcher.run(info, "/nonexistent.pyz", {"RAYSCOPE_CACHE": str(root)})
    finally:
        sys.path[:] = saved_path
        sys.modules.pop(PLANTED, None)
    assert not marker.exists(), "the launcher ran a build someone else could plant"
    message = str(err.value)
    assert "\n" not in message and str(root) in message
    assert ("chown" in message) if owner is not None else ("chmod go-w" in message)


NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting as another uid needs root")


def _plant(build: Path, marker: Path, word: str) -> None:
    (build / "site-packages" / f"{PLANTED}.py").write_text(
        f"def main():\n    with open({str(marker)!r}, 'w') as f:\n        f.write({word!r})\n    return 0\n"
    )


def _launch(launcher: ModuleType, root: Path) -> Any:
    """``launcher.run`` on ``root``: the ``LaunchError``, or the ``SystemExit`` of a build that ran."""
    info = {**INFO, "build_id": "a" * 16, "entry_point": f"{PLANTED}:main"}
    saved_path = list(sys.path)
    try:
        launcher.run(info, "/nonexistent.pyz", {"RAYSCOPE_CACHE": str(root)})
    except (launcher.LaunchError, SystemExit) as err:
        return err
    finally:
        sys.path[:] = saved_path
        sys.modules.pop(PLANTED, None)
    raise AssertionError("run returned")


def _as_nobody(*argv: str) -> None:
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        check=True,
        timeout=30,
    )


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can enter (pytest's own are root's and private)."""
    with dirs.open_dir("rayscope-cache-", 0o755) as path:
        yield path


@needs_root
def test_a_cache_under_a_directory_another_user_owns_is_refused_before_it_can_be_swapped(
    launcher: ModuleType, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack: the cache is root's and private, but it lives in a directory uid 65534
    owns; between the launcher's check and its use, uid 65534 renames the cache away and puts
    its own in its place (here at the exact moment: in front of ``open_build``). Before: the
    check looked at the cache alone, passed, and the swapped-in build's entry point ran as
    root. Now every directory from ``/`` down is checked, on the opened directories, and the
    cache is refused before anything in it is used."""
    tmp_path = open_dir
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    root = theirs / "cache"
    root.mkdir(mode=0o700)
    _plant(make_build(root, "a" * 16), tmp_path / "ran", "root's build")
    evil = theirs / "evil"
    evil.mkdir()
    _plant(make_build(evil, "a" * 16), tmp_path / "ran", "planted build")
    for path in [evil, *evil.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    real_open_build = launcher.open_build

    def swapped_first(*args: Any) -> Any:
        _as_nobody("mv", str(root), str(theirs / "old"))
        _as_nobody("mv", str(evil), str(root))
        return real_open_build(*args)

    monkeypatch.setattr(launcher, "open_build", swapped_first)
    outcome = _launch(launcher, root)
    assert not (tmp_path / "ran").exists(), f"a build ran: {(tmp_path / 'ran').read_text()}"
    assert isinstance(outcome, launcher.LaunchError)
    assert str(outcome) == (
        f"its cache {root} is under {theirs}, which belongs to uid {NOBODY}, not to you (uid 0) or"
        f" root, so its code cannot be trusted: {launcher.REMEDY}"
    )


@needs_root
@pytest.mark.parametrize(
    ("above", "refused"),
    [
        ("root-0755", None),
        ("root-1777", None),  # /tmp: sticky, the cache below it is ours
        ("root-0777", "which is writable by group or others and not sticky"),
        ("root-0775", "which is writable by group or others and not sticky"),
        ("nobody-1777", f"which belongs to uid {NOBODY}"),
        ("link-nobody", f"a symlink of uid {NOBODY}"),
        ("link-root", None),
    ],
)
def test_every_directory_down_to_the_cache_is_checked(
    launcher: ModuleType, tmp_path: Path, above: str, refused: Any
) -> None:
    """A cache of root's, private, a complete build: trusted only when what is above it is
    root's (or the user's) and nobody else can rename it away; a symlink on the way counts
    as its own owner's. Before: every case ran the build."""
    parent = tmp_path / "above"
    parent.mkdir()
    real = parent / "cache"
    real.mkdir(mode=0o700)
    _plant(make_build(real, "a" * 16), tmp_path / "ran", "ran")
    root = real
    owner, _, mode = above.partition("-")
    if owner == "link":
        sticky = tmp_path / "sticky"
        sticky.mkdir()
        sticky.chmod(0o1777)
        root = sticky / "cache-link"
        root.symlink_to(real)
        if mode == "nobody":
            os.lchown(root, NOBODY, NOBODY)
    else:
        parent.chmod(int(mode, 8))
        if owner == "nobody":
            os.chown(parent, NOBODY, NOBODY)
    outcome = _launch(launcher, root)
    if refused is None:
        assert isinstance(outcome, SystemExit) and (tmp_path / "ran").exists()
    else:
        assert isinstance(outcome, launcher.LaunchError) and refused in str(outcome)
        assert "\n" not in str(outcome) and not (tmp_path / "ran").exists()


def test_a_missing_cache_is_created_private_and_each_new_directory_checked(
    launcher: ModuleType, tmp_path: Path
) -> None:
    """The walk creates what is missing (mode 0700) and opens it like the rest."""
    root = tmp_path / "new" / "rayscope"
    fd = launcher.open_cache(str(root))
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(root))
    finally:
        os.close(fd)
    assert root.stat().st_mode & 0o077 == 0 and (tmp_path / "new").stat().st_mode & 0o077 == 0


def test_a_launch_that_fails_exits_with_rayscopes_no_data_code(launcher: ModuleType) -> None:
    """Before: exit 1, which ``status``' table calls partial; nothing was read."""
    from rayscope.errors import EXIT_NO_DATA

    assert launcher.EXIT_CANNOT_START == EXIT_NO_DATA == 2
