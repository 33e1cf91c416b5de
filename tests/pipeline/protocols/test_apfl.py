"""APFL (protocols/apfl.py): the three updates of Algorithm 1 written out by hand on a tiny model, the
mixture, and what a site keeps (Deng et al. 2020)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcxr.pipeline.local import LocalConfig
from fedcxr.pipeline.losses import masked_bce
from fedcxr.pipeline.protocols.apfl import STATE, apfl_steps, mixture

from .personal_helpers import federation, max_diff, same

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Tiny(nn.Module):
    """fedcxr's output format with a BatchNorm layer (its statistics are the local model's own)."""

    aux_tasks: dict = {}

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.out = nn.Linear(3, 2)

    def forward(self, x):
        return {"main": self.out(self.bn(self.fc(x.flatten(1)))), "aux": {}}


def _batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    return [{"image": torch.randn(5, 1, 2, 2, generator=g), "label": torch.randint(0, 2, (5, 2), generator=g).float(),
             "label_mask": torch.ones(5, 2)} for _ in range(n)]


def _by_hand(w: nn.Module, v: nn.Module, alpha: float, data: list[dict], lr: float, alpha_lr: float, adaptive: bool):
    """Algorithm 1, literally: at the previous iterates, g = ∇f(v̄) with v̄ = αv + (1−α)w (v's BN buffers);
    w ← w − η∇f(w); v ← v − η·α·g; α ← clip(α − η_α·⟨v − w, g⟩, 0, 1)."""
    for batch in data:
        mix = Tiny(0)
        mix.load_state_dict({k: (alpha * v.state_dict()[k] + (1 - alpha) * w.state_dict()[k])
                             if k in dict(w.named_parameters()) else v.state_dict()[k] for k in w.state_dict()})
        mix.train()
        loss_mix = masked_bce(mix(batch["image"])["main"], batch["label"], batch["label_mask"])
        g = dict(zip(dict(mix.named_parameters()), torch.autograd.grad(loss_mix, list(mix.parameters()))))
        with torch.no_grad():  # v's BN statistics moved by the mixture's forward pass
            for name, buffer in mix.named_buffers():
                dict(v.named_buffers())[name].copy_(buffer)
        grad_alpha = sum(float(((dict(v.named_parameters())[k] - p) * g[k]).sum()) for k, p in w.named_parameters())
        loss_w = masked_bce(w(batch["image"])["main"], batch["label"], batch["label_mask"])
        gw = torch.autograd.grad(loss_w, list(w.parameters()))
        with torch.no_grad():
            for p, d in zip(w.parameters(), gw):
                p -= lr * d
            for k, p in v.named_parameters():
                p -= lr * alpha * g[k]
        if adaptive:
            alpha = min(max(alpha - alpha_lr * grad_alpha, 0.0), 1.0)
    return w, v, alpha


@pytest.mark.parametrize("adaptive", [True, False])
def test_the_local_steps_are_algorithm_1(adaptive):
    data, lr, alpha_lr = _batches(3), 0.1, 0.5
    w, v = Tiny(1), Tiny(2)
    local = {k: t.detach().clone() for k, t in v.state_dict().items()}
    cfg = LocalConfig(lr=lr, batch_size=5, epochs=1, use_aux=False, optimizer="sgd", momentum=0.0, amp=False)
    out, alpha, steps, _ = apfl_steps(w, local, 0.5, data, cfg, device=torch.device("cpu"), seed=0,
                                      adaptive=adaptive, alpha_lr=alpha_lr)
    w_ref, v_ref, alpha_ref = _by_hand(Tiny(1).train(), Tiny(2).train(), 0.5, data, lr, alpha_lr, adaptive)
    assert steps == 3 and alpha == pytest.approx(alpha_ref, abs=1e-6)
    assert (alpha != 0.5) == adaptive
    for k, t in w_ref.state_dict().items():
        torch.testing.assert_close(w.state_dict()[k], t, rtol=1e-5, atol=1e-6)
    for k, t in v_ref.state_dict().items():
        torch.testing.assert_close(out[k], t.detach(), rtol=1e-5, atol=1e-6)


def test_the_mixture_mixes_weights_and_keeps_the_local_models_statistics():
    local = {"w": torch.tensor([1.0, 3.0]), "bn.running_mean": torch.tensor([5.0]), "bn.num_batches_tracked":
             torch.tensor(7)}
    global_ = {"w": torch.tensor([3.0, 1.0]), "bn.running_mean": torch.tensor([9.0]),
               "bn.num_batches_tracked": torch.tensor(2)}
    out = mixture(0.25, local, global_)
    assert out["w"].tolist() == [2.5, 1.5] and out["bn.running_mean"].tolist() == [5.0]
    assert int(out["bn.num_batches_tracked"]) == 7


def test_a_site_keeps_v_alpha_and_its_mixture_and_sends_only_w(tiny_manifests, tmp_path):
    _, protocol, ctx, theta0, runners = federation(tiny_manifests, tmp_path / "cache", "APFL",
                                                   apfl={"alpha": 0.25, "alpha_lr": 0.05})
    site = runners["nih_style"]
    reply = site.handle("train_apfl", theta0, protocol.source_config(ctx, 0))
    kept = site.kept_state(STATE)
    local = {k[2:]: v for k, v in kept.items() if k.startswith("v.")}
    alpha = float(kept["alpha"])
    assert alpha != 0.25 and 0.0 <= alpha <= 1.0 and reply.metrics["alpha"] == pytest.approx(alpha)
    assert set(local) == set(theta0) and max_diff(local, theta0) > 0 and max_diff(reply.params, theta0) > 0
    assert max_diff({k: site.local_state[k] for k in theta0}, mixture(alpha, local, reply.params)) == 0.0
    assert protocol.eval_local_keys(ctx) == list(theta0)  # the mixture is the site's whole model
    # round 1 starts from the kept v and α (the private entries never leave: PRIVATE_PREFIXES)
    from fedcxr.pipeline.keys import PRIVATE_PREFIXES

    assert STATE.startswith(PRIVATE_PREFIXES)
    site.handle("train_apfl", theta0, protocol.source_config(ctx, 1))
    assert not same(site.kept_state(STATE + "v."), local, [k for k in local if local[k].is_floating_point()])
