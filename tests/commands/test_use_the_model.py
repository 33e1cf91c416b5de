"""README's "Use the model" block, run as written: demo → predict → export-bundle → MONAI → evaluate --cam."""

from __future__ import annotations

import re
import shlex
import shutil

import numpy as np
import pandas as pd
import pytest

from fedcxr.cli import main

from .test_bundle import REPO, monai_run

pytest.importorskip("fire", reason="MONAI's bundle runner needs `fire` (pip install fedcxr[bundle])")
pytest.importorskip("ignite", reason="MONAI's evaluator needs pytorch-ignite (pip install fedcxr[bundle])")


def readme_commands() -> list[str]:
    """The shell lines of the first bash block under '## Use the model' (continuations joined)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Use the model", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


@pytest.mark.slow  # the quick demo, predict, a bundle run by MONAI's runner (a subprocess), evaluate --cam
def test_readme_use_the_model_block_runs_as_written(shared_data, quick_demo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    env: dict[str, str] = {}
    commands = readme_commands()
    assert [c.split()[0] for c in commands] == ["fedcxr", "RUN=fedcxr-demo/runs/FedAvg_Finetune_AuxInfo_GP",
                                                "fedcxr", "fedcxr", "python", "fedcxr"]
    for line in commands:
        line = line.replace("../shared/data", str(shared_data))
        for name, value in env.items():
            line = line.replace(f"${name}", value)
        if re.fullmatch(r"[A-Z_]+=\S+", line):
            name, value = line.split("=", 1)
            env[name] = value
            continue
        argv = shlex.split(line)
        if argv[:2] == ["fedcxr", "demo"]:
            # the session's quick demo is exactly this command + DEMO_TEST_ARGS: a copy stands in for it
            assert argv[2:] == ["--out", "fedcxr-demo"], line
            shutil.copytree(quick_demo[0], tmp_path / "fedcxr-demo")
        elif argv[0] == "fedcxr":
            assert main(argv[1:] + ["-q"]) == 0, line
        else:
            assert argv[:3] == ["python", "-m", "monai.bundle"], line
            args = dict(zip(argv[4::2], argv[5::2]))
            result = monai_run(tmp_path / args["--bundle_root"], shared_data / "dicom", tmp_path / args["--output_dir"])
            assert result.returncode == 0, result.stderr[-3000:]
    capsys.readouterr()

    preds = pd.read_csv("scored/new_scans.csv", dtype={"key": str}).set_index("key")
    key_map = pd.read_csv("scored/new_scans.private-key-map.csv", dtype={"key": str}, keep_default_na=False)
    assert len(preds) + (key_map["status"] != "scored").sum() == 8  # 8 DICOMs: scored, or listed with why
    key_map = key_map.loc[key_map["status"] == "scored"].set_index("key")
    monai = pd.read_csv("monai_out/predictions.csv").set_index("image")
    preds.index = key_map.loc[preds.index, "image_path"]
    cols = [c for c in preds.columns if c.startswith("prob__")]
    np.testing.assert_allclose(monai.loc[preds.index, cols].to_numpy(), preds[cols].to_numpy(), atol=1e-4)
    assert "## Grad-CAM gallery" in (tmp_path / env["RUN"] / "report.md").read_text()
    assert any((tmp_path / env["RUN"] / "cam").rglob("*.png"))
