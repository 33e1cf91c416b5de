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
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcxr.errors import UserError
from fedcxr.vocab import AUX_TASKS, CLASS_SET


#: Keys of older configs that were replaced, with what to write instead (exit 2 naming it).
RENAMED_KEYS = {
    "head_warmup_rounds": "use `head_warmup: {epochs: N, lr: 1e-3}` (head-only local epochs before the first "
                          "round, the best-validation head kept, as the surgical aggregation code; epochs: 0 "
                          "turns it off)",
    "surgical_weighting": "use `backbone_weighting: uniform|samples` (it now applies to every method's "
                          "backbone average, not only FL_Surgical)",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalTrainingConfig(_Strict):
    """How one site trains in one round (optimiser and whether its state carries over: per method)."""

    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(32, ge=1)
    epochs: int = Field(1, ge=0)
    steps: Optional[int] = Field(None, ge=1, description="optimizer steps per round; overrides epochs")
    weight_decay: Optional[float] = Field(
        None, ge=0, description="default per method: 5e-4 for FACT (its code's SGD), 0 otherwise")
    optimizer: Optional[Literal["adam", "adamw", "sgd"]] = Field(
        None, description="default per method: sgd (momentum 0.9) for FACT/FACT_NF (FACT client.py), adam "
        "otherwise (AuxInfo+GP, AutoFedGP and surgical aggregation code)")
    max_rows: Optional[int] = Field(None, ge=1, description="use at most this many training rows (speed)")


class TargetTrainingConfig(LocalTrainingConfig):
    """Target-site fine-tuning; ``labeled`` limits the labeled rows it may use."""

    lr: float = Field(2e-4, gt=0)
    labeled: Optional[Union[int, float]] = Field(
        None, description="labeled target rows used: a count (int) or a fraction of train rows (float ≤ 1)"
    )


class HeadWarmupConfig(_Strict):
    """FL, FL_PartialLoss, FL_Surgical, PFL: head-only local epochs before round 0 (surgical aggregation code)."""

    epochs: int = Field(15, ge=0, description="head-only epochs on the frozen backbone, the head with the lowest "
                        "validation loss kept; each client starts round 0 from its own warmed model (surgical "
                        "aggregation code: warmup_epochs=15, ModelCheckpoint on val_loss); 0: no warm-up")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of the warm-up (its __train_local default 1e-3)")
    batch_size: Optional[int] = Field(None, ge=1, description="default: source.batch_size")


class SharedTaskConfig(_Strict):
    """One binary output shared by every site, each site mapping its own condition onto it
    (AuxInfo+GP paper's CheXpert domains; :mod:`fedcxr.pipeline.shared_task`)."""

    output: str = Field(..., description="the one output, a canonical class (the head's row is named by it; "
                        "e.g. the target's condition)")
    site_labels: dict[str, str] = Field(..., description="site → the class that site labels, mapped onto `output`")
    balance: bool = Field(True, description="per site and split: all positives and as many negatives "
                          "(AuxInfo+GP: 2,000 positive / 2,000 negative per domain)")
    negatives: Literal["zero", "unmentioned"] = Field(
        "zero", description="zero: rows labeled 0 for the site's condition (the paper's text); unmentioned: "
        "rows where it is blank (the authors' preprocessing code)")

    @field_validator("site_labels")
    @classmethod
    def _known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted({c for c in value.values() if c not in CLASS_SET})
        if unknown:
            raise ValueError(f"unknown class(es) {unknown}; canonical classes: {sorted(CLASS_SET)}")
        return value

    @field_validator("output")
    @classmethod
    def _known_output(cls, value: str) -> str:
        if value not in CLASS_SET:
            raise ValueError(f"unknown class {value!r}; the output is named by a canonical class: {sorted(CLASS_SET)}")
        return value


class ModelConfig(_Strict):
    backbone: Literal["resnet18", "resnet10", "resnet_tiny", "densenet121"] = "resnet18"
    hidden: Optional[int] = Field(128, ge=1)
    weights: Optional[Path] = None
    classes: Optional[list[str]] = Field(None, description="model head classes; default: see `class_source`")
    norm: Literal["batch", "group"] = Field("batch", description="BatchNorm, or GroupNorm (needed by privacy.dp)")
    stem: Literal["imagenet", "small"] = Field(
        "imagenet", description="ResNet stem: `imagenet` (7x7 stride-2 conv + max-pool) or `small` (3x3 stride-1, "
        "no max-pool: for images of about 64 px or less, as MedMNIST's ResNet at 28 px; ~8x the compute)")

    @field_validator("classes")
    @classmethod
    def _known_classes(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        if value is not None:
            unknown = [c for c in value if c not in CLASS_SET]
            if unknown:
                raise ValueError(f"unknown class(es) {unknown}; canonical classes: {sorted(CLASS_SET)}")
        return value


class DPConfig(_Strict):
    """DP-SGD (Opacus) for every site's local training: per-sample clipping plus Gaussian noise.

    Needs ``pip install 'fedcxr[dp]'`` and a GroupNorm backbone (``model.norm: group``):
    Opacus refuses BatchNorm, whose statistics mix the samples of a batch. Each site's ε
    (for ``delta``) is accumulated over rounds and reported per site in ``run.json``.
    """

    noise_multiplier: float = Field(1.0, gt=0, description="σ: noise std / max_grad_norm")
    max_grad_norm: float = Field(1.0, gt=0, description="per-sample gradient clipping norm C")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of the reported (ε, δ)")


class PrivacyConfig(_Strict):
    """Who sees which update in the GP-family methods, FLARE output filters and DP (README "Privacy modes").

    * ``combine_at`` — fixed-β GP, FedDA, FedGP: ``server`` (default; the target sends its
      fine-tuned model, the server combines, no source update reaches a peer hospital) or
      ``target`` (the server sends every source update to the target, which combines).
    * ``auto_weights_at`` — FedDA_Auto/FedGP_Auto: ``server`` (default; the target also sends
      its per-batch updates, B × model size, to the server) or ``target`` (the sources'
      updates go to the target, which estimates β_i and combines).
    * ``filters`` — NVFLARE result filters every site applies to what it sends (FLARE runs only):
      ``{exclude_vars: REGEX | [names]}`` (those entries keep the global value) and
      ``{percentile_privacy: {percentile: 10, gamma: 0.01}}`` (Shokri & Shmatikov). With any
      filter, sites send updates as differences from the model they received.
    * ``dp`` — DP-SGD local training (:class:`DPConfig`); null: off.
    """

    combine_at: Literal["server", "target"] = "server"
    auto_weights_at: Literal["server", "target"] = "server"
    filters: list[dict[str, Any]] = Field(default_factory=list)
    dp: Optional[DPConfig] = None

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, item in enumerate(value):
            if not isinstance(item, dict) or len(item) != 1 or next(iter(item)) not in FILTERS:
                raise ValueError(f"filters[{i}]: each filter is one of {{{', '.join(FILTERS)}: ...}}, got {item!r}")
            kind, args = next(iter(item.items()))
            if kind == "exclude_vars":
                ok = isinstance(args, str) and args or (isinstance(args, list) and args
                                                        and all(isinstance(a, str) for a in args))
                if not ok:
                    raise ValueError(f"filters[{i}].exclude_vars: a regular expression or a list of entry names")
                if isinstance(args, str):
                    try:
                        re.compile(args)
                    except re.error as exc:
                        raise ValueError(f"filters[{i}].exclude_vars: not a regular expression ({exc})") from None
            else:
                unknown = sorted(set(args or {}) - {"percentile", "gamma"}) if isinstance(args, dict) else ["?"]
                if unknown:
                    raise ValueError(f"filters[{i}].percentile_privacy: a mapping of percentile and gamma, "
                                     f"got {args!r}")
                if not 0 <= float(args.get("percentile", 10)) <= 100 or float(args.get("gamma", 0.01)) <= 0:
                    raise ValueError(f"filters[{i}].percentile_privacy: percentile in 0..100, gamma > 0")
        return value


#: FLARE result filters ``privacy.filters`` may name (mapped in :mod:`fedcxr.flare.job`).
FILTERS = ("exclude_vars", "percentile_privacy")


class EngineConfig(_Strict):
    """How training uses the hardware (:mod:`fedcxr.pipeline.engine`); ``null`` = auto.

    Auto is right on CPU and on CUDA: AMP, channels-last, cuDNN autotuning, pinned memory and
    moving waiting sites' models off the GPU are on for CUDA only. None of these keys is part
    of the config fingerprint (like ``device``), so a run may resume with other values.
    """

    amp: Optional[bool] = Field(None, description="float16 autocast on CUDA (auto: on)")
    channels_last: Optional[bool] = Field(None, description="NHWC model and batches (auto: on CUDA)")
    cudnn_benchmark: Optional[bool] = Field(None, description="cuDNN autotuning (auto: on CUDA unless deterministic)")
    deterministic: bool = Field(False, description="deterministic CUDA kernels (slower; CPU runs always are)")
    pin_memory: Optional[bool] = Field(None, description="page-locked batches (auto: on CUDA)")
    persistent_workers: Optional[bool] = Field(None, description="keep loader workers between epochs (auto: on)")
    prefetch_factor: Optional[int] = Field(None, ge=1, description="batches each loader worker prepares ahead")
    cache_workers: int = Field(0, ge=0, description="processes decoding a site's image cache (0: every core)")
    offload_idle: Optional[bool] = Field(None, description="a site's model leaves the GPU between its turns")


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
    head_warmup: HeadWarmupConfig = Field(HeadWarmupConfig(), description=HeadWarmupConfig.__doc__)
    optimizer_state: Optional[Literal["fresh", "kept"]] = Field(
        None, description="`kept`: each site's optimiser state carries over from round to round (saved in "
        "checkpoints); `fresh`: a new optimiser every round. Default per method as the authors' code: kept "
        "for FL, FL_PartialLoss, FL_Surgical, PFL (surgical aggregation: one compiled Keras Adam per client) "
        "and FACT/FACT_NF (one SGD per client); fresh for the rest (AuxInfo+GP and AutoFedGP build a new "
        "Adam in every train() call)")
    min_sites: int = Field(1, ge=1, description="a round needs at least this many source replies")
    model: ModelConfig = ModelConfig()
    task: Optional[SharedTaskConfig] = Field(None, description=SharedTaskConfig.__doc__)
    class_source: Literal["target", "union", "sources"] = "target"
    image_size: int = Field(224, ge=8)
    augment: bool = True
    device: str = Field("auto", description="auto (CUDA when present) | cpu | cuda | cuda:N (GPU number N)")
    seed: int = 0
    cache_dir: Optional[Path] = None
    eval_sites: Optional[list[str]] = Field(None, description="sites evaluated; default target or all")
    eval_every: int = Field(1, ge=0, description="validation AUROC every N rounds (0: never)")
    select_round: Literal["last", "best_val"] = Field(
        "last", description="which round's model becomes final_model.pt: the `last`, or the one with the highest "
        "mean validation AUROC over the evaluated sites (`best_val`; validation rounds only, see `eval_every`; "
        "ties keep the earlier round). The test split is never looked at. MedMNIST's training code keeps the "
        "best-validation epoch the same way")
    num_workers: Optional[int] = Field(None, ge=0, description="loader processes (auto: 0 on CPU, up to 8 on CUDA)")
    engine: EngineConfig = EngineConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    tracking: Optional[Literal["none", "tensorboard", "mlflow"]] = Field(
        None, description="per-round scalars: tensorboard (RUN_DIR/tensorboard), mlflow, none; "
                          "default tensorboard when installed (fedcxr.tracking)")

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """An old config using a key that was replaced stops naming the new key (never silently ignored)."""
        if isinstance(data, dict):
            for old, new in RENAMED_KEYS.items():
                if old in data:
                    raise ValueError(f"`{old}` was replaced: {new}")
        return data

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        """``cuda:N`` picks a GPU by number; whether it exists is checked when the run starts."""
        text = str(value).strip().lower()
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
            raise ValueError(f"{value!r}: use auto, cpu, cuda or cuda:N (N: the GPU's number, e.g. cuda:1)")
        return text

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
    def _dp_needs_group_norm(self) -> "ExperimentConfig":
        """Opacus computes per-sample gradients; BatchNorm mixes the samples of a batch, so DP-SGD refuses it."""
        if self.privacy.dp is not None and self.model.norm != "group":
            raise ValueError("privacy.dp: DP-SGD (Opacus) cannot train BatchNorm layers, which mix the samples of a "
                             "batch; set model.norm: group (GroupNorm backbone) or remove privacy.dp")
        return self

    @model_validator(mode="after")
    def _best_val_needs_validation(self) -> "ExperimentConfig":
        if self.select_round == "best_val" and self.eval_every == 0:
            raise ValueError("select_round: best_val picks the round by validation AUROC, but eval_every: 0 "
                             "never validates; set eval_every ≥ 1 or select_round: last")
        return self

    @model_validator(mode="after")
    def _target_not_a_source(self) -> "ExperimentConfig":
        """A site is a source or the target, never both (a target listed in ``sites`` was silently dropped)."""
        if self.target is not None and self.site_name(self.target) in {self.site_name(s) for s in self.sites}:
            raise ValueError(f"target {self.target!r} is also listed under `sites`; a site is either a source "
                             "or the target: remove it from `sites`")
        return self

    @model_validator(mode="after")
    def _every_site_has_a_task_label(self) -> "ExperimentConfig":
        if self.task is not None:
            missing = [self.site_name(s) for s in self.all_sites() if self.site_name(s) not in self.task.site_labels]
            if missing:
                raise ValueError(f"task.site_labels: no class given for site(s) {missing}")
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
    """Hash of everything that changes a run's result (device, workers, the engine block, cache and
    where the manifests folder lies do not: the sites' content is checked separately, by manifest
    hash, on resume)."""
    data = cfg.model_dump(mode="json")
    for key in ("device", "num_workers", "cache_dir", "manifests", "engine", "tracking"):
        data.pop(key, None)
    for key, default in (("norm", "batch"), ("stem", "imagenet")):  # defaults: the fingerprint of earlier versions
        if data.get("model", {}).get(key) == default:
            data["model"].pop(key)
    if data.get("select_round") == "last":
        data.pop("select_round")
    privacy = data.pop("privacy", {})
    for key in ("combine_at", "auto_weights_at"):  # where a rule is computed does not change its result
        privacy.pop(key, None)
    if privacy != {"filters": [], "dp": None}:  # no privacy options: the fingerprint of earlier versions
        data["privacy"] = privacy
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
