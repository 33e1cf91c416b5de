"""One site's side of every task (the FLARE client script and the in-process transport call it).

A :class:`SiteRunner` owns the site's data (its own manifest), its cache of decoded images and
its persistent local state (BN statistics under FedBN, local heads under PFL). It answers
tasks with a :class:`~fedcxr.pipeline.transport.Reply` carrying only parameters, counts,
class names and metrics.

Task configs are typed (:mod:`fedcxr.pipeline.messages`, built by the round protocols) and
parsed once, in :meth:`SiteRunner.handle` (a plain dict — a test's, a recorded one — must hold
exactly the config's keys):

``metadata``  (:class:`~fedcxr.pipeline.messages.NoConfig`) → class set, train/val/test and
              labeled counts, the manifest's hash.
``train``     (:class:`~fedcxr.pipeline.messages.TrainTask`) → local training from the received
              model (its fields document each setting).
``evaluate``  (:class:`~fedcxr.pipeline.messages.EvaluateTask`) → per-class validation AUROC of
              the received model on ``split``.

The runner answers these three by itself (:data:`TASKS`). Every other task is a method's
(docs/methods.md): its module declares it — handler, config type, flags — as a :class:`SiteTask`,
and whoever builds the runner passes the tasks in (``SiteRunner(..., tasks=...)``, from
:func:`fedcxr.pipeline.protocols.methods.site_tasks`; FLARE adds its cross-site ``validate``);
nothing registers a task by being imported, and the runner never imports the protocols that send
the tasks. A method's handler uses the runner's public helpers: :meth:`SiteRunner.train` (the one
local-training path, with its hooks), :meth:`SiteRunner.prepared_model`,
:meth:`SiteRunner.training_data`, the kept state (:meth:`SiteRunner.kept_state`,
:meth:`SiteRunner.keep_state`: saved with the site's local state, never sent) and
:attr:`SiteRunner.memory` (kept in memory until a later task of the round, never saved).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from fedcxr.pipeline.engine import Engine, loader_options, offload, resolve_engine
from fedcxr.pipeline.keys import OPTIMIZER_PREFIX, derive_seed
from fedcxr.pipeline.messages import (
    TASK_CONFIGS,
    EvaluateTask,
    NoConfig,
    Reply,
    StateDict,
    TaskConfig,
    TaskConfigError,
    TrainTask,
)
from fedcxr.pipeline.model_pool import ModelPool, covers, load_state
from fedcxr.pipeline.state import cpu_state
from fedcxr.site_adapters.manifest import content_hash
from fedcxr.vocab import AUX_VOCAB, CLASSES, label_column

if TYPE_CHECKING:
    from fedcxr.pipeline.data import SeededLoader
    from fedcxr.pipeline.local import LocalConfig

log = logging.getLogger(__name__)

#: A site-side task: ``handler(runner, params, config) -> Reply`` (config: the task's typed config).
TaskHandler = Callable[["SiteRunner", Optional[StateDict], TaskConfig], Reply]


@dataclass(frozen=True)
class SiteTask:
    """One task a site answers (docs/methods.md): the handler and what the rest of fedcxr needs to know.

    * ``changes_state``: the task may change the site's local state (BN statistics, heads, optimiser
      state, a method's kept state): a FLARE client saves that state after it;
    * ``config``: the type of its config (a :class:`~fedcxr.pipeline.messages.TaskConfig`; a method's
      task: a :class:`~fedcxr.pipeline.messages.TrainTask` subclass with the fields only it sends);
      ``None``: the runner's own tasks, typed in :data:`~fedcxr.pipeline.messages.TASK_CONFIGS`;
    * ``streams``: the part of its reply's metrics a FLARE site streams to the server's tracking
      (``train`` or ``val``; ``None``: none — :func:`fedcxr.tracking.site_scalars`);
    * ``filtered``: its reply carries a model update that FLARE's ``privacy.filters`` act on;
    * ``together``: the same task at several sites of one process at once (``(runners, params, config)
      -> {site: Reply}``, each reply what ``handler`` gives that site): the in-process transport's way
      to answer many simulated sites (:func:`handle_together`); ``handler`` must be it for one site.
    """

    handler: TaskHandler
    changes_state: bool
    config: Optional[type] = None
    streams: Optional[str] = None
    filtered: bool = False
    together: Optional[Callable[[list["SiteRunner"], Optional[StateDict], TaskConfig], dict[str, Reply]]] = None

    def config_type(self, task: str) -> type:
        """The config type of ``task`` (declared, or the runner's own from ``TASK_CONFIGS``)."""
        if self.config is not None:
            return self.config
        if task not in TASK_CONFIGS:
            raise ValueError(f"task {task!r} has no typed config: give its SiteTask a config type")
        return TASK_CONFIGS[task]


class SiteRunner:
    """The client-side logic of one site, independent of the transport that calls it."""

    def __init__(
        self,
        name: str,
        site_dirs: list[Path] | Path,
        *,
        model_cfg: dict,
        image_size: int,
        cache_dir: Path,
        device: torch.device,
        augment: bool = True,
        num_workers: Optional[int] = None,
        progress: bool = False,
        task: Optional[dict] = None,
        engine: Optional[Engine] = None,
        tasks: Optional[Mapping[str, SiteTask]] = None,
        pool: Optional[ModelPool] = None,
    ):
        from fedcxr.pipeline.data import load_site
        from fedcxr.pipeline.shared_task import apply_shared_task, site_task

        self.name = name
        for task_name, entry in (tasks or {}).items():
            entry.config_type(task_name)  # every task's config is typed (ValueError otherwise)
            if task_name in TASKS:
                raise ValueError(f"task {task_name!r} is one the runner answers by itself")
        #: the tasks this site answers: :data:`TASKS` plus those its builder adds (``tasks``: the methods',
        #: FLARE's cross-site evaluation)
        self.tasks: dict[str, SiteTask] = {**TASKS, **(tasks or {})}
        dirs = [site_dirs] if isinstance(site_dirs, (str, Path)) else list(site_dirs)
        # several dirs = pooled (Central baseline); ``task``: the shared-task spec (each site maps its own label)
        self.sites = [load_site(d) for d in dirs]
        if task:
            self.sites = [apply_shared_task(site, site_task(task, Path(d).name if len(dirs) > 1 else name))
                          for d, site in zip(dirs, self.sites)]
        self.model_cfg = dict(model_cfg)
        self.image_size = image_size
        self.cache_dir = Path(cache_dir)
        self.device = device
        self.augment = augment
        self.engine = engine or resolve_engine(device, None, num_workers)
        self.num_workers = self.engine.num_workers
        self.progress = progress
        self.local_state: StateDict = {}
        #: what a method's task keeps in memory for a later task of the same round (GP's target-side
        #: combination holds its fine-tuned model here); never saved, lost with the process
        self.memory: dict[str, object] = {}
        self._models: dict[tuple, torch.nn.Module] = {}
        #: the networks this process's runners share (:mod:`fedcxr.pipeline.model_pool`); None: own ones only
        self.pool = pool
        self._datasets: dict[tuple, Dataset] = {}
        self._labeled: dict[tuple, list[int]] = {}
        self._cases: dict[tuple, dict[str, list[int]]] = {}  # split_cases, counted once
        self._loaders: dict[tuple, SeededLoader] = {}  # kept training loaders (persistent workers)

    # ------------------------------------------------------------------ facts about the site
    @property
    def class_set(self) -> list[str]:
        seen: list[str] = []
        for site in self.sites:
            seen += [c for c in site.class_set if c not in seen]
        return [c for c in CLASSES if c in seen]

    @property
    def manifest_hash(self) -> str:
        """A hash of this site's manifest content: lets a resume notice a re-ingested site.

        It says nothing about the rows (a SHA-256 over their hashes), so it may leave the site.
        """
        parts = [content_hash(site.manifest) for site in self.sites]
        return parts[0] if len(parts) == 1 else hashlib.sha256(":".join(parts).encode()).hexdigest()

    def _rows(self, split: str) -> int:
        return sum(int((s.manifest["split"] == split).sum()) for s in self.sites)

    # ------------------------------------------------------------------ local state (FedBN, PFL)
    def get_local_state(self) -> StateDict:
        return {k: v.clone() for k, v in self.local_state.items()}

    def set_local_state(self, state: StateDict) -> None:
        self.local_state = {k: v.clone() for k, v in state.items()}

    def optimizer_state(self) -> StateDict:
        """The optimiser state kept from this site's earlier rounds (``{}`` before the first)."""
        n = len(OPTIMIZER_PREFIX)
        return {k[n:]: v for k, v in self.local_state.items() if k.startswith(OPTIMIZER_PREFIX)}

    def keep_optimizer_state(self, state: StateDict) -> None:
        """Store the optimiser state in the local state (checkpointed with it, so a resume is exact)."""
        for key, value in state.items():
            self.local_state[OPTIMIZER_PREFIX + key] = value

    def task_seed(self, config: TrainTask, task: str, *parts: object) -> int:
        """The seed of one random stream of a task at this site: the run's seed, the task, this site's
        name and ``parts`` (round, role, epoch, ...), so every draw repeats on resume and differs between sites."""
        return derive_seed(config.seed, task, self.name, *parts)

    def kept_state(self, prefix: str) -> StateDict:
        """The entries a method keeps at this site under ``prefix`` (prefix stripped; copies; ``{}`` before
        the first): SCAFFOLD's c_i, the surgical warm-up's head, a personal model."""
        n = len(prefix)
        return {k[n:]: v.clone() for k, v in self.local_state.items() if k.startswith(prefix)}

    def keep_state(self, prefix: str, state: StateDict) -> None:
        """Store ``state`` under ``prefix`` in the local state (checkpointed in-process, saved per round on
        FLARE; never sent unless the prefix is a model entry's: use one of :data:`~fedcxr.pipeline.keys.
        PRIVATE_PREFIXES` for state that must never leave the site)."""
        for key, value in state.items():
            self.local_state[prefix + key] = value.detach().to("cpu", copy=True)

    def drop_state(self, prefix: str) -> StateDict:
        """Remove and return the entries under ``prefix`` (prefix stripped)."""
        n = len(prefix)
        found = [k for k in self.local_state if k.startswith(prefix)]
        return {k[n:]: self.local_state.pop(k) for k in found}

    # ------------------------------------------------------------------ tasks
    def parse(self, task: str, config: TaskConfig | dict | None) -> TaskConfig:
        """``config`` as the typed config of ``task`` (a config of exactly that type passes as it is;
        ``None`` is an empty config); :class:`~fedcxr.pipeline.messages.TaskConfigError` names the key at fault."""
        entry = self.tasks.get(task)
        if entry is None:
            raise ValueError(f"site {self.name}: unknown task {str(task)[:60]!r} (it answers: {sorted(self.tasks)})")
        kind = entry.config_type(task)
        if type(config) is kind:
            return config
        try:
            return kind.from_dict({} if config is None else config)
        except TaskConfigError as exc:
            raise TaskConfigError(f"task {task!r}: {exc}") from None

    def handle(self, task: str, params: Optional[StateDict], config: TaskConfig | dict | None) -> Reply:
        """Answer one task of :attr:`tasks`; ``config`` is parsed here, once, into the task's typed config."""
        config = self.parse(task, config)
        entry = self.tasks[task]
        try:
            return entry.handler(self, params, config)
        finally:
            if self.engine.offload_idle:
                offload(self._models, "cpu")  # this site now waits: its model holds no GPU memory (a shared one stays)

    def loader_options(self, *, train: bool = True) -> dict:
        """``make_loader`` keyword arguments for this site's engine (workers, pinning, prefetch)."""
        return loader_options(self.engine, train=train)

    def train_loader(self, data: Subset, *, batch_size: int, seed: int):
        """A shuffling, augmenting loader over ``data`` (rows of a site dataset), seeded with ``seed``.

        With persistent workers (the CUDA default) the loader of the same rows and batch size
        is kept and re-seeded every round, so its worker processes start once per run, not
        once per round; batches depend only on the seed (:mod:`fedcxr.pipeline.data`), so a
        kept loader yields exactly what a fresh one would.
        """
        from fedcxr.pipeline.data import make_loader

        options = self.loader_options()
        if not options.get("persistent_workers"):
            return make_loader(data, batch_size=batch_size, shuffle=True, seed=seed, augment=self.augment, **options)
        digest = hashlib.sha256(np.asarray(data.indices, dtype=np.int64).tobytes()).hexdigest()
        key = (id(data.dataset), digest, int(batch_size), self.augment)
        if key not in self._loaders:
            self._loaders[key] = make_loader(data, batch_size=batch_size, shuffle=True, seed=seed,
                                             augment=self.augment, **options)
        loader = self._loaders[key]
        loader.reseed(seed)
        return loader

    def local_config(self, **values) -> LocalConfig:
        """A :class:`~fedcxr.pipeline.local.LocalConfig` with this site's engine switches."""
        from fedcxr.pipeline.local import LocalConfig

        return LocalConfig(amp=self.engine.amp, channels_last=self.engine.channels_last, **values)

    def _metadata(self, params, config: NoConfig) -> Reply:
        labeled, per_class = 0, {}
        for site in self.sites:
            train = site.manifest.loc[site.manifest["split"] == "train"]
            cols = [label_column(c) for c in site.class_set]
            labeled += int(train[cols].notna().any(axis=1).sum()) if cols else 0
            for cls in site.class_set:
                per_class[cls] = per_class.get(cls, 0) + int(train[label_column(cls)].notna().sum())
        return Reply(
            site=self.name,
            n_samples=self._rows("train"),
            class_set=self.class_set,
            metrics={
                "n_train": self._rows("train"), "n_val": self._rows("val"), "n_test": self._rows("test"),
                "n_labeled_train": labeled, "labeled_per_class": per_class,
                "manifest_hash": self.manifest_hash,
            },
        )

    # ------------------------------------------------------------------ model + data plumbing
    def model(self, head_classes: list[str], aux_tasks: list[str]) -> torch.nn.Module:
        """The site's own network for this head/aux layout (built once, re-loaded every task)."""
        key = (tuple(head_classes), tuple(aux_tasks))
        if key not in self._models:
            self._models[key] = self._build(head_classes, aux_tasks)
        return self._models[key]

    def _build(self, head_classes: list[str], aux_tasks: list[str]) -> torch.nn.Module:
        from fedcxr.models.network import network_from_config

        return network_from_config(head_classes, self.model_cfg,
                                   {t: len(AUX_VOCAB[t]) for t in aux_tasks}).to(self.device)

    def network_for(self, head_classes: list[str], aux_tasks: list[str], params: Optional[StateDict],
                    param_classes: list[str], local_keys: list[str], *, private: bool = False) -> torch.nn.Module:
        """The network a task loads ``params`` into: the process's shared one (:attr:`pool`) when the
        load sets every entry of it, else the site's own (:meth:`model`), which keeps what a partial
        load leaves. ``private``: always the site's own (DP-SGD attaches per-sample state to it)."""
        if self.pool is None or params is None or private:
            return self.model(head_classes, aux_tasks)
        key = (json.dumps(self.model_cfg, sort_keys=True, default=str), tuple(head_classes), tuple(aux_tasks))
        shared = self.pool.get(key, lambda: self._build(head_classes, aux_tasks))
        given = list(params) + [k for k in local_keys if k in self.local_state]
        if covers(shared, given, head_classes, param_classes):
            return shared
        return self.model(head_classes, aux_tasks)

    def load_params(self, model: torch.nn.Module, params: StateDict, param_classes: list[str],
                    local_keys: list[str]) -> None:
        """Load received params; head rows picked by class name; local keys from this site."""
        state = dict(params)
        head_classes = list(model.classes)
        if list(param_classes) != head_classes and "head.weight" in state:
            index = [param_classes.index(c) if c in param_classes else None for c in head_classes]
            own = model.state_dict()
            weight = own["head.weight"].detach().clone().cpu()
            bias = own["head.bias"].detach().clone().cpu()
            for row, src in enumerate(index):
                if src is not None:
                    weight[row] = state["head.weight"][src]
                    bias[row] = state["head.bias"][src]
            state["head.weight"], state["head.bias"] = weight, bias
        for key in local_keys:
            if key in self.local_state:
                state[key] = self.local_state[key]
        missing, unexpected = load_state(model, state)
        missing = [k for k in missing if k not in local_keys]
        if missing or unexpected:
            raise ValueError(f"site {self.name}: model mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def prepared_model(self, params: Optional[StateDict], config: TrainTask | EvaluateTask):
        """The network a task config asks for, loaded with the received params."""
        head_classes, aux_tasks, local_keys = list(config.head_classes), list(config.aux_tasks), list(config.local_keys)
        param_classes = list(config.param_classes or head_classes)
        model = self.network_for(head_classes, aux_tasks, params, param_classes, local_keys,
                                 private=bool(getattr(config, "dp", None)))
        if params is not None:
            self.load_params(model, params, param_classes, local_keys)
        return model, head_classes, aux_tasks, local_keys

    def dataset(self, split: str, classes: list[str], aux_tasks: list[str], *, augment: bool,
                loss_classes: Optional[list[str]] = None, missing_as_negative: bool = False) -> Dataset:
        from torch.utils.data import ConcatDataset

        from fedcxr.pipeline.data import make_dataset

        key = (split, tuple(classes), tuple(aux_tasks), augment, tuple(loss_classes or ()), missing_as_negative)
        if key not in self._datasets:
            parts = [
                make_dataset(
                    site, split, classes=classes, aux_tasks=aux_tasks, image_size=self.image_size,
                    cache_dir=self.cache_dir, augment=augment, loss_classes=loss_classes,
                    missing_as_negative=missing_as_negative, workers=self.engine.cache_workers,
                )
                for site in self.sites
            ]
            self._datasets[key] = parts[0] if len(parts) == 1 else ConcatDataset(parts)
        return self._datasets[key]

    def labeled_rows(self, split: str, classes: list[str], labeled, draw: Optional[int] = None,
                     holdout: tuple[int, int] = (0, 0), *, held_out: bool = False) -> list[int]:
        """Indices of rows with a label among ``classes``; ``labeled`` caps them (count or fraction).

        The cap keeps whole patients in the patient-hash order of draw ``draw``
        (:mod:`fedcxr.pipeline.labeled_rows`: ``None`` is the fixed draw of earlier versions), so the
        same rows are chosen in every round and every run of that draw. ``holdout`` = (folds, fold),
        folds ≥ 2: fold ``fold`` of the capped rows' patients is left out — or, with ``held_out``,
        only it is returned (the rows the model is scored on). Computed once per site and asked for
        from the cache after.
        """
        key = (split, tuple(classes), labeled, draw, tuple(holdout), held_out)
        if key not in self._labeled:
            self._labeled[key] = self._select_labeled(split, classes, labeled, draw, holdout, held_out)
        return self._labeled[key]

    def _select_labeled(self, split: str, classes: list[str], labeled, draw: Optional[int],
                        holdout: tuple[int, int], held_out: bool) -> list[int]:
        import pandas as pd

        from fedcxr.pipeline.labeled_rows import select_labeled, split_holdout

        frames = [s.manifest.loc[s.manifest["split"] == split].reset_index(drop=True) for s in self.sites]
        frame = pd.concat(frames, ignore_index=True)
        cols = [label_column(c) for c in classes]
        rows = select_labeled(frame, cols, labeled, draw)
        folds, fold = holdout
        if folds:
            kept, out = split_holdout(frame, rows, cols, folds, fold, draw)
            rows = out if held_out else kept
        elif held_out:
            raise ValueError(f"site {self.name}: held-out rows asked for without a holdout (folds ≥ 2)")
        return rows.tolist()

    # ------------------------------------------------------------------ train
    def training_data(self, config: TrainTask, head_classes: list[str], aux_tasks: list[str]) -> Subset:
        """The training rows a ``train``-like task config asks for (labeled, capped, negatives policy)."""
        loss_classes = [c for c in head_classes if c in self.class_set]
        negatives = config.missing_as_negative  # Vanilla FL / Central: unlabeled = negative
        base = self.dataset("train", head_classes, aux_tasks, augment=self.augment,
                            loss_classes=head_classes if negatives else loss_classes, missing_as_negative=negatives)
        if config.role != "target" and config.use_aux and aux_tasks:
            # AuxInfo: rows without a finding label still teach the aux heads (masked main loss).
            rows = list(range(len(base)))
        else:
            rows = self.labeled_rows("train", head_classes if negatives else loss_classes, config.labeled,
                                     config.label_draw, (config.holdout_folds, config.holdout_fold))
        if config.max_rows:
            rows = rows[: int(config.max_rows)]
        return Subset(base, rows)

    def train(self, params: Optional[StateDict], config: TrainTask, *, prepare: Optional[Callable] = None,
              seed_parts: tuple = (), prox_mu: float = 0.0, prox_anchor: Optional[StateDict] = None,
              record_batch_updates: bool = False, frozen_bn_trains: bool = False,
              drift_correction: Optional[StateDict] = None, loss_term: Optional[Callable] = None) -> Reply:
        """Local training from the received params: the one training path of the site (``train``, and
        every method task that trains through it). The hooks are what methods change in the local loop:

        * ``prepare(model)``: called once the received params are loaded (the surgical warm-up's
          head, a personal model);
        * ``seed_parts``: extra parts of the task's seed (Finetune_Offline's pass number);
        * ``prox_mu``, ``prox_anchor``: the proximal term μ/2·‖w − anchor‖² (FedProx: the received
          weights, the default; a personalised method: the global model while training the personal one);
        * ``record_batch_updates``: the state change of every optimiser step (auto-β), in ``extra``;
        * ``frozen_bn_trains``: frozen BatchNorm layers still on batch statistics (FACT's heads);
        * ``drift_correction``: SCAFFOLD's c − c_i, correcting every step;
        * ``loss_term(named)``: a method's own term added to every step's loss (given the trainable
          ``(name, parameter)`` pairs; FedDyn's linear term in ``examples/methods/feddyn.py``).
        """
        from fedcxr.pipeline.local import train_local

        model, head_classes, aux_tasks, local_keys = self.prepared_model(params, config)
        if prepare is not None:
            prepare(model)
        data = self.training_data(config, head_classes, aux_tasks)
        seed = self.task_seed(config, "train", config.round, config.role, *seed_parts)
        cfg = self.local_config(
            lr=config.lr, batch_size=config.batch_size, epochs=config.epochs, steps=config.steps, alpha=config.alpha,
            aux_reduction=config.aux_reduction, use_aux=config.use_aux and bool(aux_tasks),
            weight_decay=config.weight_decay, optimizer=config.optimizer, dp=config.dp or None, momentum=config.momentum,
            prox_mu=prox_mu,
        )
        if len(data) == 0:
            # the server says so once per run (protocols.base.valid_replies); here only at debug level
            log.debug("site %s: no labeled training rows for %s; returning the model unchanged",
                      self.name, head_classes)
            return Reply(site=self.name, params=cpu_state(model), n_samples=0, n_batches=0,
                         class_set=head_classes, metrics={"loss": float("nan")})
        loader = self.train_loader(data, batch_size=cfg.batch_size, seed=seed)
        result = train_local(
            model, loader, cfg, device=self.device, seed=seed, trainable=config.trainable,
            record_batch_updates=record_batch_updates, freeze_bn=config.freeze_bn,
            optimizer_state=self.optimizer_state() if config.keep_optimizer else None,
            frozen_bn_trains=frozen_bn_trains, drift_correction=drift_correction, prox_anchor=prox_anchor,
            loss_term=loss_term,
        )
        if result.optimizer_state is not None:
            self.keep_optimizer_state(result.optimizer_state)
        state = cpu_state(model)
        for key in local_keys:
            self.local_state[key] = state[key].clone()
        extra = {}
        if result.batch_updates is not None:
            extra["batch_updates"] = result.batch_updates.detach().cpu()
        metrics = {"loss": result.loss, "main_loss": result.main_loss, "aux_loss": result.aux_loss}
        if drift_correction is not None:
            metrics["scaffold_steps"] = result.corrected_steps  # K of the control-variate update
        if cfg.dp:
            from fedcxr.pipeline.dp import spent

            metrics["dp"] = spent(cfg.dp, cfg.batch_size, len(data), result.n_batches)
        return Reply(
            site=self.name, params=state, n_samples=result.n_samples, n_batches=result.n_batches,
            class_set=head_classes, metrics=metrics, extra=extra,
        )

    def _train(self, params: Optional[StateDict], config: TrainTask) -> Reply:
        """The ``train`` task: :meth:`train` without hooks."""
        return self.train(params, config)

    # ------------------------------------------------------------------ evaluate
    def _evaluate(self, params: Optional[StateDict], config: EvaluateTask) -> Reply:
        """The ``evaluate`` task: :func:`evaluate_sites` of this site alone (the FLARE client's path)."""
        return evaluate_sites([self], params, config)[self.name]

    def scores(self, out: dict, split: str, head_classes: list[str], n: int) -> Reply:
        """The ``evaluate`` reply of this site from its ``n`` rows' forward pass (``probs``, ``labels``,
        ``label_mask`` of :func:`~fedcxr.pipeline.forward.predict`)."""
        from fedcxr.pipeline.forward import quick_auroc

        aurocs = quick_auroc(out["labels"], out["label_mask"], out["probs"], head_classes)
        defined = [v for v in aurocs.values() if np.isfinite(v)]
        return Reply(
            site=self.name, n_samples=n, class_set=head_classes,
            metrics={"split": split, "n": n, "auroc": aurocs,
                     "mean_auroc": float(np.mean(defined)) if defined else float("nan"),
                     "cases": self.split_cases(split, head_classes, out["labels"], out["label_mask"])},
        )

    def split_cases(self, split: str, classes: list[str], labels, mask) -> dict[str, list[int]]:
        """Class → ``[positive, negative]`` patients of ``split`` (counts only: they may leave the site).

        Why: the round line prints a site's validation AUROC only where the split supports one
        (``run_log.val_supported``, the small-sample rule of :mod:`fedcxr.evaluation.small_sample`,
        which counts patients). The labels are the same every round, so they are counted once.
        """
        from fedcxr.evaluation.small_sample import count_cases

        key = (split, tuple(classes))
        if key not in self._cases:
            patients = np.concatenate([s.manifest.loc[s.manifest["split"] == split, "patient_id"].to_numpy(dtype=object)
                                       for s in self.sites])
            if len(patients) != len(labels):  # not the manifest's rows (never expected): count images
                patients = None
            labels, mask = np.asarray(labels, dtype=float), np.asarray(mask)
            counts = {}
            for i, cls in enumerate(classes):
                cases = count_cases(np.where(mask[:, i] > 0, labels[:, i], np.nan), patients)
                counts[cls] = [cases.pos_patients, cases.neg_patients]
            self._cases[key] = counts
        return self._cases[key]


def evaluate_sites(runners: list[SiteRunner], params: Optional[StateDict], config: EvaluateTask) -> dict[str, Reply]:
    """The ``evaluate`` task at each of ``runners`` (one site's on FLARE; a process's simulated sites in-process).

    Why together: at a hundred simulated sites, loading the received model into the shared network,
    placing it and switching it to eval mode cost each site about as much as its own forward pass
    over its ~5 validation rows. Where the sites would load the same model into the same shared
    network (:meth:`SiteRunner.network_for`; none holds local entries of its own, e.g. FedBN
    statistics) it is loaded once and each site's rows go through it in the batches its own pass
    uses (:func:`~fedcxr.pipeline.forward.predict_each`): the same floats, so the same AUROCs
    (``tests/pipeline/test_site_runner.py``). Rows of different sites are not batched together:
    on a CPU a row's output can change (in the last bits) with the number of rows in its batch.
    """
    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.forward import predict_each

    head_classes, aux_tasks = list(config.head_classes), list(config.aux_tasks)
    param_classes, local_keys = list(config.param_classes or head_classes), list(config.local_keys)
    replies: dict[str, Reply] = {}
    groups: dict[int, list[SiteRunner]] = {}  # the runners that load the same params into the same network
    for runner in runners:
        model = runner.network_for(head_classes, aux_tasks, params, param_classes, local_keys)
        alone = params is None or any(k in runner.local_state for k in local_keys)  # its own entries: alone
        groups.setdefault(id(runner) if alone else id(model), []).append(runner)
    for members in groups.values():
        first = members[0]
        model, head_classes, aux_tasks, _ = first.prepared_model(params, config)
        data = {r.name: r.dataset(config.split, head_classes, aux_tasks, augment=False) for r in members}
        rows = [r for r in members if len(data[r.name])]
        loaders = [make_loader(data[r.name], batch_size=config.batch_size, shuffle=False, seed=0, augment=False,
                               **r.loader_options(train=False)) for r in rows]
        outs = predict_each(model, loaders, device=first.device, amp=first.engine.amp,
                            channels_last=first.engine.channels_last)
        for r, out in zip(rows, outs):
            replies[r.name] = r.scores(out, config.split, head_classes, len(data[r.name]))
        for r in members:
            if r.name not in replies:
                replies[r.name] = Reply(site=r.name, class_set=head_classes, metrics={"split": config.split, "n": 0})
    return {r.name: replies[r.name] for r in runners}


def handle_together(runners: list[SiteRunner], task: str, params: Optional[StateDict],
                    config: TaskConfig | dict | None) -> dict[str, Reply]:
    """``task`` with the same ``params`` and ``config`` at each of ``runners`` (a process's simulated
    sites): at once where the task says how (:attr:`SiteTask.together`), else site by site
    (:meth:`SiteRunner.handle`). Replies in the runners' order, each what that site's own ``handle`` gives."""
    entry = runners[0].tasks.get(task) if runners else None
    if entry is None or entry.together is None or len(runners) < 2 or any(r.tasks.get(task) is not entry
                                                                          for r in runners):
        return {r.name: r.handle(task, params, config) for r in runners}
    config = runners[0].parse(task, config)
    try:
        return entry.together(runners, params, config)
    finally:
        for runner in runners:
            if runner.engine.offload_idle:
                offload(runner._models, "cpu")


#: The tasks every :class:`SiteRunner` answers by itself (a method's own are passed in: ``SiteRunner(tasks=...)``).
TASKS: dict[str, SiteTask] = {
    "metadata": SiteTask(SiteRunner._metadata, changes_state=False),
    "train": SiteTask(SiteRunner._train, changes_state=True, streams="train", filtered=True),
    "evaluate": SiteTask(SiteRunner._evaluate, changes_state=False, streams="val", together=evaluate_sites),
}
