"""Prometheus's ``promtool`` run on text or on the shipped alert rules (``deploy/prometheus/``)."""

import subprocess
from pathlib import Path

from tests import debian_deps
from tests.conftest import REPO


def promtool(*args: str, stdin: str = "", cwd: Path = REPO) -> "subprocess.CompletedProcess[str]":
    """``promtool ARGS`` with ``stdin``; a failure (not a skip) when it is not installed."""
    path = debian_deps.need("promtool")
    return subprocess.run(
        [path, *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def lint(text: str) -> "subprocess.CompletedProcess[str]":
    return promtool("check", "metrics", stdin=text)
