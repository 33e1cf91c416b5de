"""The Python API (``fedcxr.train``, ``fedcxr.evaluate``, ...): the functions the commands call, typed
results, errors as exceptions, a cheap ``import fedcxr``, and README's "Use fedcxr from Python" as written."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fedcxr
from fedcxr.cli import main
from fedcxr.errors import UserError

REPO = Path(__file__).resolve().parents[2]
#: API name → (workflow module, the command that calls it, a command line reaching it)
CALLED_BY = {
    "train": ("fedcxr.workflows.train", ["train", "x.yaml"]),
    "evaluate": ("fedcxr.workflows.evaluate", ["evaluate", "run"]),
    "ingest": ("fedcxr.workflows.ingest", ["ingest", "csv", "--input", "e", "--out", "o"]),
    "predict": ("fedcxr.workflows.predict", ["predict", "run", "--input", "i", "--out", "o.csv"]),
    "statistics": ("fedcxr.workflows.stats", ["stats", "x.yaml", "--out", "o"]),
    "report": ("fedcxr.workflows.report", ["report", "run", "--out", "o"]),
    "sweep": ("fedcxr.workflows.sweep", ["sweep", "x.yaml", "--methods", "FedAvg", "--out", "o"]),
    "init_study": ("fedcxr.workflows.init", ["init", "study"]),
}


def test_import_fedcxr_loads_no_library_until_a_function_is_used():
    code = ("import sys, fedcxr; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'pandas', 'numpy', 'pydantic', 'monai', 'typing') or m.startswith('fedcxr.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
    assert set(fedcxr.__all__) <= set(dir(fedcxr))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fedcxr.nothing  # noqa: B018


@pytest.mark.parametrize("name", sorted(CALLED_BY))
def test_each_api_function_is_the_function_its_command_calls(name, monkeypatch, capsys):
    import importlib

    module_name, argv = CALLED_BY[name]
    module = importlib.import_module(module_name)
    assert getattr(fedcxr, name) is getattr(module, name)

    def stub(*args, **kwargs):
        raise UserError(f"the {name} the command called")

    monkeypatch.setattr(module, name, stub)
    assert main(argv) == 2
    assert f"the {name} the command called" in capsys.readouterr().err


def _config(**changes) -> dict:
    return {"name": "api", "manifests": "/nowhere", "sites": ["a", "b"], "target": "c", "method": "FedAvg_Finetune",
            "rounds": 4, **changes}


def test_errors_are_exceptions_naming_the_problem_never_an_exit(tmp_path):
    with pytest.raises(UserError, match="roudns"):
        fedcxr.train(_config(roudns=2), out=tmp_path / "run")
    with pytest.raises(UserError, match="no manifest"):
        fedcxr.train(_config(), out=tmp_path / "run")
    with pytest.raises(UserError, match="no such run directory"):
        fedcxr.evaluate(tmp_path / "missing")
    with pytest.raises(UserError, match="unknown SOURCE 'pacs'"):
        fedcxr.ingest("pacs", tmp_path, tmp_path / "out")
    with pytest.raises(UserError, match="expected a YAML file path, a mapping or an ExperimentConfig"):
        fedcxr.train(42)


def test_fedcxr_stats_called_is_the_statistics_function_and_still_the_package(tmp_path):
    """``fedcxr.stats(...)`` (the command's name, as users write it) runs ``fedcxr.statistics``."""
    import types

    import fedcxr.stats.release  # the package's modules import as before

    with pytest.raises(UserError) as by_api:
        fedcxr.statistics(tmp_path / "missing.yaml", tmp_path / "a")
    with pytest.raises(UserError) as by_package:
        fedcxr.stats(tmp_path / "missing.yaml", tmp_path / "b")
    assert str(by_package.value) == str(by_api.value) and "missing.yaml" in str(by_api.value)
    assert isinstance(fedcxr.stats, types.ModuleType) and fedcxr.stats.release.__name__ == "fedcxr.stats.release"


def readme_block() -> str:
    """The python block under '## Use fedcxr from Python'."""
    section = (REPO / "README.md").read_text().split("## Use fedcxr from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow  # init, ingest 180 images, 3 rounds, evaluate, predict: ~30 s on 2 cores
def test_readme_use_fedcxr_from_python_runs_as_written(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_block(), "README.md", "exec"), namespace)
    out = printed.getvalue()
    ingested, run, result, scored = (namespace[k] for k in ("ingested", "run", "result", "scored"))
    assert isinstance(ingested, fedcxr.IngestResult) and sorted(ingested.sites) == ["hospital_a", "hospital_b",
                                                                                     "hospital_c"]
    assert all(path.is_file() for path in ingested.manifests.values())
    assert isinstance(run, fedcxr.TrainResult) and isinstance(run.run_dir, fedcxr.RunDir)
    assert run.run["status"] == "finished" and run.rounds == 3 and run.run_dir.final_model.is_file()
    assert isinstance(result, fedcxr.EvaluateResult) and set(result.mean_auroc) == {"hospital_c"}
    assert result.report["sites"]["hospital_c"]["n_rows"] > 0 and result.report_md.is_file()
    assert [r["class"] for r in namespace["per_class"]] == result.report["classes"]
    assert isinstance(scored, fedcxr.PredictResult) and scored.csv == Path("pystudy/scored.csv")
    assert len(scored.predictions) == len(pd.read_parquet(ingested.manifests["hospital_c"]))  # every row scored
    assert "already holds a finished run" in out and "rows kept at ['hospital_a', 'hospital_b', 'hospital_c']" in out
