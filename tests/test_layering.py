"""The house rules of ``agent/`` that a linter does not check (docs/architecture.md, Modules).

* no import circle, counting every import: at the top, inside functions, under
  ``TYPE_CHECKING`` — a lazy import that closes a circle is still a circle;
* the pure parts (``rayscope.core``) import only ``rayscope.schema``, ``rayscope.units``,
  ``rayscope.labels``, ``rayscope.errors``, ``rayscope.defaults`` and each other; a source
  (``rayscope.sources``) imports no rule of ``rayscope.core``: it reports, the pure parts judge;
* no module over 400 lines, and ``cli.py`` (commands and their options only) under 350.

Positive control: make ``agent/rayscope/sources/local_agents.py`` import
``rayscope.node.placed_agents`` again (the
circle of the second round: collect → sources/agents → ray_agents → push → collect) and
:func:`test_agent_has_no_import_circle` names it.
"""

import ast
import re
from pathlib import Path

AGENT = Path(__file__).resolve().parent.parent / "agent" / "rayscope"
MAX_MODULE_LINES = 400
MAX_CLI_LINES = 350


def module_name(path: Path) -> str:
    parts = path.relative_to(AGENT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in AGENT.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every module of ``agent`` that ``path`` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for imported in names:
            name = imported
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v roots a component: it and everything above it on the stack
            at = stack.index(v)
            component = stack[at:]
            del stack[at:]
            on_stack.difference_update(component)
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of ``agent`` it imports (its own packages left out)."""
    known = modules()
    return {
        name: {m for m in imports_of(path, set(known)) if m != name and not name.startswith(m + ".")}
        for name, path in known.items()
    }


def test_agent_has_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a circle through three modules is found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


PURE = "rayscope.core"
PURE_MAY_IMPORT = (
    "rayscope.schema",
    "rayscope.units",
    "rayscope.labels",
    "rayscope.errors",
    "rayscope.defaults",  # constants, itself free of imports
    PURE,
)
SOURCES = "rayscope.sources"


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def imports_beyond(graph: dict[str, set[str]], part: str, allowed: tuple[str, ...]) -> dict[str, set[str]]:
    """Per module of ``part``, what it imports of ``agent`` outside the ``allowed`` packages."""
    found = {
        name: {m for m in imported if not any(within(m, a) for a in allowed)}
        for name, imported in graph.items()
        if within(name, part)
    }
    return {name: beyond for name, beyond in found.items() if beyond}


def test_the_pure_parts_import_only_schema_units_labels_errors_and_each_other() -> None:
    """Positive control: make ``agent/rayscope/core/usage/summary.py`` import
    ``rayscope.render.fmt`` (or ``rayscope.sources.procs``) and this names that module."""
    assert imports_beyond(import_graph(), PURE, PURE_MAY_IMPORT) == {}


def test_a_source_imports_no_rule_of_the_pure_parts() -> None:
    """Positive control: give ``agent/rayscope/sources/nvml/modes.py`` back its import of
    ``rayscope.core.gpu.trust.memory_used_reliable`` (issue 31) and this names it."""
    rules = {n: {m for m in ms if within(m, PURE)} for n, ms in import_graph().items() if within(n, SOURCES)}
    assert {n: ms for n, ms in rules.items() if ms} == {}


RULES = {"gpu_used", "nvml_trusted", "health_flags", "measured_memory", "memory_used_reliable"}
"""The per-GPU rules the merge settles once (rayscope.core.gpu.settled): no output asks them again."""
OUTPUTS = ("rayscope.render", "rayscope.head.serve.answers", "rayscope.head.serve.routes")


def rules_imported(path: Path) -> set[str]:
    """The names of :data:`RULES` a module imports or reaches through its module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names} & RULES
        elif isinstance(node, ast.Attribute) and node.attr in RULES:
            found.add(node.attr)
    return found


def test_no_output_judges_a_gpu_again() -> None:
    """Decide once, in the merge (issue 31): the lines, --gpus, the JSON, the metrics and the
    page read each GPU's settled figure, source and flags. Positive control: give
    ``agent/rayscope/render/gpus.py`` back ``from rayscope.core.gpu.memory import gpu_used``
    and this names it."""
    found = {
        name: rules
        for name, path in modules().items()
        if any(within(name, o) for o in OUTPUTS)
        for rules in (rules_imported(path),)
        if rules
    }
    assert found == {}


def test_the_layer_check_names_what_is_imported_beyond() -> None:
    """The checks above can fail: a pure module importing a renderer is named, with only that import."""
    graph = {
        "rayscope.core.a": {"rayscope.render.fmt", "rayscope.units", "rayscope.core.b"},
        "rayscope.core.b": {"rayscope.schema.report"},
        "rayscope.render.fmt": {"rayscope.core.a"},
    }
    assert imports_beyond(graph, PURE, PURE_MAY_IMPORT) == {"rayscope.core.a": {"rayscope.render.fmt"}}


def test_no_module_is_too_big_and_the_cli_is_thin() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_MODULE_LINES} == {}
    assert sizes["rayscope.cli.app"] <= MAX_CLI_LINES


MAX_TOP_LEVEL = 16
"""Modules and subpackages at the top of the package together (``py.typed`` is a marker): the top level shows
the architecture (docs/architecture.md's folders), not 36 modules side by side."""


def test_the_top_of_the_package_shows_its_parts() -> None:
    """Positive control: ``touch agent/rayscope/a.py`` makes 17 entries."""
    entries = sorted(p.name for p in AGENT.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file())
    assert len(entries) <= MAX_TOP_LEVEL, entries


def test_no_module_named_agent_is_importable_from_the_source_root() -> None:
    """``pip install`` must not add a top-level ``agent`` (a distribution of that name exists
    on the package index): the source root ``agent/`` holds the one package ``rayscope``."""
    importable = [
        p.name for p in AGENT.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    ]
    assert importable == ["rayscope"]


ISSUE_CITATION = re.compile(r"\bissues? \d+", re.IGNORECASE)


def cites_an_issue(text: str) -> list[str]:
    """The lines of ``text`` that cite a tracker's issue by number ("issue 20", "Issues 3")."""
    return [line.strip() for line in text.splitlines() if ISSUE_CITATION.search(line)]


def test_the_code_cites_no_issue_number() -> None:
    """The repository has no issue tracker: "issue 20" in its code and docs points nowhere.
    What a line means is said in the line; the history is in the commit messages."""
    repo = AGENT.parent.parent
    code = [*AGENT.rglob("*.py"), *(repo / "build").rglob("*.py"), *(repo / "tests").rglob("*.py")]
    docs = [*repo.glob("*.md"), *(repo / "docs").glob("*.md"), *(repo / "deploy").rglob("*.y*ml")]
    cited = {
        str(path.relative_to(repo)): lines
        for path in sorted(code + docs)
        if path.name != "test_layering.py" and (lines := cites_an_issue(path.read_text()))
    }
    assert cited == {}


def test_the_citation_check_finds_a_citation() -> None:
    assert cites_an_issue('x = 1\n"""Read as NVML\'s (issue 20)."""\n# Issues 3 and 4\n') == [
        '"""Read as NVML\'s (issue 20)."""',
        "# Issues 3 and 4",
    ]
    assert cites_an_issue("an issue with 20 GPUs\nissue-free\n") == []
