"""README's "Try it on one machine" block of `fedcxr flare`, command by command, as written.

The demo's hospitals and config come from the same steps `fedcxr demo --quick` runs (synth →
ingest → demo config; its training is tested in tests/commands/test_demo.py), then every line
of the block runs: the simulator, POC mode, the comparison table and TensorBoard (``--inspect``:
the server would not return).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("nvflare")
pytest.importorskip("tensorboard")

from fedcxr.cli import main  # noqa: E402
from fedcxr.commands.demo import DEMO_TARGET, demo_config  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[str]:
    text = README.read_text()
    section = text.split("### Try it on one machine", 1)[1].split("\n### ", 1)[0]
    block = section.split("run on FLARE as", 1)[1]
    commands = []
    for line in block.splitlines():
        if not line.startswith("    ") and line.strip() and commands:
            break
        if line.strip().startswith(".venv/bin/"):
            commands.append(line.strip())
    return commands


def prepare_demo(out: Path) -> None:
    """What `fedcxr demo --quick` writes before it trains: four hospitals, manifests, demo.yaml."""
    from fedcxr.synth import ingest_synthetic, write_synthetic_export

    write_synthetic_export(out / "export", images_per_site=80, image_size=64, seed=0)
    site_dirs = ingest_synthetic(out / "export", out / "manifests", progress=False)
    sites = sorted(Path(d).name for d in site_dirs.values())
    data = demo_config(out / "manifests", sites, DEMO_TARGET, quick=True)
    data["device"] = "cpu"
    (out / "demo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.slow
def test_the_readme_flare_commands_run_as_written(tmp_path, monkeypatch, capsys):
    commands = readme_commands()
    assert [c.split()[1] for c in commands] == ["flare", "flare", "report", "--logdir"], commands
    monkeypatch.chdir(tmp_path)
    prepare_demo(Path("fedcxr-demo"))
    for command in commands:
        argv = shlex.split(command)
        if argv[0].endswith("/fedcxr"):
            assert main(argv[1:]) == 0, command
        else:  # tensorboard: list what it would serve
            done = subprocess.run([str(Path(sys.executable).with_name("tensorboard")), *argv[1:], "--inspect"],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            for tag in ("train/nih_style/loss", "round/seconds", "train/loss"):  # server's and streamed
                assert re.search(rf"^\s*{re.escape(tag)}\s*$", done.stdout, re.M), (tag, done.stdout[-3000:])
    out = capsys.readouterr().out
    for run in ("runs/demo-flare", "runs/demo-poc"):
        assert f"cross-site evaluation (each site on its own test split): {run}/report.md" in out
        report = json.loads(Path(run, "report.json").read_text())
        assert report["source"] == "site summaries" and report["ci"]["n_boot"] == 200
        assert list(report["sites"]) == [DEMO_TARGET] and report["sites"][DEMO_TARGET]["n_rows"] > 0
        assert Path(run, "per_class.csv").is_file() and Path(run, "tensorboard").is_dir()
    table = json.loads(Path("runs/demo-flare-table/comparison.json").read_text())["table"]
    assert table[0]["cells"][DEMO_TARGET]["seeds"] == [0, 1]
