"""Every method fedcxr runs, by the papers' names: the one table of method names (a leaf).

Each entry names the protocol class that runs the method (in this package) and the options it
is built with; :data:`fedcxr.pipeline.protocols.REGISTRY` turns the table into protocol
factories. This module imports nothing, so the config can check a method name when it is
loaded (:class:`fedcxr.pipeline.config.ExperimentConfig`) without importing the protocols,
which import the config: the names live here, in ``protocols/``, and nowhere else (DESIGN §1).
"""

from __future__ import annotations

#: method name → (protocol class name, keyword arguments of its constructor besides the name)
METHODS: dict[str, tuple[str, dict]] = {
    # AuxInfo+GP paper (protocols/fedavg.py, protocols/target_combine.py, protocols/baselines.py)
    "FedAvg": ("FedAvgProtocol", {"finetune": False, "aux_info": False}),
    "FedAvg_Finetune": ("FedAvgProtocol", {"finetune": True, "aux_info": False}),
    "FedAvg_Finetune_AuxInfo": ("FedAvgProtocol", {"finetune": True, "aux_info": True}),
    "FedAvg_Finetune_GP": ("GPProtocol", {"aux_info": False}),
    "FedAvg_Finetune_AuxInfo_GP": ("GPProtocol", {"aux_info": True}),
    "Oracle": ("TargetOnlyProtocol", {"oracle": True}),
    # FedGP / auto-weighting paper
    "Source_Only": ("SourceOnlyProtocol", {}),
    "Finetune_Offline": ("FinetuneOfflineProtocol", {}),
    "FedDA": ("FedDAGPProtocol", {"rule": "fedda", "auto": False}),
    "FedGP": ("FedDAGPProtocol", {"rule": "fedgp", "auto": False}),
    "FedDA_Auto": ("FedDAGPProtocol", {"rule": "fedda", "auto": True}),
    "FedGP_Auto": ("FedDAGPProtocol", {"rule": "fedgp", "auto": True}),
    "Target_Only": ("TargetOnlyProtocol", {"oracle": False}),
    # surgical aggregation paper (protocols/surgical.py, protocols/baselines.py)
    "Individual": ("IndividualProtocol", {}),
    "PFL": ("SurgicalFamilyProtocol", {"mode": "pfl"}),
    "Central": ("CentralProtocol", {}),
    "FL": ("SurgicalFamilyProtocol", {"mode": "fl"}),
    "FL_PartialLoss": ("SurgicalFamilyProtocol", {"mode": "partial"}),
    "FL_Surgical": ("SurgicalFamilyProtocol", {"mode": "surgical"}),
    # FACT (protocols/fact.py)
    "FACT": ("FACTProtocol", {"finetune": True}),
    "FACT_NF": ("FACTProtocol", {"finetune": False}),
    # the reviewers' baselines (protocols/fedopt.py); _Finetune: the target fine-tunes as FedAvg_Finetune
    "FedProx": ("FedProxProtocol", {"finetune": False}),
    "FedProx_Finetune": ("FedProxProtocol", {"finetune": True}),
    "SCAFFOLD": ("SCAFFOLDProtocol", {"finetune": False}),
    "SCAFFOLD_Finetune": ("SCAFFOLDProtocol", {"finetune": True}),
    "FedAdagrad": ("FedOptProtocol", {"rule": "adagrad", "finetune": False}),
    "FedAdagrad_Finetune": ("FedOptProtocol", {"rule": "adagrad", "finetune": True}),
    "FedAdam": ("FedOptProtocol", {"rule": "adam", "finetune": False}),
    "FedAdam_Finetune": ("FedOptProtocol", {"rule": "adam", "finetune": True}),
    "FedYogi": ("FedOptProtocol", {"rule": "yogi", "finetune": False}),
    "FedYogi_Finetune": ("FedOptProtocol", {"rule": "yogi", "finetune": True}),
}

#: The method every config runs unless it says (``method:``).
DEFAULT_METHOD = "FedAvg"


def unknown_method(name: object) -> str:
    """The message for a method name that is not in :data:`METHODS` (listing the known ones); the
    name is user input: shown bounded."""
    from fedcxr.suggest import did_you_mean  # a leaf: this table still imports no protocol

    shown = repr(name) if isinstance(name, str) else f"of type {type(name).__name__}"
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"unknown method {shown}{did_you_mean(name, METHODS)}; known: {', '.join(METHODS)}"
