"""README's "Your own method" block, run as written (from the repository's folder): the demo's
hospitals, then `fedcxr train` with the method from `examples/methods/feddyn.py`, then `evaluate`."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from fedcxr.cli import main

REPO = Path(__file__).resolve().parents[2]


def readme_commands() -> list[list[str]]:
    """The command lines of the bash block under '### Your own method'."""
    section = (REPO / "README.md").read_text().split("### Your own method", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.mark.slow  # the quick demo (shared), one FedDyn run of its rounds, evaluate
def test_readme_own_method_block_runs_as_written(quick_demo, tmp_path, monkeypatch):
    demo, *_ = quick_demo  # (folder, stdout, stderr)
    work = tmp_path / "repo"
    shutil.copytree(REPO / "examples" / "methods", work / "examples" / "methods")  # the repository's folder
    shutil.copytree(demo, work / "fedcxr-demo")
    monkeypatch.chdir(work)
    commands = readme_commands()
    assert [c[:2] for c in commands] == [["fedcxr", "demo"], ["fedcxr", "train"], ["fedcxr", "evaluate"]]
    assert commands[0][2:] == ["--out", "fedcxr-demo"]  # done once per session by the quick_demo fixture
    assert main([*commands[1][1:], "--device", "cpu"]) == 0
    assert main([*commands[2][1:], "--bootstrap", "20"]) == 0
    run = json.loads((work / "runs" / "feddyn" / "run.json").read_text())
    assert run["method"] == "FedDyn" and run["status"] == "finished"
    assert run["config"]["method"].endswith("examples/methods/feddyn.py:FedDyn") and run["config"]["feddyn"] == {
        "alpha": 0.01}
    assert (work / "runs" / "feddyn" / "report.json").is_file()
