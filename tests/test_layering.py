"""The layering rules of docs/explanation/architecture.md hold: ``cluster/`` is pure, ``runtime/`` never
imports Airflow, and the Airflow side loads no TensorFlow when Airflow imports it (a DAG file
parsed by the scheduler must not pay TensorFlow's start-up, and the Airflow image need not carry it);
and the page's layout names every module of the package."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_tf"
TENSORFLOW = {"tensorflow", "keras", "tensorboard"}
AIRFLOW_SIDE = ["operators", "sensors", "triggers", "backends", "data", "plugins", "task_groups.py", "storage.py",
                "compat.py", "metrics.py"]


def _modules(room: str) -> list[Path]:
    path = PACKAGE / room
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def _imports(path: Path, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; with ``top_level_only``, only
    those that run when the module is imported (not inside functions or ``if TYPE_CHECKING:``)."""
    package = ".".join(path.relative_to(PACKAGE.parent).parent.parts)  # what a relative import starts from
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if top_level_only and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                found.append((child.lineno, name))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


def _violations(rooms: list[str], bad, top_level_only: bool = False) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
            for room in rooms for path in _modules(room)
            for line, name in _imports(path, top_level_only) if bad(name)]


def _root(name: str) -> str:
    return name.split(".")[0]


def test_cluster_imports_neither_airflow_nor_tensorflow_nor_another_room():
    def bad(name: str) -> bool:
        if _root(name) == "airflow_tf":
            return not (name.startswith("airflow_tf.cluster") or name in LEAVES)
        return _root(name) in {"airflow"} | TENSORFLOW

    assert _violations(["cluster", "files.py"], bad) == []


LEAVES = ("airflow_tf.files", "airflow_tf.deprecation")
"""Helpers every room may import (file writes, the deprecation warning): they import no room."""


def test_files_helper_and_deprecation_are_leaves():
    assert _violations(["files.py", "deprecation.py"],
                       lambda name: _root(name) in {"airflow", "airflow_tf"} | TENSORFLOW) == []


def test_runtime_never_imports_airflow_and_only_cluster_data_and_files_of_the_project():
    allowed = ("airflow_tf.runtime", "airflow_tf.cluster", "airflow_tf.data", "airflow_tf.files")

    def bad(name: str) -> bool:
        return _root(name) == "airflow" or (_root(name) == "airflow_tf" and not name.startswith(allowed))

    assert _violations(["runtime"], bad) == []


def test_airflow_side_modules_import_no_tensorflow_at_module_level():
    assert _violations(AIRFLOW_SIDE, lambda name: _root(name) in TENSORFLOW, top_level_only=True) == []


def test_importing_the_airflow_side_loads_no_tensorflow():
    # Transitively too: what the scheduler imports to parse a DAG file must not load TensorFlow.
    modules = ["airflow_tf.operators", "airflow_tf.sensors", "airflow_tf.triggers", "airflow_tf.backends.local",
               "airflow_tf.backends.kubernetes", "airflow_tf.data", "airflow_tf.plugins", "airflow_tf.task_groups"]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in %r))" % sorted(TENSORFLOW))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"TensorFlow modules loaded: {result.stdout[:500]}"


def test_runtime_modules_import_each_other_without_a_cycle():
    # A cycle forces deferred imports that break when hoisted (``python -m airflow_tf.runtime``).
    graph = {path.stem: {name.rpartition(".")[2] for _, name in _imports(path)
                         if name.startswith("airflow_tf.runtime.")}
             for path in _modules("runtime")}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"runtime modules import each other in a cycle: {' -> '.join(exc.args[1])}") from None


def _package_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Which modules of the package each one imports, deferred imports included (a circle closed
    inside a function is still one the reader must hold). ``from pkg import name`` is an arrow to
    ``pkg.name`` when that is a module. A package imported before its own submodule is Python's
    order, not an arrow."""
    modules = _package_modules()

    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            for target in (known(t) for t in targets if t.split(".")[0] == "airflow_tf"):
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def test_no_module_of_the_package_is_in_an_import_circle():
    graph = _import_graph()
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"modules import each other in a circle: {' -> '.join(exc.args[1])}") from None


def test_no_arrow_points_up_from_backends_data_or_cluster_to_the_airflow_facing_rooms():
    # The arrows of docs/explanation/architecture.md: operators/sensors/triggers -> backends, data -> cluster.
    above = ("airflow_tf.operators", "airflow_tf.sensors", "airflow_tf.triggers", "airflow_tf.plugins",
             "airflow_tf.task_groups")
    upward = [f"{name} imports {target}" for name, targets in sorted(_import_graph().items())
              if name.startswith(("airflow_tf.backends", "airflow_tf.data", "airflow_tf.cluster", "airflow_tf.runtime"))
              for target in sorted(targets) if target.startswith(above)]
    assert upward == []


ARCHITECTURE = PACKAGE.parent / "docs" / "explanation" / "architecture.md"


def _documented_modules() -> set[str]:
    """Module paths (``data/split.py``) of the layout in docs/explanation/architecture.md: a line whose
    first word ends in ``/`` opens a folder inside the folders indented less, a word ending in ``.py``
    names a module of the innermost one; other lines continue a description."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    folders: list[tuple[int, str]] = []
    found: set[str] = set()
    for line in block.splitlines():
        word = line.split()[0] if line.strip() else ""
        indent = len(line) - len(line.lstrip(" "))
        if not word.endswith(("/", ".py")) or word.count("/") > 1 or word.startswith(("`", "(")):
            continue
        folders = [(i, name) for i, name in folders if i < indent]
        if word.endswith("/"):
            folders.append((indent, word))
        elif folders and folders[0][1] == "airflow_tf/":
            found.add("".join(name for _, name in folders[1:]) + word)
    return found


def test_the_architecture_page_names_every_module_of_the_package():
    modules = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
               if path.name != "__init__.py" and "templates" not in path.parts}
    documented = _documented_modules()
    assert sorted(modules - documented) == [], "modules missing from docs/explanation/architecture.md's layout"
    assert sorted(documented - modules) == [], "the layout names modules that do not exist"


TOOLING = PACKAGE.parent / "scripts" / "localkube"
"""The local Kubernetes' package (scripts/kube): developer tooling, never in the wheel."""


def test_the_local_kubernetes_tooling_imports_only_the_standard_library_and_the_plane_env_leaf():
    # scripts/kube runs before any environment exists, and the arrow points from the tooling to the
    # package: the tooling takes DIR/env's format from airflow_tf.plane_env (which the shipped demo
    # reads with), a leaf of the standard library only; nothing of airflow_tf imports the tooling.
    def bad(name: str) -> bool:
        return not (_root(name) in sys.stdlib_module_names or name.startswith("localkube")
                    or name == "airflow_tf.plane_env")

    tooling = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}" for path in sorted(TOOLING.glob("*.py"))
               for line, name in _imports_of_tooling(path) if bad(name)]
    leaf = _violations(["plane_env.py"], lambda name: _root(name) not in sys.stdlib_module_names)
    package = _violations(["."], lambda name: _root(name) == "localkube")
    assert (tooling, leaf, package) == ([], [], [])


def _imports_of_tooling(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a module of the tooling's package."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "localkube" if node.level else node.module or ""))
    return found
