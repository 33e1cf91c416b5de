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
        with pytest.raises(UserError, match=rf"{key}: unknown method 'FedAVG' \(did you mean `FedAvg`\?\); {known}"):
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



def test_aux_reduction_is_sum_or_mean_and_only_mean_changes_the_fingerprint():
    base = {"sites": ["a"]}
    default = load_config(data=base, check_sites=False)
    assert default.aux_reduction == "sum"
    assert config_fingerprint(load_config(data={**base, "aux_reduction": "sum"}, check_sites=False)) == \
        config_fingerprint(default) == "5de14a000d548775"  # earlier versions' runs still resume
    assert config_fingerprint(load_config(data={**base, "aux_reduction": "mean"}, check_sites=False)) != \
        config_fingerprint(default)
    with pytest.raises(UserError, match="aux_reduction"):
        load_config(data={**base, "aux_reduction": "median"}, check_sites=False)

# --------------------------------------------------------------------------- typos: did you mean …?


def test_a_mistyped_key_at_any_level_gets_the_nearest_known_key(tmp_path):
    cases = [({"roudns": 3}, "roudns: Extra inputs are not permitted (did you mean `rounds`?)"),
             ({"source": {"lrr": 0.1}}, "source.lrr: Extra inputs are not permitted (did you mean `lr`?)"),
             ({"target_train": {"labled": 5}}, "target_train.labled: Extra inputs are not permitted (did you mean "
                                               "`labeled`?)"),
             ({"privacy": {"dp": {"noise_multiplyer": 1.0}}}, "(did you mean `noise_multiplier`?)"),
             ({"stratgy": "FedAvg"}, "(did you mean `strategy`?)"),
             ({"model": {"backbone": "resnet_tiyn"}}, "(did you mean `resnet_tiny`?)"),
             ({"model": {"backbone": "resnet19"}}, "(did you mean `resnet10` or `resnet18`?)")]
    for extra, message in cases:
        with pytest.raises(UserError) as info:
            load_config(data={"sites": ["a"], **extra}, check_sites=False)
        assert message in str(info.value), str(info.value)
    with pytest.raises(UserError) as info:       # nothing close: no guess
        load_config(data={"sites": ["a"], "zzzzzz": 1}, check_sites=False)
    assert "did you mean" not in str(info.value)


def test_a_mistyped_key_of_a_methods_options_block_gets_the_nearest_key_of_that_block():
    """The methods' blocks are not fields of the config: a typo inside one is compared with the block's
    own keys (never the top level's), a misspelt block name with the blocks' names too."""
    cases = [({"fedprox": {"muu": 0.1}}, "fedprox.muu: Extra inputs are not permitted (did you mean `mu`?)"),
             ({"surgical": {"head_warmup": {"epoch": 1}}}, "surgical.head_warmup.epoch: Extra inputs are not "
                                                           "permitted (did you mean `epochs`?)"),
             ({"fedprx": {"mu": 0.1}}, "fedprx: Extra inputs are not permitted (did you mean `fedprox`?)"),
             ({"gp": {"auto_alignment": "lr_s_over_lrt"}}, "(did you mean `lr_s_over_lr_t`?)")]
    for extra, message in cases:
        with pytest.raises(UserError) as info:
            load_config(data={"sites": ["a"], **extra}, check_sites=False)
        assert message in str(info.value), str(info.value)


def test_a_mistyped_set_key_method_class_or_site_gets_a_suggestion(tmp_path):
    with pytest.raises(UserError, match=r"roudns: Extra inputs are not permitted \(did you mean `rounds`\?\)"):
        load_config(data={"sites": ["a"]}, overrides=["roudns=3"], check_sites=False)
    with pytest.raises(UserError, match=r"unknown method 'FedAvg_FineTune' \(did you mean `FedAvg_Finetune`"):
        load_config(data={"sites": ["a"], "method": "FedAvg_FineTune"}, check_sites=False)
    with pytest.raises(UserError, match=r"unknown class\(es\) \['pneumonai'\] \(did you mean `pneumonia`\?\)"):
        load_config(data={"sites": ["a"], "model": {"classes": ["pneumonai"]}}, check_sites=False)
    _fake_site(tmp_path / "m", "hospital_a")
    _fake_site(tmp_path / "m", "hospital_b")
    with pytest.raises(UserError, match=r"site 'hospital_c'.*\(did you mean `hospital_a` or `hospital_b`\?\)"):
        load_config(_write(tmp_path, {"manifests": "m", "sites": ["hospital_a", "hospital_c"]}))
    with pytest.raises(UserError, match=r"site 'Hospital_A'.*\(did you mean `hospital_a`"):
        load_config(_write(tmp_path, {"manifests": "m", "sites": ["Hospital_A"]}))
