"""Differential privacy of local training (``privacy.dp``): DP-SGD with Opacus, and each site's ε.

* :func:`private` turns a model and its optimizer into DP-SGD ones for one local training call:
  per-sample gradients (Opacus over torch's expanded weights) and Opacus' ``DPOptimizer`` (each sample's
  gradient clipped to ``max_grad_norm``, Gaussian noise of std ``noise_multiplier ×
  max_grad_norm`` added to the batch sum). BatchNorm is refused: it mixes the samples of a
  batch (use ``model.norm: group``).
* A site reports what its training spent in the reply's ``metrics["dp"]``: noise multiplier,
  sampling rate q = batch size / training rows, and optimizer steps — numbers only.
* :class:`PrivacyLedger` (a transport wrapper on the server) collects those per site over
  rounds, as plain lists that go into every checkpoint (resume keeps the sum), and
  :func:`epsilon` gives each site's accumulated ε at ``delta`` with Opacus' RDP accountant;
  ``run.json["dp"]`` reports them.

Batches are shuffled fixed-size batches (as Opacus with ``poisson_sampling=False``), not
Poisson samples: the reported ε is the usual approximation for that case. Noise comes from
the training call's seeded RNG (reproducible runs), not from a cryptographically secure one.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Optional

import torch
from torch import nn

from fedcxr.errors import UserError
from fedcxr.pipeline.messages import Reply
from fedcxr.pipeline.transport import Transport

log = logging.getLogger(__name__)

INSTALL_HINT = "privacy.dp needs Opacus: pip install 'fedcxr[dp]' (or: pip install opacus)"


def require_opacus() -> None:
    try:
        import opacus  # noqa: F401
    except ImportError:
        raise UserError(INSTALL_HINT) from None


def private(model: nn.Module, optimizer: torch.optim.Optimizer, dp: Mapping, batch_size: int
            ) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    """(module to call, DP optimizer, close) for one DP-SGD training call on ``model``.

    ``close()`` removes Opacus' hooks and per-sample gradients, leaving ``model`` as it was
    (the site reuses it next round).
    """
    require_opacus()
    from opacus.grad_sample import GradSampleModuleExpandedWeights
    from opacus.optimizers import DPOptimizer
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise UserError("privacy.dp: Opacus cannot train this model: " + "; ".join(str(e) for e in errors[:3])
                        + " (DP needs model.norm: group)")
    # torch's expanded weights, not Opacus' default backward hooks: MONAI's residual blocks add
    # in place to a normalisation output (`out += residual`), which backward hooks forbid
    module = GradSampleModuleExpandedWeights(model, batch_first=True, loss_reduction="mean")
    dp_optimizer = DPOptimizer(optimizer, noise_multiplier=float(dp["noise_multiplier"]),
                               max_grad_norm=float(dp["max_grad_norm"]), expected_batch_size=int(batch_size))

    def close() -> None:
        for p in model.parameters():
            for attr in ("grad_sample", "summed_grad"):
                if hasattr(p, attr):
                    delattr(p, attr)

    return module, dp_optimizer, close


def spent(dp: Mapping, batch_size: int, n_rows: int, steps: int) -> dict:
    """What one training call spent: ``{"noise_multiplier", "sample_rate", "steps"}`` (goes in the reply)."""
    return {"noise_multiplier": float(dp["noise_multiplier"]),
            "sample_rate": min(1.0, batch_size / max(int(n_rows), 1)), "steps": int(steps)}


def epsilon(history: list[list[float]], delta: float) -> float:
    """ε at ``delta`` after the training calls in ``history`` (``[noise_multiplier, sample_rate, steps]`` each)."""
    require_opacus()
    from opacus.accountants import RDPAccountant

    if not history:
        return 0.0
    accountant = RDPAccountant()
    accountant.history = [(float(s), float(q), int(n)) for s, q, n in history if int(n) > 0]
    return float(accountant.get_epsilon(delta=float(delta))) if accountant.history else 0.0


class PrivacyLedger(Transport):
    """A transport wrapper on the server: records each site's DP spending from its replies."""

    def __init__(self, inner: Transport, delta: float):
        self.inner = inner
        self.site_names = inner.site_names
        self.delta = float(delta)
        self.history: dict[str, list[list[float]]] = {}

    def run(self, task, targets, params, config, *, per_site=None) -> dict[str, Reply]:
        replies = self.inner.run(task, targets, params, config, per_site=per_site)
        for site, reply in replies.items():
            used = reply.metrics.get("dp") if isinstance(reply.metrics, dict) else None
            if isinstance(used, dict) and used.get("steps"):
                self.history.setdefault(site, []).append(
                    [float(used["noise_multiplier"]), float(used["sample_rate"]), int(used["steps"])])
        return replies

    def local_states(self) -> dict[str, dict]:
        return self.inner.local_states()

    def load_local_states(self, states) -> None:
        self.inner.load_local_states(states)

    def report(self) -> dict[str, dict]:
        """``{site: {"epsilon", "delta", "steps", "calls"}}`` so far."""
        return {site: {"epsilon": epsilon(calls, self.delta), "delta": self.delta,
                       "steps": sum(int(c[2]) for c in calls), "calls": len(calls)}
                for site, calls in sorted(self.history.items())}


def ledger_for(cfg, transport: Transport) -> tuple[Transport, Optional[PrivacyLedger]]:
    """``transport`` wrapped in a :class:`PrivacyLedger` when the config asks for DP."""
    if cfg.privacy.dp is None:
        return transport, None
    require_opacus()
    ledger = PrivacyLedger(transport, cfg.privacy.dp.delta)
    return ledger, ledger
