"""The config of a consortium's rounds: who is asked (``participation:``) and a simulated clock (``simulate:``).

Kept out of :mod:`fedcxr.pipeline.config` (the experiment config, which imports these models) so
each block reads in one place (README "Running a consortium"):

* :class:`ParticipationConfig` — ``participation: {fraction, min_sites, deadline_s}``: each round
  asks a seeded random share of the source sites (at least ``min_sites``; the draw in
  :mod:`fedcxr.pipeline.participation`), closes at ``deadline_s``, and fails below ``min_sites``
  valid replies. The top-level ``min_sites`` of earlier configs is another name of
  ``participation.min_sites`` (:func:`move_min_sites`), and a config that uses neither
  ``fraction`` nor ``deadline_s`` keeps its earlier fingerprint (:func:`fingerprint_view`).
* :class:`SimulateConfig` — ``simulate: {...}``: each site's seconds per optimiser step, network
  latency, bandwidth and drop-out probability, so that an in-process run keeps a virtual clock
  (:mod:`fedcxr.pipeline.virtual_clock`) on which ``participation.deadline_s`` closes rounds —
  nothing really waits (the FeTS challenge's way).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the most sites a config may name (:data:`fedcxr.pipeline.config.MAX_SITES`; this module imports no config)
MAX_CONSORTIUM = 1000
#: the longest deadline, latency or step time accepted (30 days): past it a number is a typo
MAX_SECONDS = 30 * 24 * 3600.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ParticipationConfig(_Strict):
    """Which source sites each round asks, how long it waits, how many replies it needs (README
    "Running a consortium"; Flower's ``fraction_fit``/``min_fit_clients`` and round timeout, FLARE's
    ``min_clients`` and task timeout).

    A round asks ``max(min_sites, ⌈fraction·N⌉)`` of the N sources, drawn from the run's seed and
    the round (the same subsets for the same seed, another subset every round); the target of a
    target method is always asked. A round with fewer than ``min_sites`` valid replies fails: the
    run stops (exit 1) naming who missed and why, and ``--resume`` retries it.
    """

    fraction: float = Field(1.0, gt=0, le=1, description="share of the source sites asked each round, drawn "
                            "from the run's seed and the round (1: every source, every round)")
    min_sites: int = Field(1, ge=1, le=MAX_CONSORTIUM, description="a round needs at least this many valid source "
                           "replies, and asks at least this many sources (the top-level `min_sites` of earlier "
                           "configs is this key)")
    deadline_s: Optional[float] = Field(None, gt=0, le=MAX_SECONDS, description="seconds a round's training tasks "
                                        "wait for replies; a reply after it is not aggregated (FLARE: wall time, "
                                        "unset: `--timeout`; in-process: the simulated clock of `simulate:`, "
                                        "unset: no deadline)")


class LogNormal(_Strict):
    """A per-site value drawn once from a log-normal distribution: ``median · exp(spread · z)``, z ~ N(0, 1)."""

    median: float = Field(..., gt=0, le=MAX_SECONDS, description="the median value")
    spread: float = Field(0.0, ge=0, le=5, description="σ of the value's natural logarithm (0: every site the "
                          "median; 0.5: the middle two thirds of the sites within ×/÷ 1.65 of it)")


#: a number (every site the same) or a log-normal draw per site
Drawn = Union[float, LogNormal]


class SiteTiming(_Strict):
    """One site's fixed values, overriding the drawn ones."""

    speed: Optional[float] = Field(None, gt=0, le=1e6, description="compute speed (1: `step_s` per step)")
    latency_s: Optional[float] = Field(None, ge=0, le=MAX_SECONDS, description="one-way network delay, seconds")
    dropout: Optional[float] = Field(None, ge=0, le=1, description="probability of dropping out of a round")


class SimulateConfig(_Strict):
    """A simulated consortium on a virtual clock, in one process (README "Running a consortium").

    A site's reply to a training task arrives ``latency + sent bytes/bandwidth + steps·step_s/speed +
    latency + reply bytes/bandwidth`` seconds after the task is sent (``steps``: the optimiser
    steps it took); a task closes when every asked site has answered or at
    ``participation.deadline_s``, and a round lasts as long as its tasks. A source drops out of a
    round with probability ``dropout`` (drawn per site and round from the seed; the target only
    where ``sites:`` says). Only the clock is simulated: every site's training is real and each
    site's local state advances as it would (a late site trained; its reply is discarded).
    """

    step_s: float = Field(0.1, gt=0, le=MAX_SECONDS, description="seconds one optimiser step takes at speed 1: "
                          "the compute unit (measure it: BENCHMARKS.md 'Planning a consortium')")
    speed: Drawn = Field(1.0, description="each site's compute speed (a number, or {median, spread}: log-normal, "
                         "drawn once per site from the seed)")
    latency_s: Drawn = Field(0.0, description="each site's one-way network delay in seconds (a number, or "
                             "{median, spread})")
    bandwidth_mbit_s: Optional[float] = Field(None, gt=0, le=1e6, description="each site's link in Mbit/s: a "
                                              "model's bytes take time each way (null: transfer time not modelled)")
    dropout: float = Field(0.0, ge=0, lt=1, description="probability that a source drops out of a round (drawn per "
                           "site and round from the seed)")
    sites: dict[str, SiteTiming] = Field(default_factory=dict, max_length=MAX_CONSORTIUM,
                                         description="{site: {speed, latency_s, dropout}}: fixed values of named "
                                         "sites (the target's drop-out is 0 unless set here)")
    seed: Optional[int] = Field(None, ge=0, le=2**63 - 1, description="the draws' seed (null: the run's `seed`)")

    @field_validator("speed", "latency_s", mode="before")
    @classmethod
    def _drawn(cls, value: Any) -> Any:
        """A plain number is fixed for every site; a bool is not a number."""
        if isinstance(value, bool):
            raise ValueError("a number or {median, spread}, not true/false")
        return value

    @field_validator("speed")
    @classmethod
    def _positive_speed(cls, value: Drawn) -> Drawn:
        if isinstance(value, (int, float)) and not 0 < value <= 1e6:
            raise ValueError(f"a speed is a positive factor (1: step_s per step), got {value}")
        return value

    @field_validator("latency_s")
    @classmethod
    def _latency(cls, value: Drawn) -> Drawn:
        if isinstance(value, (int, float)) and not 0 <= value <= MAX_SECONDS:
            raise ValueError(f"a latency is 0 to {MAX_SECONDS:g} seconds, got {value}")
        return value


def check_consortium(cfg: Any) -> Any:
    """``cfg`` (an :class:`~fedcxr.pipeline.config.ExperimentConfig`) when its blocks fit its sites:
    ``participation.min_sites`` at most the sources, ``simulate.sites`` naming only the run's sites."""
    n = len(cfg.sites)
    if cfg.participation.min_sites > n:
        raise ValueError(f"participation.min_sites: {cfg.participation.min_sites} is more than the {n} site(s) under "
                         "`sites`; no round could ever have that many replies")
    names = {cfg.site_name(s) for s in cfg.all_sites()}
    unknown = sorted(s for s in (cfg.simulate.sites if cfg.simulate else {}) if s not in names)
    if unknown:
        raise ValueError(f"simulate.sites: {unknown[:5]!s:.200} not among the run's sites (a site is named by its "
                         "folder's last name)")
    return cfg


def move_min_sites(data: Any) -> Any:
    """The top-level ``min_sites`` of earlier configs, moved to ``participation.min_sites``.

    One setting under two names: both given with different values is an error naming both
    (never one silently winning)."""
    if not isinstance(data, dict) or "min_sites" not in data:
        return data
    data = dict(data)
    value = data.pop("min_sites")
    block = data.get("participation")
    if block is None:
        data["participation"] = {"min_sites": value}
    elif isinstance(block, dict):
        if "min_sites" in block and block["min_sites"] != value:
            raise ValueError(f"min_sites: {value!s:.40} and participation.min_sites: {block['min_sites']!s:.40} are "
                             "one setting (the top-level key is its former name); keep participation.min_sites")
        data["participation"] = {**block, "min_sites": value}
    elif isinstance(block, BaseModel):
        if block.min_sites != value and "min_sites" in block.model_fields_set:
            raise ValueError(f"min_sites: {value!s:.40} and participation.min_sites: {block.min_sites} are one "
                             "setting (the top-level key is its former name); keep participation.min_sites")
        data["participation"] = {**block.model_dump(), "min_sites": value}
    return data


def fingerprint_view(data: dict) -> dict:
    """``data`` (a config's ``model_dump(mode="json")``) as configs written before ``participation:`` and
    ``simulate:`` hashed it: ``min_sites`` at the top, the blocks left out at their defaults — so that
    their runs resume (:func:`fedcxr.pipeline.config.config_fingerprint`)."""
    out = dict(data)
    block = dict(out.pop("participation", None) or {})
    out["min_sites"] = block.pop("min_sites", 1)
    if block != {"fraction": 1.0, "deadline_s": None}:
        out["participation"] = block
    if out.get("simulate") is None:
        out.pop("simulate", None)
    return out


__all__ = ["LogNormal", "ParticipationConfig", "SimulateConfig", "SiteTiming", "check_consortium", "fingerprint_view",
           "move_min_sites"]
