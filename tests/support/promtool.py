"""Prometheus's ``promtool`` run on text or on the shipped alert rules (``deploy/prometheus/``)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO


def promtool(*args: str, stdin: str = "", cwd: Path = REPO) -> "subprocess.CompletedProcess[str]":
    """``promtool ARGS`` with ``stdin``; a failure (not a skip) when it is not installed."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found: `apt-get install -y prometheus` (Debian) gives it; .ci/run installs it"
        )
    return subprocess.run(
        [path, *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def lint(text: str) -> "subprocess.CompletedProcess[str]":
    return promtool("check", "metrics", stdin=text)
