"""Which methods ``privacy.secure_aggregation`` can hide every update of: a property of each protocol
(:attr:`RoundProtocol.reads_each_update`), refused with the method's own reason otherwise."""

from __future__ import annotations

import re

import pytest

from fedcxr.errors import UserError
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.protocols import REGISTRY, get_protocol

BLIND = {"norm_factor": None, "norm_limit": None, "bn_factor": None, "check_variance": False}
#: the methods whose server needs only a weighted sum of the sites' models
WEIGHTED_SUM = ["APFL", "Ditto", "FL", "FL_PartialLoss", "FedAvg", "FedAvg_Finetune", "FedAvg_Finetune_AuxInfo",
                "FedBABU", "FedProx", "FedProx_Finetune", "Finetune_Offline", "Source_Only"]


def _cfg(method: str, **extra):
    return load_config(data={"sites": ["a", "b", "c"], "target": "t", "method": method, "defences": BLIND,
                             "privacy": {"secure_aggregation": "he"}, **extra}, check_sites=False)


def test_the_protocols_declare_which_servers_only_sum():
    assert sorted(m for m in REGISTRY if get_protocol(m).reads_each_update is None) == WEIGHTED_SUM


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_every_other_method_is_refused_with_what_its_server_reads(method):
    protocol = get_protocol(method)
    if method in WEIGHTED_SUM:
        protocol.validate_secure_aggregation(_cfg(method))
        return
    with pytest.raises(UserError, match=re.escape(f"privacy.secure_aggregation: he: method {method} "
                                                  f"{protocol.reads_each_update}, which an encrypted update hides")):
        protocol.validate_secure_aggregation(_cfg(method))


@pytest.mark.parametrize("method, backbone, refused", [
    ("FedAvg", "fedbn", False), ("FedAvg", "fedbn_plus", False), ("FedProx", "fedbn", False),
    ("FedAvg_Finetune", "fedbn", True), ("Finetune_Offline", "fedbn_plus", True), ("FedAvg_Finetune", "fedavg", False),
])
def test_fedbn_is_summed_where_the_batchnorm_entries_stay_apart(method, backbone, refused):
    cfg = _cfg(method, backbone_aggregation=backbone)
    if refused:
        with pytest.raises(UserError, match="takes the target's fine-tuned BatchNorm entries into the global model"):
            get_protocol(method).validate_secure_aggregation(cfg)
    else:
        get_protocol(method).validate_secure_aggregation(cfg)


def test_a_run_without_secure_aggregation_is_never_refused_for_it():
    cfg = load_config(data={"sites": ["a", "b"], "target": "t", "method": "FedGP"}, check_sites=False)
    get_protocol("FedGP").validate_secure_aggregation(cfg)
