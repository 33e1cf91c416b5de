"""The pilot round of ``fedcxr stats``: what it says is about the pilot (a FedGP_Auto round), not the user's method."""

from __future__ import annotations

import logging

import pytest

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.protocols.target_combine import PILOT_METHOD
from fedcxr.stats.pilot import pilot_estimates, pilot_note

from ..conftest import tiny_config


@pytest.mark.slow  # one short training round of three sites (~5 s on 2 cores)
def test_the_pilots_batch_warning_is_labelled_as_the_pilots_not_the_configs_method(tiny_manifests, tmp_path, caplog):
    """The tiny target gives 2 batch updates a round: FedGP_Auto would warn. The config trains FedAvg_Finetune,
    whose run that advice does not concern: the warning says it is about the pilot and leaves the run alone."""
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache"))
    assert cfg.method != PILOT_METHOD
    with caplog.at_level(logging.WARNING, logger="fedcxr"):
        pilot = pilot_estimates(cfg, device="cpu")
    assert pilot["status"] == "ok"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings and all(w.startswith("the pilot round") for w in warnings), warnings
    assert f"nothing to change for your {cfg.method} run" in warnings[0]
    assert pilot["notes"] == warnings


def test_a_config_of_the_pilots_own_kind_is_told_the_advice_is_its_own():
    said = "FedGP_Auto: the target gives B = 2 batch update(s) per round; lower target_train.batch_size to 3"
    assert pilot_note(said, "FedGP_Auto", auto=True).endswith(f"(this applies to your FedGP_Auto run too): {said}")
    other = pilot_note(said, "FedAvg_Finetune", auto=False)
    assert other.startswith("the pilot round (one FedGP_Auto round that only estimates σ² and β for this report)")
    assert "advice for FedGP_Auto, nothing to change for your FedAvg_Finetune run" in other
