"""Experiment configuration: one YAML file, validated by pydantic (DESIGN §7).

Example::

    name: demo
    manifests: manifests          # folder holding one sub-folder per site (relative to the YAML)
    sites: [nih_style, chexpert_style, midrc_style]   # source sites
    target: dicom_style           # optional target site (fine-tuning / evaluation)
    method: FedAvg_Finetune       # the papers' method names (fedcxr.pipeline.protocols); `strategy:` works too
    rounds: 5
    source: {lr: 1.0e-3, batch_size: 32, epochs: 1}
    target_train: {lr: 2.0e-4, batch_size: 32, epochs: 1, labeled: 0.25}
    model: {backbone: resnet18, hidden: 128}
    image_size: 224
    seed: 0

Every key is checked: an unknown key, a missing site folder, an unknown class or method
stops with exit code 2 and a message naming the key.

A method's own options live under its own key, declared by its module (docs/methods.md):
``fedprox: {mu: 0.01}``, ``gp: {beta: 0.5, warmup_rounds: 2}``, ... Every registered method's
block is accepted (a sweep runs one config under several methods) and checked at load
(:func:`fedcxr.pipeline.protocols.methods.option_models`; ``method: path/to/file.py:Name`` adds that
method's block); :meth:`ExperimentConfig.options` reads one, typed. Former names of keys (``strategy``
for ``method``, the method options that were top-level keys) keep loading, with the same
fingerprint: :mod:`fedcxr.pipeline.config_compat`, the one place that knows them.

Per-method defaults (optimiser, target batch size, warm-up rounds, ...) are the method's, set
and documented in its protocol (:mod:`fedcxr.pipeline.protocols`: ``task_defaults`` and the class
attributes beside it); a field left unset here takes them, a field set here overrides them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_serializer, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from fedcxr.errors import UserError
from fedcxr.pipeline import config_compat
from fedcxr.escape import short
from fedcxr.pipeline import config_consortium as consortium
# the bounds on every size and count (SECURITY.md R7) and the privacy/aggregation/defences sections live in
# modules of their own; their names are re-exported here (``fedcxr.pipeline.config.MAX_SITE_ROWS``, ...)
from fedcxr.pipeline.config_bounds import (  # noqa: F401
    MAX_BATCH, MAX_EPOCHS, MAX_FILTERS, MAX_HIDDEN, MAX_IMAGE_SIZE, MAX_NAME, MAX_PATH, MAX_ROUNDS, MAX_ROWS, MAX_SITES,
    MAX_SITE_ROWS, MAX_STEPS, MAX_WORKERS)
from fedcxr.pipeline.config_bounds import Strict as _Strict
from fedcxr.pipeline.config_bounds import refuse as _refuse
from fedcxr.pipeline.config_defences import (  # noqa: F401
    FILTERS, NEW_DEFENCES, AggregationConfig, DefencesConfig, DPConfig, PrivacyConfig)
from fedcxr.pipeline.config_errors import error_line
from fedcxr.suggest import did_you_mean
from fedcxr.site_adapters.site_names import MAX_SITE_NAME
from fedcxr.yamlfile import check_size, read_yaml
from fedcxr.vocab import AUX_TASKS, CLASS_SET


#: error lines shown for one invalid config (the rest are counted)
MAX_ERROR_LINES = 20


#: The description of a field whose default is the method's: the value is set, with the code it follows,
#: in the method's protocol (never repeated here, so the two cannot drift apart).
METHOD_DEFAULT = ("null: the method's default, set with its source in the method's protocol "
                  "(fedcxr.pipeline.protocols: RoundProtocol.task_defaults and the attributes beside it; "
                  "the README's table of defaults)")


def _nearest_classes(unknown: list) -> str:
    """`` (did you mean `pneumonia`?)`` for the first mistyped class that is close to a canonical one."""
    for name in unknown[:20]:
        hint = did_you_mean(name, sorted(CLASS_SET))
        if hint:
            return hint if len(unknown) == 1 else hint.replace("(did you mean", f"({short(name, 40)}: did you mean", 1)
    return ""


class LocalTrainingConfig(_Strict):
    """How one site trains in one round (optimiser and whether its state carries over: per method)."""

    lr: float = Field(1e-3, gt=0, description="AuxInfo+GP App. A.3 (sources 1e-3); DomainBed's small-image "
                      "default that AutoFedGP uses (hparams_registry lr 1e-3)")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH, description="AuxInfo+GP federated_chexpert/mimic_multi.py "
                            "--source_batch_size 32; DomainBed's default for large images")
    epochs: int = Field(1, ge=0, le=MAX_EPOCHS, description="local passes per round: 1 in both papers' code "
                        "(--num_source_epochs/--num_target_epochs 1; 'local update epoch 1')")
    steps: Optional[int] = Field(None, ge=1, le=MAX_STEPS, description="optimizer steps per round; overrides epochs")
    weight_decay: Optional[float] = Field(None, ge=0, description=METHOD_DEFAULT)
    optimizer: Optional[Literal["adam", "adamw", "sgd"]] = Field(None, description=METHOD_DEFAULT)
    max_rows: Optional[int] = Field(None, ge=1, le=MAX_ROWS, description="use at most this many training rows (speed)")
    momentum: Optional[float] = Field(
        None, ge=0, lt=1, description="SGD momentum; " + METHOD_DEFAULT)


class HoldoutConfig(_Strict):
    """Fold ``fold`` of ``folds`` (the labeled rows' patients) held out of training: cross-fitting within
    the label budget (:mod:`fedcxr.pipeline.labeled_rows`; ``fedcxr sweep --select`` sets it)."""

    folds: int = Field(..., ge=2, le=20)
    fold: int = Field(..., ge=0, le=19)

    @model_validator(mode="after")
    def _fold_in_range(self) -> "HoldoutConfig":
        if self.fold >= self.folds:
            raise ValueError(f"fold {self.fold} is not one of 0..{self.folds - 1}")
        return self


class TargetTrainingConfig(LocalTrainingConfig):
    """Target-site fine-tuning; ``labeled`` limits the labeled rows it may use."""

    lr: float = Field(2e-4, gt=0, description="1/5 of the sources' 1e-3, as the papers: AuxInfo+GP App. A.3 "
                      "(target 2e-4, sources 1e-3) and AutoFedGP `--lr_ratio 0.2`")
    batch_size: Optional[int] = Field(
        None, ge=1, le=MAX_BATCH, description=METHOD_DEFAULT)
    labeled: Optional[Union[int, float]] = Field(
        None, description="labeled target rows used: a count (int ≥ 1) or a fraction of train rows (float in (0, 1])"
    )
    label_draw: Optional[int] = Field(None, ge=0, le=2**31 - 1, description=(
        "which labeled rows the cap keeps: null = the one fixed draw of earlier versions (their rows and "
        "fingerprint); k = draw k, other whole patients, as many (fedcxr.pipeline.labeled_rows)"))
    holdout: Optional[HoldoutConfig] = Field(None, description="{folds: K, fold: i}: fold i held out of training")

    @field_validator("labeled")
    @classmethod
    def _labeled_rows(cls, value):
        """A count of at least one row, or a fraction in (0, 1] (``labeled: -5`` silently trained on 1 row)."""
        if value is None or isinstance(value, bool):
            return None if value is None else _refuse("a count of rows or a fraction, not true/false")
        if isinstance(value, int):
            if not 1 <= value <= MAX_ROWS:
                _refuse(f"a count of labeled rows is 1 to {MAX_ROWS:,}, got {value}")
            return value
        if 0 < value <= 1:
            return value
        if value > 1 and value == int(value) and value <= MAX_ROWS:
            return int(value)
        return _refuse(f"a fraction of the train rows is in (0, 1] (a count is a whole number ≥ 1), got {value}")


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
            raise ValueError(f"unknown class(es) {short(unknown)}{_nearest_classes(unknown)}; canonical classes: "
                             f"{sorted(CLASS_SET)}")
        return value

    @field_validator("output")
    @classmethod
    def _known_output(cls, value: str) -> str:
        if value not in CLASS_SET:
            raise ValueError(f"unknown class {short(value)}{did_you_mean(value, sorted(CLASS_SET))}; the output is "
                             f"named by a canonical class: {sorted(CLASS_SET)}")
        return value


class ModelConfig(_Strict):
    backbone: Literal["resnet18", "resnet10", "resnet_tiny", "densenet121"] = "resnet18"
    hidden: Optional[int] = Field(128, ge=1, le=MAX_HIDDEN)
    weights: Optional[Path] = Field(None, description="initial weights file")
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
                raise ValueError(f"unknown class(es) {short(unknown)}{_nearest_classes(unknown)}; canonical classes: "
                                 f"{sorted(CLASS_SET)}")
        return value


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
    prefetch_factor: Optional[int] = Field(None, ge=1, le=1024, description="batches each loader worker prepares ahead")
    cache_workers: int = Field(0, ge=0, le=MAX_WORKERS,
                               description="processes decoding a site's image cache (0: every core)")
    offload_idle: Optional[bool] = Field(None, description="a site's model leaves the GPU between its turns")
    threads: Optional[int] = Field(None, ge=1, description="torch intra-op threads of a training/evaluation "
                                   "process (auto: 1; a CPU run is bit-identical only with the same count)")
    site_workers: int = Field(0, ge=0, le=MAX_WORKERS,
                              description="in-process runs on a CPU: worker processes training the round's sites "
                              "at the same time, each site kept in one (0 or 1: every site in the main process, "
                              "one after another); never changes a result")


class ExperimentConfig(_Strict):
    name: str = Field("experiment", description="the run's name (the default run folder is runs/<name>-...): "
                      f"1 to {MAX_NAME} characters, no '/', '\\' or control character, not only dots")
    manifests: Optional[Path] = Field(None, description="base folder of the site folders")
    sites: list[str] = Field(..., min_length=1, max_length=MAX_SITES, description="source site folders (or all sites)")
    target: Optional[str] = None
    method: str = Field(
        None, max_length=MAX_PATH, validation_alias=config_compat.METHOD_KEYS, validate_default=True,
        description="the method, by its paper's name (README 'Methods'; unset: FedAvg), or a method of your own: "
        "path/to/file.py:Name or package.module:Name (README 'Your own method'); `strategy` is its former name, "
        "still accepted")
    rounds: int = Field(5, ge=0, le=MAX_ROUNDS)
    source: LocalTrainingConfig = LocalTrainingConfig()
    target_train: TargetTrainingConfig = TargetTrainingConfig()
    alpha: float = Field(1.0, ge=0, description="weight of auxiliary losses (AuxInfo)")
    aux_reduction: Literal["sum", "mean"] = Field(
        "sum", description="AuxInfo: `sum` (the paper's Eq. 2: α·Σ_k over the auxiliary tasks) or `mean` (α·the "
        "mean over the tasks with a known row in the batch: α then weighs the same whatever the number of tasks)")
    aux_tasks: list[str] = Field(default_factory=lambda: list(AUX_TASKS))
    aux_info: Optional[bool] = Field(None, description="force AuxInfo (the auxiliary heads' losses) on/off; "
                                     + METHOD_DEFAULT)
    backbone_aggregation: Literal["fedavg", "fedbn", "fedbn_plus"] = "fedavg"
    backbone_weighting: Optional[Literal["uniform", "samples"]] = Field(
        None, description="how the server weights sites when it averages the shared entries: `uniform` "
        "(1/K) or `samples` (n_i/Σn); " + METHOD_DEFAULT)
    aggregation: AggregationConfig = Field(AggregationConfig(), description=AggregationConfig.__doc__)
    defences: DefencesConfig = Field(DefencesConfig(), description=DefencesConfig.__doc__)
    optimizer_state: Optional[Literal["fresh", "kept"]] = Field(
        None, description="`kept`: each site's optimiser state carries over from round to round (saved in "
        "checkpoints); `fresh`: a new optimiser every round; " + METHOD_DEFAULT)
    participation: consortium.ParticipationConfig = Field(consortium.ParticipationConfig(),
                                                          description=consortium.ParticipationConfig.__doc__)
    simulate: Optional[consortium.SimulateConfig] = Field(None, description=consortium.SimulateConfig.__doc__)
    model: ModelConfig = ModelConfig()
    task: Optional[SharedTaskConfig] = Field(None, description=SharedTaskConfig.__doc__)
    class_source: Literal["target", "union", "sources"] = "target"
    image_size: int = Field(224, ge=8, le=MAX_IMAGE_SIZE)
    augment: bool = True
    device: str = Field("auto", description="auto (CUDA when present) | cpu | cuda | cuda:N (GPU number N)")
    seed: int = Field(0, ge=0, le=2**63 - 1)
    cache_dir: Optional[Path] = None
    eval_sites: Optional[list[str]] = Field(None, max_length=MAX_SITES,
                                            description="sites evaluated; default target or all")
    eval_every: int = Field(1, ge=0, le=MAX_ROUNDS, description="validation AUROC every N rounds (0: never)")
    select_round: Literal["last", "best_val"] = Field(
        "last", description="which round's model becomes final_model.pt: the `last`, or the one with the highest "
        "mean validation AUROC over the evaluated sites (`best_val`; validation rounds only, see `eval_every`; "
        "ties keep the earlier round). The test split is never looked at. MedMNIST's training code keeps the "
        "best-validation epoch the same way")
    num_workers: Optional[int] = Field(None, ge=0, le=MAX_WORKERS,
                                       description="loader processes (auto: 0 on CPU, up to 8 on CUDA)")
    engine: EngineConfig = EngineConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    tracking: Optional[Literal["none", "tensorboard", "mlflow"]] = Field(
        None, description="per-round scalars: tensorboard (RUN_DIR/tensorboard), mlflow, none; "
                          "default tensorboard when installed (fedcxr.tracking)")

    #: every method's options block, typed (config key → MethodOptions): :meth:`options`
    _options: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _method_options(cls, data: Any, handler) -> "ExperimentConfig":
        """Every method's options block (``fedprox: {...}``), checked by the model its method module
        declares; errors of the blocks and of the other keys reported together, each under its key.

        First, an old config using a key that was replaced stops naming the new key (never silently
        ignored), and a method option that moved under its method's key is put there
        (:mod:`~fedcxr.pipeline.config_compat`)."""
        if not isinstance(data, dict):
            return handler(data)
        data = config_compat.upgrade(data)
        data = consortium.move_min_sites(data)  # the former top-level key of participation.min_sites
        former = config_compat.written_as(data)
        models, problem = _option_models(data)
        rest = {k: v for k, v in data.items() if k not in models}
        errors: list[InitErrorDetails] = []
        blocks = {}
        for key, model in models.items():
            try:
                blocks[key] = model.model_validate(data.get(key) if data.get(key) is not None else {})
            except ValidationError as exc:
                errors += [_located(err, (key,), former) for err in exc.errors()]
        config = None
        try:
            config = handler(rest)
        except ValidationError as exc:
            errors = [_located(err, ()) for err in exc.errors()] + errors
        if problem and not any(err["loc"][:1] == ("method",) for err in errors):
            errors.insert(0, problem)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        config._options = blocks
        return config

    @model_serializer(mode="wrap")
    def _dump_options(self, handler, info) -> dict:
        """The options blocks at the top level, right after ``method`` (as a user writes them)."""
        data = handler(self)
        if not isinstance(data, dict) or not self._options:
            return data
        blocks = {key: block.model_dump(mode=info.mode) for key, block in self._options.items()}
        out: dict = {}
        for key, value in data.items():
            out[key] = value
            if key == "method":
                out.update(blocks)
        return out if "method" in data else {**data, **blocks}

    @field_validator("method", mode="before")
    @classmethod
    def _known_method(cls, value: Any) -> str:
        """A method of the registry or a reference to one of your own (checked at load, naming the known
        ones); unset: the default."""
        # imported here: the registry imports the method modules (torch), loaded only to validate a config
        from fedcxr.pipeline.protocols.methods import DEFAULT_METHOD, METHODS, resolve, unknown_method

        if value is None:
            return DEFAULT_METHOD
        if not isinstance(value, str):
            raise ValueError(unknown_method(value))
        if value not in METHODS:
            try:
                resolve(value)
            except UserError as exc:
                raise ValueError(str(exc)) from None
            source, _, name = value.rpartition(":")
            if source.endswith(".py"):  # the file's absolute path: config.yaml of the run names it wherever it runs
                value = f"{Path(source).expanduser().resolve()}:{name}"
        return value

    @property
    def method_name(self) -> str:
        """The method's name (run folders, reports): :attr:`method`, or the ``Name`` of ``file.py:Name``."""
        from fedcxr.pipeline.protocols.methods import method_name

        return method_name(self.method)

    @property
    def strategy(self) -> str:
        """The former name of :attr:`method` (:mod:`~fedcxr.pipeline.config_compat`)."""
        return self.method

    def options(self, key: Optional[str]):
        """The options block of the method whose config key is ``key`` (typed, defaults filled in);
        ``None`` for a method without options."""
        if key is None:
            return None
        if key not in self._options:
            raise KeyError(f"no method options block `{key}` in this config (method {self.method})")
        return self._options[key]

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        """``cuda:N`` picks a GPU by number; whether it exists is checked when the run starts."""
        text = str(value).strip().lower()
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
            raise ValueError(f"{short(value)}: use auto, cpu, cuda or cuda:N (N: the GPU's number, e.g. cuda:1)")
        return text

    @field_validator("aux_tasks")
    @classmethod
    def _known_aux(cls, value: list[str]) -> list[str]:
        unknown = [t for t in value if t not in AUX_TASKS]
        if unknown:
            raise ValueError(f"unknown aux task(s) {short(unknown)}; known: {AUX_TASKS}")
        return value

    @field_validator("name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        """The name becomes a folder name (``runs/<name>-<method>-seed<seed>``): it must stay one folder."""
        if not 0 < len(value) <= MAX_NAME or re.search(r"[/\\\x00-\x1f\x7f]", value) or not value.strip("."):
            _refuse(f"{short(value)} cannot name a run folder: 1 to {MAX_NAME} characters, no '/', '\\' or "
                    "control character, not only dots")
        return value

    @field_validator("sites", "eval_sites", "target")
    @classmethod
    def _site_folder(cls, value):
        """A site is a folder whose last name is the site's name: bounded, not empty, not ``.``/``..``."""
        for site in ([value] if isinstance(value, str) else value or []):
            name = Path(site).name
            if len(site) > MAX_PATH or not name or name in (".", "..") or len(name) > MAX_SITE_NAME:
                _refuse(f"{short(site)} is not a site folder (its last name is the site's name: 1 to "
                        f"{MAX_SITE_NAME} characters, not '.' or '..')")
        return value

    @model_validator(mode="after")
    def _sites_unique(self) -> "ExperimentConfig":
        """Two entries with one name (``a/site`` and ``b/site``, or a site listed twice) would be one site:
        the second silently replaced the first."""
        for key, entries in (("sites", self.sites), ("eval_sites", self.eval_sites or [])):
            seen: dict[str, str] = {}
            for entry in entries:
                name = self.site_name(entry)
                if name in seen:
                    twice = seen[name] == entry
                    raise ValueError(f"{key}: {short(entry)} is listed twice" if twice else
                                     f"{key}: {short(seen[name])} and {short(entry)} are both site {name!r} (a "
                                     "site is named by its folder's last name); rename one folder")
                seen[name] = entry
        return self

    @model_validator(mode="after")
    def _declared_sites_exist(self) -> "ExperimentConfig":
        """A declared size for a site the run does not have is a typo that would leave a site unbounded."""
        names = {self.site_name(s) for s in self.all_sites()}
        unknown = [s for s in self.defences.declared_sizes if s not in names]
        if unknown:
            raise ValueError(f"defences.declared_sizes: {short(unknown)} not among the run's sites "
                             f"{short(sorted(names))} (a site is named by its folder's last name)")
        return self

    @model_validator(mode="after")
    def _consortium_possible(self) -> "ExperimentConfig":
        return consortium.check_consortium(self)

    @property
    def min_sites(self) -> int:  # participation.min_sites (min_sites is its former top-level name)
        return self.participation.min_sites

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
    def _secure_aggregation_blinds_the_value_checks(self) -> "ExperimentConfig":
        """An encrypted update cannot be read by the server: what would read one is refused or must be off."""
        mode = self.privacy.secure_aggregation
        if mode is None:
            return self
        if self.privacy.filters:
            raise ValueError(f"privacy.secure_aggregation: {mode} with privacy.filters: the filters act on an update "
                             "in the clear, but with secure aggregation it leaves the site encrypted; remove one")
        if self.aggregation.rule != "mean":
            raise ValueError(f"privacy.secure_aggregation: {mode} with aggregation.rule {self.aggregation.rule}: a "
                             "robust rule compares the sites' updates value by value, which the server cannot read "
                             "under encryption; use aggregation.rule: mean (the weighted sum)")
        on = [name for name, value in (("norm_factor", self.defences.norm_factor),
                                        ("norm_limit", self.defences.norm_limit),
                                        ("bn_factor", self.defences.bn_factor),
                                        ("check_variance", self.defences.check_variance)) if value]
        if on:
            off = ", ".join(f"{n}: {'false' if n == 'check_variance' else 'null'}" for n in on)
            raise ValueError(
                f"privacy.secure_aggregation: {mode} sends every update encrypted, so the server cannot read one and "
                f"defences.{', defences.'.join(on)} cannot check it. Acknowledge that by turning "
                f"{'it' if len(on) == 1 else 'them'} off (defences: {{{off}}}): the reply counts and the ciphertexts' "
                "structure are still checked and every site checks the model it decrypts, but a site's "
                "implausible update is no longer refused (README 'Secure aggregation')")
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
            raise ValueError(f"target {short(self.target)} is also listed under `sites`; a site is either a source "
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


def _option_models(data: dict) -> tuple[dict, Optional[InitErrorDetails]]:
    """Config key → options model of every registered method and of the config's own (a reference
    that cannot be loaded contributes nothing here: the ``method`` key's check says why)."""
    from fedcxr.pipeline.protocols.methods import is_reference, option_models

    value = next((data[k] for k in ("method", "strategy") if k in data), None)
    models = option_models()
    if isinstance(value, str) and is_reference(value):
        try:
            models = option_models(value)
        except UserError:
            return models, None
    clash = sorted(set(models) & set(ExperimentConfig.model_fields))
    if clash:
        problem = InitErrorDetails(type=PydanticCustomError(
            "options_key", "the method's options key `{key}` is a key of the config itself; choose another "
            "options_key", {"key": clash[0]}), loc=("method",), input=value)
        return {k: m for k, m in models.items() if k not in clash}, problem
    return models, None


def _located(err: dict, prefix: tuple, former: Optional[dict] = None) -> InitErrorDetails:
    """A pydantic error as init details under ``prefix`` (a block's errors as ``fedprox.mu: ...``); an error
    of a value written under a former key (``former``: :func:`~fedcxr.pipeline.config_compat.written_as`)
    names that key too."""
    loc = (*prefix, *err["loc"])
    old = next((o for path, o in (former or {}).items() if ".".join(map(str, loc)).startswith(path)), None)
    details = InitErrorDetails(type=err["type"], loc=loc, input=err.get("input"), ctx=err.get("ctx") or {})
    try:
        ValidationError.from_exception_data("check", [details])
    except (KeyError, TypeError, ValueError):  # an error type of a validator's own: keep its message
        old = old or ""
    if old is not None:
        message = str(err["msg"]).removeprefix("Value error, ")
        details = InitErrorDetails(type=PydanticCustomError(str(err["type"]), message + (
            f" (written as `{old}`, its former name)" if old else "")), loc=loc, input=err.get("input"))
    return details


def _set_dotted(data: dict, key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"--set {key[:80]}: {short(part)} is not a mapping")
    node[parts[-1]] = value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``--set key=value`` (YAML-parsed values, dotted keys) to a raw config mapping.

    ``--set strategy=X`` and ``--set method=X`` both replace the method, whichever name the
    YAML used, and a former key sets its new place (``--set warmup_rounds=0`` is ``gp.warmup_rounds``:
    :func:`~fedcxr.pipeline.config_compat.override_key`)."""
    out = copy.deepcopy(data)
    for item in overrides or []:
        if "=" not in item:
            raise UserError(f"--set {short(item)}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part.strip() for part in key.split(".")):
            raise UserError(f"--set {short(item)}: the key is empty (expected KEY=VALUE, e.g. rounds=10 or "
                            "source.lr=1e-3)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            reason = str(getattr(exc, "problem", "") or "not valid YAML")
            raise UserError(f"--set {key[:80]}: cannot read the value {short(raw)} ({reason}); quote strings, "
                            "write lists as [a, b]") from None
        except RecursionError:
            raise UserError(f"--set {key[:80]}: the value is nested too deeply") from None
        key = config_compat.override_key(key)
        config_compat.forget_former(out, key)
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
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise UserError(f"{path}: the config must be a mapping of keys to values")
        if data.get("manifests") is not None and not Path(data["manifests"]).is_absolute():
            data["manifests"] = str((path.parent / data["manifests"]).resolve())
        _method_file_beside(data, path.parent)
    data = apply_overrides(data, overrides or [])
    check_size(data, f"{path}: " if path else "")
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        errors = exc.errors()
        sections = _option_models(data)[0] if isinstance(data, dict) else {}  # the methods' options blocks
        lines = [error_line(err, ExperimentConfig, sections) for err in errors[:MAX_ERROR_LINES]]
        if len(errors) > MAX_ERROR_LINES:
            lines.append(f"... and {len(errors) - MAX_ERROR_LINES} more")
        raise UserError(where + "invalid config:\n  " + "\n  ".join(lines)) from None
    if check_sites:
        check_sites_exist(cfg)
    return cfg


def _method_file_beside(data: dict, folder: Path) -> None:
    """``method: path/to/file.py:Name`` relative to the config's folder, as ``manifests:``."""
    for key in ("method", "strategy"):
        value = data.get(key)
        if isinstance(value, str) and ":" in value:
            source, _, name = value.rpartition(":")
            if source.endswith(".py") and not Path(source).expanduser().is_absolute():
                data[key] = f"{(folder / source).resolve()}:{name}"


def check_sites_exist(cfg: ExperimentConfig) -> None:
    """Every named site must be an ingested manifest folder."""
    for site in cfg.all_sites():
        folder = cfg.site_dir(site)
        if not (folder / "manifest.parquet").is_file():
            raise UserError(
                f"site {short(site)}: no manifest at {short(str(folder / 'manifest.parquet'), 300)}"
                f"{did_you_mean(folder.name, _ingested_sites(folder.parent))} "
                f"(sites are folders written by `fedcxr ingest`; check `manifests:` and `sites:`)"
            )
    if cfg.eval_sites:
        unknown = [s for s in cfg.eval_sites if s not in cfg.all_sites()]
        if unknown:
            raise UserError(f"eval_sites: {short(unknown)}{did_you_mean(unknown[0], cfg.all_sites())} are not among "
                            f"sites/target {short(cfg.all_sites(), 300)}")


def _ingested_sites(folder: Path, limit: int = 1000) -> list[str]:
    """The site folders (holding a manifest) in ``folder``: what a mistyped site name may have meant."""
    try:
        names = [p.name for _, p in zip(range(limit), folder.iterdir())]
    except OSError:
        return []
    return [n for n in names if (folder / n / "manifest.parquet").is_file()]


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (written into every run directory)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def config_fingerprint(cfg: ExperimentConfig) -> str:
    """Hash of everything that changes a run's result (device, workers, the engine block, cache and
    where the manifests folder lies do not: the sites' content is checked separately, by manifest
    hash, on resume). The method is hashed by its name under its former key ``strategy`` and the
    method options in their former flat layout (:func:`~fedcxr.pipeline.config_compat.fingerprint_view`):
    configs keep the fingerprint of earlier versions, so their runs resume."""
    data = cfg.model_dump(mode="json")
    data.pop("method")
    data["strategy"] = cfg.method_name
    data = config_compat.fingerprint_view(data, {key: type(block)().model_dump(mode="json")
                                                 for key, block in cfg._options.items()})
    data = consortium.fingerprint_view(data)  # participation:/simulate: as earlier versions hashed them
    for key in ("device", "num_workers", "cache_dir", "manifests", "engine", "tracking"):
        data.pop(key, None)
    for key, default in (("norm", "batch"), ("stem", "imagenet")):  # defaults: the fingerprint of earlier versions
        if data.get("model", {}).get(key) == default:
            data["model"].pop(key)
    if data.get("select_round") == "last":
        data.pop("select_round")
    for key, default in NEW_DEFENCES.items():  # added later: earlier runs' fingerprint
        if data.get("defences", {}).get(key) == default:
            data["defences"].pop(key)
    for key, default in (("aggregation", AggregationConfig()), ("defences", DefencesConfig())):
        defaults = default.model_dump(mode="json")
        if key == "defences":
            defaults = {k: v for k, v in defaults.items() if k not in NEW_DEFENCES}
        if data.get(key) == defaults:  # defaults: the fingerprint of earlier versions
            data.pop(key)
    for block in ("source", "target_train"):
        if data.get(block, {}).get("momentum") is None:
            data.get(block, {}).pop("momentum", None)
    for key in ("label_draw", "holdout"):  # unset: the fingerprint of earlier versions (the same rows)
        if data.get("target_train", {}).get(key) is None:
            data.get("target_train", {}).pop(key, None)
    if data.get("aux_reduction") == "sum":  # the default: the fingerprint of earlier versions
        data.pop("aux_reduction")
    privacy = data.pop("privacy", {})
    for key in ("combine_at", "auto_weights_at"):  # where a rule is computed does not change its result
        privacy.pop(key, None)
    if privacy.get("secure_aggregation") is None:  # off: the fingerprint of earlier versions
        privacy.pop("secure_aggregation", None)
    if privacy != {"filters": [], "dp": None}:  # no privacy options: the fingerprint of earlier versions
        data["privacy"] = privacy
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
