"""Experiment config: validation errors name the key; sites must be ingested folders."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedcxr.errors import UserError
from fedcxr.pipeline.config import apply_overrides, config_fingerprint, load_config


def _fake_site(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    pd.DataFrame({"image_path": ["a.png"]}).to_parquet(folder / "manifest.parquet")
    return folder


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_valid_config_resolves_manifests_relative_to_yaml(tmp_path):
    _fake_site(tmp_path / "m", "a")
    _fake_site(tmp_path / "m", "b")
    cfg = load_config(_write(tmp_path, {"manifests": "m", "sites": ["a"], "target": "b", "strategy": "FedAvg_Finetune"}))
    assert cfg.site_dir("a") == (tmp_path / "m" / "a").resolve()
    assert cfg.all_sites() == ["a", "b"]
    assert cfg.source_sites() == ["a"]


def test_missing_site_names_the_site(tmp_path):
    _fake_site(tmp_path / "m", "a")
    with pytest.raises(UserError, match="site 'nowhere'"):
        load_config(_write(tmp_path, {"manifests": "m", "sites": ["a", "nowhere"]}))


def test_unknown_key_and_unknown_class_are_named(tmp_path):
    _fake_site(tmp_path / "m", "a")
    with pytest.raises(UserError, match="roundz"):
        load_config(_write(tmp_path, {"manifests": "m", "sites": ["a"], "roundz": 3}))
    with pytest.raises(UserError, match="unknown class"):
        load_config(_write(tmp_path, {"manifests": "m", "sites": ["a"], "model": {"classes": ["cardio"]}}))
    with pytest.raises(UserError, match="aux"):
        load_config(_write(tmp_path, {"manifests": "m", "sites": ["a"], "aux_tasks": ["height"]}))


def test_overrides_are_yaml_typed_and_dotted(tmp_path):
    _fake_site(tmp_path / "m", "a")
    cfg = load_config(_write(tmp_path, {"manifests": "m", "sites": ["a"]}),
                      overrides=["rounds=7", "source.lr=0.01", "model.backbone=resnet_tiny"])
    assert cfg.rounds == 7 and cfg.source.lr == 0.01 and cfg.model.backbone == "resnet_tiny"
    with pytest.raises(UserError, match="KEY=VALUE"):
        apply_overrides({}, ["rounds"])


def test_fingerprint_ignores_device_but_not_lr(tmp_path):
    _fake_site(tmp_path / "m", "a")
    path = _write(tmp_path, {"manifests": "m", "sites": ["a"]})
    base = load_config(path)
    assert config_fingerprint(load_config(path, overrides=["device=cpu"])) == config_fingerprint(base)
    assert config_fingerprint(load_config(path, overrides=["source.lr=0.5"])) != config_fingerprint(base)


@pytest.mark.parametrize("item, message", [
    ("rounds=[1,", "--set rounds: cannot read the value '[1,'"),
    ("=3", "the key is empty"),
    ("source..lr=1", "the key is empty"),
    ("rounds", "expected KEY=VALUE"),
])
def test_malformed_set_values_are_named_without_a_traceback(item, message):
    with pytest.raises(UserError, match=re.escape(message)):
        apply_overrides({"rounds": 1}, [item])


def test_a_target_listed_as_a_source_is_refused_not_dropped(tmp_path):
    data = {"sites": ["a", "b"], "target": "b"}
    with pytest.raises(UserError, match="target 'b' is also listed under `sites`") as info:
        load_config(data=data, check_sites=False)
    assert "Value error" not in str(info.value)


# --------------------------------------------------------------------------- method (formerly strategy)


def test_method_is_checked_at_load_naming_the_key_and_the_known_methods(tmp_path):
    for key in ("method", "strategy"):
        known = r"known: FedAvg, FedAvg_Finetune, .*Oracle, .*FedProx, .*file.py:Name"
        with pytest.raises(UserError, match=rf"{key}: unknown method 'FedAVG'; {known}"):
            load_config(data={"sites": ["a"], key: "FedAVG"}, check_sites=False)


def test_strategy_is_the_former_name_of_method_in_yaml_and_in_set():
    assert load_config(data={"sites": ["a"], "strategy": "FedGP"}, check_sites=False).method == "FedGP"
    assert load_config(data={"sites": ["a"]}, check_sites=False).method == "FedAvg"  # unset: the default
    for yaml_key in ("method", "strategy"):
        for set_key in ("method", "strategy"):
            cfg = load_config(data={"sites": ["a"], yaml_key: "FedGP"}, overrides=[f"{set_key}=FedDA"],
                              check_sites=False)
            assert cfg.method == cfg.strategy == "FedDA"
    with pytest.raises(UserError, match="both `method` and `strategy` are given"):
        load_config(data={"sites": ["a"], "method": "FedGP", "strategy": "FedGP"}, check_sites=False)


def test_fingerprint_is_the_one_earlier_versions_computed_under_either_key():
    """Runs started before ``method`` existed resume: their checkpoints hold these fingerprints (computed
    by fedcxr 0.2.0 at main 4d70a38, which knew only ``strategy``)."""
    base = {"sites": ["a", "b"], "target": "t", "rounds": 3, "seed": 7}
    for key in ("strategy", "method"):
        assert config_fingerprint(load_config(data={**base, key: "FedGP_Auto"}, check_sites=False)) == \
            "eec626c4674de65e"
    assert config_fingerprint(load_config(data={"sites": ["a"]}, check_sites=False)) == "5de14a000d548775"
