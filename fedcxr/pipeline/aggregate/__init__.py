"""Aggregation rules: pure functions on state dicts (DESIGN §5, interfaces §10).

Every rule here takes ``StateDict`` s (``dict[str, Tensor]``) plus metadata (sample counts,
class sets, learning rates) and returns a new ``StateDict``. Nothing is trained, sent or logged
here: the in-process federation and NVIDIA FLARE call these same functions, so a rule tested
once serves both transports (STYLE: Flower's ``strategy/aggregate.py``).

One module per rule family; every public name is re-exported here, so the documented import
path stays ``from fedcxr.pipeline import aggregate as agg; agg.gp(...)``:

==================  ===========================================================================
module              rules
==================  ===========================================================================
``mean``            :class:`StreamingAverage`, :func:`fedavg`, :func:`fedavg_streaming`,
                    :func:`fedbn` (FedAvg, FedBN; the surgical backbone, FedProx's server)
``surgical``        :func:`surgical_heads` (surgical aggregation of per-class head rows)
``projection``      :func:`gp`, :func:`fedgp`, :func:`fedda`, :func:`projection_cosines`,
                    :func:`magnitude_scales`, :data:`COS_EPS` (the target-combine rules)
``auto_weighting``  :func:`auto_betas`, :func:`source_step_update` (β_i of the ``_Auto`` methods)
``fact``            :func:`idd` (FACT's inter-domain distance)
``robust``          :data:`ROBUST_RULES`, :func:`coordinate_median`, :func:`trimmed_mean`,
                    :func:`krum`, :func:`multi_krum`, :func:`krum_scores`, :func:`krum_select`,
                    :func:`norm_clipped_mean`, :func:`update_norms`, :func:`clip_factors`
``server_opt``      :data:`FEDOPT_RULES`, :func:`fedopt`, :func:`scaffold`,
                    :func:`scaffold_client_control` (server state kept across rounds)
``checks``          argument checks the families share (not rules)
==================  ===========================================================================

Conventions shared by all rules:

* **Inputs are never mutated.** Arithmetic rules return fresh tensors; the dict helpers
  (:mod:`fedcxr.pipeline.state`) are shallow and say so.
* **Per state-dict entry.** Weights, biases and each BatchNorm tensor (``weight``, ``bias``,
  ``running_mean``, ``running_var``) are separate entries; cosines are taken per entry. Every
  entry is processed with whole-tensor ops (no Python loop over elements); loops run over
  entries and sources only.
* **Dtypes.** Arithmetic runs in float32 (float64 when the input is float64) and the result
  is cast back to the entry's original dtype.
* **Special entries.** 0-dim entries (``num_batches_tracked``) never take part in cosines and
  keep θ0 in :func:`gp`, :func:`fedgp` and :func:`fedda`; so do integer entries of any shape
  (none exist in our models; an integer counter has no meaningful "update"). FedAvg averages
  every entry: integer ones as a weighted mean rounded back to their dtype. The robust rules
  treat integer, 0-dim and BatchNorm entries like the rest (see :mod:`.robust`).

Cost in the number of sites N (issue 31 item 4):

* **Mean** (FedAvg, FedBN, the surgical backbone, FedProx): streams. :class:`StreamingAverage`
  holds one running sum and no reply, so the rule's memory is one model plus the reply being added
  at any N (``tests/pipeline/aggregate/test_mean.py``: the same buffers at 5 and 100 sites;
  ``benchmarks/bench_aggregate.py``: 2.3 models above the process for 2, 8 and 32 sites); time
  is one pass per reply, linear in N.
* **GP, FedGP, FedDA**: every source's cosine needs the whole entry before any source is added,
  so the rule reads the N source states it is given (N+2 inputs) and adds one model of its own
  (measured N+3.05 models, ``bench_aggregate.py``); time two passes per source.
* **Robust rules**: the median and trimmed mean stack the N values of one entry at a time (N
  models of inputs plus N copies of the largest entry) and sort them, O(N log N) per coordinate;
  Krum and multi-Krum compute the N² pairwise distances entry by entry (N models of inputs plus
  N float64 copies of one entry; time O(N²·model)); the clipped mean is one pass per reply plus the N norms.
* **A round**, whatever the rule: the protocols screen each reply against the median of the
  *other* replies' norms (:mod:`fedcxr.pipeline.screening`) before any reply reaches a rule, and
  the transport returns a round's replies together, so a round holds its N replies (one model
  each) until it aggregates. What that costs at 100 sites of a small model is measured in
  BENCHMARKS.md "Scale: 100 sites against 5"; streaming past the screening would need a
  two-pass protocol (norms first, then the states), which no transport offers yet.

Papers (``../shared/papers``): GP = weakly-supervised-fda-auxinfo-gp (Eq. 4-9, App. A.2);
FedDA/FedGP and auto-weighting = fedgp-auto-weighting-iclr (Def. 4.1, 4.3; Eq. 1-3; App. A.5,
C.4, C.9); surgical aggregation (Eq. 1-3, Alg. 1); FACT (Eq. 1). The robust rules and the
reviewers' baselines (SCAFFOLD, FedOpt) cite their papers in their modules.
"""

from __future__ import annotations

from fedcxr.pipeline.aggregate.auto_weighting import auto_betas, source_step_update
from fedcxr.pipeline.aggregate.fact import idd
from fedcxr.pipeline.aggregate.mean import StreamingAverage, fedavg, fedavg_streaming, fedbn
from fedcxr.pipeline.aggregate.projection import COS_EPS, fedda, fedgp, gp, magnitude_scales, projection_cosines
from fedcxr.pipeline.aggregate.robust import (
    ROBUST_RULES,
    clip_factors,
    coordinate_median,
    krum,
    krum_scores,
    krum_select,
    multi_krum,
    norm_clipped_mean,
    trimmed_mean,
    update_norms,
)
from fedcxr.pipeline.aggregate.server_opt import FEDOPT_RULES, fedopt, scaffold, scaffold_client_control
from fedcxr.pipeline.aggregate.surgical import surgical_heads

__all__ = [
    "StreamingAverage",
    "fedavg",
    "fedavg_streaming",
    "fedbn",
    "surgical_heads",
    "gp",
    "fedgp",
    "fedda",
    "projection_cosines",
    "magnitude_scales",
    "auto_betas",
    "idd",
    "source_step_update",
    "ROBUST_RULES",
    "coordinate_median",
    "trimmed_mean",
    "krum_scores",
    "krum_select",
    "krum",
    "multi_krum",
    "update_norms",
    "clip_factors",
    "norm_clipped_mean",
    "FEDOPT_RULES",
    "fedopt",
    "scaffold",
    "scaffold_client_control",
]
