"""The wheel and the sdist as ``python -m build`` makes them (hatchling, pyproject.toml):
built out of tree, nothing written into the checkout, the wheel holding ``rayscope`` only
with its metadata.

Positive control: pyproject.toml's setuptools backend of before (``build-backend =
"setuptools.build_meta"``, ``[tool.setuptools.packages.find] where = ["agent"]``) left
``build/lib/`` and ``agent/rayscope.egg-info/`` behind, and
:func:`test_a_build_writes_nothing_into_the_checkout` names them.
"""

import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from rayscope import __version__
from tests.conftest import REPO

BUILD_TIMEOUT_S = 600.0
TOOL_CACHES = ("__pycache__/", ".pytest_cache/", ".hypothesis/", ".mypy_cache/", ".ruff_cache/")
"""What the test tools themselves write while this runs, beside any build."""


def checkout_state() -> list[str]:
    """Every change, untracked and ignored file of the checkout, less the test tools' caches."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return sorted(line for line in done.stdout.splitlines() if not any(c in line for c in TOOL_CACHES))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    """(the output folder, the checkout's state before the build, after it)."""
    out = tmp_path_factory.mktemp("dist")
    before = checkout_state()
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(REPO)],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, before, checkout_state()


def test_a_build_writes_nothing_into_the_checkout(built: tuple[Path, list[str], list[str]]) -> None:
    _out, before, after = built
    assert after == before


def test_the_wheel_holds_rayscope_only_with_its_metadata(built: tuple[Path, list[str], list[str]]) -> None:
    out, _before, _after = built
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"rayscope-{__version__}.dist-info"
        metadata = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    assert {name.split("/", 1)[0] for name in names} == {"rayscope", info}
    assert "rayscope/py.typed" in names and "rayscope/client/api.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert metadata["Version"] == __version__
    assert metadata["Summary"].startswith("Booked vs measured GPU state")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.9"
    assert "Typing :: Typed" in metadata.get_all("Classifier", [])
    assert "rayscope = rayscope.__main__:main" in entry_points
    assert not any(d.startswith("click") for d in metadata.get_all("Requires-Dist", []))  # through typer only


def test_the_sdist_holds_what_builds_and_tests_the_wheel(built: tuple[Path, list[str], list[str]]) -> None:
    out, _before, _after = built
    (sdist,) = out.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = {"pyproject.toml", "LICENSE", "README.md", "agent/rayscope/__init__.py", "tests/conftest.py"}
    assert wanted <= names
    assert not [n for n in names if n.startswith((".venv/", "dist/", "build/", ".git/"))]
