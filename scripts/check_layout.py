"""Checks that the code's layout still shows the architecture; CI runs it.

    python scripts/check_layout.py        exit 1 and one line per problem, or exit 0

- no import cycle between modules;
- packages depend one way: orchestrator -> node_agent, contract; node_agent and serving
  -> contract only; contract -> the standard library and msgspec only; testkit may use
  them all; bench may use them and testkit, never tests;
- no module over 400 lines, no function over 60 lines;
- SSH lives in the transport: no module outside orchestrator/transports/ imports asyncssh.
- one error table: the OpenAI and Anthropic error types are named in
  contract/openai_errors.py only (both servers map statuses through it);
- every pytest marker the tests use is registered in pyproject.toml (and --strict-markers
  is on), so `-m "not e2e"` cannot miss a misspelt mark;
- docs/architecture.md's "Where each concern lives" table names every module of every
  package folder (and testkit's), and names no module that is gone;
- tests/ has the packages' floor plan: each test module sits in the folder of the package
  it tests (tests/serving/api/ for serving/api/), and no test module imports another.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "node_agent", "serving", "orchestrator", "testkit", "bench")
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "node_agent": {"contract"},
    "serving": {"contract"},
    "orchestrator": {"contract", "node_agent"},
    "testkit": {"contract", "node_agent", "serving", "orchestrator"},
    "bench": {"contract", "node_agent", "serving", "orchestrator", "testkit"},
}
CONTRACT_THIRD_PARTY = {"msgspec"}
SSH_LIBRARY, SSH_HOME = "asyncssh", "orchestrator.transports"
# Error types a second status -> type table would spell out; only their one home may.
ERROR_TYPES = {"invalid_request_error", "server_error", "authentication_error",
               "rate_limit_error", "not_found_error", "overloaded_error", "api_error"}
ERROR_TABLE_HOME = "contract.openai_errors"
SHIPPED = ("contract", "node_agent", "serving", "orchestrator")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Markers pytest and our plugins (pytest-asyncio, pytest-timeout) register themselves.
PLUGIN_MARKERS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings"}
PLUGIN_MARKERS |= {"asyncio", "timeout"}
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# A row of its table: | `serving/engine/` | `engine.py`, `batch.py`, ... | what they do |
TABLE_ROW = re.compile(r"^\| `([\w/]+/)` \| ([^|]*) \|", re.M)
DOCUMENTED = (*SHIPPED, "testkit")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, tree: ast.Module) -> Iterator[str]:
    """Absolute names of everything the module imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def owner(target: str, known: dict[str, Path]) -> str | None:
    """The project module a dotted import name refers to, if any."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def size_problems(name: str, path: Path, tree: ast.Module) -> Iterator[str]:
    lines = path.read_text().count("\n")
    if lines > MAX_MODULE_LINES:
        yield f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES})"
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                yield f"{where}: {node.name}() has {length} lines (at most {MAX_FUNCTION_LINES})"


def dependency_problems(name: str, targets: set[str], known: dict[str, Path]) -> Iterator[str]:
    package = name.split(".")[0]
    ours = {mine for target in targets if (mine := owner(target, known))}
    outside = {target.split(".")[0] for target in targets if owner(target, known) is None}
    for mine in sorted(ours):
        other = mine.split(".")[0]
        if other != package and other not in ALLOWED[package]:
            yield f"{name} imports {mine}: {package} may not depend on {other}"
    for top in sorted(outside):
        if top == "tests":
            yield f"{name} imports tests: nothing may import tests/"
        elif package == "contract" and top not in sys.stdlib_module_names | CONTRACT_THIRD_PARTY:
            yield f"{name} imports {top}: contract uses the stdlib and msgspec only"
        elif top == SSH_LIBRARY and not (name + ".").startswith(SSH_HOME + "."):
            yield (
                f"{name} imports {SSH_LIBRARY}: SSH lives in orchestrator/transports/ only "
                "(use Transport.run, Transport.open_files)"
            )


def error_table_problems(name: str, tree: ast.Module) -> Iterator[str]:
    """An error type spelt outside contract/openai_errors.py is the start of a second table."""
    if name == ERROR_TABLE_HOME or not name.startswith(SHIPPED):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in ERROR_TYPES:
            yield (f"{name}:{node.lineno}: error type {node.value!r} spelt outside "
                   f"{ERROR_TABLE_HOME} (map the status through its table)")


def marker_problems() -> Iterator[str]:
    """Every `pytest.mark.NAME` under tests/ is registered in pyproject.toml's markers."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    ini = options["ini_options"]
    if "--strict-markers" not in ini.get("addopts", ""):
        yield "pyproject.toml: [tool.pytest.ini_options] addopts lacks --strict-markers"
    registered = {line.split(":")[0].split("(")[0].strip() for line in ini.get("markers", [])}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark"
                and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "pytest"
                and node.attr not in registered | PLUGIN_MARKERS
            ):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                yield (
                    f"{where}: marker {node.attr!r} is not registered: add it to pyproject.toml's "
                    f"[tool.pytest.ini_options] markers (known: {', '.join(sorted(registered))})"
                )


def architecture_problems() -> Iterator[str]:
    """The modules table names each module of each package folder, and only those."""
    named = {
        folder + name
        for folder, cell in TABLE_ROW.findall(ARCHITECTURE.read_text())
        for name in re.findall(r"`([\w.]+\.py)`", cell)
    }
    modules = {
        str(path.relative_to(ROOT))
        for package in DOCUMENTED
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }
    doc = ARCHITECTURE.relative_to(ROOT)
    for path in sorted(modules - named):
        folder, name = path.rsplit("/", 1)
        yield f"{doc}: its table's row `{folder}/` does not name `{name}`: add it, and what it does"
    for path in sorted(named - modules):
        yield f"{doc}: its table names `{path}`, which does not exist: rename or remove it"


def test_floor_plan_problems() -> Iterator[str]:
    """tests/a/b/test_x.py tests a/b/; a test module imports no other test module."""
    tests = ROOT / "tests"
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(ROOT)
        folder = path.parent.relative_to(tests)
        if path.name.startswith("test_") and folder.parts and not (ROOT / folder).is_dir():
            yield f"{where}: tests/{folder}/ mirrors no package folder {folder}/: move it"
        for target in imports("tests", path, ast.parse(path.read_text(), str(path))):
            if target == "tests" or target.startswith("tests."):
                yield f"{where} imports {target}: shared test helpers belong in testkit/"
                break


def main() -> int:
    known = modules()
    graph: dict[str, set[str]] = {}
    problems: list[str] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set(imports(name, path, tree))
        graph[name] = {m for t in targets if (m := owner(t, known)) and m != name}
        problems += dependency_problems(name, targets, known)
        problems += size_problems(name, path, tree)
        problems += error_table_problems(name, tree)
    problems += [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    problems += marker_problems()
    problems += architecture_problems()
    problems += test_floor_plan_problems()
    for problem in problems:
        print(problem)
    print(f"{len(known)} modules, {len(problems)} layout problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
