"""``install.sh`` says what it is doing before each long step (it used to be silent for minutes).

The script runs for real, with stand-ins for the interpreter and pip that record their
arguments: what it prints, and which installs it asks for in which order.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
# stand-in interpreter: venv creation, --version, `-c "import torch"` (per $TORCH_PRESENT), pip
echo "python $*" >> "$CALLS"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; cp "$(dirname "$0")/pip" "$3/bin/pip"
    printf 'export PATH="%s/bin:$PATH"\\n' "$(cd "$3" && pwd)" > "$3/bin/activate"; exit 0
fi
if [ "$1" = "--version" ]; then echo "Python 3.11.7"; exit 0; fi
if [ "$1" = "-c" ]; then
    [ "$TORCH_PRESENT" = 1 ] || exit 1
    case "$2" in *__version__*) echo "2.13.0+cpu";; esac; exit 0
fi
exit 0
"""
FAKE_PIP = """#!/usr/bin/env bash
echo "pip $*" >> "$CALLS"
"""


def _run(tmp_path: Path, *, torch_present: bool) -> tuple[str, list[str]]:
    shutil.copy(REPO / "install.sh", tmp_path / "install.sh")
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("pip", FAKE_PIP)):
        (tools / name).write_text(text)
        (tools / name).chmod((tools / name).stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PYTHON": str(tools / "python3"), "CALLS": str(calls),
           "TORCH_PRESENT": "1" if torch_present else "0"}
    env.pop("FEDCXR_EXTRAS", None)
    done = subprocess.run(["bash", str(tmp_path / "install.sh")], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout, calls.read_text().splitlines()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_fresh_install_announces_each_step_before_it_runs(tmp_path):
    out, calls = _run(tmp_path, torch_present=False)
    lines = out.splitlines()
    assert lines[0].startswith("[1/4] creating a virtual environment in") and "(Python 3.11.7)" in lines[0]
    assert lines[1] == "[2/4] upgrading pip"
    assert lines[2].startswith("[3/4] installing PyTorch (the CPU wheel torch==2.13.0")
    assert lines[3] == "[4/4] installing fedcxr with its extras [test,flare,dp,he] (MONAI, NVIDIA FLARE, Opacus, " \
                       "TenSEAL, ...; a few minutes)"
    assert lines[-1].startswith("fedcxr installed in")
    assert "source .venv/bin/activate" in lines[-1] and "try fedcxr demo" in lines[-1]  # as the README's commands
    pips = [c for c in calls if " install " in f" {c} "]
    assert pips == ["python -m pip install -q --upgrade pip", "pip install -q torch==2.13.0",
                    "pip install -q -e .[test,flare,dp,he]"]  # CPU torch first, then fedcxr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_rerun_keeps_the_venv_and_the_installed_torch_and_says_so(tmp_path):
    _run(tmp_path, torch_present=False)
    (tmp_path / "calls.txt").unlink()
    shutil.rmtree(tmp_path / "tools")
    out, calls = _run(tmp_path, torch_present=True)
    assert out.splitlines()[0] == f"[1/4] using the existing virtual environment {tmp_path}/.venv"
    assert "[3/4] PyTorch 2.13.0+cpu is already installed: kept" in out
    assert not any("torch==" in c for c in calls)
