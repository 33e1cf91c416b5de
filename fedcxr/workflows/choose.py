"""Choose a method within the target's label budget: cross-fitting on its N labeled rows only.

A hospital with N labeled images cannot set aside more labels to pick a method: a validation
split of 108 labels is 10.8 times a budget of 10. ``fedcxr sweep --select`` chooses with the N
labels it has (nested cross-fitting, e.g. Varma & Simon 2006, *BMC Bioinformatics* 7:91, on why
the choice must not see the rows that score it):

1. the N labeled rows' patients are dealt into K folds, stratified by label
   (:func:`fedcxr.pipeline.labeled_rows.patient_folds`; ``target_train.holdout``);
2. every candidate method is trained K times, each time without one fold (the sources train as
   always: only the target's labeled rows are held out), and scores the fold it did not see;
3. the held-out scores of the K folds are pooled, and each candidate gets one out-of-fold AUROC
   over all N rows (mean over classes) — pooled rather than averaged per fold, because a fold of
   3–4 rows rarely holds both classes;
4. the candidate with the highest out-of-fold AUROC is chosen (ties: the earlier candidate), and
   trained again on all N rows (:func:`select_and_train`: the runs of ``fedcxr sweep``).

Cost: K × candidates extra runs. Nothing but counts and AUROCs is written (``select/choice.json``,
``select/choice.md``); the fold runs are ordinary run directories under ``select/runs/``.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from fedcxr.advice import regime
from fedcxr.errors import UserError
from fedcxr.rundir import RunDir
from fedcxr.workflows.experiment import ConfigLike, experiment_config

log = logging.getLogger(__name__)

#: folds of the labeled rows: 3 keeps 2/3 of a budget of 10 for training and costs 3 runs a candidate
DEFAULT_FOLDS = 3
CHOICE_JSON, CHOICE_MD = "choice.json", "choice.md"


@dataclass(frozen=True)
class HeldOut:
    """One fold run's predictions on the rows it did not train on: ``labels``/``mask``/``probs`` (n, C)."""

    classes: list[str]
    labels: np.ndarray
    mask: np.ndarray
    probs: np.ndarray


@dataclass(frozen=True)
class Choice:
    """The chooser's answer: ``chosen``, each candidate's pooled out-of-fold AUROC (``scores``) and
    per-fold AUROC (NaN where a fold holds one class), the fold runs and the files written."""

    chosen: str
    candidates: list[str]
    scores: dict[str, float]
    fold_scores: dict[str, list[float]]
    folds: int
    seed: int
    n_labeled: int
    runs: list[RunDir] = field(default_factory=list, repr=False)
    files: list[Path] = field(default_factory=list)
    margin: Optional["Margin"] = None

    def as_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "candidates": self.candidates, "folds": self.folds, "seed": self.seed,
                "n_labeled": self.n_labeled, "scores": _json_numbers(self.scores),
                "fold_scores": {m: [_json_number(v) for v in vs] for m, vs in self.fold_scores.items()},
                "margin": self.margin.as_dict() if self.margin else None,
                "procedure": ("patients of the labeled target rows dealt into folds (stratified by label); each "
                              "candidate trained once per fold without it and scored on it; held-out predictions "
                              "pooled: one out-of-fold AUROC per candidate over every labeled row; highest chosen "
                              "(ties: the earlier candidate); no validation or test label is read")}


def holdout_settings(folds: int, fold: int) -> list[str]:
    """The ``--set`` strings of fold ``fold`` of ``folds`` (``target_train.holdout``)."""
    return [f"target_train.holdout={{folds: {int(folds)}, fold: {int(fold)}}}"]


def heldout_predictions(run_dir: "RunDir | str | os.PathLike", device: Optional[str] = None) -> HeldOut:
    """A finished fold run's predictions on its held-out rows (the fold of ``target_train.holdout``),
    scored at the target with the model it would deploy (:func:`fedcxr.pipeline.predictions.site_params`)."""
    from torch.utils.data import Subset

    from fedcxr.pipeline.data import default_cache_dir, make_loader
    from fedcxr.pipeline.devices import resolve_device
    from fedcxr.pipeline.engine import backend_settings, resolve_engine
    from fedcxr.pipeline.forward import predict
    from fedcxr.pipeline.predictions import load_final, site_params
    from fedcxr.pipeline.site_runner import SiteRunner

    run = RunDir.existing(run_dir)
    info, final = load_final(run.root)
    config = info["config"]
    target_train = config.get("target_train") or {}
    holdout = target_train.get("holdout")
    target = info.get("target")
    if not holdout or not target:
        raise UserError(f"{run.root}: not a fold run (its config has no target or no target_train.holdout)")
    dev = resolve_device(device or config.get("device"))
    cache = Path(config["cache_dir"]) if config.get("cache_dir") else default_cache_dir()
    engine = resolve_engine(dev, config.get("engine"), config.get("num_workers"))
    with backend_settings(engine):
        runner = SiteRunner(target, Path(info["site_dirs"][target]), model_cfg=final["model"],
                            image_size=final["image_size"], cache_dir=cache, device=dev, augment=False, engine=engine)
        classes, aux_tasks = list(final["classes"]), list(final["aux_tasks"])
        trained = [c for c in classes if c in runner.class_set]  # the classes its labeled rows were picked by
        rows = runner.labeled_rows("train", trained, target_train.get("labeled"), target_train.get("label_draw"),
                                   (int(holdout["folds"]), int(holdout["fold"])), held_out=True)
        model = runner.model(classes, aux_tasks)
        model.load_state_dict(site_params(final, target))
        data = Subset(runner.dataset("train", classes, aux_tasks, augment=False), rows)
        out = predict(model, make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False,
                                         **runner.loader_options(train=False)), device=runner.device)
    return HeldOut(classes, out["labels"], out["label_mask"], out["probs"])


def pooled_auroc(parts: Sequence[HeldOut]) -> float:
    """Mean over classes of the AUROC of every held-out prediction pooled (NaN: no class with both labels)."""
    from fedcxr.evaluation.metrics import class_aurocs, mean_auroc

    if not parts:
        return math.nan
    labels, mask, probs = pooled(parts)
    return float(mean_auroc(class_aurocs(labels, mask, probs, parts[0].classes)))


def pooled(parts: Sequence[HeldOut]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The folds' held-out labels, label mask and probabilities stacked into one (N, C) set each."""
    return tuple(np.concatenate([getattr(p, k) for p in parts]) for k in ("labels", "mask", "probs"))


@dataclass(frozen=True)
class Margin:
    """How far the chosen candidate is ahead of the runner-up on the N labeled rows: the pooled
    out-of-fold AUROC difference, its paired bootstrap interval and the share of resamples in
    which the choice stays ahead. ``told_apart`` is False where the interval reaches 0: those N rows
    cannot tell the two apart, and the choice between them is as good as a coin."""

    runner_up: str
    diff: float
    low: float
    high: float
    ahead: float
    resamples: int

    @property
    def told_apart(self) -> bool:
        return math.isfinite(self.low) and self.low > 0

    def as_dict(self) -> dict[str, Any]:
        return {"runner_up": self.runner_up, "diff": _json_number(self.diff), "low": _json_number(self.low),
                "high": _json_number(self.high), "ahead": _json_number(self.ahead), "resamples": self.resamples,
                "told_apart": self.told_apart}


#: bootstrap resamples of the labeled rows for :func:`choice_margin`
MARGIN_RESAMPLES = 2000


def choice_margin(parts: Mapping[str, Sequence[HeldOut]], scores: Mapping[str, float], chosen: str,
                  n_boot: int = MARGIN_RESAMPLES, seed: int = 0) -> Optional[Margin]:
    """The chosen candidate against the runner-up (the next highest score): paired bootstrap over the
    labeled rows (the same resamples for both; a resample leaving a class with one label value is
    skipped), 95 % percentile interval of the mean-over-classes AUROC difference. None with one
    scored candidate. Why: a choice made on 10 rows is a guess, and the user should see that it is."""
    from fedcxr.evaluation.metrics import bootstrap_aurocs

    others = [m for m in scores if m != chosen and math.isfinite(scores[m])]
    if not others:
        return None
    runner_up = max(others, key=lambda m: scores[m])
    labels, mask, _ = pooled(parts[chosen])  # the same rows, in the same order, for every candidate
    labels = np.where(mask == 0, np.nan, labels.astype(float))
    defined = [c for c in range(labels.shape[1]) if len(np.unique(labels[~np.isnan(labels[:, c]), c])) == 2]
    rows = np.arange(len(labels))  # rows resampled one by one: a patient with several labeled rows narrows it
    boots = [bootstrap_aurocs(labels[:, defined], pooled(parts[m])[2][:, defined], rows, n_boot=n_boot, seed=seed)
             for m in (chosen, runner_up)]
    both = np.isfinite(boots[0]).all(axis=1) & np.isfinite(boots[1]).all(axis=1)
    diffs = boots[0][both].mean(axis=1) - boots[1][both].mean(axis=1)
    if diffs.size == 0:
        return Margin(runner_up, scores[chosen] - scores[runner_up], math.nan, math.nan, math.nan, 0)
    low, high = np.quantile(diffs, [0.025, 0.975])
    return Margin(runner_up, float(scores[chosen] - scores[runner_up]), float(low), float(high),
                  float(np.mean(diffs > 0) + 0.5 * np.mean(diffs == 0)), int(diffs.size))


def pick(scores: Mapping[str, float], candidates: Sequence[str]) -> str:
    """The candidate with the highest score; ties (and NaN) go to the earlier candidate."""
    best, best_score = None, -math.inf
    for method in candidates:
        value = scores.get(method, math.nan)
        if math.isfinite(value) and value > best_score:
            best, best_score = method, value
    if best is None:
        raise UserError("no candidate has an out-of-fold AUROC: the labeled target rows hold one class only (or "
                        "none), so no method can be chosen by AUROC on them")
    return best


def choose_method(config: ConfigLike, candidates: Sequence[str], *, out: "str | os.PathLike",
                  folds: int = DEFAULT_FOLDS, seed: int = 0, device: Optional[str] = None, progress: bool = True,
                  settings: Sequence[str] = (), announce: Optional[Callable[[str], None]] = None) -> Choice:
    """Cross-fit every candidate on the target's labeled rows (``folds`` folds, ``seed``) and choose one;
    writes ``OUT/select/choice.json`` and ``choice.md``. Finished fold runs are kept and skipped on a re-run."""
    from fedcxr.pipeline.protocols import get_protocol
    from fedcxr.pipeline.run_driver import run_experiment

    say = announce or log.info
    candidates = list(dict.fromkeys(candidates))
    if len(candidates) < 2:
        raise UserError(f"--select chooses among at least 2 methods, got {candidates}")
    if not 2 <= int(folds) <= 20:
        raise UserError(f"--folds: 2 to 20 folds of the labeled rows, got {folds}")
    for method in candidates:
        get_protocol(method)  # a typo fails before any training
    base = experiment_config(config, settings=[*settings, f"method={candidates[0]}", f"seed={seed}"])
    if not base.target:
        raise UserError("--select chooses with the target's labeled rows: the config names no `target:`")
    if base.target_train.holdout is not None:
        raise UserError("--select sets target_train.holdout itself: remove it from the config")
    root = Path(out) / "select"
    parts: dict[str, list[HeldOut]] = {m: [] for m in candidates}
    runs = []
    for method in candidates:
        for fold in range(int(folds)):
            cfg = experiment_config(config, settings=[*settings, f"method={method}", f"seed={seed}",
                                                      *holdout_settings(folds, fold)])
            run = RunDir(root / "runs" / f"{method}-seed{seed}-fold{fold}")
            if not run.final_model.exists():
                resume = bool(run.checkpoint_files())
                say(f"select: {method} seed {seed}, fold {fold + 1} of {folds} held out: training"
                    f"{' (resuming)' if resume else ''}")
                run_experiment(cfg, run, resume=resume, device=device, progress=progress)
            parts[method].append(heldout_predictions(run, device))
            runs.append(run)
    n_labeled = int(sum(len(p.labels) for p in parts[candidates[0]]))
    scores = {m: pooled_auroc(parts[m]) for m in candidates}
    fold_scores = {m: [pooled_auroc([p]) for p in parts[m]] for m in candidates}
    chosen = pick(scores, candidates)
    choice = Choice(chosen, candidates, scores, fold_scores, int(folds), int(seed), n_labeled, runs,
                    margin=choice_margin(parts, scores, chosen))
    return Choice(**{**choice.__dict__, "files": write_choice(choice, root)})


def select_and_train(config: ConfigLike, candidates: Sequence[str], *, out: "str | os.PathLike", seeds: int = 1,
                     folds: int = DEFAULT_FOLDS, select_seed: int = 0, device: Optional[str] = None,
                     progress: bool = True, settings: Sequence[str] = (),
                     announce: Optional[Callable[[str], None]] = None):
    """Choose (:func:`choose_method`), then train and evaluate the chosen method on all N labeled rows
    (``fedcxr sweep``'s runs ``OUT/runs/<method>-seed<k>``, k < ``seeds``); returns (choice, sweep result)."""
    from fedcxr.workflows.sweep import sweep

    choice = choose_method(config, candidates, out=out, folds=folds, seed=select_seed, device=device,
                           progress=progress, settings=settings, announce=announce)
    (announce or log.info)(f"select: chose {choice.chosen} (out-of-fold AUROC "
                           f"{choice.scores[choice.chosen]:.3f}); training it on all {choice.n_labeled} labeled rows")
    if choice.margin:  # how sure the choice is: a choice on 10 rows is a guess, and says so
        (announce or log.info)(f"select: {margin_text(choice.margin, choice.chosen, choice.n_labeled)}")
    result = sweep(config, [choice.chosen], out=out, seeds=seeds, device=device, progress=progress,
                   settings=settings, announce=announce)
    return choice, result


def write_choice(choice: Choice, root: Path) -> list[Path]:
    """``choice.json`` and ``choice.md``: the scores and the choice (no identifier, no path)."""
    from fedcxr.atomic import atomic_write_bytes, atomic_write_json
    from fedcxr.escape import md, md_text

    root.mkdir(parents=True, exist_ok=True)
    data = choice.as_dict()
    lines = [f"# Method chosen within the label budget: {md_text(choice.chosen)}", "",
             f"{choice.n_labeled} labeled target rows, {choice.folds} folds by patient, seed {choice.seed}. "
             + data["procedure"] + ".", "",
             "| candidate | out-of-fold AUROC (all labeled rows) | per fold |", "|---|---|---|"]
    for method in choice.candidates:
        folds = ", ".join("n/a" if not math.isfinite(v) else f"{v:.3f}" for v in choice.fold_scores[method])
        mark = " (chosen)" if method == choice.chosen else ""
        score = choice.scores[method]
        lines.append(f"| {md(method)}{mark} | {'n/a' if not math.isfinite(score) else f'{score:.3f}'} | {folds} |")
    if choice.margin:
        lines += ["", md_text(margin_text(choice.margin, choice.chosen, choice.n_labeled))]
    paths = [root / CHOICE_JSON, root / CHOICE_MD]
    atomic_write_json(paths[0], data)
    atomic_write_bytes(paths[1], ("\n".join(lines) + "\n").encode())
    return paths


def margin_text(margin: Margin, chosen: str, n_labeled: int, cells: Optional[Sequence[regime.Cell]] = None) -> str:
    """One sentence on how sure the choice is and, where it is not sure, what the regime map (``cells``;
    the shipped one by default) measured choosing on about this many labels to cost."""
    interval = ("no interval (every resample left a class with one label value)" if not margin.resamples else
                f"95 % bootstrap interval over the rows [{margin.low:+.3f}, {margin.high:+.3f}], ahead in "
                f"{margin.ahead:.0%} of {margin.resamples} resamples")
    head = (f"{chosen} is ahead of the runner-up, {margin.runner_up}, by {margin.diff:+.3f} out-of-fold AUROC "
            f"({interval})")
    if margin.told_apart:
        return f"{head}: told apart on these {n_labeled} rows."
    tie = "; a tie goes to the earlier candidate" if margin.diff == 0 else ""
    cost = regime.chooser_cost(n_labeled, cells)
    return f"{head}: these {n_labeled} rows cannot tell the two apart{tie}." + (f" {cost}" if cost else "")


def _json_number(value: float) -> Optional[float]:
    return float(value) if value is not None and math.isfinite(value) else None


def _json_numbers(values: Mapping[str, float]) -> dict[str, Optional[float]]:
    return {k: _json_number(v) for k, v in values.items()}


__all__ = ["Choice", "HeldOut", "Margin", "choice_margin", "choose_method", "heldout_predictions", "holdout_settings",
           "margin_text", "pick", "pooled_auroc", "select_and_train"]
