"""The documentation keeps up with the code: docs/architecture.md's module table names every
module of ``agent/`` and no other, the README stays an operator's page (under 300 lines),
its reference names every command and option the CLI has and no other, and every link in
the README and docs/ resolves inside the repository.

Positive controls: add ``agent/rayscope/new_part.py`` (or delete a row of the table) and
:func:`test_the_module_table_lists_every_module` names it; link ``https://example.org`` or
``docs/gone.md`` from a page and :func:`test_links_stay_inside_the_repository` names it;
drop ``--max-pending`` from the README's reference (as it was before) and
:func:`test_the_readmes_reference_is_the_cli` names it.
"""

import re
from pathlib import Path

from rayscope.cli import typer_click
from rayscope.cli.app import app

REPO = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(agent/[\w/]+\.py)` \|", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
OPTION = re.compile(r"--[a-z][a-z-]*")
MAX_README_LINES = 300


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_module_table_lists_every_module() -> None:
    listed = ROW.findall(ARCHITECTURE.read_text())
    assert len(listed) == len(set(listed)), "a module listed twice"
    present = {p.relative_to(REPO).as_posix() for p in (REPO / "agent").rglob("*.py")}
    assert sorted(present - set(listed)) == [], "modules missing from docs/architecture.md"
    assert sorted(set(listed) - present) == [], "rows of docs/architecture.md for no module"


def test_the_readme_is_an_operators_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < MAX_README_LINES
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Install", headings  # what it is and its output come first
    assert headings[-1].startswith("## Contributing"), headings  # contributors second


def test_links_stay_inside_the_repository() -> None:
    wrong = []
    for page in pages():
        for target in LINK.findall(page.read_text()):
            path = target.split("#", 1)[0]
            if "://" in target or target.startswith(("mailto:", "/")):
                wrong.append(f"{page.name}: {target} leaves the repository")
            elif path and not (page.parent / path).resolve().exists():
                wrong.append(f"{page.name}: {target} does not exist")
    assert wrong == []


def readme_reference() -> dict[str, set[str]]:
    """The README's command summary (its Reference's first block): each command's long
    options, the top level's under ``""``."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Reference", 1)[1].split("```", 2)[1]
    said: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        if line.startswith("rayscope "):
            word = line.split()[1]
            command = "" if word.startswith("-") else word
            said.setdefault(command, set())
        elif not line.startswith(" "):
            command = None  # `python -m rayscope ...` and the like
        if command is not None:
            said[command] |= set(OPTION.findall(line))
    return said


def cli_reference() -> dict[str, set[str]]:
    """The same from typer: every command's long options (``--help`` only at the top)."""
    root = typer_click.root_command(app)

    def long_options(command: typer_click.Command) -> set[str]:
        names = {n for p in command.params for n in (*p.opts, *p.secondary_opts) if n.startswith("--")}
        return names - {"--help"}

    commands = typer_click.commands(root)
    return {"": long_options(root) | {"--help"}, **{n: long_options(c) for n, c in commands.items()}}


def test_the_readmes_reference_is_the_cli() -> None:
    assert readme_reference() == cli_reference()
