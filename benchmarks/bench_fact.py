"""FACT on an unlabeled shifted target vs Source_Only (real PneumoniaMNIST; issue 10).

The FACT paper's claim, in its own terms: with several labeled source clients and one
*unlabeled* target, cross-training pairs of sources and minimising the two source heads'
inter-domain distance (IDD) on the target's images gives a model that predicts the target
better than the sources' model alone; the head fine-tuning step (FACT vs FACT_NF) helps most on
the hard targets; the final model is the round of lowest IDD, chosen without a target label.

Setting: the sites, target and shift of ``bench_shift.py`` (reused by import; its module doc
describes them): sources = the official *train* images dealt to three sites by patient hash,
target = the official *test* images re-split 45/15/40 by patient hash and shifted with
``fedcxr shift --kind mix --level L`` (seed 0). What differs:

* the label-free methods (``Source_Only``, ``FACT``, ``FACT_NF``) train with an **unlabeled
  copy** of the shifted target: the same rows and images with every finding label removed and
  ``site.json`` ``"unlabeled": true`` (an empty class set; the config says ``class_source:
  sources``), so no target label — train, val or test — can reach training or model selection;
* ``Oracle`` (reference: the target alone with all its labels) trains on the labeled shifted
  target's 260 training rows;
* every run is then scored the same way: its final model on the **labeled** shifted target's
  test split (279 images, :func:`fedcxr.pipeline.predictions.site_prediction_frame`, AUROC of
  :mod:`fedcxr.evaluation.metrics`), written to ``RUN_DIR/target_test.json``;
* every method uses Adam (lr 1e-3, no weight decay), as ``bench_shift``'s runs; FACT keeps its
  other defaults (random source pair per round, its lr annealing, optimiser state kept across
  rounds, final model = round of lowest summed IDD). FACT's own default optimiser is SGD
  (momentum 0.9, as its code); ``FACT_SGD`` runs it so, at the paper's η0 = 0.005
  (``--fact-sgd LR`` to change);
* ``Source_Only_AdaBN`` (diagnostic, no training): each Source_Only model with its BatchNorm
  statistics re-estimated on the unlabeled target's training images (AdaBN; label-free). FACT's
  target step trains G in train mode, so its BatchNorm statistics move to the target too; this
  separates that effect from the IDD objective's;
* ``FACT_last`` (diagnostic, no training): each FACT run's last-round model instead of its
  lowest-IDD round (from its last checkpoint): what the label-free model selection adds;
* ``FACT_AdaBN`` (diagnostic, no training): AdaBN applied to each FACT model, so that against
  ``Source_Only_AdaBN`` both have BatchNorm statistics of the target and only the weights the
  two methods trained differ.

The paper's favourable case is sources from *distinct* domains, which IID sites are not:
``--source-shift noise gamma blur`` (with ``--source-level L``, default 3) shifts site-k with the
k-th kind first, so each source is its own domain (``--stem fact_domains`` keeps its outputs apart).

Nothing is tuned on the test split: :data:`FACT_CONFIG` and :data:`ROUNDS` were fixed before any
test AUROC was seen.

Re-run (5 levels × 10 seeds: 250 trained runs, about 20 min with ``--workers 2`` on 2 shared
CPU cores)::

    nice -n 10 python benchmarks/bench_fact.py --work runs/bench_fact --out benchmarks/results --workers 2

Finished runs are skipped, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # a real module: its functions must pickle into the worker processes
import bench_shift  # noqa: E402

from fedcxr.errors import UserError  # noqa: E402

METHODS = ["Source_Only", "Source_Only_AdaBN", "FACT", "FACT_last", "FACT_AdaBN", "FACT_NF", "FACT_SGD", "Oracle"]
#: trained with the unlabeled copy of the target (the rest: with the labeled target)
LABEL_FREE = {"Source_Only", "FACT", "FACT_NF", "FACT_SGD"}
#: derived from another method's finished runs without training: name → the method it starts from
DERIVED = {"Source_Only_AdaBN": "Source_Only", "FACT_last": "FACT", "FACT_AdaBN": "FACT"}
#: ``FACT_SGD``: FACT with its authors' optimiser (SGD momentum 0.9, weight decay 5e-4)
VARIANTS = {"FACT_SGD": "FACT"}
#: the same optimiser for every method (FACT's default is SGD; see the module doc)
FACT_CONFIG = ["source.optimizer=adam", "source.weight_decay=0", "target_train.optimizer=adam",
               "target_train.weight_decay=0"]
#: more rounds than bench_shift's 5: FACT picks its model among the rounds and anneals its lr over them
ROUNDS = 10
SCORE_FILE = "target_test.json"

#: The FACT paper's predictions: (claim, better, worse, levels: "none" = 0, "shift" = > 0, "all").
CLAIMS = [
    ("FACT > Source_Only", "FACT", "Source_Only", "shift", False),
    ("FACT_NF > Source_Only", "FACT_NF", "Source_Only", "shift", False),
    ("FACT ≈ Source_Only (no shift)", "FACT", "Source_Only", "none", True),
    ("FACT ≥ FACT_NF", "FACT", "FACT_NF", "all", False),
    ("Oracle > FACT (reference)", "Oracle", "FACT", "all", False),
    ("FACT > Source_Only_AdaBN (diagnostic: IDD beyond BN statistics)", "FACT", "Source_Only_AdaBN", "shift", False),
    ("FACT > FACT_last (diagnostic: lowest-IDD round vs last round)", "FACT", "FACT_last", "all", False),
    ("FACT_AdaBN > Source_Only_AdaBN (diagnostic: the weights, BN statistics of the target in both)",
     "FACT_AdaBN", "Source_Only_AdaBN", "all", False),
]



def claims_for(source_shift: Sequence[str]) -> list[tuple]:
    """:data:`CLAIMS`, or with every source its own domain (``--source-shift``) the target differs
    from each source at every level, so the paper expects FACT's gains at level 0 too."""
    if not source_shift:
        return CLAIMS
    return [(c, a, b, "all", x) for c, a, b, _, x in CLAIMS if "≈" not in c]


# --------------------------------------------------------------------------- data


def unlabeled_copy(target: Path, out: Path) -> Path:
    """The target's rows and images with every finding label removed, written as an unlabeled
    site (``site.json`` ``"unlabeled": true``, empty class set) under ``out``; returns its folder."""
    from fedcxr.site_adapters.manifest import read_manifest, read_site_json, write_site
    from fedcxr.vocab import CLASSES, label_column

    site = out / "target"
    if (site / "site.json").is_file():
        return site
    meta, frame = read_site_json(target), read_manifest(target)
    for cls in CLASSES:
        frame[label_column(cls)] = np.nan
    frame = frame.drop(columns=[c for c in frame.columns if c.startswith("raw__")])
    write_site(out, "target", frame, classes=[], source=meta["source"], adapter_version=meta["adapter_version"],
               export_root=Path(meta["export_root"]), set_aside=[], unlabeled=True,
               key_id=(meta.get("pseudonyms") or {}).get("key_id"),
               options={**meta.get("options", {}), "bench_fact": "finding labels removed (FACT's unlabeled target)"})
    return site


# --------------------------------------------------------------------------- runs


def shifted_sources(manifests: Path, work: Path, kinds: Sequence[str], level: int) -> list[str]:
    """Source site-k shifted with ``kinds[k-1]`` at ``level`` (seed 0): one domain per source;
    returns the site folders."""
    from fedcxr.site_adapters.shift import shift_site

    folders = []
    for k, kind in enumerate(kinds, start=1):
        out = work / "sources" / f"{kind}{level}"
        if not (out / f"site-{k}" / "site.json").is_file():
            shift_site(manifests / f"site-{k}", out, kind=kind, level=level, seed=0, site_name=f"site-{k}",
                       progress=False)
        folders.append(str((out / f"site-{k}").resolve()))
    return folders


def score_run(run_dir: Path, labeled_target: Path, cache: Path, *, params: Optional[dict] = None,
              out: Optional[Path] = None) -> dict:
    """The run's final model (or ``params``) on the labeled target's test split; written to
    ``out/SCORE_FILE`` (default: the run's folder)."""
    import torch

    from fedcxr.evaluation.metrics import auroc
    from fedcxr.pipeline.predictions import load_final, site_params, site_prediction_frame
    from fedcxr.pipeline.site_runner import SiteRunner
    from fedcxr.vocab import label_column

    run, final = load_final(run_dir)
    runner = SiteRunner("target", labeled_target, model_cfg=final["model"], image_size=final["image_size"],
                        cache_dir=cache, device=torch.device("cpu"), augment=False)
    classes = final["classes"]
    weights = params if params is not None else site_params(final, "target")
    frame = site_prediction_frame(runner, weights, classes, final["aux_tasks"], "test")
    per_class = {c: auroc(frame[label_column(c)], frame[f"prob__{c}"]) for c in classes}
    values = [v for v in per_class.values() if np.isfinite(v)]
    result = {"mean_auroc": float(np.mean(values)) if values else float("nan"), "auroc": per_class,
              "n": int(len(frame)), "positives": {c: int((frame[label_column(c)] == 1).sum()) for c in classes},
              "strategy": run["method"], "target_unlabeled": not run["class_sets"].get("target"),
              "selected_round": _selected_round(run_dir)}
    if params is not None:
        result.update(derived_from=run_dir.name, selected_round=None)
    ((out or run_dir) / SCORE_FILE).write_text(json.dumps(result, indent=1))
    return result


def _selected_round(run_dir: Path) -> Optional[int]:
    """FACT's lowest-IDD round (``best_round`` of the last ``metrics.jsonl`` line); None otherwise."""
    lines = (run_dir / "metrics.jsonl").read_text().strip().splitlines()
    value = json.loads(lines[-1]).get("best_round") if lines else None
    return int(value) if value is not None else None


def adabn_run(source_run: Path, run_dir: Path, unlabeled_target: Path, labeled_target: Path, cache: Path) -> dict:
    """AdaBN: ``source_run``'s final model with every BatchNorm's running statistics re-estimated on
    the unlabeled target's training images (no label, no gradient), scored as :func:`score_run`."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    from fedcxr.pipeline.data import make_loader
    from fedcxr.pipeline.predictions import load_final, site_params
    from fedcxr.pipeline.site_runner import SiteRunner

    _, final = load_final(source_run)
    runner = SiteRunner("target", unlabeled_target, model_cfg=final["model"], image_size=final["image_size"],
                        cache_dir=cache, device=torch.device("cpu"), augment=False)
    model = runner.model(final["classes"], final["aux_tasks"])
    model.load_state_dict(site_params(final, "target"))
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over the target's batches
    model.train()
    data = runner.dataset("train", final["classes"], final["aux_tasks"], augment=False)
    with torch.no_grad():
        for batch in make_loader(data, batch_size=64, shuffle=False, seed=0, augment=False):
            model(batch["image"])
    run_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return score_run(source_run, labeled_target, cache, params=state, out=run_dir)


def last_round_run(source_run: Path, run_dir: Path, unlabeled_target: Path, labeled_target: Path,
                   cache: Path) -> dict:
    """``source_run``'s global model after its last round (its newest checkpoint), scored as
    :func:`score_run`: FACT without its lowest-IDD model selection."""
    from fedcxr.pipeline.checkpoints import latest_checkpoint, load_checkpoint

    ckpt = load_checkpoint(latest_checkpoint(source_run))
    rounds = json.loads((source_run / "run.json").read_text())["rounds"]
    if ckpt["round"] != rounds - 1:
        raise UserError(f"{source_run}: newest checkpoint is round {ckpt['round']}, not the last ({rounds - 1})")
    run_dir.mkdir(parents=True, exist_ok=True)
    return score_run(source_run, labeled_target, cache, params=ckpt["state"]["global"], out=run_dir)


def run_level(job: tuple) -> float:
    """Every method × seed of one level (in a worker process, one torch thread); returns its wall time."""
    import torch

    from fedcxr.pipeline.checkpoints import latest_checkpoint
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    configs, methods, seeds, out, overrides, (labeled_target, unlabeled_target), sgd_lr = job
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    t0 = time.time()
    for method in methods:
        config = configs["unlabeled" if method in LABEL_FREE else "labeled"]
        extra = (["source.optimizer=sgd", "target_train.optimizer=sgd", "source.weight_decay=5e-4",
                  "target_train.weight_decay=5e-4", f"source.lr={sgd_lr}", f"target_train.lr={sgd_lr}"]
                 if method == "FACT_SGD" else [])
        for seed in range(seeds):
            run_dir = out / "runs" / f"{method}-seed{seed}"
            if (run_dir / SCORE_FILE).is_file():
                continue
            if method in DERIVED:
                source = out / "runs" / f"{DERIVED[method]}-seed{seed}"
                if not (source / "final_model.pt").is_file():
                    raise UserError(f"{method} needs {DERIVED[method]} among --methods, before it")
                derive = adabn_run if method.endswith("_AdaBN") else last_round_run
                derive(source, run_dir, unlabeled_target, labeled_target, Path(load_config(config).cache_dir))
                continue
            cfg = load_config(config, overrides=[*FACT_CONFIG, *overrides, *extra,
                                                 f"strategy={VARIANTS.get(method, method)}", f"seed={seed}"])
            if not (run_dir / "final_model.pt").exists():
                print(f"{out.name} {method} seed {seed}: training", flush=True)
                run_experiment(cfg, run_dir, resume=latest_checkpoint(run_dir) is not None, device="cpu",
                               progress=False)
            score_run(run_dir, labeled_target, Path(cfg.cache_dir))
    return time.time() - t0


def run_auroc(run_dir: Path) -> float:
    value = json.loads((run_dir / SCORE_FILE).read_text()).get("mean_auroc")
    return float(value) if value is not None else float("nan")


# --------------------------------------------------------------------------- main


def parse(argv: Optional[Sequence[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    sgd_lr = float(_pop(argv, "--fact-sgd", 1)[0] or 5e-3)  # FACT_SGD's lr: the paper's η0 by default
    source_level = int(_pop(argv, "--source-level", 1)[0] or 3)
    source_shift = _pop(argv, "--source-shift", None)
    defaults = ["--levels", "0", "1", "2", "3", "4", "--methods", *METHODS, "--seeds", "10", "--stem", "fact_mix",
                "--rounds", str(ROUNDS)]
    args = bench_shift.parse(defaults + argv)
    args.sgd_lr, args.source_level, args.source_shift = sgd_lr, source_level, [k for k in source_shift if k]
    if args.source_shift and len(args.source_shift) != args.sources:
        raise UserError(f"--source-shift needs one kind per source site ({args.sources}), got {args.source_shift}")
    return args


def _pop(argv: list[str], flag: str, n: Optional[int]) -> list[Optional[str]]:
    """Remove ``flag`` and its values from ``argv`` (``n`` values, or all up to the next flag)."""
    if flag not in argv:
        return [None]
    i = argv.index(flag)
    j = i + 1 + n if n is not None else next((k for k in range(i + 1, len(argv)) if argv[k].startswith("--")),
                                             len(argv))
    values = argv[i + 1:j]
    if not values or len(values) != (n or len(values)):
        raise UserError(f"{flag} needs {n or 'at least one'} value(s)")
    del argv[i:j]
    return values


def main(argv: Optional[Sequence[str]] = None) -> pd.DataFrame:
    import torch

    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    start = time.time()
    sweep = args.work / "sweep" / args.stem
    manifests = bench_shift.prepare_sites(args.npz, args.work, n_sources=args.sources,
                                          target_split=args.target_split, target_from=args.target_from)
    sources = (shifted_sources(manifests, args.work, args.source_shift, args.source_level)
               if args.source_shift else None)
    jobs = []
    for level in args.levels:
        labeled = bench_shift.shifted_target(manifests, args.work, args.kind, level)
        unlabeled = unlabeled_copy(labeled, args.work / "targets" / f"{args.kind}{level}-unlabeled")
        out = sweep / f"level{level}"
        configs = {
            name: bench_shift.level_config(args.work, manifests, site, args.sources, None, args.rounds, out,
                                           name=f"config-{name}.yaml", extra={"class_source": "sources"},
                                           sites=sources)
            for name, site in (("unlabeled", unlabeled), ("labeled", labeled))}
        bench_shift.warm_caches(configs["labeled"])
        bench_shift.warm_caches(configs["unlabeled"])
        jobs.append((configs, args.methods, args.seeds, out, args.overrides, (labeled, unlabeled), args.sgd_lr))
    bench_shift.run_levels(jobs, args.workers, job_fn=run_level)
    frame = bench_shift.collect(sweep, args.methods, args.seeds, args.levels, scored=SCORE_FILE, score=run_auroc)
    meta = {"kind": args.kind, "levels": args.levels, "seeds": args.seeds, "sources": args.sources,
            "source_shift": args.source_shift, "source_level": args.source_level if args.source_shift else None,
            "rounds": args.rounds, "target_split": args.target_split, "overrides": [*FACT_CONFIG, *args.overrides],
            "fact_sgd_lr": args.sgd_lr if "FACT_SGD" in args.methods else None, "workers": args.workers,
            "selected_rounds": selected_rounds(sweep, args), "base_config": bench_shift.BASE_CONFIG,
            "wall_s": round(time.time() - start)}
    bench_shift.write_outputs(frame, "level", args.methods, args.out, args.stem, header="level",
                              xlabel=f"{args.kind} shift level (0 = none)",
                              title=title(args.kind, args.seeds, args.source_shift, args.source_level),
                              meta=meta, claims=claims_for(args.source_shift))
    print(f"total {time.time() - start:.0f} s; outputs in {args.out}")
    return frame


def title(kind: str, seeds: int, source_shift: Sequence[str] = (), source_level: int = 0) -> str:
    if source_shift:  # shorter: the figure's width
        return (f"PneumoniaMNIST, sources {'/'.join(source_shift)} {source_level}, unlabeled `{kind}` target, "
                f"{seeds} seeds")
    return f"PneumoniaMNIST, unlabeled `{kind}`-shifted target, {seeds} seeds: FACT vs Source_Only"


def selected_rounds(sweep: Path, args) -> dict:
    """FACT's lowest-IDD round per level and method, over seeds (rounds count from 0)."""
    out = {}
    for level in args.levels:
        for method in args.methods:
            picks = []
            for seed in range(args.seeds):
                path = sweep / f"level{level}" / "runs" / f"{method}-seed{seed}" / SCORE_FILE
                if path.is_file() and json.loads(path.read_text()).get("selected_round") is not None:
                    picks.append(json.loads(path.read_text())["selected_round"])
            if picks:
                out[f"level{level} {method}"] = picks
    return out


if __name__ == "__main__":
    main()
