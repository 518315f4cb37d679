"""The house's floors: imports only go down, no private name crosses a module, the CLI stays thin;
the tests import the package and tests/support/, never another test module or tools/.

Read from the source (its imports, as the parser sees them), so the rules
hold for what is there, not for what a list says.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent.parent / "sendstream"
TESTS = Path(__file__).resolve().parent.parent
# The modules of tools/ (programs, run, never imported by a test) that no other place provides.
TOOLS = {p.stem for p in (PACKAGE.parent / "tools").glob("*.py")} - set(sys.stdlib_module_names)

# Bottom to top. A module may import its own floor and the floors below it, never a floor above.
FLOORS = [
    {"errors"},
    {"retention"},
    {"format"},
    {"codec"},
    {"io"},
    {"transfer"},
    {"analysis"},
    {"ops"},
    {"render"},
    {"extract"},
    {"transport"},
    {"session"},
    {"endpoints"},
    {"archive"},
    {"stores"},
    {"service"},
    {"backup"},
    {"cli", "__main__", "__init__"},
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
def test_no_private_name_crosses_a_module(module: str, path: Path) -> None:
    """What another module needs is public: a ``_name`` is its own module's (an extension module
    built from C, ``_native``, and a generated one, ``_layout``, are modules, not names)."""
    names = {m for m, _ in MODULES}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("sendstream")):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{target}.{alias.name}" not in names and alias.name not in ("_native", "_layout"):
                    found.append(f"{module}:{node.lineno} imports {alias.name} from {target}")
    assert not found, "\n".join(found)


STORE_NAMES = {"s3", "_s3", "store", "_store", "bucket"}  # what a parameter or attribute holding a store is called
IDENTITY_NAMES = {"identity", "stream"}  # ... and one holding a stream's identity (``stream`` may be a path too)


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_no_any_for_a_store_or_an_identity(module: str, path: Path) -> None:
    """A store and its client are typed (:class:`~sendstream.archive.store.BucketClient`,
    :class:`~sendstream.stores.store.Store`), and so is a stream's identity
    (:class:`~sendstream.transfer.identity.Identity`, not a ``dict`` of ``Any``): with ``Any`` a call the
    client does not have, or a field an identity does not have, goes unchecked."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.arg) and node.annotation is not None:
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            annotation = node.annotation
        else:
            continue
        typed = ast.unparse(annotation)
        if (name in STORE_NAMES and "Any" in typed) or (name in IDENTITY_NAMES and "dict[str, Any]" in typed):
            found.append(f"{module}:{node.lineno} {name}: {ast.unparse(annotation)}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", sorted(p.name for p in (PACKAGE / "cli").glob("*.py")))
def test_the_cli_is_thin(name: str) -> None:
    tree = ast.parse((PACKAGE / "cli" / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.While):
            loop = ast.unparse(node.iter if isinstance(node, ast.For) else node.test)
            assert not any(w in loop for w in ("sock", "frame", "event", "accept", "recv")), f"{name} loops: {loop}"


# The session's sans-IO modules: its machines, its lines, and what a resumable sender decides across connections.
SANS_IO = ("protocol.py", "messages.py", "resume.py")


@pytest.mark.parametrize("module", SANS_IO)
def test_the_session_protocol_does_no_io(module: str) -> None:
    tree = ast.parse((PACKAGE / "session" / module).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    absolute = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level]
    imported |= {n.module.split(".")[0] for n in absolute if n.module}
    assert not imported & {"socket", "threading", "select", "time", "selectors", "asyncio", "ssl"}, module
    ours = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
    assert ours <= {m.removesuffix(".py") for m in SANS_IO}, f"{module} imports a driver: {ours}"


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


def test_the_test_files_ci_names_exist() -> None:
    """.ci/run and the tools' scripts name test files by path: a file moved or split must not leave one of
    them running nothing (pytest exits 4 on a missing file, after the rest of CI has run)."""
    root = PACKAGE.parent
    named = []
    for script in [root / ".ci" / "run", *sorted((root / "tools").glob("*.sh"))]:
        text = script.read_text()
        named += [(script.name, f"tests/{m}") for m in re.findall(r"(?:\btests|\$t)/([\w/]+\.py)", text)]
    assert named, "no test file named: the pattern no longer matches how the scripts name them"
    missing = [f"{script}: {path}" for script, path in named if not (root / path).exists()]
    assert not missing, "\n".join(missing)


def test_unit_tests_start_no_process() -> None:
    """tests/unit is the inner loop: in the process alone (a command run as a subprocess, or a peer, is
    an integration test; docs/contributing/testing.md, "Tests by kind")."""
    found = []
    for path in sorted((TESTS / "unit").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            if any(name == "subprocess" or name.startswith("multiprocessing") for name in names):
                found.append(f"{path.relative_to(TESTS)}:{node.lineno} imports {', '.join(names)}")
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
