"""``privacy.secure_aggregation``: what a config must say to turn it on, and what it refuses beside it."""

from __future__ import annotations

import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline.config import config_fingerprint, load_config

BLIND = {"norm_factor": None, "norm_limit": None, "bn_factor": None, "check_variance": False}


def _cfg(**extra):
    return load_config(data={"sites": ["a", "b"], **extra}, check_sites=False)


def test_the_value_checks_must_be_turned_off_to_acknowledge_what_the_server_cannot_read():
    with pytest.raises(UserError, match=r"defences.norm_factor, defences.norm_limit, defences.bn_factor, defences.check_variance cannot "
                                        r"check it. Acknowledge that by turning them off \(defences: \{norm_factor: "
                                        r"null, norm_limit: null, bn_factor: null, check_variance: false\}\)"):
        _cfg(privacy={"secure_aggregation": "he"})
    with pytest.raises(UserError, match=r"defences.check_variance cannot check it. .*turning it off \(defences: "
                                        r"\{check_variance: false\}\)"):
        _cfg(privacy={"secure_aggregation": "he"}, defences={"norm_factor": None, "norm_limit": None, "bn_factor": None})
    cfg = _cfg(privacy={"secure_aggregation": "he"}, defences=BLIND)
    assert cfg.privacy.secure_aggregation == "he" and cfg.defences.check_counts  # counts are still checked


@pytest.mark.parametrize("extra, match", [
    ({"aggregation": "median"}, "aggregation.rule median: a robust rule compares the sites' updates value by value"),
    ({"privacy": {"secure_aggregation": "he", "filters": [{"exclude_vars": "^head"}]}},
     "with privacy.filters: the filters act on an update in the clear"),
    ({"privacy": {"secure_aggregation": "paillier"}}, "secure_aggregation"),
])
def test_what_cannot_work_on_encrypted_updates_is_refused_saying_why(extra, match):
    data = {"privacy": {"secure_aggregation": "he"}, "defences": BLIND, **extra}
    with pytest.raises(UserError, match=match):
        _cfg(**data)


def test_secure_aggregation_is_part_of_the_fingerprint_and_off_keeps_the_old_one():
    """A run sealed and a plain one differ in the 7th digit: a resume must not mix their checkpoints; a
    config without the option keeps the fingerprint runs of earlier versions were started with."""
    plain = _cfg(defences=BLIND)
    assert config_fingerprint(_cfg(defences=BLIND, privacy={"secure_aggregation": "he"})) != config_fingerprint(plain)
    assert config_fingerprint(_cfg(defences=BLIND, privacy={"secure_aggregation": None})) == \
        config_fingerprint(plain)
    assert config_fingerprint(load_config(data={"sites": ["a"]}, check_sites=False)) == "5de14a000d548775"
