"""The package map is the architecture (docs/architecture.md): these tests fail when an import goes up a layer,
a circle appears, a login-node package reaches TensorFlow or Horovod, or a module or function outgrows a sitting.

They read the source with ``ast`` (no import runs), so lazy imports inside functions count as much as those
at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"

# Which packages each package may import (besides itself). `app` alone (the root package) is everyone's.
ALLOWED = {
    "core": set(),
    "engines": {"core"},
    "data": {"core", "engines"},
    "training": {"core", "engines", "data"},
    "cluster": {"core"},
    "study": {"core", "engines", "cluster", "training"},
    "reports": {"core", "engines", "study"},
    "cli": {"core", "engines", "data", "training", "cluster", "study", "reports"},
}
# Where a package may use only some modules of another: (importer, imported package) -> those modules.
ONLY = {
    ("study", "engines"): {"app.engines", "app.engines.world"},  # launcher detection, no Horovod
    ("study", "training"): {"app.training", "app.training.schedule"},  # the schedule's arithmetic
    ("reports", "engines"): {"app.engines", "app.engines.diagnostics.timeline"},  # reading a Horovod trace
}
# Functions that load TensorFlow by name (importlib): importing them counts as importing TensorFlow.
LOADS_TENSORFLOW = {
    "app.core.compat.import_tensorflow",
    "app.core.compat.import_tensorflow_without_keras",
    "app.core.compat._import_quietly",
}
# Packages whose modules run on a login node: whatever they import, however indirectly, imports neither.
LOGIN_NODE = ("cluster", "study", "reports")
HEAVY = ("tensorflow", "horovod", "keras", "tf_keras", "tensorflow_datasets")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(APP.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def resolve(name: str) -> str | None:
    """The app module an imported name lives in: ``app.core.config.Config`` -> ``app.core.config``."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def absolute(node: ast.ImportFrom, name: str) -> str | None:
    """The module an ``ImportFrom`` names, relative ones (``from . import x``) resolved against ``name``."""
    if not node.level:
        return node.module
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def imports(name: str) -> tuple[set[str], set[str]]:
    """(app modules, other top-level packages) that module ``name`` imports anywhere in its body. Importing
    ``app.a.b`` runs ``app/a/__init__.py`` too, so that counts as imported; and importing a function that
    loads TensorFlow by name counts as importing TensorFlow."""
    inner, outer = set(), set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (module := absolute(node, name)):
            targets = [f"{module}.{a.name}" for a in node.names] + [module]
        else:
            continue
        for target in targets:
            if target in LOADS_TENSORFLOW:
                outer.add("tensorflow")
            if target == "app" or target.startswith("app."):
                found = resolve(target)
                while found and found != "app":  # the module and every package above it (but its own)
                    if not name.startswith(found + "."):
                        inner.add(found)
                    found = found.rpartition(".")[0]
            else:
                outer.add(target.split(".")[0])
    return inner - {name}, outer


GRAPH = {name: imports(name) for name in MODULES}


def package_of(name: str) -> str | None:
    """``app.core.config`` -> ``core``; the root package's own modules (``app``, ``app.__main__``) -> None."""
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 and (APP / parts[1]).is_dir() else None


def test_every_package_states_what_it_owns_and_must_not_import():
    for folder in sorted(p for p in APP.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert folder.name in ALLOWED, (
            f"app/{folder.name}/ is not in the package map (tests/test_architecture.py)"
        )
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert "import" in doc, f"app/{folder.name}/__init__.py's docstring must say what it may not import"


def test_no_arrow_goes_up_a_layer():
    wrong = []
    for name, (inner, _) in GRAPH.items():
        own = package_of(name)
        if own is None:
            continue
        for target in inner:
            other = package_of(target)
            if other in (None, own):
                continue
            if other not in ALLOWED[own] or target not in ONLY.get((own, other), {target}):
                wrong.append(f"{name} imports {target}")
    assert not wrong, "imports against the package map:\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    circles, state = [], {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(GRAPH[name][0]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(MODULES):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += GRAPH[name][0]
    return seen


@pytest.mark.parametrize("name", sorted(n for n in MODULES if package_of(n) in LOGIN_NODE))
def test_login_node_packages_never_reach_tensorflow_or_horovod(name):
    heavy = sorted(
        f"{module} imports {pkg}" for module in reachable(name) for pkg in GRAPH[module][1] if pkg in HEAVY
    )
    assert not heavy, f"{name} reaches TensorFlow or Horovod:\n" + "\n".join(heavy)


def test_modules_and_functions_stay_readable_in_one_sitting():
    too_long = []
    for name, path in MODULES.items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(APP.parent)}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(
                        f"{path.relative_to(APP.parent)}:{node.lineno} {node.name}: {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    assert not too_long, "split these:\n" + "\n".join(sorted(too_long))


def test_the_graph_sees_real_imports():
    """The checks above read the graph right: imports known to exist are in it, lazy ones included."""
    inner, outer = GRAPH["app.training.train"]
    assert {"app.core.config", "app.training.output"} <= inner
    assert any(m.startswith("app.engines") for m in inner)
    assert "tensorflow" in GRAPH["app.data.pipeline"][1]
    assert "horovod" in GRAPH["app.engines.horovod"][1]  # imported inside functions only
    assert "tensorflow" in GRAPH["app.training.checkpoint"][1]  # inside problem(), lazily
    assert "app.training" in GRAPH["app.study.large_batch"][0]  # a package's __init__ runs on import
    assert "tensorflow" in GRAPH["app.data.convert"][1]  # through import_tensorflow_without_keras(), by name


def test_the_engines_type_check_against_their_contract():
    """mypy on what pyproject.toml's [tool.mypy] files name, as in `make lint`: the engine contract and both
    engines (an engine whose method no longer matches Engine's signature fails here), the config schema
    (app/core/config.py) and the login-node side of Slurm (app/cluster)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=APP.parent, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_architecture_page_names_every_module():
    """docs/architecture.md is the map: a module it does not name is one a reader cannot find."""
    page = (APP.parent / "docs" / "architecture.md").read_text()
    unnamed = [
        str(path.relative_to(APP.parent))
        for path in sorted(APP.rglob("*.py"))
        if path.name != "__init__.py" and f"`{path.name}`" not in page and f"`app/{path.name}`" not in page
    ]
    assert not unnamed, "name these in docs/architecture.md: " + ", ".join(unnamed)
