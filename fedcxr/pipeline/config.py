"""Experiment configuration: one YAML file, validated by pydantic (DESIGN §7).

Example::

    name: demo
    manifests: manifests          # folder holding one sub-folder per site (relative to the YAML)
    sites: [nih_style, chexpert_style, midrc_style]   # source sites
    target: dicom_style           # optional target site (fine-tuning / evaluation)
    strategy: FedAvg_Finetune
    rounds: 5
    source: {lr: 1.0e-3, batch_size: 32, epochs: 1}
    target_train: {lr: 2.0e-4, batch_size: 32, epochs: 1, labeled: 0.25}
    model: {backbone: resnet18, hidden: 128}
    image_size: 224
    seed: 0

Every key is checked: an unknown key, a missing site folder, an unknown class or strategy
stops with exit code 2 and a message naming the key.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcxr.errors import UserError
from fedcxr.vocab import AUX_TASKS, CLASS_SET


#: Keys of older configs that were replaced, with what to write instead (exit 2 naming it).
RENAMED_KEYS = {
    "surgical_weighting": "use `backbone_weighting: uniform|samples` (it now applies to every method's "
                          "backbone average, not only FL_Surgical)",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalTrainingConfig(_Strict):
    """How one site trains in one round (Adam, fresh each round as in the papers)."""

    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(32, ge=1)
    epochs: int = Field(1, ge=0)
    steps: Optional[int] = Field(None, ge=1, description="optimizer steps per round; overrides epochs")
    weight_decay: float = Field(0.0, ge=0)
    max_rows: Optional[int] = Field(None, ge=1, description="use at most this many training rows (speed)")


class TargetTrainingConfig(LocalTrainingConfig):
    """Target-site fine-tuning; ``labeled`` limits the labeled rows it may use."""

    lr: float = Field(2e-4, gt=0)
    labeled: Optional[Union[int, float]] = Field(
        None, description="labeled target rows used: a count (int) or a fraction of train rows (float ≤ 1)"
    )


class ModelConfig(_Strict):
    backbone: Literal["resnet18", "resnet10", "resnet_tiny", "densenet121"] = "resnet18"
    hidden: Optional[int] = Field(128, ge=1)
    weights: Optional[Path] = None
    classes: Optional[list[str]] = Field(None, description="model head classes; default: see `class_source`")

    @field_validator("classes")
    @classmethod
    def _known_classes(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is not None:
            unknown = [c for c in value if c not in CLASS_SET]
            if unknown:
                raise ValueError(f"unknown class(es) {unknown}; canonical classes: {sorted(CLASS_SET)}")
        return value


class ExperimentConfig(_Strict):
    name: str = "experiment"
    manifests: Optional[Path] = Field(None, description="base folder of the site folders")
    sites: list[str] = Field(..., min_length=1, description="source site folders (or all sites)")
    target: Optional[str] = None
    strategy: str = "FedAvg"
    rounds: int = Field(5, ge=0)
    warmup_rounds: Optional[int] = Field(
        None, ge=0, description="GP/FedDA/FedGP: the first rounds (counted in `rounds`) are warm-up rounds. "
        "Default per method as the authors' code: 2 plain FedAvg rounds for FedDA, FedGP, FedDA_Auto, "
        "FedGP_Auto (AutoFedGP main_domain_bed*.py: 'do fedavg for 2 epochs'); 5 rounds for "
        "FedAvg_Finetune_GP and FedAvg_Finetune_AuxInfo_GP, in which θ0 of the projection is the FedAvg of "
        "the sources (AuxInfo+GP federated_*_multi.py: `if i < 5: average_weights`)")
    post_warmup_lr_scale: Optional[float] = Field(
        None, gt=0, description="multiplies source and target learning rates after the warm-up rounds. "
        "Default per method: 0.1 for FedDA_Auto and FedGP_Auto (AutoFedGP main_domain_bed_auto_beta.py: "
        "hparams['lr'] *= 0.1 after warm-up), 1 otherwise")
    source: LocalTrainingConfig = LocalTrainingConfig()
    target_train: TargetTrainingConfig = TargetTrainingConfig()
    finetune_offline_epochs: int = Field(
        50, ge=1, description="Finetune_Offline: target fine-tuning passes after the last FedAvg round, each "
        "one `target_train` budget with a fresh optimiser (FedGP paper App. C: 'the same number of 50 epochs "
        "of fine-tuning after FedAvg'; AutoFedGP main_domain_bed_offline.py calls train() once per epoch)")
    alpha: float = Field(1.0, ge=0, description="weight of auxiliary losses (AuxInfo)")
    beta: float = Field(0.5, ge=0, le=1, description="GP: weight of the source projection")
    aux_tasks: list[str] = Field(default_factory=lambda: list(AUX_TASKS))
    aux_info: Optional[bool] = Field(None, description="force AuxInfo on/off; default from the strategy name")
    backbone_aggregation: Literal["fedavg", "fedbn", "fedbn_plus"] = "fedavg"
    backbone_weighting: Optional[Literal["uniform", "samples"]] = Field(
        None, description="how the server weights sites when it averages the shared entries: `uniform` "
        "(1/K) or `samples` (n_i/Σn). Default per method: uniform for FL, FL_PartialLoss, FL_Surgical, PFL "
        "(surgical aggregation paper Eq. 1 and its code's np.mean over clients); samples for FedAvg and the "
        "GP/FedDA/FedGP family (AuxInfo+GP and AutoFedGP code: clients_size_frac)")
    head_warmup_rounds: int = Field(0, ge=0, description="surgical/FL: rounds training heads only first")
    min_sites: int = Field(1, ge=1, description="a round needs at least this many source replies")
    model: ModelConfig = ModelConfig()
    class_source: Literal["target", "union", "sources"] = "target"
    image_size: int = Field(224, ge=8)
    augment: bool = True
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = 0
    cache_dir: Optional[Path] = None
    eval_sites: Optional[list[str]] = Field(None, description="sites evaluated; default target or all")
    eval_every: int = Field(1, ge=0, description="validation AUROC every N rounds (0: never)")
    num_workers: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """An old config using a key that was replaced stops naming the new key (never silently ignored)."""
        if isinstance(data, dict):
            for old, new in RENAMED_KEYS.items():
                if old in data:
                    raise ValueError(f"`{old}` was replaced: {new}")
        return data

    @field_validator("aux_tasks")
    @classmethod
    def _known_aux(cls, value: list[str]) -> list[str]:
        unknown = [t for t in value if t not in AUX_TASKS]
        if unknown:
            raise ValueError(f"unknown aux task(s) {unknown}; known: {AUX_TASKS}")
        return value

    # ------------------------------------------------------------------ resolved views
    def base_dir(self) -> Path:
        return Path(self.manifests) if self.manifests is not None else Path(".")

    def site_dir(self, site: str) -> Path:
        path = Path(site)
        return path if path.is_absolute() else self.base_dir() / path

    def all_sites(self) -> list[str]:
        """Sources then target (once), as written."""
        out = list(self.sites)
        if self.target and self.target not in out:
            out.append(self.target)
        return out

    @model_validator(mode="after")
    def _target_not_a_source(self) -> "ExperimentConfig":
        """A site is a source or the target, never both (a target listed in ``sites`` was silently dropped)."""
        if self.target is not None and self.site_name(self.target) in {self.site_name(s) for s in self.sites}:
            raise ValueError(f"target {self.target!r} is also listed under `sites`; a site is either a source "
                             "or the target: remove it from `sites`")
        return self

    def source_sites(self) -> list[str]:
        return [s for s in self.sites if s != self.target]

    def site_name(self, site: str) -> str:
        return Path(site).name


def _set_dotted(data: dict, key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"--set {key}: {part!r} is not a mapping")
    node[parts[-1]] = value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``--set key=value`` (YAML-parsed values, dotted keys) to a raw config mapping."""
    out = copy.deepcopy(data)
    for item in overrides or []:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part.strip() for part in key.split(".")):
            raise UserError(f"--set {item!r}: the key is empty (expected KEY=VALUE, e.g. rounds=10 or source.lr=1e-3)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            reason = str(getattr(exc, "problem", "") or "not valid YAML")
            raise UserError(f"--set {key}: cannot read the value {raw!r} ({reason}); quote strings, "
                            "write lists as [a, b]") from None
        _set_dotted(out, key, value)
    return out


def load_config(path: Path | str | None = None, *, data: Optional[dict] = None,
                overrides: Optional[list[str]] = None, check_sites: bool = True) -> ExperimentConfig:
    """Read, override and validate a config; relative ``manifests`` resolve against the YAML's folder.

    ``check_sites=False`` skips the manifest check (``fedcxr flare export``: the sites' data
    lives at the hospitals, not where the job is written)."""
    if data is None:
        if path is None:
            raise UserError("no config given")
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path}: config file not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: the config must be a mapping of keys to values")
        if data.get("manifests") is not None and not Path(data["manifests"]).is_absolute():
            data["manifests"] = str((path.parent / data["manifests"]).resolve())
    data = apply_overrides(data, overrides or [])
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        lines = [_error_line(err) for err in exc.errors()]
        raise UserError(where + "invalid config:\n  " + "\n  ".join(lines)) from None
    if check_sites:
        check_sites_exist(cfg)
    return cfg


def _error_line(err: dict) -> str:
    """One pydantic error as ``key.path: message`` (no "Value error," prefix, no empty key)."""
    message = str(err["msg"]).removeprefix("Value error, ")
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {message}" if where else message


def check_sites_exist(cfg: ExperimentConfig) -> None:
    """Every named site must be an ingested manifest folder."""
    for site in cfg.all_sites():
        folder = cfg.site_dir(site)
        if not (folder / "manifest.parquet").is_file():
            raise UserError(
                f"site {site!r}: no manifest at {folder / 'manifest.parquet'} "
                f"(sites are folders written by `fedcxr ingest`; check `manifests:` and `sites:`)"
            )
    if cfg.eval_sites:
        unknown = [s for s in cfg.eval_sites if s not in cfg.all_sites()]
        if unknown:
            raise UserError(f"eval_sites: {unknown} are not among sites/target {cfg.all_sites()}")


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (written into every run directory)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def config_fingerprint(cfg: ExperimentConfig) -> str:
    """Hash of everything that changes a run's result (device, workers, cache and where the manifests
    folder lies do not: the sites' content is checked separately, by manifest hash, on resume)."""
    data = cfg.model_dump(mode="json")
    for key in ("device", "num_workers", "cache_dir", "manifests"):
        data.pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
