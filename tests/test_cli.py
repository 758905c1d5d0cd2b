"""The CLI as an operator meets it: one-line errors, exit codes, deadlines, help."""

import socket
import time
from collections.abc import Iterator

import pytest

from rayscope import __version__
from tests.conftest import run_rayscope
from tests.schemas import parsed
from tests.support.ports import refused_port


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word (a hung GCS, a firewall)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_closed_port_is_one_line_and_exit_2_within_the_deadline() -> None:
    port = refused_port()
    started = time.monotonic()
    done = run_rayscope("status", "--gcs", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5.0
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"rayscope: GCS unreachable at 127.0.0.1:{port} (connection refused)\n"


@pytest.mark.ray_here  # without ray a silent port cannot be told from a slow GCS: that is said
def test_silent_gcs_answers_at_our_deadline_not_rays_40_s(silent_listener: int) -> None:
    started = time.monotonic()
    done = run_rayscope("status", "--gcs", f"127.0.0.1:{silent_listener}", "--timeout", "1.5")
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr == f"rayscope: GCS unreachable at 127.0.0.1:{silent_listener} (timeout 1.5 s)\n"
    assert elapsed < 10.0  # 1.5 s deadline plus interpreter start; Ray alone would block ~40 s


@pytest.mark.parametrize("bad", ["foo:x", "127.0.0.1:99999", "127.0.0.1:", "a b"])
def test_malformed_address_is_a_usage_error(bad: str) -> None:
    """(A host without a port is Ray's 6379: tests/test_cli_messages.py.)"""
    done = run_rayscope("status", "--gcs", bad)
    assert done.returncode == 2
    assert done.stderr.startswith("rayscope: status --gcs: ")
    assert "Traceback" not in done.stderr


def test_non_positive_timeout_is_a_usage_error() -> None:
    done = run_rayscope("status", "--timeout", "0", "--gcs", f"127.0.0.1:{refused_port()}")
    assert done.returncode == 2 and done.stderr.startswith("rayscope: status --timeout 0: ")


def test_version() -> None:
    done = run_rayscope("--version")
    assert done.returncode == 0 and done.stdout == f"rayscope {__version__}\n"


def test_help_explains_the_three_numbers() -> None:
    done = run_rayscope("--help")
    assert done.returncode == 0
    assert "VRAM_MB" in done.stdout and "NVML" in done.stdout
    for command in ("status", "node"):
        assert command in done.stdout


def test_node_works_without_any_cluster(tmp_path: object) -> None:
    """Diagnostics on a host with no Ray cluster reachable: sources report, exit 0."""
    done = run_rayscope("node", "--json", "--gcs", f"127.0.0.1:{refused_port()}")
    assert done.returncode == 0, done.stderr
    diag = parsed(done.stdout, "node")
    gcs = next(s for s in diag["sources"] if s["name"] == "gcs")
    assert not gcs["ok"] and "connection refused" in gcs["reason"]
    assert diag["host"]["cpu_count"] >= 1


def test_a_closed_pipe_ends_quietly_with_the_exit_code_the_answer_had() -> None:
    """``rayscope node | head -1``: the reader leaves before the answer is written. Before:
    "internal error: BrokenPipeError", exit 1 (for ``status``: "partial"; for ``fit``: "does
    not fit"). Now: nothing on stderr, and the exit code the answer had (node: 0)."""
    import subprocess
    import sys

    from tests.conftest import REPO, base_env

    process = subprocess.Popen(
        [sys.executable, "-m", "rayscope", "node", "--gcs", f"127.0.0.1:{refused_port()}"],
        cwd=REPO,
        env=base_env(RAY_AUTH_MODE="disabled"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before anything is written
    with process.stderr:
        stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0, stderr
    assert stderr == ""
