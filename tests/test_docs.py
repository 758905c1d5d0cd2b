"""The documentation keeps up with the code: docs/architecture.md's module table names every
module of ``agent/`` and no other, the README stays an operator's page (under 300 lines),
its reference names every command and option the CLI has and no other, every link in
the README and docs/ resolves inside the repository, and every module path and
``module.name`` they put in backticks names something the code has.

Positive controls: add ``agent/rayscope/new_part.py`` (or delete a row of the table) and
:func:`test_the_module_table_lists_every_module` names it; link ``https://example.org`` or
``docs/gone.md`` from a page and :func:`test_links_stay_inside_the_repository` names it;
drop ``--max-pending`` from the README's reference (as it was before) and
:func:`test_the_readmes_reference_is_the_cli` names it; write `gcs_read.read_pending` (a
module since renamed) and :func:`test_every_name_the_docs_tick_is_in_the_code` names it.
"""

import ast
import importlib
import re
import sys
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
    assert wrong == [], "\n".join(wrong)


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


TICKED = re.compile(r"`([^`\n]+)`")
PY_PATH = re.compile(r"[\w./-]+\.py")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PACKAGE = REPO / "agent" / "rayscope"
NOT_OURS = frozenset(
    {"ray", "msgspec", "psutil", "pynvml", "typer", "click", "pytest", *sys.stdlib_module_names}
)
FILE_KINDS = frozenset(
    {"pyz", "md", "json", "txt", "toml", "yaml", "yml", "so", "png", "service", "sh", "html"}
)
Names = dict[str, set[str]]  # a module's top-level names under "", each class's under its name
Modules = dict[str, list[Names]]  # by the file's stem: several modules may share one
Classes = dict[str, set[str]]
# Backticked names that read like ours but are another program's: each says whose.
FOREIGN = {
    "bioengine/cluster/proxy_actor.py": "BioEngine's source",
    "tests/end_to_end/test_worker.py": "BioEngine's test",
    "py.typed": "PEP 561's marker file",
    "AppBuilder._apply_gpu_memory": "BioEngine's source",
    "GlobalStateAccessor.disconnect": "Ray's source",
    "NodeState.labels": "Ray's autoscaler protobuf",
    "gpuI.proc_util": "a key of Ray's dashboard answer",
    "Network.setExtraHTTPHeaders": "Chrome's DevTools protocol",
    "Page.navigate": "Chrome's DevTools protocol",
    "cluster.pending": "a path in status --json (schema/status.schema.json)",
    "cluster.shared_gpus": "a path in status --json (schema/status.schema.json)",
    "pending_resources.actors": "a path in status --json (schema/status.schema.json)",
    "request.label_selector": "a path in fit --json (schema/fit.schema.json)",
    "raylet.nodeId": "a key of Ray's dashboard answer",
    "raylet.nodeManagerAddress": "a key of Ray's dashboard answer",
}


def is_foreign(text: str) -> bool:
    """A file name (``rayscope.pyz``) or another library's name (``json.loads``)."""
    return text.rsplit(".", 1)[1] in FILE_KINDS or text.split(".", 1)[0] in NOT_OURS


def defined_names(tree: ast.Module) -> Names:
    """A module's top-level names under ``""``, and each class's attributes under its name."""
    found: Names = {"": set()}

    def names_of(body: list[ast.stmt]) -> set[str]:
        names: set[str] = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        return names

    found[""] = names_of(tree.body)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = names_of(node.body)
    return found


def code_index() -> tuple[Modules, Classes]:
    """Every module of the package by its file's stem, and every class's attributes by name."""
    modules: Modules = {}
    classes: Classes = {}
    for path in PACKAGE.rglob("*.py"):
        names = defined_names(ast.parse(path.read_text()))
        modules.setdefault(path.stem, []).append(names)
        for cls, attributes in names.items():
            if cls:
                classes.setdefault(cls, set()).update(attributes)
    return modules, classes


def path_resolves(text: str) -> bool:
    """A ``.py`` path: from the repository's root, or inside the package (``core/gpu/fit.py``)."""
    if (REPO / text).is_file() or (PACKAGE / text).is_file():
        return True
    return "/" not in text and any(PACKAGE.rglob(text))


def dotted_resolves(text: str, modules: Modules, classes: Classes) -> bool:
    """``rayscope.x.name`` imports and finds ``name``; ``module.name`` and ``Class.name`` name
    a module or class of the package and something it defines. Other programs' names pass."""
    first, rest = text.split(".", 1)
    if first == "rayscope":
        return imported_resolves(text)
    parts = rest.split(".")
    if first in modules:
        return any(module_has(names, parts) for names in modules[first])
    if first in classes:
        return parts[0] in classes[first]
    return False


def module_has(names: Names, parts: list[str]) -> bool:
    if parts[0] not in names[""]:
        return False
    return len(parts) == 1 or parts[0] not in names or parts[1] in names[parts[0]]


def imported_resolves(text: str) -> bool:
    parts = text.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_name_the_docs_tick_is_in_the_code() -> None:
    modules, classes = code_index()
    wrong = []
    for page in pages():
        for text in sorted(set(TICKED.findall(page.read_text()))):
            if text in FOREIGN:
                continue
            if PY_PATH.fullmatch(text):
                ok = path_resolves(text)
            elif DOTTED.fullmatch(text) and not is_foreign(text):
                ok = dotted_resolves(text, modules, classes)
            else:
                continue
            if not ok:
                wrong.append(f"{page.relative_to(REPO)}: `{text}`")
    assert wrong == [], "\n".join(wrong)
