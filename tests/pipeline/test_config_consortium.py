"""``participation:`` and ``simulate:`` (fedcxr.pipeline.config_consortium): old configs load and keep
their fingerprint, the two names of min_sites are one setting, bad values exit 2 naming the key."""

from __future__ import annotations

import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline.config import ExperimentConfig, apply_overrides, config_fingerprint, load_config

#: fingerprints of configs written before participation: (pinned: computed by the version before it)
GOLDEN = [({"sites": ["a", "b"]}, "11461666544ce7c8"),
          ({"sites": ["a", "b", "c"], "min_sites": 2, "method": "SCAFFOLD"}, "646995e7d09fce2a"),
          ({"sites": ["a"], "target": "t", "method": "FedGP"}, "061e87ada48fc349")]


@pytest.mark.parametrize("data, fingerprint", GOLDEN)
def test_configs_without_participation_keep_their_fingerprint(data, fingerprint):
    assert config_fingerprint(ExperimentConfig(**data)) == fingerprint


def test_top_level_min_sites_is_participation_min_sites():
    old = ExperimentConfig(sites=["a", "b", "c"], min_sites=2)
    new = ExperimentConfig(sites=["a", "b", "c"], participation={"min_sites": 2})
    assert old.min_sites == new.min_sites == old.participation.min_sites == 2
    assert config_fingerprint(old) == config_fingerprint(new)
    assert "min_sites" not in old.model_dump() and old.model_dump()["participation"]["min_sites"] == 2
    assert ExperimentConfig(sites=["a", "b"], min_sites=2, participation={"min_sites": 2}).min_sites == 2
    with pytest.raises(ValueError, match="one setting"):
        ExperimentConfig(sites=["a", "b"], min_sites=1, participation={"min_sites": 2})
    # --set either name replaces the setting, whichever name the YAML used
    data = {"sites": ["a", "b", "c"], "participation": {"fraction": 0.5, "min_sites": 1}}
    cfg = ExperimentConfig(**apply_overrides(data, ["min_sites=3"]))
    assert cfg.min_sites == 3 and cfg.participation.fraction == 0.5
    assert ExperimentConfig(**apply_overrides({"sites": ["a", "b"], "min_sites": 1},
                                              ["participation.min_sites=2"])).min_sites == 2


def test_participation_and_simulate_change_the_fingerprint():
    base = config_fingerprint(ExperimentConfig(sites=["a", "b"]))
    prints = {config_fingerprint(ExperimentConfig(sites=["a", "b"], **extra)) for extra in (
        {"participation": {"fraction": 0.5}}, {"participation": {"deadline_s": 60}}, {"simulate": {}},
        {"simulate": {"dropout": 0.1}})}
    assert base not in prints and len(prints) == 4


@pytest.mark.parametrize("block, message", [
    ({"participation": {"fraction": 0}}, "participation.fraction"),
    ({"participation": {"fraction": 1.5}}, "participation.fraction"),
    ({"participation": {"deadline_s": -1}}, "participation.deadline_s"),
    ({"participation": {"min_sites": 3}}, "participation.min_sites: 3 is more than the 2 site"),
    ({"participation": {"share": 0.5}}, "share"),
    ({"simulate": {"dropout": 1.0}}, "simulate.dropout"),
    ({"simulate": {"speed": True}}, "simulate.speed"),
    ({"simulate": {"speed": -2}}, "simulate.speed"),
    ({"simulate": {"latency_s": {"median": 0}}}, "simulate.latency_s"),
    ({"simulate": {"sites": {"nowhere": {"speed": 2}}}}, "simulate.sites: ['nowhere'] not among the run's sites"),
    ({"simulate": {"step_s": ".nan"}}, "simulate.step_s"),
])
def test_bad_participation_or_simulate_values_exit_2_naming_the_key(tiny_manifests, tmp_path, block, message):
    from ..conftest import tiny_config

    data = tiny_config(tiny_manifests, tmp_path / "cache", target=None, **block)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_config(data=data)
