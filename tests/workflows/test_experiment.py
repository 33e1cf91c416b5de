"""The experiment config a workflow is handed (fedcxr.workflows.experiment): a path, a mapping or an
``ExperimentConfig``, with the command line's ``--set`` strings and the API's keyword overrides."""

from __future__ import annotations

import pytest

from fedcxr.errors import UserError
from fedcxr.workflows.experiment import experiment_config, override_strings


def _config(**changes) -> dict:
    return {"name": "api", "manifests": "/nowhere", "sites": ["a", "b"], "target": "c", "method": "FedAvg_Finetune",
            "rounds": 4, **changes}


def test_a_config_is_a_path_a_mapping_or_a_validated_config_with_the_same_overrides(tmp_path):
    import yaml

    from fedcxr.pipeline.config import ExperimentConfig

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_config()))
    overrides = {"rounds": 2, "source": {"lr": 1e-3}, "seed": 7}
    assert override_strings(overrides) == ["rounds=2", "source.lr=0.001", "seed=7"]
    configs = [experiment_config(c, overrides=overrides, check_sites=False)
               for c in (path, str(path), _config(), ExperimentConfig.model_validate(_config()))]
    for cfg in configs:
        assert (cfg.rounds, cfg.source.lr, cfg.seed, cfg.method) == (2, 1e-3, 7, "FedAvg_Finetune")
    same = experiment_config(path, settings=["rounds=2", "source.lr=1e-3", "seed=7"], check_sites=False)
    assert same == configs[0]  # keyword overrides are exactly the command line's --set
    validated = configs[-1]
    assert experiment_config(validated, check_sites=False) is validated


def test_a_keyword_override_is_checked_like_a_set_key(tmp_path):
    with pytest.raises(UserError, match="roudns"):
        experiment_config(_config(), overrides={"roudns": 2}, check_sites=False)
    assert override_strings({"manifests": tmp_path, "sites": ("a", "b")}) == [f'manifests="{tmp_path}"',
                                                                             'sites=["a", "b"]']
