"""Hostile configs (SECURITY.md R7): every size and count bounded, rates finite, sites unique, files that
are not UTF-8 text or that expand without bound refused — exit 2 naming the key, never a traceback, and no
error message that formats unbounded input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedcxr.cli import main
from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("content, message", [
    ("image_size: 100000\n", "image_size: Input should be less than or equal to 2048"),
    ("model: {hidden: 1.0e+9}\n", "model.hidden: Input should be less than or equal to 16384"),
    ("target: dicom_style\ntarget_train: {labeled: -5}\n", "target_train.labeled: a count of labeled rows is 1"),
    ("target: dicom_style\ntarget_train: {labeled: 2.5}\n", "target_train.labeled: a fraction of the train rows"),
    ("source: {lr: .inf}\n", "source.lr: Input should be a finite number"),
    ("target_train: {lr: .nan}\n", "target_train.lr: Input should be a finite number"),
    ("alpha: -.inf\n", "alpha: Input should be a finite number"),
    ("source: {batch_size: 1000000000}\n", "source.batch_size: Input should be less than or equal to 4096"),
    ("rounds: 1000000000\n", "rounds: Input should be less than or equal to 100000"),
    ("source: {steps: 1000000000000}\n", "source.steps: Input should be less than or equal to 10000000"),
    ("source: {epochs: 99999999}\n", "source.epochs: Input should be less than or equal to 10000"),
    ("sites: [nih_style, nih_style]\n", "sites: 'nih_style' is listed twice"),
    ("sites: [nih_style, ../elsewhere/nih_style]\n",
     "sites: 'nih_style' and '../elsewhere/nih_style' are both site 'nih_style'"),
    ("sites: [nih_style, chexpert_style]\nmin_sites: 3\n", "min_sites: 3 is more than the 2 site(s)"),
    ("name: ../../escaped\n", "name: '../../escaped' cannot name a run folder"),
    ("sites: [nih_style, ..]\n", "sites: '..' is not a site folder"),
    ("privacy: {filters: [{percentile_privacy: {percentile: .nan}}]}\n", "percentile in 0..100, gamma > 0 (finite numbers)"),
])
def test_out_of_bounds_configs_exit_2_naming_the_key(tiny_manifests, tmp_path, capsys, content, message):
    config = tmp_path / "exp.yaml"
    base = f"manifests: {tiny_manifests}\nimage_size: 32\nrounds: 1\nsites: [nih_style]\n"
    keys = {line.split(":")[0] for line in content.splitlines()}
    config.write_text("".join(line + "\n" for line in base.splitlines() if line.split(":")[0] not in keys) + content)
    code = main(["train", str(config), "--out", str(tmp_path / "run"), "--set", "model.backbone=resnet_tiny"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_config_that_is_not_utf8_exits_2_naming_the_byte(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_bytes("name: h\u00f4pital\nsites: [a]\n".encode("latin-1"))
    code = main(["train", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "not UTF-8 text (byte 7, line 1: b'\\xf4')" in err and "Traceback" not in err


def test_a_csv_mapping_that_is_not_utf8_or_an_alias_bomb_exits_2(tmp_path, capsys):
    (tmp_path / "export").mkdir()
    mapping = tmp_path / "mapping.yaml"
    for content, message in ((b"csv: d\xe9j\xe0.csv\n", "not UTF-8 text (byte 6, line 1"),
                             (("csv: data.csv\n" + BOMB).encode(), "values once its YAML aliases are expanded")):
        mapping.write_bytes(content)
        code = main(["ingest", "csv", "--input", str(tmp_path / "export"), "--mapping", str(mapping), "--out",
                     str(tmp_path / "out"), "-q"])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err and len(err) < 1000, err


BOMB = ("privacy:\n  filters:\n    - a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"      {c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                  for p, c in zip("abcdefgh", "bcdefghi")))


def test_a_yaml_alias_bomb_is_refused_in_bounded_memory_and_time(tmp_path):
    """1 KB of YAML that reads as 10^9 values: refused before anything walks or prints it. Run in a
    process capped at 1 GiB of address space, so a regression fails here instead of exhausting the machine."""
    config = tmp_path / "bomb.yaml"
    config.write_text("sites: [a]\n" + BOMB)
    assert config.stat().st_size < 1024
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from fedcxr.errors import UserError\nfrom fedcxr.pipeline.config import load_config\n"
            "try:\n    load_config(sys.argv[1], check_sites=False)\nexcept UserError as exc:\n"
            "    print(str(exc)); sys.exit(2)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "more than 100,000 values once its YAML aliases are expanded" in result.stdout
    assert len(result.stdout) < 500


@pytest.mark.parametrize("text, message", [
    ("sites: &s [a, *s]\n", "refers to itself"),
    ("sites: [a]\nx: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ("sites: [a]\n" + "#" * (1 << 20) + "\n", "a config file is at most 1,048,576 bytes"),
])
def test_recursive_deep_or_huge_yaml_is_refused(tmp_path, text, message):
    config = tmp_path / "exp.yaml"
    config.write_text(text)
    with pytest.raises(UserError, match=message):
        load_config(config, check_sites=False)


def test_no_error_message_formats_unbounded_input(tmp_path):
    long = "x" * 50_000
    cases = {
        "a huge site name": f"sites: [{long}]\n",
        "a huge unknown key": f"sites: [a]\n{long}: 1\n",
        "many unknown keys": "sites: [a]\n" + "".join(f"k{i}: 1\n" for i in range(1000)),
        "a huge class list": "sites: [a]\nmodel: {classes: [" + ", ".join(f"c{i}" for i in range(3000)) + "]}\n",
        "a huge filter": "sites: [a]\nprivacy: {filters: [{nonsense: [" + ", ".join(["1"] * 3000) + "]}]}\n",
    }
    for name, text in cases.items():
        config = tmp_path / "exp.yaml"
        config.write_text(text)
        with pytest.raises(UserError) as caught:
            load_config(config, check_sites=False)
        assert len(str(caught.value)) < 3000, f"{name}: a message of {len(str(caught.value))} characters"
    with pytest.raises(UserError) as caught:
        load_config(data={"sites": ["a"]}, overrides=[f"{long}={long}"], check_sites=False)
    assert len(str(caught.value)) < 3000
