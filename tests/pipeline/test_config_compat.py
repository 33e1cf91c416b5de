"""Configs written for earlier versions keep loading and keep their fingerprint (issue 29 item 1, 7).

The fingerprints below were computed by fedcxr before the method options moved under their
methods' keys (commit ff6db77): a run started then resumes now only if they stay the same.
"""

from __future__ import annotations

import logging

import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline import config_compat
from fedcxr.pipeline.config import apply_overrides, config_fingerprint, dump_config, load_config

BASE = {"name": "golden", "sites": ["a", "b"], "target": "t", "rounds": 3,
        "source": {"lr": 0.002, "batch_size": 16, "steps": 2}, "model": {"backbone": "resnet_tiny", "hidden": 16},
        "image_size": 32, "seed": 1}

#: name → (what the old config added to BASE, its fingerprint then, the same config written with the new keys)
GOLDEN = {
    "fedavg_default": ({}, "9d544b2c92f4c4aa", {}),
    "strategy_key": ({"strategy": "FedAvg_Finetune"}, "8513f15f1f4f1733", {"method": "FedAvg_Finetune"}),
    "fedprox_mu": ({"method": "FedProx", "fedprox_mu": 0.1}, "601313b4119a92b9",
                   {"method": "FedProx", "fedprox": {"mu": 0.1}}),
    "scaffold_lr": ({"method": "SCAFFOLD", "server_lr": 0.5}, "6fccf6f558ab2533",
                    {"method": "SCAFFOLD", "scaffold": {"server_lr": 0.5}, "fedopt": {"server_lr": 0.5}}),
    "fedadam_all": ({"method": "FedAdam", "server_lr": 0.02, "server_betas": [0.8, 0.9], "server_tau": 0.01},
                    "5895471b4421b697",
                    {"method": "FedAdam", "fedopt": {"server_lr": 0.02, "betas": [0.8, 0.9], "tau": 0.01},
                     "scaffold": {"server_lr": 0.02}}),
    "gp_options": ({"method": "FedGP_Auto", "warmup_rounds": 0, "post_warmup_lr_scale": 0.5, "beta": 0.3,
                    "auto_alignment": "lr_t_over_lr_s"}, "80e75b5583fa1b73",
                   {"method": "FedGP_Auto", "gp": {"warmup_rounds": 0, "post_warmup_lr_scale": 0.5, "beta": 0.3,
                                                   "auto_alignment": "lr_t_over_lr_s"}}),
    "offline": ({"method": "Finetune_Offline", "finetune_offline_epochs": 3}, "484c0bf46a88d0ce",
                {"method": "Finetune_Offline", "finetune_offline": {"epochs": 3}}),
    "surgical": ({"method": "FL_Surgical", "target": None, "head_warmup": {"epochs": 2, "lr": 0.01}},
                 "8c9e7af33498cfbe",
                 {"method": "FL_Surgical", "target": None, "surgical": {"head_warmup": {"epochs": 2, "lr": 0.01}}}),
    "generic": ({"method": "FedAvg", "backbone_aggregation": "fedbn", "alpha": 0.5, "optimizer_state": "kept"},
                "982af634e1c20028",
                {"method": "FedAvg", "backbone_aggregation": "fedbn", "alpha": 0.5, "optimizer_state": "kept"}),
}


def _load(extra: dict):
    data = {**BASE, **extra}
    return load_config(data={k: v for k, v in data.items() if v is not None}, check_sites=False)


@pytest.mark.parametrize("name", GOLDEN)
def test_old_configs_keep_their_fingerprint_and_the_new_layout_has_it_too(name):
    old, fingerprint, new = GOLDEN[name]
    assert config_fingerprint(_load(old)) == fingerprint
    assert config_fingerprint(_load(new)) == fingerprint
    cfg = _load(new)  # the resolved config.yaml of a run loads back to the same fingerprint
    assert config_fingerprint(load_config(data=cfg.model_dump(mode="json"), check_sites=False)) == fingerprint


def test_a_moved_key_loads_into_its_block_with_a_deprecation_note(caplog):
    config_compat._WARNED.discard("warmup_rounds")
    with caplog.at_level(logging.WARNING, logger="fedcxr.pipeline.config_compat"):
        cfg = _load({"method": "FedGP", "warmup_rounds": 1, "beta": 0.25})
    assert cfg.options("gp").warmup_rounds == 1 and cfg.options("gp").beta == 0.25
    assert "`warmup_rounds` is deprecated" in caplog.text and "write `gp.warmup_rounds`" in caplog.text
    assert "warmup_rounds" not in dump_config(cfg).split("gp:")[0]  # written back under its method only


def test_an_old_key_beside_its_new_one_stops_naming_the_new_one():
    with pytest.raises(UserError, match=r"`beta` and `gp.beta` are both given.*keep `gp: \{beta: ...\}`"):
        _load({"beta": 0.3, "gp": {"beta": 0.4}})


def test_set_with_a_former_key_changes_the_value_the_yaml_wrote_under_either_name():
    new_style = {**BASE, "gp": {"beta": 0.2, "warmup_rounds": 3}}
    old_style = {**BASE, "head_warmup": {"epochs": 2, "lr": 0.01}}
    assert apply_overrides(new_style, ["warmup_rounds=0"])["gp"] == {"beta": 0.2, "warmup_rounds": 0}
    out = apply_overrides(old_style, ["head_warmup.epochs=0"])
    assert "head_warmup" not in out and out["surgical"] == {"head_warmup": {"epochs": 0, "lr": 0.01}}
    out = apply_overrides({**BASE, "server_lr": 0.5}, ["fedopt.server_lr=0.1"])
    assert out["fedopt"]["server_lr"] == 0.1 and out["scaffold"]["server_lr"] == 0.5
    cfg = load_config(data=apply_overrides({**BASE, "strategy": "FedGP"}, ["method=FedDA"]), check_sites=False)
    assert cfg.method == cfg.strategy == "FedDA"


def test_errors_in_a_block_name_the_block_key_and_the_former_name():
    with pytest.raises(UserError) as info:
        _load({"fedprox": {"mu": -1, "nu": 1}, "gp": {"beta": 2}, "bogus": 1, "head_warmup": {"epochs": -1}})
    text = str(info.value)
    for line in ("bogus: Extra inputs are not permitted", "fedprox.mu: Input should be greater than or equal to 0",
                 "fedprox.nu: Extra inputs are not permitted", "gp.beta: Input should be less than or equal to 1",
                 "surgical.head_warmup.epochs: Input should be greater than or equal to 0 (written as `head_warmup`"):
        assert line in text, text


def test_the_suites_own_config_writes_no_former_key(tiny_manifests, tmp_path):
    """The deprecation warning is said once per process: a former key in the suite's shared config would
    say it in whichever test loads a config first, and a test asserting its own warnings would pass or
    fail by the order the tests run in (tests/stats/test_pilot.py did, run alone)."""
    from ..conftest import tiny_config

    data = tiny_config(tiny_manifests, tmp_path / "cache")
    assert config_compat.upgrade(data) is data, "tests/conftest.py's tiny_config writes a key that moved (config_compat.MOVED_KEYS)"
