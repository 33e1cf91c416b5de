"""The one local training loop with FedProx's proximal term and SCAFFOLD's drift correction
(fedcxr.pipeline.local), against the published local updates written out step by step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcxr.pipeline import aggregate as A
from fedcxr.pipeline.local import LocalConfig, train_local
from fedcxr.pipeline.losses import masked_bce, proximal_term

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Linear(nn.Module):
    """The smallest model with fedcxr's output format (main logits, no aux heads)."""

    aux_tasks: dict = {}

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return {"main": self.fc(x.flatten(1)), "aux": {}}


def batches(n: int = 3, masked: bool = False) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"image": torch.randn(6, 1, 2, 2, generator=g), "label": torch.randint(0, 2, (6, 2), generator=g).float(),
             "label_mask": torch.zeros(6, 2) if masked else torch.ones(6, 2)} for _ in range(n)]


def weights(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def sgd(lr: float, **extra) -> LocalConfig:
    return LocalConfig(lr=lr, batch_size=6, epochs=1, use_aux=False, optimizer="sgd", momentum=0.0, **extra)


def by_hand(model: nn.Module, data: list[dict], lr: float, *, mu: float = 0.0, correction: dict | None = None,
            anchor: dict | None = None, linear: dict | None = None) -> dict:
    """Li et al. Eq. 2 and Karimireddy et al. Alg. 1 line 10, literally: for each batch,
    loss = BCE + μ/2·Σ‖w − w^t‖² (w^t: ``anchor``, else the start) − Σ⟨g, w⟩ (``linear``: FedDyn's g),
    then w ← w − η·(∇loss + c − c_i)."""
    anchor = weights(model) if anchor is None else anchor
    for batch in data:
        out = model(batch["image"])["main"]
        loss = masked_bce(out, batch["label"], batch["label_mask"])
        loss = loss + mu / 2 * sum(((p - anchor[k]) ** 2).sum() for k, p in model.named_parameters())
        if linear is not None:
            loss = loss - sum((linear[k] * p).sum() for k, p in model.named_parameters())
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for k, p in model.named_parameters():
                p -= lr * (p.grad + (correction[k] if correction else 0.0))
    return weights(model)


def test_proximal_term_by_hand():
    """μ = 0.5, w − w^t = (1, 2) and (−1,): 0.25·(1 + 4 + 1) = 1.5; gradient μ·(w − w^t)."""
    w = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([-1.0], requires_grad=True)]
    term = proximal_term(w, [torch.zeros(2), torch.zeros(1)], 0.5)
    assert float(term.detach()) == pytest.approx(1.5)
    term.backward()
    assert w[0].grad.tolist() == [0.5, 1.0] and w[1].grad.tolist() == [-0.5]


def test_fedprox_local_training_is_proximal_sgd():
    data = batches()
    trained = Linear()
    result = train_local(trained, data, sgd(0.5, prox_mu=2.0), device="cpu", seed=0)
    expected = by_hand(Linear(), data, 0.5, mu=2.0)
    for key, value in weights(trained).items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)
    plain = by_hand(Linear(), data, 0.5)
    start = weights(Linear())
    assert sum(float((weights(trained)[k] - start[k]).norm()) for k in start) < \
        sum(float((plain[k] - start[k]).norm()) for k in start), "μ pulls the site towards w^t"
    assert result.loss > result.main_loss, "the reported loss includes the proximal term"


def test_scaffold_local_steps_are_corrected_sgd_steps():
    data = batches()
    correction = {"fc.weight": torch.full((2, 4), 0.3), "fc.bias": torch.tensor([-0.2, 0.1])}
    trained = Linear()
    result = train_local(trained, data, sgd(0.5), device="cpu", seed=0, drift_correction=correction)
    expected = by_hand(Linear(), data, 0.5, correction=correction)
    for key, value in weights(trained).items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-6)
    assert result.corrected_steps == result.n_batches == 3


def test_with_no_data_gradient_the_new_control_variate_is_the_zero_mean_gradient():
    """All labels masked: g = 0, so y = x − K·η·(c − c_i) and option II gives c_i⁺ = mean g = 0."""
    x = weights(Linear())
    c, c_i = {k: torch.full_like(v, 0.25) for k, v in x.items()}, {k: torch.full_like(v, -0.5) for k, v in x.items()}
    trained = Linear()
    result = train_local(trained, batches(4, masked=True), sgd(0.1), device="cpu", seed=0,
                         drift_correction={k: c[k] - c_i[k] for k in x})
    new_local, delta = A.scaffold_client_control(c_i, c, x, weights(trained), steps=result.corrected_steps, lr=0.1)
    for key in x:
        torch.testing.assert_close(weights(trained)[key], x[key] - 4 * 0.1 * 0.75, rtol=0, atol=1e-6)
        torch.testing.assert_close(new_local[key], torch.zeros_like(x[key]), rtol=0, atol=1e-5)
        torch.testing.assert_close(delta[key], -c_i[key], rtol=0, atol=1e-5)


def test_dp_sgd_keeps_the_scaffold_correction():
    """Opacus replaces p.grad by its clipped, noised per-sample sum; the correction is applied after
    the step, so it survives: same seed (same noise), zero data gradient → the runs differ by K·η·(c − c_i)."""
    pytest.importorskip("opacus")
    dp = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-5}
    correction = {"fc.weight": torch.full((2, 4), 0.3), "fc.bias": torch.tensor([-0.2, 0.1])}
    plain, corrected = Linear(), Linear()
    train_local(plain, batches(2, masked=True), sgd(0.1, dp=dp), device="cpu", seed=3)
    train_local(corrected, batches(2, masked=True), sgd(0.1, dp=dp), device="cpu", seed=3, drift_correction=correction)
    moved = weights(plain)
    assert any(float(v.abs().max()) > 0 for v in moved.values()), "the DP noise moved the model"
    for key, value in weights(corrected).items():
        torch.testing.assert_close(value, moved[key] - 2 * 0.1 * correction[key], rtol=0, atol=1e-6)


def test_combinations_that_would_not_be_the_published_update_are_refused():
    correction = {"fc.weight": torch.zeros(2, 4), "fc.bias": torch.zeros(2)}
    with pytest.raises(ValueError, match="plain SGD"):
        train_local(Linear(), batches(1), LocalConfig(lr=0.1, optimizer="adam", use_aux=False), device="cpu", seed=0,
                    drift_correction=correction)
    with pytest.raises(ValueError, match="plain SGD"):
        train_local(Linear(), batches(1), LocalConfig(lr=0.1, optimizer="sgd", momentum=0.9, use_aux=False),
                    device="cpu", seed=0, drift_correction=correction)
    with pytest.raises(ValueError, match="lacks trainable parameters"):
        train_local(Linear(), batches(1), sgd(0.1), device="cpu", seed=0, drift_correction={"fc.bias": torch.zeros(2)})
    with pytest.raises(ValueError, match="DP-SGD"):
        train_local(Linear(), batches(1), sgd(0.1, prox_mu=0.1, dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0}),
                    device="cpu", seed=0)


def test_a_proximal_anchor_other_than_the_start_pulls_toward_it():
    """Ditto's personal step (Li et al. 2021, Alg. 1): v ← v − η(∇F(v) + λ(v − w^t)) where v starts at the
    site's own personal model and w^t is the round's global model — not where v starts."""
    data, anchor = batches(), weights(Linear(seed=5))
    trained = Linear()
    train_local(trained, data, sgd(0.5, prox_mu=2.0), device="cpu", seed=0, prox_anchor=anchor)
    expected = by_hand(Linear(), data, 0.5, mu=2.0, anchor=anchor)
    for key, value in weights(trained).items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)
    plain = by_hand(Linear(), data, 0.5, mu=2.0)  # anchored at the start: another model
    assert any(not torch.allclose(plain[k], expected[k]) for k in plain)
    with pytest.raises(ValueError, match="prox_anchor lacks trainable parameters"):
        train_local(Linear(), data, sgd(0.5, prox_mu=2.0), device="cpu", seed=0, prox_anchor={"fc.weight": anchor["fc.weight"]})


def test_a_methods_loss_term_is_added_to_every_step():
    """A method's own term (FedDyn's −⟨∇L_k(θ_k^{t−1}), θ⟩, examples/methods/feddyn.py) enters the loss of
    every step, given the trainable (name, parameter) pairs; refused with DP-SGD."""
    data = batches()
    g = {k: torch.full_like(v, 0.3) for k, v in weights(Linear()).items()}
    trained = Linear()
    seen = []

    def term(named):
        seen.append([n for n, _ in named])
        return -sum((g[n] * p).sum() for n, p in named)

    train_local(trained, data, sgd(0.5), device="cpu", seed=0, loss_term=term)
    expected = by_hand(Linear(), data, 0.5, linear=g)
    for key, value in weights(trained).items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)
    assert seen == [["fc.weight", "fc.bias"]] * len(data)
    with pytest.raises(ValueError, match="a method's own loss term"):
        train_local(Linear(), data, sgd(0.1, dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0}), device="cpu",
                    seed=0, loss_term=term)
