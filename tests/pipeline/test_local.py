"""Local training (fedcxr.pipeline.local): learning, trainable parts, recorded batch updates, determinism."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fedcxr.models.network import CXRNet
from fedcxr.pipeline.state import flatten_state
from fedcxr.pipeline.data import AugmentConfig, SiteDataset, make_loader
from fedcxr.pipeline.forward import predict, quick_auroc
from fedcxr.pipeline.local import LocalConfig, train_local
from fedcxr.vocab import aux_column, label_column

CLASSES = ["edema", "atelectasis"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_dataset(n: int = 32, size: int = 16, seed: int = 0) -> SiteDataset:
    """A learnable set: edema = a bright square; atelectasis observed on half the rows; sex known on 3/4."""
    rng = np.random.default_rng(seed)
    edema = rng.permutation(np.arange(n) % 2)
    images = rng.integers(0, 60, (n, size, size)).astype(np.uint8)
    images[edema == 1, size // 4: 3 * size // 4, size // 4: 3 * size // 4] = 230
    atel = np.where(np.arange(n) % 2 == 0, rng.integers(0, 2, n).astype(float), np.nan)
    sex = pd.array([None if i % 4 == 0 else int(edema[i]) for i in range(n)], dtype="Int64")
    frame = pd.DataFrame({label_column("edema"): edema.astype(float), label_column("atelectasis"): atel,
                          aux_column("sex"): sex})
    return SiteDataset(images, frame, np.arange(n), classes=CLASSES, aux_tasks=["sex"], loss_classes=CLASSES,
                       augment_config=AugmentConfig(prob=1.0))


def toy_model(seed: int = 0, aux: bool = True) -> CXRNet:
    torch.manual_seed(seed)
    return CXRNet(CLASSES, backbone="resnet_tiny", hidden=8, aux_tasks={"sex": 2} if aux else None)


def states_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


# --------------------------------------------------------------------------- training


def loader(ds, seed=0, batch_size=8, augment=False):
    return make_loader(ds, batch_size=batch_size, shuffle=True, seed=seed, augment=augment)


def test_alpha_zero_equals_training_without_aux():
    ds = toy_dataset()
    a, b = toy_model(), toy_model()
    ra = train_local(a, loader(ds), LocalConfig(alpha=0.0, use_aux=True), device="cpu", seed=1)
    rb = train_local(b, loader(ds), LocalConfig(use_aux=False), device="cpu", seed=1)
    assert ra.main_loss == pytest.approx(rb.main_loss, rel=1e-6) and ra.aux_loss > 0 and rb.aux_loss == 0
    sa, sb = a.state_dict(), b.state_dict()
    for key in sa:
        assert torch.allclose(sa[key].float(), sb[key].float(), atol=1e-6), key
    assert ra.loss == pytest.approx(ra.main_loss)


def test_loss_decreases_and_the_model_learns():
    ds = toy_dataset(n=48)
    model = toy_model()
    eval_loader = make_loader(ds, batch_size=16, shuffle=False, seed=0, augment=False)
    before = predict(model, eval_loader, device="cpu")
    result = train_local(model, loader(ds), LocalConfig(lr=3e-3, epochs=8), device="cpu", seed=0)
    after = predict(model, eval_loader, device="cpu")
    assert result.n_samples == 48 and result.n_batches == 48 and result.samples_seen == 8 * 48

    def bce(out):
        p = torch.from_numpy(out["probs"][:, 0]).clamp(1e-6, 1 - 1e-6)
        return F.binary_cross_entropy(p, torch.from_numpy(out["labels"][:, 0])).item()

    assert bce(after) < 0.7 * bce(before)
    assert quick_auroc(after["labels"], after["label_mask"], after["probs"], CLASSES)["edema"] > 0.9


def test_recorded_batch_updates_sum_to_the_total_change():
    ds = toy_dataset(n=20)
    model = toy_model()
    start = flatten_state(model.state_dict())[0]
    result = train_local(model, loader(ds), LocalConfig(epochs=2), device="cpu", seed=0,
                         record_batch_updates=True)
    updates = result.batch_updates
    assert result.n_batches == 6  # 3 batches (8, 8, 4) x 2 epochs
    assert updates.shape == (6, start.numel()) and updates.dtype == torch.float32
    total = flatten_state(model.state_dict())[0] - start
    assert torch.allclose(updates.sum(0), total, atol=1e-5)
    # buffers take part: BN running means move with every training step
    keys = [k for k, v in model.state_dict().items() if v.dim() > 0]
    offset = 0
    for key in keys:
        if key == "backbone.bn1.running_mean":
            break
        offset += model.state_dict()[key].numel()
    assert (updates[:, offset:offset + 8].abs().sum(1) > 0).all()


def test_trainable_head_leaves_the_backbone_and_bn_statistics_unchanged():
    ds = toy_dataset(n=16)
    model = toy_model()
    before = copy.deepcopy(model.state_dict())
    model.train()
    train_local(model, loader(ds), LocalConfig(lr=1e-2), device="cpu", seed=0, trainable="head")
    after = model.state_dict()
    for key in before:
        changed = not torch.equal(before[key], after[key])
        assert changed == key.startswith("head."), key
    assert all(p.requires_grad for p in model.parameters())  # not left frozen
    assert model.training


def test_freeze_bn_keeps_every_batchnorm_entry_and_uses_running_statistics():
    """FedBN+: BN weight, bias and running statistics stay the initial ones; the rest learns."""
    from fedcxr.models.network import bn_keys

    ds = toy_dataset(n=16)
    model = toy_model()
    bn = set(bn_keys(model))
    assert bn
    before = copy.deepcopy(model.state_dict())
    train_local(model, loader(ds), LocalConfig(lr=1e-2), device="cpu", seed=0, freeze_bn=True)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in bn)
    assert any(not torch.equal(before[k], after[k]) for k in after if k not in bn)
    assert all(p.requires_grad for p in model.parameters())  # flags restored
    plain = toy_model()
    train_local(plain, loader(ds), LocalConfig(lr=1e-2), device="cpu", seed=0)
    assert any(not torch.equal(before[k], plain.state_dict()[k]) for k in bn)  # without it BN moves


def test_trainable_backbone_leaves_the_head_unchanged():
    ds = toy_dataset(n=16)
    model = toy_model()
    before = copy.deepcopy(model.state_dict())
    train_local(model, loader(ds), LocalConfig(lr=1e-2), device="cpu", seed=0, trainable="backbone")
    after = model.state_dict()
    assert torch.equal(before["head.weight"], after["head.weight"])
    assert not torch.equal(before["backbone.conv1.weight"], after["backbone.conv1.weight"])


def test_same_seed_gives_identical_weights():
    ds = toy_dataset(n=20)
    runs = []
    for seed in (5, 5, 6):
        model = toy_model()
        torch.manual_seed(seed * 100)  # global RNG state in between must not matter
        train_local(model, loader(ds, seed=seed, augment=True), LocalConfig(epochs=2), device="cpu", seed=seed)
        runs.append(model)
    assert states_equal(runs[0], runs[1])
    assert not states_equal(runs[0], runs[2])


def test_steps_override_epochs_and_cycle_the_loader():
    ds = toy_dataset(n=16)
    result = train_local(toy_model(), loader(ds), LocalConfig(steps=5, epochs=1), device="cpu", seed=0,
                         record_batch_updates=True)
    assert result.n_batches == 5 and result.batch_updates.shape[0] == 5 and result.samples_seen == 40


def test_loss_classes_mask_keeps_unlabelled_class_rows_still():
    ds = toy_dataset(n=16)
    model = toy_model(aux=False)
    before = model.head.weight.detach().clone()
    train_local(model, loader(ds), LocalConfig(lr=1e-2), device="cpu", seed=0,
                loss_classes_mask=torch.tensor([1.0, 0.0]))
    assert torch.equal(model.head.weight[1], before[1]) and not torch.equal(model.head.weight[0], before[0])


def test_single_sample_batches_are_skipped_while_bn_trains():
    ds = toy_dataset(n=9)
    result = train_local(toy_model(), loader(ds), LocalConfig(), device="cpu", seed=0)
    assert result.n_batches == 1 and result.skipped_batches == 1 and result.samples_seen == 8


def test_empty_loader_trains_nothing():
    ds = toy_dataset(n=4)
    empty = torch.utils.data.Subset(ds, [])
    model = toy_model()
    before = copy.deepcopy(model.state_dict())
    result = train_local(model, loader(empty), LocalConfig(steps=3), device="cpu", seed=0,
                         record_batch_updates=True)
    assert result.n_batches == 0 and math.isnan(result.loss) and result.batch_updates.shape[0] == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())



def test_aux_mean_reaches_the_training_loss():
    """Two aux tasks known in every batch (sex, age bin): ``mean`` with α = 2 trains exactly as ``sum``
    with α = 1, and ``mean`` with α = 1 differently (half the auxiliary weight)."""
    base = toy_dataset()
    frame = base.frame.copy()
    frame[aux_column("age_bin")] = pd.array([i % 5 for i in range(len(frame))], dtype="Int64")
    ds = SiteDataset(base.images, frame, np.arange(len(frame)), classes=CLASSES, aux_tasks=["sex", "age_bin"],
                     loss_classes=CLASSES, augment_config=AugmentConfig(prob=1.0))
    runs = {}
    for name, cfg in {"sum": LocalConfig(alpha=1.0), "mean": LocalConfig(alpha=1.0, aux_reduction="mean"),
                      "mean2": LocalConfig(alpha=2.0, aux_reduction="mean")}.items():
        torch.manual_seed(0)
        model = CXRNet(CLASSES, backbone="resnet_tiny", hidden=8, aux_tasks={"sex": 2, "age_bin": 5})
        train_local(model, loader(ds), cfg, device="cpu", seed=1)
        runs[name] = model
    assert states_equal(runs["sum"], runs["mean2"])
    assert not states_equal(runs["sum"], runs["mean"])


def test_a_cpu_step_is_seeded_on_the_cpu_generator_alone_as_torch_manual_seed_seeds_it(monkeypatch):
    """Issue 31 item 4: ``torch.manual_seed`` also queues the seed for CUDA, XPU and MTIA, formatting
    a stack trace each time (~0.6 ms, every simulated site every round); a CPU run seeds only the CPU
    generator, to the same state, and training is what it was."""
    from fedcxr.pipeline.local import seed_step_rng

    torch.manual_seed(11)
    want = torch.rand(5)
    seed_step_rng(11, use_cuda=False)
    assert torch.equal(torch.rand(5), want)
    ds = toy_dataset()
    before = toy_model()
    train_local(before, loader(ds), LocalConfig(), device="cpu", seed=3)

    def refuse(seed):
        raise AssertionError("torch.manual_seed called for a CPU run")

    after = toy_model()
    monkeypatch.setattr(torch, "manual_seed", refuse)
    train_local(after, loader(ds), LocalConfig(), device="cpu", seed=3)
    assert states_equal(before, after)
