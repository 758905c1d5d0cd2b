"""``--help`` as an operator reads it in an 80- and a 120-column terminal (golden files).

The help text is written in paragraphs and wrapped once, by the terminal's width: a
docstring's own line breaks must not survive into the output (they broke lines
mid-sentence at 80 columns). Positive control: drop ``reflow`` in ``agent/rayscope/cli/app.py`` and the
command list takes two lines for ``fit``, failing the one-line test and every golden.
"""

import re

import pytest
from typer.testing import CliRunner

from rayscope.cli.app import app
from tests.conftest import run_rayscope
from tests.golden import check_golden

COMMANDS = ["", *sorted(c.name or c.callback.__name__ for c in app.registered_commands if c.callback)]
WIDTHS = (80, 120)


def render_help(command: str, width: int) -> str:
    args = [command, "--help"] if command else ["--help"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(width), "TERM": "dumb"}, terminal_width=width)
    assert result.exit_code == 0, result.output
    return "\n".join(line.rstrip() for line in result.output.splitlines()) + "\n"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_the_width(command: str, width: int) -> None:
    text = render_help(command, width)
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("command", COMMANDS)
def test_help_matches_its_golden_file(command: str, width: int) -> None:
    """The golden files are the help as the lock's typer draws it (constraints.txt, the
    single file's typer): another typer release draws its own boxes (0.29 writes ``<bool>``
    beside every flag), so ``make install-ends`` leaves this one out and runs the one above."""
    check_golden(f"help_{command or 'rayscope'}_{width}.txt", render_help(command, width))


@pytest.mark.parametrize("width", WIDTHS)
def test_command_list_is_one_line_per_command(width: int) -> None:
    text = render_help("", width)
    panel = text.split("Commands")[1]
    rows = [line for line in panel.splitlines() if line.startswith("│")]
    named = [row for row in rows if re.match(r"│ \w", row)]
    assert len(rows) == len(named) == len(COMMANDS) - 1, panel


def test_node_help_names_the_exit_code_it_gives_for_bad_usage() -> None:
    """Before: ``Exit code 0 unless rayscope itself fails`` while a bad option exits 2."""
    done = run_rayscope("node", "--gcs", "ray://127.0.0.1:10001")
    assert done.returncode == 2
    assert "Exit 2: bad usage" in " ".join(run_rayscope("node", "--help").stdout.split())
