"""Exit codes keep their meaning. An internal error (a bug, MemoryError, a
field that does not parse) is one line and exit 70 (``EX_SOFTWARE``), never 1, which cron
reads as "partial" (``status``) or "does not fit" (``fit``).

Before (SECURITY.md): exit 1 from inside a command; a traceback and exit 1 from outside one
(the fast path's parsing, an option's callback).
"""

import sys

import pytest

import rayscope.__main__ as entry
from rayscope.cli import app as cli
from rayscope.cli import fast_status
from rayscope.client import head as client
from rayscope.errors import EXIT_INTERNAL, one_line_errors
from tests.reliability_plugin import FaultRecord
from tests.support.ports import refused_port

FAILURES = [MemoryError(), ValueError("invalid literal for int() with base 10: '²'"), KeyError("node_ip")]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_an_internal_error_in_a_command_is_exit_70(
    failure: Exception, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` whose read raises: one line, exit 70."""

    def broken(*_: object, **__: object) -> None:
        raise failure

    monkeypatch.setattr(client, "read_cluster", broken)
    with pytest.raises(SystemExit) as done:
        cli.main(["status", "--gcs", f"127.0.0.1:{refused_port()}"])
    assert done.value.code == EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert err.startswith(f"rayscope: internal error: {type(failure).__name__}") and err.count("\n") == 1


@pytest.mark.fault
def test_an_internal_error_outside_any_command_is_exit_70(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fault: FaultRecord
) -> None:
    """The entry point itself (the fast path's parsing here): before, a traceback and exit 1."""
    fault.expect(
        "MemoryError in rayscope status (the fast path's parsing)",
        "one line on stderr and exit 70, never 1 ('partial' to cron) (before: a traceback and exit 1)",
    )

    def broken(*_: object, **__: object) -> None:
        raise MemoryError

    monkeypatch.setattr(fast_status, "parse", broken)
    monkeypatch.setattr(sys, "argv", ["rayscope", "status", "--head", f"http://127.0.0.1:{refused_port()}"])
    with pytest.raises(SystemExit) as done:
        entry.main()
    assert done.value.code == 70
    err = capsys.readouterr().err
    assert err == "rayscope: internal error: MemoryError (--verbose shows where)\n"
    fault.observe(f"exit {done.value.code}: {err.strip()}")


def test_an_operators_error_keeps_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    """The control: what rayscope says on purpose keeps its code (2: bad usage)."""
    from rayscope.errors import AgentError

    with pytest.raises(SystemExit) as done, one_line_errors(verbose=False):
        raise AgentError("bad usage", 2)
    assert done.value.code == 2 and capsys.readouterr().err == "rayscope: bad usage\n"
