"""The config's privacy and robustness sections: ``privacy:`` (who sees which update, FLARE
filters, DP-SGD, secure aggregation), ``aggregation:`` (the robust rules) and ``defences:`` (the
checks of every site's reply).

Why a module of its own: the threat model's settings read together (SECURITY.md; README "Privacy
modes", "Robust aggregation", "Secure aggregation"), apart from the experiment's shape in
:mod:`fedcxr.pipeline.config`, which holds them as ``cfg.privacy``, ``cfg.aggregation`` and
``cfg.defences`` and checks how they combine with the rest of the experiment
(``ExperimentConfig._secure_aggregation_blinds_the_value_checks``). The names are re-exported there.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import Field, StrictInt, field_validator, model_validator

from fedcxr.escape import short
from fedcxr.pipeline.config_bounds import MAX_FILTERS, MAX_ROWS, MAX_SITE_ROWS, MAX_SITES
from fedcxr.pipeline.config_bounds import Strict as _Strict
from fedcxr.pipeline.config_bounds import refuse as _refuse


class DPConfig(_Strict):
    """DP-SGD (Opacus) for every site's local training: per-sample clipping plus Gaussian noise.

    Needs ``pip install 'fedcxr[dp]'`` and a GroupNorm backbone (``model.norm: group``):
    Opacus refuses BatchNorm, whose statistics mix the samples of a batch. Each site's ε
    (for ``delta``) is accumulated over rounds and reported per site in ``run.json``.
    """

    noise_multiplier: float = Field(1.0, gt=0, le=1e6, description="σ: noise std / max_grad_norm")
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
    * ``secure_aggregation`` — ``he``: every model a site sends is CKKS-encrypted under the clients'
      key (FLARE provisioning's ``HEBuilder``) and the server only sums ciphertexts
      (:mod:`fedcxr.flare.secure_aggregation`); FLARE runs of methods whose server needs only a
      weighted sum. The server then cannot read an update: the value checks of ``defences:``
      (``norm_factor``, ``norm_limit``, ``check_variance``) must be turned off to acknowledge it
      (counts and the ciphertexts' structure are still checked), and no robust ``aggregation.rule``
      or ``filters`` apply. null: off (README "Secure aggregation", SECURITY.md).
    """

    combine_at: Literal["server", "target"] = "server"
    auto_weights_at: Literal["server", "target"] = "server"
    filters: list[dict[str, Any]] = Field(default_factory=list)
    dp: Optional[DPConfig] = None
    secure_aggregation: Optional[Literal["he"]] = Field(
        None, description="he: sites send CKKS-encrypted models and the FLARE server sums ciphertexts it cannot "
        "read (README 'Secure aggregation'); null: off")

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(value) > MAX_FILTERS:
            raise ValueError(f"{len(value)} filters (at most {MAX_FILTERS})")
        for i, item in enumerate(value):
            if not isinstance(item, dict) or len(item) != 1 or next(iter(item)) not in FILTERS:
                raise ValueError(f"filters[{i}]: each filter is one of {{{', '.join(FILTERS)}: ...}}, "
                                 f"got {short(item)}")
            kind, args = next(iter(item.items()))
            if kind == "exclude_vars":
                ok = isinstance(args, str) and 0 < len(args) <= 1000 or (
                    isinstance(args, list) and 0 < len(args) <= MAX_ROWS and all(isinstance(a, str) for a in args))
                if not ok:
                    raise ValueError(f"filters[{i}].exclude_vars: a regular expression (at most 1000 characters) or "
                                     "a list of entry names")
                if isinstance(args, str):
                    try:
                        re.compile(args)
                    except re.error as exc:
                        raise ValueError(f"filters[{i}].exclude_vars: not a regular expression "
                                         f"({short(str(exc), 120)})") from None
            else:
                unknown = sorted(set(args or {}) - {"percentile", "gamma"}) if isinstance(args, dict) else ["?"]
                if unknown:
                    raise ValueError(f"filters[{i}].percentile_privacy: a mapping of percentile and gamma, "
                                     f"got {short(args)}")
                try:
                    percentile, gamma = float(args.get("percentile", 10)), float(args.get("gamma", 0.01))
                except (TypeError, ValueError):
                    percentile = gamma = float("nan")
                if not (0 <= percentile <= 100 and 0 < gamma < float("inf")):
                    raise ValueError(f"filters[{i}].percentile_privacy: percentile in 0..100, gamma > 0 "
                                     "(finite numbers)")
        return value


#: FLARE result filters ``privacy.filters`` may name (mapped in :mod:`fedcxr.flare.job`).
FILTERS = ("exclude_vars", "percentile_privacy")


class AggregationConfig(_Strict):
    """How the server combines the sites' models where a method averages them (README "Robust aggregation").

    ``rule`` (pure functions in :mod:`fedcxr.pipeline.aggregate`): ``mean`` (FedAvg/FedBN, the
    default), ``median`` (coordinate-wise), ``trimmed_mean`` (``trim`` = β cut from each end),
    ``krum`` / ``multi_krum`` (``byzantine`` = f, ``select`` = m), ``clip`` (each update's norm
    bounded by ``clip_norm``, the round's median update norm when null). A bare string is
    accepted: ``aggregation: median``.
    """

    rule: Literal["mean", "median", "trimmed_mean", "krum", "multi_krum", "clip"] = "mean"
    trim: float = Field(0.1, ge=0, lt=0.5, description="trimmed_mean: fraction β of values cut from each end "
                        "per coordinate (int(β·n) of n, as scipy/Flower)")
    byzantine: int = Field(1, ge=0, le=1000, description="krum / multi_krum: f, the number of hostile sites "
                           "tolerated (needs at least 2f+3 replies per round)")
    select: Optional[int] = Field(None, ge=1, le=1000, description="multi_krum: m, the number of models "
                                  "averaged (default n − f)")
    clip_norm: Optional[float] = Field(None, gt=0, allow_inf_nan=False, description="clip: the update-norm "
                                       "bound M (null: the median of the round's update norms)")

    @model_validator(mode="before")
    @classmethod
    def _bare_rule(cls, data: Any) -> Any:
        """``aggregation: median`` is short for ``aggregation: {rule: median}``."""
        return {"rule": data} if isinstance(data, str) else data


class DefencesConfig(_Strict):
    """Checks of every site's reply before it is aggregated (on by default; README "Robust aggregation").

    Refused replies are recorded with their reason in ``run.json`` (``refused``) and
    ``metrics.jsonl``; NaN/Inf and wrong shapes are always refused.
    """

    check_counts: bool = Field(True, description="refuse a reply claiming more training rows than its site "
                               "reported at the start of the run (or more optimiser steps than the task "
                               "allowed); a count that is not a non-negative integer is always refused")
    check_variance: bool = Field(True, description="refuse a reply whose BatchNorm running variance is "
                                 "negative (no training makes one; a sign-flipped update does, and every "
                                 "prediction of the model becomes NaN)")
    norm_factor: Optional[float] = Field(10.0, gt=1, allow_inf_nan=False, description="k: refuse an update "
                                         "whose norm per optimiser step and unit of learning rate exceeds k × "
                                         "the median of the round's other replies (needs 2 others; null: off)")
    norm_limit: Optional[float] = Field(100.0, gt=0, allow_inf_nan=False, description="refuse an update with "
                                        "‖Δ‖ above this many times ‖θ0‖, the model it started from (any number "
                                        "of replies, a lone source too; null: off)")
    stop_on_suspect: bool = Field(True, description="stop the run (exit 1) naming the suspect when a site's "
                                  "update turns NaN/Inf after another site's reply was refused in an earlier "
                                  "round, or when most replies (of three or more) are refused two rounds in a "
                                  "row")
    bn_factor: Optional[float] = Field(3.0, gt=1, allow_inf_nan=False, description="refuse a reply whose "
                                       "BatchNorm running statistics move more than this many times the median "
                                       "of the round's other replies and more than half a standard deviation "
                                       "(RMS over channels; needs 2 others; null: off). Tighter than norm_factor: "
                                       "honest sites' statistics move alike, and a shift of one standard "
                                       "deviation by one site of five costs ~0.1 AUROC (BENCHMARKS.md)")
    max_share: Optional[float] = Field(0.5, gt=0, le=1, allow_inf_nan=False, description="the largest share of "
                                       "a round's sample-weighted average one source may hold, and of the "
                                       "consortium's rows its step budget is planned from (with three or more "
                                       "sources; 0.5: no site outweighs all the others together, which no site "
                                       "of a balanced consortium does; null or 1: off)")
    declared_sizes: dict[str, StrictInt] = Field(
        default_factory=dict, max_length=MAX_SITES, description="{site: training rows} the consortium agreed on "
        f"outside fedcxr (0 to {MAX_SITE_ROWS:,}); a site reporting more at the start of the run stops it (exit 2), "
        "and its size is credited as at most this. Unset sites: their own word, bounded by max_share")

    @field_validator("declared_sizes")
    @classmethod
    def _declared_counts(cls, value: dict[str, int]) -> dict[str, int]:
        for site, rows in value.items():
            if isinstance(rows, bool) or not 0 <= rows <= MAX_SITE_ROWS:
                _refuse(f"{short(site)}: {short(rows)} is not a count of training rows (0 to {MAX_SITE_ROWS:,})")
        return value


#: ``defences`` keys added after runs were fingerprinted, with their defaults (left out at these values)
NEW_DEFENCES = {"bn_factor": 3.0, "max_share": 0.5, "declared_sizes": {}}


__all__ = ["AggregationConfig", "DPConfig", "DefencesConfig", "FILTERS", "NEW_DEFENCES", "PrivacyConfig"]
