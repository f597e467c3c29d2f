"""The deploy package stands alone: nothing in ``inference/`` imports or names the training package (or MindSpore),
its sub-packages depend on each other one way only, and every module imports with MindSpore made unimportable.

The static checks read the source with ``ast``, so an import inside a function (one that runs on some code path
only, which an import probe never reaches) is caught as surely as a module-level one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "inference"
TRAINING = "msrl_consistency"
# Top-level packages the deploy side never imports. It probes MindSpore's presence by distribution metadata
# (``doctor``: importlib.metadata), never by import; ``mindspore_lite`` (the ``lite-python`` runtime) is a package
# of its own and allowed.
FORBIDDEN = {TRAINING, "mindspore"}
# Calls that import the module named by their first argument, when it is a literal.
DYNAMIC_IMPORTS = {"import_module", "__import__", "find_spec"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. inference.compare.checks
    target: str  # the module imported (absolute, dotted)
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``: never executed, so no dependency at run time


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import of one source file, at any depth: ``import``, ``from`` (relative ones resolved; ``from P import
    m`` depends on ``P.m`` when that is a module of ``root``, else on ``P``) and literal dynamic imports."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(module, a.name, node.lineno, type_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if base.split(".")[0] == root.name and _is_module(sub, root) else base
                found.append(Import(module, target, node.lineno, type_only))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in DYNAMIC_IMPORTS and isinstance(node.args[0].value, str):
                found.append(Import(module, node.args[0].value.split(":")[0], node.lineno, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only or (isinstance(node, ast.If) and _type_checking(node) and child in node.body))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (first statement of a module, class or function)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def strings_naming(path: Path, name: str) -> list[tuple[int, str]]:
    """String literals (f-string parts included) that contain ``name``, docstrings aside: a docstring may point the
    reader at the training side, any other string may be an import path (``MODULE:ATTR``, ``python -m``) or a
    label the deploy side prints. Comments are not in the syntax tree."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    literals = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [(n.lineno, n.value) for n in literals if name in n.value and id(n) not in skip]


def unit(module: str, root: Path) -> str:
    """The part of the package a module belongs to: its sub-package (``inference.compare``), else itself."""
    parts = module.split(".")
    if len(parts) > 1 and (root / parts[1] / "__init__.py").is_file():
        return ".".join(parts[:2])
    return module


def unit_graph(root: Path, by_module: bool = False) -> dict[str, set[str]]:
    """Which units of ``root`` (sub-packages and top-level modules; or every module) import which, counting every
    import at any depth, those under ``if TYPE_CHECKING:`` too: an annotation is a dependency a reader follows."""
    part = (lambda m: m) if by_module else (lambda m: unit(m, root))
    graph: dict[str, set[str]] = {}
    for path in _sources(root):
        for imp in imports_of(path, root):
            src, dst = part(imp.module), part(imp.target)
            if imp.target.split(".")[0] == root.name and src != dst and dst != root.name:
                graph.setdefault(src, set()).add(dst)
    return graph


def unit_cycles(root: Path, by_module: bool = False) -> list[list[str]]:
    """Import cycles between the units of ``root`` (``unit_graph``), each as one strongly connected component."""
    graph = unit_graph(root, by_module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return cycles


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "build" not in p.relative_to(root).parts)


def test_no_deploy_module_imports_the_training_stack():
    bad = [f"{imp.module}:{imp.line} imports {imp.target}" for path in _sources(DEPLOY)
           for imp in imports_of(path, DEPLOY) if imp.target.split(".")[0] in FORBIDDEN]  # fmt: skip
    assert not bad, bad


def test_no_deploy_module_names_the_training_package_in_a_string():
    bad = [f"{path.relative_to(REPO)}:{line}: {text!r}" for path in _sources(DEPLOY)
           for line, text in strings_naming(path, TRAINING)]  # fmt: skip
    assert not bad, bad


def test_the_deploy_sub_packages_import_each_other_one_way():
    assert unit_cycles(DEPLOY) == []  # e.g. report depends on compare, never the reverse
    assert unit_cycles(DEPLOY, by_module=True) == []


# The deploy package's rooms, top to bottom (``inference/__init__``'s drawing): a unit imports units of its own row
# (without a cycle) or below it, never above.
LAYERS = [
    {"inference.check", "inference.play", "inference.bench", "inference.doctor", "inference.build_runner"},
    {"inference.policy", "inference.field", "inference.report"},
    {"inference.compare"},
    {"inference.runtimes"},
    {"inference.lite", "inference.bundle", "inference.machine"},
    {"inference.errors"},
]


def test_every_deploy_unit_has_a_row_and_no_import_runs_back_up():
    graph = unit_graph(DEPLOY)
    row = {u: k for k, units in enumerate(LAYERS) for u in units}
    units = {unit(module_name(p, DEPLOY), DEPLOY) for p in _sources(DEPLOY)} - {"inference"}
    assert units <= set(row), f"units without a row in LAYERS: {sorted(units - set(row))}"
    upward = sorted(f"{src} -> {dst}" for src, dsts in graph.items() for dst in dsts if row[dst] < row[src])
    assert not upward, upward


def test_the_training_sub_packages_import_each_other_one_way():
    training = REPO / "msrl_consistency"  # e.g. training depends on artifacts, never the reverse
    assert unit_cycles(training) == []
    assert unit_cycles(training, by_module=True) == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path):
    """The scanner on a made-up package: a function-level training import, a registration string, a cycle."""
    root = tmp_path / "inference"
    for sub in ("compare", "report"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text('"""A sub-package naming msrl_consistency in its docstring."""\n')
    (root / "__init__.py").write_text("")
    (root / "compare" / "checks.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from inference.report import baseline\n"
        "def table():\n    from ..report.writers import write\n    import msrl_consistency.envs\n"
        "    importlib.import_module('mindspore.nn')\n"
        "PATHS = {'ms-cell': 'msrl_consistency.runtimes.ms_cell:MsCellRuntime'}\n"
    )  # fmt: skip
    (root / "report" / "writers.py").write_text("from inference.compare import checks\n")
    (root / "report" / "baseline.py").write_text("from inference.compare.checks import table\n")
    found = {(i.target, i.type_only) for i in imports_of(root / "compare" / "checks.py", root)}
    assert found >= {("inference.report.baseline", True), ("inference.report.writers", False),
                     ("msrl_consistency.envs", False), ("mindspore.nn", False)}  # fmt: skip
    assert [line for line, _ in strings_naming(root / "compare" / "checks.py", TRAINING)] == [8]
    assert strings_naming(root / "compare" / "__init__.py", TRAINING) == []
    assert unit_cycles(root) == [["inference.compare", "inference.report"]]
    (root / "compare" / "checks.py").write_text("def table():\n    return 1\n")  # report on compare only
    assert unit_cycles(root) == []


_PROBE = """
import importlib, json, pkgutil, sys
sys.modules['mindspore'] = None
sys.modules['msrl_consistency'] = None
import inference
names = sorted(m.name for m in pkgutil.walk_packages(inference.__path__, 'inference.'))
for name in names:
    importlib.import_module(name)
from inference.runtimes.registry import RUNTIMES, TRAINING_SIDE
reasons = {name: RUNTIMES[name].reason for name in TRAINING_SIDE}
heavy = ('mindspore', 'msrl_consistency', 'onnx', 'onnxruntime', 'matplotlib', 'torch', 'gymnasium')
loaded = sorted(m for m, mod in sys.modules.items() if m.split('.')[0] in heavy and mod is not None)
print(json.dumps({'modules': names, 'loaded': loaded, 'reasons': reasons}))
"""


def test_every_deploy_module_imports_without_mindspore():
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    expected = {"bench", "build_runner", "bundle", "doctor", "lite.client", "lite.common", "bundle.mindir", "play",
                "lite.runner_info", "compare.verifier", "report.writers", "runtimes.registry"}  # fmt: skip
    assert expected <= {m.removeprefix("inference.") for m in result["modules"]}
    # Gymnasium too is imported only when episodes are played, so doctor and bench start without it.
    assert result["loaded"] == []
    # Without the training package its runtimes are still listed, unavailable with the reason.
    assert set(result["reasons"]) == {"ms-cell", "ms-graph", "ms-mindir"}
    assert all("needs the training stack" in why for why in result["reasons"].values()), result["reasons"]


@pytest.mark.parametrize("name", ["ms-cell", "ms-graph", "ms-mindir"])
def test_the_training_package_registers_its_runtimes(name):
    import msrl_consistency.runtimes  # noqa: F401 - what every training entry point imports
    from inference.runtimes.registry import RUNTIMES

    assert RUNTIMES[name].__module__.startswith("msrl_consistency.runtimes.")


def test_every_deploy_sub_package_ships_with_the_deploy_distribution():
    """``inference/pyproject.toml`` lists its packages by name (``package-dir`` maps the folder): a room missing there
    imports in a checkout and is absent from ``pip install ./inference``."""
    import tomllib

    listed = set(tomllib.loads((DEPLOY / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    rooms = {module_name(init, DEPLOY) for init in DEPLOY.rglob("__init__.py") if "build" not in init.parts}
    assert rooms - listed == set(), f"add to inference/pyproject.toml: {sorted(rooms - listed)}"
