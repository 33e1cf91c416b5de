"""Evaluation stands alone: it never imports the training side (``fedcxr.pipeline``) nor torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fedcxr.evaluation

PACKAGE = Path(fedcxr.evaluation.__file__).parent
#: The one lazy import still allowed, until ``load_predictions(create=...)`` is removed (lead's side).
ALLOWED: set[tuple[str, str]] = set()  # no exception: evaluation never imports pipeline


def _pipeline_imports(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of every ``import fedcxr.pipeline...`` in ``path``."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            modules = []
            if isinstance(child, ast.Import):
                modules = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module:
                modules = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
            if any(m == "fedcxr.pipeline" or m.startswith("fedcxr.pipeline.") for m in modules):
                found.append((name, child.lineno))
            visit(child, name)

    visit(tree, None)
    return found


def test_no_evaluation_module_imports_the_pipeline():
    offenders = [f"{path.name}:{line} (in {function})" for path in sorted(PACKAGE.glob("*.py"))
                 for function, line in _pipeline_imports(path) if (path.name, function) not in ALLOWED]
    assert not offenders, "evaluation must not import fedcxr.pipeline: " + ", ".join(offenders)


def test_the_import_probe_finds_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import fedcxr.pipeline\nfrom fedcxr import pipeline\nimport fedcxr.pipelines_other\n"
                     "def f():\n    from fedcxr.pipeline.predictions import write_predictions\n")
    assert _pipeline_imports(probe) == [(None, 1), (None, 2), ("f", 5)]


def test_importing_evaluation_loads_neither_torch_nor_the_pipeline():
    code = ("import sys, fedcxr.evaluation.metrics, fedcxr.evaluation.report, fedcxr.evaluation.compare, "
            "fedcxr.evaluation.runs, fedcxr.evaluation.operating, fedcxr.evaluation.calibration, "
            "fedcxr.evaluation.plots, fedcxr.workflows.report, fedcxr.cli\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('fedcxr.pipeline'))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent.parent)
    assert out.stdout.strip() == "[]"
