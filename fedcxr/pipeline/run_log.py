"""What a run says while it trains: one line per round, and ``RUN_DIR/train.log``.

On a terminal the round bar (tqdm) shows progress; when the output goes to a file (``nohup``,
SLURM, CI) tqdm draws nothing, so each round is logged as one line instead
(:func:`round_line`). Whatever the console, :func:`run_log` copies fedcxr's log records into
``RUN_DIR/train.log`` (appended: a resumed run continues the same file) with time stamps:
the run's header, every round's line, and fedcxr's warnings and messages (at the console's
verbosity; the header and round lines always).

Rounds are numbered from 1 wherever people read them (the console, ``train.log``, reports and
error messages: ``round 1/5`` is the first round); the files a program reads (``metrics.jsonl``,
``run.json``, checkpoint names ``round_0000.pt``, TensorBoard steps) keep the 0-based round
*index* under ``round``. :func:`round_number` turns one into the other.

The round lines are records of the ``fedcxr.rounds`` logger, whose level is INFO whatever the
console's (``--quiet`` hides them from the console by the console handler's level, not from
the file). Like every file of a run directory, the log holds no patient identifier and no
image path: site names, class names, numbers and the run's own paths only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from fedcxr import rundir
from fedcxr.evaluation.small_sample import is_small

#: the log file of a run directory (fedcxr.rundir)
TRAIN_LOG = rundir.TRAIN_LOG
#: the logger of the header and the per-round lines (always INFO: they reach train.log under --quiet too)
ROUNDS_LOGGER = "fedcxr.rounds"

rounds_log = logging.getLogger(ROUNDS_LOGGER)
rounds_log.setLevel(logging.INFO)


#: up to this many sites a round line names every site's loss and validation AUROC; beyond, it summarises
LISTED_SITES = 5
#: the sites a summarised line names: the highest losses, the lowest validation AUROCs
WORST_SITES = 3
#: what a site's validation AUROC reads when its split cannot support one
TOO_FEW = "too few cases"


def _float(value: Any) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _number(value: Any) -> str:
    value = _float(value)
    return "n/a" if value is None else f"{value:.3f}"


def round_number(index: int) -> int:
    """The round as people count it (1 = the first) from the 0-based index that ``metrics.jsonl``,
    ``run.json`` and the checkpoint names (``round_0000.pt``) keep."""
    return int(index) + 1


def round_line(metrics: Mapping[str, Any], rounds: int) -> str:
    """``round 3/10 (4.2 s): loss a 0.612, b 0.587, target 0.650; val AUROC c 0.712``.

    ``metrics`` is the round's ``metrics.jsonl`` entry: ``train`` (site → ``{"loss", ...}``),
    ``target`` (the target's fine-tuning, ``{"loss", ...}``), ``val`` (site → ``{"mean_auroc",
    "auroc", "cases"}``), ``missed``/``refused`` (this round's), ``seconds``. Parts a method does
    not have are left out; an undefined number is ``n/a``.

    Why it stays short: at 100 sites a line naming every site is thousands of characters, which
    no one reads in a log. Up to :data:`LISTED_SITES` sites every site is named; beyond, the line
    gives the median and range of the sites' losses with the :data:`WORST_SITES` highest by name
    (``loss median 0.612 (0.501–0.702) of 100, worst site-7 0.702, ...``), how many sites missed or
    were refused (named up to :data:`LISTED_SITES` sites), and the median validation AUROC with the
    lowest site; ``metrics.jsonl`` (and TensorBoard) keep every site's numbers. A site's validation AUROC is printed only where its
    split supports one (:func:`val_supported`); otherwise it reads ``too few cases``.
    """
    head = f"round {round_number(metrics.get('round', 0))}/{rounds}"
    if metrics.get("seconds") is not None:
        head += f" ({float(metrics['seconds']):.1f} s)"
    losses = {site: entry.get("loss") for site, entry in (metrics.get("train") or {}).items()
              if isinstance(entry, Mapping) and "loss" in entry}
    parts = [] if not losses else [_listed("loss", losses) if len(losses) <= LISTED_SITES
                                   else _summarised("loss", losses, worst=max)]
    target = metrics.get("target")
    if isinstance(target, Mapping) and "loss" in target:
        if parts and len(losses) <= LISTED_SITES:
            parts[0] += f", target {_number(target.get('loss'))}"
        else:
            parts.append(f"{'' if parts else 'loss '}target {_number(target.get('loss'))}")
    parts += _absent(metrics, named=len(losses) <= LISTED_SITES)
    val = {site: (entry.get("mean_auroc") if val_supported(entry) else TOO_FEW)
           for site, entry in (metrics.get("val") or {}).items() if isinstance(entry, Mapping)}
    if val:
        parts.append(_listed("val AUROC", val) if len(val) <= LISTED_SITES
                     else _summarised("val AUROC", val, worst=min))
    return head + (": " + "; ".join(parts) if parts else "")


def val_supported(entry: Mapping[str, Any]) -> bool:
    """Whether a site's validation split supports the AUROC it reports.

    The rule of every AUROC fedcxr reports (:mod:`fedcxr.evaluation.small_sample`): each class
    behind the site's mean needs :data:`~fedcxr.evaluation.small_sample.MIN_CASES` positive and as
    many negative patients in the split (``cases``: class → ``[positive, negative]`` patients, as the
    site's ``evaluate`` reply counts them). A row without ``cases`` (written before sites counted
    them) is taken as it is.
    """
    cases = entry.get("cases")
    if not isinstance(cases, Mapping):
        return True
    for cls, auroc in (entry.get("auroc") or {}).items():
        if _float(auroc) is None:
            continue  # not in the mean
        counts = cases.get(cls)
        if not isinstance(counts, (list, tuple)) or len(counts) != 2 or is_small(*counts):
            return False
    return True


def _listed(name: str, values: Mapping[str, Any]) -> str:
    return f"{name} " + ", ".join(f"{site} {v if v == TOO_FEW else _number(v)}" for site, v in values.items())


def _summarised(name: str, values: Mapping[str, Any], *, worst) -> str:
    """Losses (``worst=max``): ``loss median 0.612 (0.501–0.702) of 98, worst site-7 0.702, site-3 0.699,
    site-9 0.690, 2 n/a``. Validation AUROCs (``worst=min``), shorter: ``val AUROC median 0.713 of 97,
    lowest site-4 0.601, 3 too few cases``."""
    numbers = {site: _float(v) for site, v in values.items() if v != TOO_FEW}
    defined = {site: v for site, v in numbers.items() if v is not None}
    few = sum(v == TOO_FEW for v in values.values())
    undefined = len(numbers) - len(defined)
    pieces = [f"{undefined} n/a"] if undefined else []
    pieces += [f"{few} {TOO_FEW}"] if few else []
    if not defined:  # ``val AUROC none: 30 n/a, 70 too few cases``
        return f"{name} none: " + ", ".join(pieces)
    named = WORST_SITES if worst is max else 1
    ordered = sorted(defined, key=lambda s: defined[s], reverse=worst is max)[:named]
    spread = f" ({min(defined.values()):.3f}–{max(defined.values()):.3f})" if worst is max else ""
    return ", ".join([f"{name} median {statistics.median(defined.values()):.3f}{spread} of {len(defined)}, "
                      f"{'worst' if worst is max else 'lowest'} " + ", ".join(f"{s} {defined[s]:.3f}" for s in ordered),
                      *pieces])


def _absent(metrics: Mapping[str, Any], *, named: bool) -> list[str]:
    """This round's absent and refused sites: ``missed b``, ``refused c`` (``named``), else their
    numbers, ``2 missed, 1 refused`` (each one's name is in the round's warning lines)."""
    refused = _site_names(metrics.get("refused"))
    # missed: participation's map (site → why; a reply the checks refused is under refused only), or a list
    counts = {"missed": [s for s in _site_names(metrics.get("missed")) if s not in refused], "refused": refused}
    counts = {key: sites for key, sites in counts.items() if sites}
    if named:
        return [f"{key} {', '.join(sites)}" for key, sites in counts.items()]
    return [", ".join(f"{len(sites)} {key}" for key, sites in counts.items())] if counts else []


def _site_names(value) -> list[str]:
    """The sites of a round's ``missed`` map (site → why) or of a list of ``{"site": ...}`` entries."""
    if isinstance(value, Mapping):
        return [str(site) for site in value]
    return list(dict.fromkeys(str(e.get("site")) for e in value or [] if isinstance(e, Mapping)))


@contextlib.contextmanager
def run_log(run_dir: Path | str) -> Iterator[Path]:
    """Copy fedcxr's log records into ``RUN_DIR/train.log`` (appending) while the block runs."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / TRAIN_LOG
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("fedcxr")
    logger.addHandler(handler)
    try:
        yield path
    finally:
        logger.removeHandler(handler)
        handler.close()
