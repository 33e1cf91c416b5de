"""The advice: which method for the target, and every number it rests on.

The federation is placed in a cell of the regime map (:mod:`fedcxr.advice.regime`) by three
inputs, each shown with where it came from:

* **shift type** — the diagnosis (:func:`fedcxr.stats.distances.shift_type`) of the target
  against the pooled sources;
* **target labels** — the target's labeled training rows (released count ``train_labels``),
  capped as training caps them (``target_train.labeled``, ``target_train.max_rows``);
* **rounds** — the config's planned ``rounds``.

The map's verdict there is the advice: a method only where the cell is resolved (the winner
beat every other method, corrected for picking the winner and for the number of cells:
:mod:`fedcxr.advice.verdicts`); "unresolved: run a sweep" where it is not, with the
``fedcxr sweep --select`` that chooses among the cell's candidates on the hospital's own labeled
rows, within its budget (:mod:`fedcxr.workflows.choose`) — or, where the chooser measured in that
cell lost to the winner beyond doubt (too few labels to choose on, or a candidate list without
the leader), "unresolved: train the leader" with the ``fedcxr train`` of the cell's leader;
"no cell close enough" where the map has nothing near. The pilot's σ², τ²d² and β_i are reported beside it as the FedGP theory's reading of this
very federation; they never pick the method alone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

from fedcxr.advice import regime
from fedcxr.errors import UserError
from fedcxr.pipeline.config import ExperimentConfig


def target_labels(cfg: ExperimentConfig, payload: Optional[dict]) -> dict[str, Any]:
    """The label budget training will give the target: the config's plan (``target_train.labeled``,
    ``max_rows``) checked against the target's released labeled-row count.

    Training takes ``min(labeled rows, cap)`` (:meth:`SiteRunner.labeled_rows`). When the
    target's labeled count was suppressed (it, or the unlabeled rows beside it, fell below K),
    the planned cap is used and marked as not verified; without a cap the budget is unknown.
    """
    groups = (payload or {}).get("groups") or {}
    labeled = (groups.get("train_labels") or {}).get("counts", [None])[0]
    train_rows = (groups.get("split") or {}).get("counts", [None])[0]
    cap, steps = cfg.target_train.labeled, []
    planned: Optional[int] = None
    if cap is not None:
        if isinstance(cap, float) and cap <= 1:
            if train_rows is not None:
                planned = max(1, int(round(cap * int(train_rows))))
                steps.append(f"target_train.labeled {cap} × {int(train_rows)} training rows = {planned}")
            else:
                steps.append(f"target_train.labeled {cap} of a training-row count that was not released")
        else:
            planned = max(1, int(cap))
            steps.append(f"target_train.labeled {planned}")
    if cfg.target_train.max_rows:
        planned = min(planned or int(cfg.target_train.max_rows), int(cfg.target_train.max_rows))
        steps.append(f"target_train.max_rows {cfg.target_train.max_rows}")
    if labeled is not None:
        value = min(int(labeled), planned) if planned is not None else int(labeled)
        steps.insert(0, f"{int(labeled)} labeled training rows released (train_labels)")
        return {"value": value, "verified": True, "from": "; ".join(steps) + f" → {value}"}
    if planned is None:
        return {"value": None, "verified": False,
                "from": "; ".join(steps + ["the target's labeled-row count was not released (below the min count) "
                                           "and the config sets no cap: unknown"])}
    return {"value": planned, "verified": False,
            "from": "; ".join(steps) + f" → {planned} planned (not verified: the target's labeled-row count was "
                                       "suppressed at the site)"}


#: a regime map is a few kB of CSV; a file far larger is not one
MAX_MAP_BYTES = 16 << 20


def _map_bytes(path: Path) -> bytes:
    """The map's bytes, only from a regular file of bounded size (a pipe named as the map never hangs)."""
    from fedcxr.site_adapters.paths import regular_file_problem

    problem = regular_file_problem(path)
    if problem is not None:
        raise UserError(f"--regime-map {path}: {problem}")
    if path.stat().st_size > MAX_MAP_BYTES:
        raise UserError(f"--regime-map {path}: {path.stat().st_size} bytes, not a regime map (at most {MAX_MAP_BYTES})")
    return path.read_bytes()


def advise(cfg: ExperimentConfig, payloads: dict[str, dict], shift: dict[str, Any],
           map_path: Optional[Path] = None) -> dict[str, Any]:
    """``stats.json`` ``advice``: the recommendation (or why none), the cell, and every input."""
    path = Path(map_path) if map_path else regime.map_path()
    data = _map_bytes(path)
    cells = regime.load_regime_map(path)
    about_map = {"path": _shown(path), "cells": len(cells), "sha256": hashlib.sha256(data).hexdigest()}
    if not cfg.target:
        return {"target": None, "recommendation": None, "verdict": "no target",
                "why": "the config names no target site: the map's advice is for a target hospital", "map": about_map}
    target = cfg.site_name(cfg.target)
    kind = shift.get("type") or {}
    labels = target_labels(cfg, payloads.get(target))
    inputs = {
        "shift_type": {"value": kind.get("value"), "why": kind.get("why"), "rule": kind.get("rule"),
                       "caveat": kind.get("caveat"), "distances": shift.get("target_vs_sources")},
        "target_labels": labels,
        "rounds": {"value": int(cfg.rounds), "from": "the config's rounds"},
        "pilot": _pilot_summary(shift.get("pilot")),
    }
    placed = regime.place(cells, str(kind.get("value")), labels["value"], int(cfg.rounds))
    cell = placed.pop("cell")
    decision = regime.verdict(cell)
    out = {"target": target, **decision, "inputs": inputs, "cell": cell.as_dict() if cell else None,
           "placement": placed, "map": about_map}
    out["why"] = _why(out, placed)
    if decision["verdict"] == regime.TAKE_LEADER:
        out["next"] = f"fedcxr train CONFIG.yaml --set method={decision['leader']}"
    elif decision["verdict"] == regime.UNRESOLVED and decision.get("candidates"):
        out["next"] = sweep_command(decision["candidates"])
    elif decision["verdict"] == regime.NO_CELL:
        # the map measured nothing near: the config's own method against the nearest cell's leaders
        leaders = [m for m in regime.nearest_leaders(cells, str(kind.get("value")), labels["value"],
                                                     int(cfg.rounds), n=3) if m != cfg.method][:2]
        candidates = [cfg.method, *leaders]
        if len(candidates) > 1:
            out["candidates"] = candidates
            out["next"] = sweep_command(candidates)
            out["why"] += (f"; the map has measured nothing near this federation, so no method is advised: choose "
                           f"between your {cfg.method} and the nearest cell's leaders ({', '.join(leaders)}) on your "
                           "own labeled rows (the sweep --select below: cross-fitted within your label budget)")
    return out


def sweep_command(candidates: list[str]) -> str:
    """The ``fedcxr sweep --select`` that chooses among ``candidates`` on the user's own labeled target rows
    (cross-fitted within the label budget; no validation or test label), then trains the choice on them all."""
    return f"fedcxr sweep CONFIG.yaml --select --methods {' '.join(candidates)} --out select"


def _why(out: dict, placed: dict) -> str:
    verdict = out["verdict"]
    if verdict == regime.NO_CELL:
        return placed["why"]
    where = placed["why"]
    if verdict in ("resolved", regime.TAKE_LEADER):
        return f"{where}: {out['why']}"
    return f"{where}: {out.get('why', '')}; unresolved — run a sweep"


def _pilot_summary(pilot: Optional[dict]) -> dict[str, Any]:
    if not pilot:
        return {"status": "skipped", "reason": "not run (--no-pilot)"}
    if pilot.get("status") != "ok":
        return {k: pilot.get(k) for k in ("status", "reason")}
    reading = {}
    for site, entry in pilot["sources"].items():
        beta = entry["beta_fedgp"]
        trust = "trust it" if beta >= 0.5 else "weigh the target's own update more"
        reading[site] = f"β = σ²/(σ²+τ²d²) = {beta:.2f}: the FedGP theory would {trust}"
    return {"status": "ok", "sigma2": pilot["sigma2"],
            "tau2d2": {s: e["tau2d2"] for s, e in pilot["sources"].items()},
            "d2": {s: e["d2"] for s, e in pilot["sources"].items()},
            "beta_fedgp": {s: e["beta_fedgp"] for s, e in pilot["sources"].items()},
            "reading": reading, "notes": list(pilot.get("notes") or [])}


def _shown(path: Path) -> str:
    """The map's path relative to the fedcxr package when it is the shipped one (no machine paths)."""
    try:
        return str(Path(path).resolve().relative_to(regime.map_path().resolve().parents[2]))
    except ValueError:
        return str(path)
