"""The wheel and the sdist as ``python -m build`` makes them (hatchling, pyproject.toml):
built out of tree, nothing written into the checkout, the wheel holding ``rayscope`` only
with its metadata.

Positive control: pyproject.toml's setuptools backend of before (``build-backend =
"setuptools.build_meta"``, ``[tool.setuptools.packages.find] where = ["agent"]``) left
``build/lib/`` and ``agent/rayscope.egg-info/`` behind, and
:func:`test_a_build_writes_nothing_into_the_checkout` names them.
"""

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from rayscope import __version__
from tests.conftest import REPO

BUILD_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 600.0
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


def _installed_by(installer: str, wheel: Path, where: Path) -> Path:
    """The console script ``installer`` put in place from ``wheel`` (its dependencies from the
    package index, as an operator's install gets them); asserts the install succeeded."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PIPX_HOME": str(where / "pipx"), "PIPX_BIN_DIR": str(where / "bin")}
    env.pop("VIRTUAL_ENV", None)
    if installer == "uv":
        venv = where / "venv"
        commands = [
            [str(bin_dir / "uv"), "venv", "--quiet", "--python", sys.executable, str(venv)],
            [
                str(bin_dir / "uv"),
                "pip",
                "install",
                "--quiet",
                "--python",
                str(venv / "bin" / "python"),
                str(wheel),
            ],
        ]
        script = venv / "bin" / "rayscope"
    else:
        commands = [[str(bin_dir / "pipx"), "install", "--python", sys.executable, str(wheel)]]
        script = where / "bin" / "rayscope"
    for command in commands:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S, check=False
        )
        assert done.returncode == 0, f"{command[:3]}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return script


@pytest.mark.parametrize("installer", ["uv", "pipx"])
def test_the_wheel_installs_with_uv_and_pipx(
    built: tuple[Path, list[str], list[str]], tmp_path: Path, installer: str
) -> None:
    """The README says ``pipx install .`` and ``uv pip install .`` work as pip's does: the
    console script each puts in place answers ``--version`` and ``status --help`` from an
    install that holds no ray and no checkout (before: checked by hand only)."""
    out, _before, _after = built
    (wheel,) = out.glob("*.whl")
    script = _installed_by(installer, wheel, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    version = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert version.returncode == 0 and __version__ in version.stdout, version.stderr[-2000:]
    helped = subprocess.run(
        [str(script), "status", "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert helped.returncode == 0 and "--json" in helped.stdout, helped.stderr[-2000:]
