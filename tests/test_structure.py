"""The code stays findable: no function over 80 lines, no module over 450, no folder of more than 15 modules, no class
name defined twice (in ``inference/``, ``msrl_consistency/`` and ``export/``). ``ruff format --check`` keeps one
style (``make lint``, ``make test``)."""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("inference", "msrl_consistency", "export")
SOURCES = sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)


def test_there_are_sources_to_judge():
    assert len(SOURCES) > 100


def test_no_function_over_80_lines():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert long == []


def test_no_module_over_450_lines():
    big = [f"{p.relative_to(REPO)} ({n})" for p in SOURCES if (n := p.read_text().count("\n")) > 450]
    assert big == []


def test_no_folder_of_more_than_15_modules():
    per_folder = Counter(p.parent.relative_to(REPO) for p in SOURCES)
    assert {str(folder): n for folder, n in per_folder.items() if n > 15} == {}


def test_no_class_name_defined_twice():
    where = defaultdict(list)
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
