"""Auto-weighting: the β_i of FedDA_Auto and FedGP_Auto from the updates' statistics.

FedGP paper (fedgp-auto-weighting-iclr) §4.2 Eq. 3, App. A.5 and C.4: the target's per-batch
updates estimate its variance σ² and each source's distance d²_i (or, for FedGP, the distance
left after projection τ²d²_i); β_i = σ²/(σ² + distance). :func:`source_step_update` puts a
source's update in the same units (a mean per-step update) first.
"""

from __future__ import annotations

from typing import Mapping, Union

import torch

from fedcxr.pipeline.state import StateDict, _shape

__all__ = ["auto_betas", "source_step_update"]


def source_step_update(update: Union[torch.Tensor, Mapping[str, torch.Tensor]], n_batches: int) -> Union[torch.Tensor, StateDict]:
    """A source's mean per-step update ``s = Δ_i / #batches`` (auto-weighting, App. C.4).

    Accepts a flat vector (from :func:`flatten_state`) or a state dict (floating entries are
    divided; integer ones are returned unchanged, as copies). The target's per-batch updates
    and ``s`` must be in the same units before :func:`auto_betas`.
    """
    if int(n_batches) != n_batches or n_batches < 1:
        raise ValueError(f"source_step_update: n_batches must be a positive integer, got {n_batches!r}")
    if isinstance(update, torch.Tensor):
        return update / n_batches
    return {
        k: (v / n_batches if v.is_floating_point() else v.clone()) for k, v in update.items()
    }


def auto_betas(target_batch_updates: torch.Tensor, source_updates: torch.Tensor, rule: str = "fedgp") -> dict:
    """Auto-weighted β_i for FedDA/FedGP (FedGP paper §4.2 Eq. 3, App. A.5 and C.4; DESIGN §5).

    Inputs, already flattened (:func:`flatten_state`, the same entries in state-dict order for
    both) and magnitude-aligned by the caller (App. C.4; DESIGN §5): s_i = Δ_i / #batches via
    :func:`source_step_update`, and the g_j rescaled by the learning-rate ratio so that a
    target batch update and a source step are in the same units (steps taken at the same lr).
    :func:`fedcxr.pipeline.combine.auto_estimates` passes the trained parameters only: BN
    running statistics change by batch noise, not by gradient steps, and would swamp σ².

    .. note:: a step moves the weights by about its lr, so that means ``g_j·lr_S/lr_T``
       (:func:`fedcxr.pipeline.combine.aligned_target_updates`); the authors' DomainBed
       script uses lr_T/lr_S. The factor changes FedDA's d² and β; FedGP's β does not depend
       on it.

    * ``target_batch_updates``: ``(B, M)``, the target's B per-batch updates g_j (B ≥ 2);
    * ``source_updates``: ``(N, M)``, one mean per-step update s_i per source.

    Estimators (App. A.5, the unbiased estimators built on Eq. 22-25), each divided by M:

    * ``v = Σ_j ‖g_j − ḡ‖² / (B−1) / M`` (sample variance, summed over coordinates);
      ``σ² = v / B`` (variance of the mean target update);
    * ``d²_i = max(mean_j ‖g_j − s_i‖² / M − v, 0)`` (Eq. 24);
    * ``τ²d²_i = max(mean_j ‖p_j‖² / M − samplevar(p), 0)`` with ``p_j = g_j − ⟨g_j, u_i⟩u_i``,
      ``u_i = s_i/‖s_i‖`` and ``samplevar`` computed like v (Eq. 25);
    * Eq. 3: FedDA ``β_i = σ²/(σ²+d²_i)``, FedGP ``β_i = σ²/(σ²+τ²d²_i)``.

    Guards: an all-zero s_i gets β_i = 0 under both rules (its projection is taken as 0, so
    its τ²d² equals its d²); 0/0 (σ² = 0 and the distance 0) gives β_i = 0: with no evidence
    either way, trust the target.

    Computed in float64 over column blocks of the inputs (a few tens of MB of temporaries),
    through the identity ``mean_j‖g_j − s‖² = ‖ḡ − s‖² + Σ_j‖g_j − ḡ‖²/B`` and its analogue
    for p, which give exactly the formulas above without materialising (B·N, M) differences.

    Returns ``{"sigma2": float, "d2": [N floats], "tau2d2": [N floats], "betas": [N floats]}``.
    """
    if rule not in ("fedgp", "fedda"):
        raise ValueError(f"auto_betas: rule must be 'fedgp' or 'fedda', got {rule!r}")
    g, s = target_batch_updates, source_updates
    if g.dim() != 2 or s.dim() != 2 or g.shape[1] != s.shape[1]:
        raise ValueError(f"auto_betas: expected (B, M) and (N, M) tensors, got {_shape(g)} and {_shape(s)}")
    n_batches, m = int(g.shape[0]), int(g.shape[1])
    if n_batches < 2:
        raise ValueError(f"auto_betas: need at least 2 target batch updates to estimate a variance, got {n_batches}")
    if m == 0 or s.shape[0] == 0:
        raise ValueError(f"auto_betas: empty inputs {_shape(g)} and {_shape(s)}")
    sums = _auto_sums(g.detach(), s.detach())
    v = float(sums["centred"]) / (n_batches - 1) / m
    sigma2 = v / n_batches
    d2, tau2d2, betas = [], [], []
    for i in range(s.shape[0]):
        ss = float(sums["ss"][i])
        d2_i = max(float(sums["dist"][i]) / m - sigma2, 0.0)
        if ss > 0:
            along_mean = float(sums["gs"][i]) ** 2 / ss  # ⟨ḡ, u⟩²
            along_rows = float(sums["proj"][:, i].square().sum()) / ss  # Σ_j ⟨g_j − ḡ, u⟩²
        else:
            along_mean = along_rows = 0.0
        p_bar_sq = max(float(sums["gg"]) - along_mean, 0.0)
        var_p = (float(sums["centred"]) - along_rows) / (n_batches - 1)
        t_i = max((p_bar_sq - var_p / n_batches) / m, 0.0)
        distance = d2_i if rule == "fedda" else t_i
        denominator = sigma2 + distance
        beta = sigma2 / denominator if (ss > 0 and denominator > 0) else 0.0
        d2.append(d2_i)
        tau2d2.append(t_i)
        betas.append(beta)
    return {"sigma2": sigma2, "d2": d2, "tau2d2": tau2d2, "betas": betas}


def _auto_sums(g: torch.Tensor, s: torch.Tensor) -> dict[str, torch.Tensor]:
    """Block-wise float64 sums over coordinates for :func:`auto_betas`.

    centred = Σ_j‖g_j − ḡ‖²; proj[j, i] = ⟨g_j − ḡ, s_i⟩; gg = ‖ḡ‖²; gs[i] = ⟨ḡ, s_i⟩;
    ss[i] = ‖s_i‖²; dist[i] = ‖ḡ − s_i‖².
    """
    b, n, m = g.shape[0], s.shape[0], g.shape[1]
    f64 = dict(dtype=torch.float64, device=g.device)
    sums = {
        "centred": torch.zeros((), **f64), "proj": torch.zeros(b, n, **f64), "gg": torch.zeros((), **f64),
        "gs": torch.zeros(n, **f64), "ss": torch.zeros(n, **f64), "dist": torch.zeros(n, **f64),
    }
    width = max(1024, (2 * 1024 * 1024) // (b + n))  # ≈16 MB of float64 per block
    s = s.to(g.device)
    for start in range(0, m, width):
        gb = g[:, start : start + width].to(torch.float64)
        sb = s[:, start : start + width].to(torch.float64)
        mean = gb.mean(dim=0)
        centred = gb - mean
        sums["centred"] += centred.square().sum()
        sums["proj"] += centred @ sb.T
        sums["gg"] += mean.square().sum()
        sums["gs"] += sb @ mean
        sums["ss"] += sb.square().sum(dim=1)
        sums["dist"] += (sb - mean).square().sum(dim=1)
    return sums
