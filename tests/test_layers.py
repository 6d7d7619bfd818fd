"""ARCHITECTURE.md's one direction of dependency, checked on the import
statements of every module (at any depth: a function-level import counts)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trio_backplane

PACKAGE = Path(trio_backplane.__file__).parent

#: ``_numbers``, like ``errors``, is a leaf every part may use (the checks
#: of a number an option takes).
#: ``_public`` (module paths, constructors only the library calls) serves
#: every namespace the same way.
PURE = {"errors", "_numbers", "_public", "schema", "tools", "kernel"}
#: What each part may import from the rest of the package ("Nothing below
#: imports from above"): the pure layer, then store, then runtime and
#: recovery, then the edge.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_numbers": set(),
    "_public": set(),
    "_version": set(),
    "schema": {"errors", "_numbers", "_public"},
    "tools": {"errors", "_numbers", "_public", "schema"},  # tools may import schema, not reverse
    "kernel": {"errors", "_numbers", "_public"},  # only errors and its own records
    "store": {"errors", "_numbers", "_public", "kernel"},  # kernel records and errors only
    "runtime": {"errors", "_numbers", "_public", "_version", "kernel", "schema", "tools", "store"},
    "recovery": {"errors", "_numbers", "_public", "kernel", "store"},
    # run-owned resources: their tools sit on the runtime like an adapter's
    "resources": PURE | {"store", "runtime"},
    # Code Mode: its workers are run-owned resources
    "codemode": PURE | {"store", "runtime", "resources"},
    # child agents: conversations run by a manager the tools name as a registry
    "agents": PURE | {"store", "runtime"},
    "adapters": PURE | {"store", "runtime", "recovery"},
    # the fleet: conversations on PostgresStore, taken over through recovery
    "fleet": PURE | {"store", "runtime", "recovery"},
    "testing": PURE | {"store", "runtime", "recovery"},
    # the web console: stores read, answers through a host or the fleet
    "console": PURE | {"store", "runtime", "recovery", "fleet"},
    "cli": PURE
    | {
        "store",
        "runtime",
        "recovery",
        "resources",
        "testing",
        "adapters",
        "fleet",
        "console",
        "__init__",
        "_version",
    },
    "__init__": PURE | {"store", "runtime", "recovery", "testing", "_version"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    targets.append(".".join(base + ([node.module] if node.module else [])))
                elif node.module:
                    targets.append(node.module)
            elif isinstance(node, ast.Import):
                targets.extend(alias.name for alias in node.names)
            for target in targets:
                inside = target == "trio_backplane" or target.startswith("trio_backplane.")
                if inside and _part(target) != _part(module):
                    edges[_part(module)].add(_part(target))
    return edges


def test_every_part_is_known() -> None:
    """Each module and subpackage of the package has a place in ``ALLOWED``."""
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
    }
    assert parts == set(ALLOWED), parts ^ set(ALLOWED)


def test_imports_go_one_direction() -> None:
    """Nothing below imports from above (ARCHITECTURE.md, "Layers")."""
    edges = _edges()
    assert edges["runtime"], "the parser found no imports: it is broken"
    wrong = {
        part: sorted(used - ALLOWED[part]) for part, used in edges.items() if used - ALLOWED[part]
    }
    assert not wrong, wrong


def _runtime_imports() -> list[tuple[str, ast.stmt, bool]]:
    """``(module, import statement, at module level)`` for every import in
    ``runtime/``; an import in ``if TYPE_CHECKING:`` counts as module level
    (it is for annotations, never run)."""
    found: list[tuple[str, ast.stmt, bool]] = []
    for path in sorted((PACKAGE / "runtime").glob("*.py")):
        tree = ast.parse(path.read_text())
        top: set[int] = set()
        for node in tree.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                top.update(id(inner) for inner in node.body)
            else:
                top.add(id(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append((path.name, node, id(node) in top))
    return found


def test_runtime_has_no_function_level_import() -> None:
    """A function-level import is how a cycle hides: the runtime has none."""
    imports = _runtime_imports()
    assert len(imports) > 50, "the parser found no imports: it is broken"
    inner = [f"{name}:{node.lineno}" for name, node, top in imports if not top]
    assert inner == []


def test_only_the_runtime_package_imports_the_conversation_module() -> None:
    """``_conversation`` is the facade: nothing inside the runtime depends on
    it, not even for annotations, so every part stands without it."""
    users = [
        name
        for name, node, _top in _runtime_imports()
        if isinstance(node, ast.ImportFrom) and node.module == "_conversation"
    ]
    assert users == ["__init__.py"]


def _runtime_graph() -> dict[str, set[str]]:
    """Which runtime module imports which (relative imports, at any depth)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, node, _top in _runtime_imports():
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            graph[name.removesuffix(".py")].add(node.module)
    return graph


def test_runtime_modules_import_each_other_without_a_cycle() -> None:
    """The parts are layered: no runtime module reaches back, not even under
    ``TYPE_CHECKING`` (a cycle hidden for annotations is still a cycle)."""
    graph = _runtime_graph()
    assert "_conversation" in graph, "the parser found no imports: it is broken"
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append([*path[path.index(module) :], module])
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


def _runtime_trees() -> list[tuple[str, ast.Module, str]]:
    return [
        (path.name, ast.parse(text := path.read_text()), text)
        for path in sorted((PACKAGE / "runtime").glob("*.py"))
    ]


def _modules() -> list[tuple[str, str]]:
    """``(path relative to the package, text)`` of every module of the package
    (none is generated code)."""
    return [
        (str(path.relative_to(PACKAGE)), path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))
    ]


def test_modules_and_functions_are_short() -> None:
    """No module of the package over 600 lines, no function over 60."""
    modules = _modules()
    assert len(modules) > 100, "the walk found too few modules: it is broken"
    long_modules: list[str] = []
    long_functions: list[str] = []
    for name, text in modules:
        if text.count("\n") > 600:
            long_modules.append(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{name}:{node.name} ({length})")
    assert long_modules == []
    assert long_functions == []


def test_sql_drivers_leave_trio_to_the_engine() -> None:
    """The SQL drivers are synchronous code a worker thread runs: only the
    engine's modules import Trio (issue 21); a driver module imports the
    rows, the seam and the engine its store class configures, nothing else."""
    drivers = {"_sqlite.py", "_postgres.py"}
    for path in sorted((PACKAGE / "store" / "_sql").glob("*.py")):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and path.name in drivers:
                assert node.module in {"_rows", "_driver", "_engine", "_memory"}, (
                    path,
                    node.module,
                )
        if path.name in drivers:
            assert "trio" not in imported, path.name


def test_no_runtime_part_reads_another_objects_private_state() -> None:
    """``x._name`` only where ``x`` is ``self``/``cls``, another instance of
    the class being defined (``other._name`` inside that class), or a class
    of the same module (its table of its own methods): the parts are handed
    what they use, in the open."""
    found: list[str] = []
    for name, tree, _text in _runtime_trees():
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for cls in classes:
            for node in ast.walk(cls):
                node.owner = cls.name  # type: ignore[attr-defined]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr == "_create":  # NoPublicConstructor
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            owner = getattr(node, "owner", None)
            if isinstance(value, ast.Name) and value.id in {c.name for c in classes}:
                continue
            if owner is not None and _same_class(tree, owner, value):
                continue
            found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def _same_class(tree: ast.Module, owner: str, value: ast.expr) -> bool:
    """Whether ``value`` is annotated (as a parameter or a local) with the
    class ``owner`` (or ``owner | None``) in that class's methods."""
    if not isinstance(value, ast.Name):
        return False
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.arg)
            and node.arg == value.id
            and node.annotation is not None
            and owner in ast.unparse(node.annotation).split(" | ")
        ):
            return True
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == value.id
            and owner in ast.unparse(node.annotation).split(" | ")
        ):
            return True
    return False
