"""``fedcxr init DIR`` and README's "Your own data in three steps", run as written."""

from __future__ import annotations

import json
import re
import shlex

import pandas as pd
import pytest
import yaml

from fedcxr.cli import main
from fedcxr.workflows.init import init_study
from fedcxr.pipeline.config import load_config
from fedcxr.site_adapters.csv_mapping_schema import load_mapping

from .test_bundle import REPO


def readme_commands() -> list[list[str]]:
    """The commands of the bash block under '## Your own data in three steps' (continuations joined,
    comments dropped, `a && b` as two commands)."""
    section = (REPO / "README.md").read_text().split("## Your own data in three steps", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [line.split("#", 1)[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(part) for line in lines if line for part in line.split("&&")]


def test_init_writes_a_mapping_and_config_that_validate_as_they_are(tmp_path, capsys):
    assert main(["init", str(tmp_path / "study")]) == 0
    study = tmp_path / "study"
    assert "next (README: Your own data in three steps)" in capsys.readouterr().out
    mapping = load_mapping(study / "mapping.yaml")  # the csv mapping's own validation, before any row
    assert mapping.delimiter == ";" and mapping.groups == {"hospital": "Site"}
    text = (study / "mapping.yaml").read_text()
    for key in ("unmentioned:", "unlabeled:", "delimiter:", "encoding:", "keep_rows:", "split:", "default:"):
        assert key in text, key  # every key a first-time user asks about is explained there
    cfg = load_config(study / "experiment.yaml", check_sites=False)  # valid before any ingest
    assert cfg.sites == ["hospital_a", "hospital_b"] and cfg.target == "hospital_c"
    assert str(cfg.manifests) == str((study / "manifests").resolve())  # relative to the YAML
    frame = pd.read_csv(study / "export" / mapping.csv, sep=mapping.delimiter, dtype=str, keep_default_na=False)
    assert set(frame["Site"]) == {"hospital_a", "hospital_b", "hospital_c"} and len(frame) == 180
    assert set(frame["Effusion"]) <= {"yes", "no", "uncertain"} and "" in set(frame["Edema"])
    assert all((study / "export" / "images" / f"{name}.png").is_file() for name in frame["Image Index"])


def test_init_never_overwrites(tmp_path, capsys):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "mapping.yaml").write_text("mine")
    assert main(["init", str(folder)]) == 2
    assert "not empty (mapping.yaml)" in capsys.readouterr().err
    assert (folder / "mapping.yaml").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="not a folder"):
        init_study(tmp_path / "file")


def test_init_on_a_dangling_link_or_under_a_file_is_a_clear_error(tmp_path, capsys):
    link = tmp_path / "study"
    link.symlink_to(tmp_path / "gone")
    assert main(["init", str(link)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and str(tmp_path / "gone") in err and "Traceback" not in err
    assert not (tmp_path / "gone").exists(), "nothing created behind the link"
    (tmp_path / "file").write_text("x")
    assert main(["init", str(tmp_path / "file" / "study")]) == 2
    err = capsys.readouterr().err
    assert "cannot create" in err and "Traceback" not in err


@pytest.mark.slow  # ingest + 5 rounds + evaluate: ~20 s on 2 cores
def test_readme_own_data_in_three_steps_runs_as_written(tmp_path, monkeypatch, capsys):
    commands = readme_commands()
    assert [c[:2] for c in commands] == [["fedcxr", "init"], ["fedcxr", "ingest"], ["fedcxr", "train"],
                                         ["fedcxr", "evaluate"]]
    assert not any("shared" in part for c in commands for part in c), "the steps need nothing outside the repo"
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        assert main(argv[1:]) == 0, argv
    out = capsys.readouterr().out
    run = tmp_path / "mystudy" / "run"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["sites"] == ["hospital_a", "hospital_b", "hospital_c"]
    report = json.loads((run / "report.json").read_text())
    assert report["sites"]["hospital_c"]["n_rows"] > 0
    assert sorted(report["classes"]) == ["cardiomegaly", "edema", "pleural_effusion"]
    text = (run / "report.md").read_text()
    assert "![Training loss and validation AUROC per round](training_curves.png)" in text
    # the target's test split is tiny: every class is marked, no interval pretends to certainty (issue 28)
    site = report["sites"]["hospital_c"]
    assert report["schema_version"] == 3 and site["mean_auroc_small_sample_classes"]
    for row in site["per_class"]:
        if row["auroc"] is not None:
            assert row["small_sample"] is True and row["ci_method"] == "Newcombe score"
            assert row["ci_high"] - row["ci_low"] > 0.1, row
            assert f"too few cases: {row['n_pos']} positive" in text
    assert site["mean_auroc_ci_high"] - site["mean_auroc_ci_low"] > 0.1
    assert f"{len(site['mean_auroc_small_sample_classes'])} of them with too few cases" in text
    assert "(1.000–1.000)" not in text
    assert f"({len(site['mean_auroc_small_sample_classes'])} with too few cases, see report.md)" in out  # console
    assert list(pd.read_csv(run / "per_class.csv").columns[9:11]) == ["small_sample", "ci_method"]
    rounds = yaml.safe_load((run / "config.yaml").read_text())["rounds"]
    log = (run / "train.log").read_text()
    assert [int(m) for m in re.findall(rf"round (\d+)/{rounds} ", log)] == list(range(1, rounds + 1))
