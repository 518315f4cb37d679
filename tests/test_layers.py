"""The house's floors: imports only go down, modules and classes stay small, the CLI stays thin;
the tests import the package and tests/support/, never another test module or tools/.

Read from the source (its imports, as the parser sees them), so the rules
hold for what is there, not for what a list says.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sendstream"
TESTS = Path(__file__).resolve().parent
# The modules of tools/ (programs, run, never imported by a test) that no other place provides.
TOOLS = {p.stem for p in (PACKAGE.parent / "tools").glob("*.py")} - set(sys.stdlib_module_names)

# Bottom to top. A module may import its own floor and the floors below it, never a floor above.
FLOORS = [
    {"errors"},
    {"format"},
    {"codec"},
    {"io"},
    {"analysis"},
    {"ops"},
    {"render"},
    {"extract"},
    {"net"},
    {"archive"},
    {"service"},
    {"cli", "remote", "admin", "archives", "options", "params", "terminal", "manual", "__main__", "__init__"},
]
# Inside a floor with several rooms, who may use whom (the top floor's rooms may use each other).
SIDEWAYS: set[tuple[str, str]] = set()


def floor(room: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if room in rooms)


def room(module: str) -> str:
    """``sendstream.codec.decoder`` -> ``codec``; ``sendstream.cli`` -> ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def imports(module: str, path: Path) -> set[str]:
    """Every sendstream module ``module`` imports, wherever in the file (lazy imports too)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] == "sendstream":
                if target != "sendstream" or node.level == 0:  # `from .. import errors` takes a module, not the package
                    found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "sendstream")
    names = {m for m, _ in modules()}
    return {n for n in found if n in names}


MODULES = modules()


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_only_go_down(module: str, path: Path) -> None:
    here = room(module)
    for target in imports(module, path):
        there = room(target)
        if there == here or floor(here) == len(FLOORS) - 1:
            continue
        assert floor(there) < floor(here) or (here, there) in SIDEWAYS, f"{module} imports {target}: up a floor"


def test_no_import_cycle() -> None:
    graph = {m: imports(m, p) - {m} for m, p in MODULES}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail[trail.index(n) :], n]))
            if n not in state:
                visit(n, [*trail, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_modules_and_classes_stay_small(module: str, path: Path) -> None:
    lines = path.read_text().count("\n")
    assert lines <= 600, f"{module}: {lines} lines"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size <= 300, f"{module}.{node.name}: {size} lines"


@pytest.mark.parametrize(
    "name", ["cli.py", "remote.py", "admin.py", "archives.py", "options.py", "params.py", "terminal.py"]
)
def test_the_cli_is_thin(name: str) -> None:
    source = (PACKAGE / name).read_text()
    assert source.count("\n") < 450
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.While):
            loop = ast.unparse(node.iter if isinstance(node, ast.For) else node.test)
            assert not any(w in loop for w in ("sock", "frame", "event", "accept", "recv")), f"{name} loops: {loop}"


def test_the_session_protocol_does_no_io() -> None:
    tree = ast.parse((PACKAGE / "net" / "session" / "protocol.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"socket", "threading", "select", "time", "selectors", "asyncio", "ssl"}


def test_tests_import_no_test_module_and_no_tool() -> None:
    """What tests share lives in tests/support/; conftest.py holds only fixtures and hooks."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top.startswith("test_") or top == "conftest" or top in TOOLS:
                    found.append(f"{path.relative_to(TESTS)}:{node.lineno} imports {name}")
    assert not found, "\n".join(found)


def test_the_public_api_is_typed_and_lazy() -> None:
    """Every name of ``__all__`` is imported for type checkers (as itself) and loads at run time."""
    import sendstream

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    typed = {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level
        for alias in node.names
        if alias.asname == alias.name
    }
    assert typed == set(sendstream.__all__)
    for name in sendstream.__all__:
        assert getattr(sendstream, name) is not None, name
