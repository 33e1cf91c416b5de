"""The methods as the papers' code runs them: defaults and protocol details (science issue)."""

from __future__ import annotations

import json

import pytest
import torch

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.messages import TrainTask

from ...conftest import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _final(run_dir):
    return torch.load(run_dir / "final_model.pt", map_location="cpu", weights_only=True)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_fedbn_plus_carries_the_initial_batchnorm_through_local_training(tiny_manifests, tmp_path):
    """FedBN+ ≠ FedBN: every site's BN (affine and statistics) stays the initial one."""
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FL", target=None, class_source="union",
                       rounds=1, backbone_aggregation="fedbn_plus")
    run_experiment(load_config(data={**data, "rounds": 0}), tmp_path / "init", progress=False)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    initial, final = _final(tmp_path / "init")["global"], _final(tmp_path / "run")
    bn = [k for k in final["eval_local_keys"] if k.endswith(("running_mean", "running_var", ".weight"))]
    assert bn
    for site, state in final["local_states"].items():
        for key in bn:
            assert torch.equal(state[key], initial[key]), (site, key)
    moved = [k for k in initial if k not in bn and initial[k].is_floating_point()
             and not torch.equal(initial[k], final["global"][k])]
    assert moved  # everything else trained


# --------------------------------------------------------------------------- backbone weighting


class _FixedTransport:
    """Answers ``train`` with fixed parameters and sample counts per site (no data involved)."""

    def __init__(self, answers: dict):
        self.answers = answers
        self.site_names = list(answers)

    def run(self, task, targets, params, config, *, per_site=None):
        from fedcxr.pipeline.messages import Reply

        return {s: Reply(site=s, params={"w": torch.tensor(self.answers[s][0])}, n_samples=self.answers[s][1],
                         n_batches=1, class_set=["edema"]) for s in targets}

    def local_states(self):
        return {}


def _one_round(strategy: str, **cfg) -> torch.Tensor:
    from fedcxr.pipeline.config import ExperimentConfig
    from fedcxr.pipeline.protocols import Context, get_protocol

    config = ExperimentConfig(sites=["a", "b"], strategy=strategy, **cfg)
    transport = _FixedTransport({"a": ([4.0, 4.0], 1), "b": ([0.0, 0.0], 3)})
    ctx = Context(cfg=config, transport=transport, meta={}, classes=["edema"], aux_tasks=[], sources=["a", "b"],
                  target=None)
    protocol = get_protocol(strategy)
    state, _ = protocol.run_round(ctx, 0, {"global": {"w": torch.zeros(2)}, "initial_bn": {}})
    return state["global"]["w"]


@pytest.mark.parametrize("strategy", ["FL", "FL_PartialLoss", "PFL"])
def test_surgical_papers_methods_average_the_backbone_unweighted_by_default(strategy):
    """1/K (paper Eq. 1, code np.mean): sites of 1 and 3 samples count the same."""
    assert torch.allclose(_one_round(strategy), torch.tensor([2.0, 2.0]))
    assert torch.allclose(_one_round(strategy, backbone_weighting="samples"), torch.tensor([1.0, 1.0]))


def test_fedavg_keeps_sample_weights_by_default_and_can_go_uniform():
    assert torch.allclose(_one_round("FedAvg"), torch.tensor([1.0, 1.0]))
    assert torch.allclose(_one_round("FedAvg", backbone_weighting="uniform"), torch.tensor([2.0, 2.0]))


def test_the_replaced_surgical_weighting_key_names_its_successor(tmp_path):
    from fedcxr.errors import UserError

    with pytest.raises(UserError, match="backbone_weighting"):
        load_config(data={"sites": ["a"], "surgical_weighting": "uniform"}, check_sites=False)


# --------------------------------------------------------------------------- β = 0


@pytest.mark.parametrize("strategy", ["FedDA", "FedGP"])
def test_beta_zero_is_target_only_exactly(strategy, tiny_manifests, tmp_path):
    """β = 0 weighs only the target's update: the run ends with Target_Only's weights, bit for bit
    (``num_batches_tracked`` aside: 0-dim counters keep θ0 under the GP rules, DESIGN §5)."""
    common = dict(rounds=2, warmup_rounds=0, beta=0.0)
    run_experiment(load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="Target_Only",
                                                **common)), tmp_path / "alone", progress=False)
    run_experiment(load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy=strategy, **common)),
                   tmp_path / "fed", progress=False)
    alone, fed = _final(tmp_path / "alone")["global"], _final(tmp_path / "fed")["global"]
    floating = [k for k, v in alone.items() if v.is_floating_point()]
    assert floating and all(torch.equal(alone[k], fed[k]) for k in floating)


# --------------------------------------------------------------------------- warm-up and schedule


class _Recorder:
    """Wraps the in-process transport and records (round, task, site, lr) of every training task."""

    def __init__(self, inner):
        self.inner, self.site_names, self.calls = inner, inner.site_names, []

    def run(self, task, targets, params, config, *, per_site=None):
        for site in targets:
            cfg = (per_site or {}).get(site, (params, config))[1]
            if task not in ("metadata", "evaluate"):
                self.calls.append((cfg.get("round"), task, site, cfg.get("lr")))
        return self.inner.run(task, targets, params, config, per_site=per_site)

    def local_states(self):
        return self.inner.local_states()

    def load_local_states(self, states):
        self.inner.load_local_states(states)


def _recorded_run(tiny_manifests, tmp_path, **overrides):
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
    from fedcxr.pipeline.devices import resolve_device

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", eval_every=0, **overrides))
    recorder = _Recorder(InProcessTransport(build_runners(cfg, resolve_device("cpu"), progress=False)))
    run_experiment(cfg, tmp_path / "run", progress=False, transport=recorder)
    return recorder.calls


def test_fedgp_auto_warms_up_two_fedavg_rounds_then_runs_at_a_tenth_of_the_lr(tiny_manifests, tmp_path):
    """AutoFedGP code: 2 FedAvg rounds, then hparams['lr'] *= 0.1 for sources and target
    (the target fine-tunes in the sources' ``train_gp`` request: the server combines by default)."""
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="FedGP_Auto", rounds=3)
    by_round = {r: [(task, site, lr) for rr, task, site, lr in calls if rr == r] for r in range(3)}
    for r in (0, 1):  # plain FedAvg: sources only, full lr
        assert {t for t, _, _ in by_round[r]} == {"train"}
        assert {s for _, s, _ in by_round[r]} == {"nih_style", "chexpert_style"}
        assert all(lr == pytest.approx(2e-3) for _, _, lr in by_round[r])
    assert ("train_gp", "dicom_style", pytest.approx(1e-4)) in by_round[2]
    assert all(lr == pytest.approx(2e-4) for t, s, lr in by_round[2] if s != "dicom_style")


def test_gp_warms_up_five_rounds_projecting_from_the_sources_average(tiny_manifests, tmp_path):
    """AuxInfo+GP code: for i < 5 the global is the FedAvg of the sources, then GP on top; no lr change."""
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="FedAvg_Finetune_GP", rounds=1)
    assert ("train_gp", "dicom_style", 1e-3) in [(t, s, lr) for _, t, s, lr in calls]
    rows = _metrics(tmp_path / "run")
    assert rows[0]["warmup"] is True and set(rows[0]["betas"]) == {"nih_style", "chexpert_style"}


def test_warmup_and_lr_scale_defaults_can_be_overridden(tiny_manifests, tmp_path):
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="FedDA", rounds=1, warmup_rounds=0,
                          post_warmup_lr_scale=0.5)
    assert ("train_gp", "dicom_style", pytest.approx(5e-4)) in [(t, s, lr) for _, t, s, lr in calls]


def test_finetune_offline_fine_tunes_the_configured_number_of_passes_after_the_last_round(tiny_manifests, tmp_path):
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="Finetune_Offline", rounds=2, finetune_offline_epochs=3)
    target = [(r, t) for r, t, s, _ in calls if s == "dicom_style"]
    assert target == [(1, "finetune_pass")] * 3
    assert _metrics(tmp_path / "run")[-1]["target"]["passes"] == 3


def test_finetune_offline_defaults_to_fifty_passes_as_the_fedgp_paper():
    from fedcxr.pipeline.config import ExperimentConfig

    assert ExperimentConfig(sites=["a"]).options("finetune_offline").epochs == 50


# --------------------------------------------------------------------------- FACT


def test_fact_fine_tunes_heads_with_g_in_train_mode_and_keeps_sgd_state(tiny_manifests, tmp_path):
    calls = []

    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
    from fedcxr.pipeline.devices import resolve_device

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FACT", target="midrc_style",
                                       rounds=2, eval_every=0,
                                       model={"backbone": "resnet_tiny", "hidden": 16, "classes": ["cardiomegaly"]}))
    inner = InProcessTransport(build_runners(cfg, resolve_device("cpu"), progress=False))

    class Spy(_Recorder):
        def run(self, task, targets, params, config, *, per_site=None):
            for site in targets:
                calls.append((task, (per_site or {}).get(site, (params, config))[1]))
            return self.inner.run(task, targets, params, config, per_site=per_site)

    run_experiment(cfg, tmp_path / "run", progress=False, transport=Spy(inner))
    trains = [c for t, c in calls if t in ("train", "fact_head", "fact_target")]
    assert all(c["optimizer"] == "sgd" and c["weight_decay"] == 5e-4 and c["keep_optimizer"] for c in trains)
    heads = [c for t, c in calls if t == "fact_head"]  # its handler trains with frozen BN on batch statistics
    assert heads and all(c["trainable"] == "head" for c in heads)
    for site in ("nih_style", "chexpert_style", "midrc_style"):
        state = inner.runners[site].local_state
        assert any(k.startswith("optimizer.") and k.endswith("momentum_buffer") for k in state), site
    assert not any(k.startswith("optimizer.") for s in _final(tmp_path / "run")["local_states"].values() for k in s)


# --------------------------------------------------------------------------- optimiser state across rounds


class _Crash(_Recorder):
    """Dies (like a killed process) when a training task of round ``at`` starts."""

    def __init__(self, inner, at: int):
        super().__init__(inner)
        self.at = at

    def run(self, task, targets, params, config, *, per_site=None):
        rounds = {(per_site or {}).get(s, (params, config))[1].get("round") for s in targets}
        if task != "evaluate" and self.at in rounds:
            raise KeyboardInterrupt("killed")
        return self.inner.run(task, targets, params, config, per_site=per_site)


def _transport(cfg):
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
    from fedcxr.pipeline.devices import resolve_device

    return InProcessTransport(build_runners(cfg, resolve_device("cpu"), progress=False))


@pytest.mark.parametrize("strategy, extra", [
    ("FL_Surgical", {"target": None, "class_source": "union", "surgical": {"head_warmup": {"epochs": 2}}}),
    ("FACT", {"target": "midrc_style", "model": {"backbone": "resnet_tiny", "hidden": 16,
                                                  "classes": ["cardiomegaly"]}}),
])
def test_kept_optimiser_state_is_checkpointed_and_a_killed_run_resumes_bit_identical(
        strategy, extra, tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy=strategy, rounds=2, eval_every=0, **extra)
    cfg = load_config(data=data)
    run_experiment(cfg, tmp_path / "straight", progress=False, transport=_transport(cfg))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "killed", progress=False, transport=_Crash(_transport(cfg), at=1))
    ckpt = torch.load(tmp_path / "killed" / "checkpoints" / "round_0000.pt", weights_only=True)
    assert any(k.startswith("optimizer.") for state in ckpt["local_states"].values() for k in state)
    run_experiment(cfg, tmp_path / "killed", resume=True, progress=False, transport=_transport(cfg))
    straight, resumed = _final(tmp_path / "straight")["global"], _final(tmp_path / "killed")["global"]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    fresh = load_config(data={**data, "optimizer_state": "fresh"})
    run_experiment(fresh, tmp_path / "fresh", progress=False, transport=_transport(fresh))
    other = _final(tmp_path / "fresh")["global"]
    assert any(not torch.equal(straight[k], other[k]) for k in straight)  # the kept state matters


# --------------------------------------------------------------------------- surgical head warm-up


def test_head_warmup_keeps_the_best_validation_head_and_round_zero_starts_from_it(tiny_manifests, tmp_path):
    from fedcxr.pipeline.keys import WARM_PREFIX

    calls = []
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FL_Surgical", target=None,
                                       class_source="union", rounds=1, eval_every=0,
                                       surgical={"head_warmup": {"epochs": 4, "lr": 1e-2}}))
    inner = _transport(cfg)

    class Spy(_Recorder):
        def run(self, task, targets, params, config, *, per_site=None):
            for site in targets:
                calls.append((task, site, (per_site or {}).get(site, (params, config))[1]))
            if task == "train_from_warm":  # what each site holds when round 0 starts
                calls.append(("warm", {s: dict(inner.runners[s].local_state) for s in targets}, None))
            return self.inner.run(task, targets, params, config, per_site=per_site)

    run_experiment(cfg, tmp_path / "run", progress=False, transport=Spy(inner))
    warm = [(s, c) for t, s, c in calls if t == "warmup_head"]
    assert {s for s, _ in warm} == {"nih_style", "chexpert_style"}
    assert all(c["trainable"] == "head" and c["epochs"] == 4 and c["lr"] == 1e-2 for _, c in warm)
    held = next(s for t, s, _ in calls if t == "warm")
    assert all(WARM_PREFIX + "head.weight" in held[s] for s in ("nih_style", "chexpert_style"))
    assert {t for t, _, _ in calls if t.startswith("train")} == {"train_from_warm"}  # round 0: from the warm head
    row = _metrics(tmp_path / "run")[0]["head_warmup"]
    measured = 0
    for site, m in row.items():
        losses = m["val_loss"]
        assert len(losses) == 4, site
        if all(loss is None for loss in losses):  # no validation rows (null in metrics.jsonl): last head kept
            assert m["best_epoch"] == 3, site
            continue
        measured += 1
        assert m["best_epoch"] == min(range(4), key=losses.__getitem__), site
    assert measured, "no site had validation rows: the test would not test the selection"
    assert not any(k.startswith(WARM_PREFIX) for r in inner.runners.values() for k in r.local_state)


def test_warmed_head_is_the_best_epochs_head(tiny_manifests, tmp_path):
    """The site keeps the head of the epoch with the lowest validation loss, not the last one."""

    from fedcxr.pipeline.keys import WARM_PREFIX
    from fedcxr.pipeline.protocols.surgical import _val_loss

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", strategy="FL_Surgical", target=None,
                                       class_source="union", rounds=0))
    runner = _transport(cfg).runners["chexpert_style"]  # nih_style of the fixture has no val rows
    classes = runner.class_set
    model = runner.model(classes, [])
    theta0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    config = TrainTask.build(round=0, seed=0, role="source", head_classes=classes, param_classes=classes, lr=0.3,
                             batch_size=16, epochs=5, trainable="head")
    reply = runner.handle("warmup_head", theta0, config)
    losses, best = reply.metrics["val_loss"], reply.metrics["best_epoch"]
    assert best == min(range(5), key=losses.__getitem__)
    model.head.weight.data.copy_(runner.local_state[WARM_PREFIX + "head.weight"])
    model.head.bias.data.copy_(runner.local_state[WARM_PREFIX + "head.bias"])
    val = runner.dataset("val", classes, [], augment=False, loss_classes=classes)
    assert _val_loss(model, val, runner) == pytest.approx(losses[best], rel=1e-6)
    for key in theta0:  # the backbone (and its BN) did not move
        if not key.startswith("head."):
            assert torch.equal(theta0[key], model.state_dict()[key].cpu()), key


def test_the_replaced_head_warmup_rounds_key_names_head_warmup():
    from fedcxr.errors import UserError

    with pytest.raises(UserError, match="head_warmup: {epochs"):
        load_config(data={"sites": ["a"], "head_warmup_rounds": 2}, check_sites=False)


# --------------------------------------------------------------------------- target batch size


@pytest.mark.parametrize("strategy,size", [("FedGP_Auto", 4), ("FedDA_Auto", 4), ("FedGP", 16), ("FedDA", 16),
                                           ("Target_Only", 16), ("Finetune_Offline", 16), ("FedAvg_Finetune", 32),
                                           ("FedAvg_Finetune_GP", 32), ("Oracle", 32)])
def test_the_target_batch_size_defaults_to_the_authors_per_method(strategy, size):
    """AutoFedGP: 4 for the auto versions (paper App. C.4, noniid scripts), 16 for the rest of its methods
    (main_domain_bed*.py); AuxInfo+GP: 32. A configured size wins, and reaches the GP scale s_i."""
    from fedcxr.pipeline.config import ExperimentConfig
    from fedcxr.pipeline.protocols import Context, get_protocol, task_config

    def ctx(**target_train):
        cfg = ExperimentConfig(sites=["a"], target="t", strategy=strategy, target_train=target_train)
        protocol = get_protocol(strategy)
        return protocol, Context(cfg=cfg, transport=None, meta={}, classes=["edema"], aux_tasks=[], sources=["a"],
                                 target="t", task_defaults=protocol.task_defaults())

    protocol, default = ctx()
    assert task_config(default, 0, "target")["batch_size"] == size
    assert task_config(default, 0, "source")["batch_size"] == 32
    protocol, set_ = ctx(batch_size=7)
    assert task_config(set_, 0, "target")["batch_size"] == 7
    if hasattr(protocol, "combine_spec"):
        assert protocol.combine_spec(default, {})["bs_target"] == size


def _target_meta(n_labeled: int, n_train: int = 260):
    from fedcxr.pipeline.messages import Reply

    return Reply(site="t", metrics={"n_labeled_train": n_labeled, "n_train": n_train})


def test_auto_weighting_counts_the_target_batches_at_run_start(caplog):
    """B from labeled rows, batch size and epochs/steps: error below 2 (exit 2, before any round), a warning
    with the numbers below the authors' fewest (9), silence at the default batch of 4 with 50 labels."""
    from fedcxr.errors import UserError
    from fedcxr.pipeline.config import ExperimentConfig
    from fedcxr.pipeline.protocols.target_combine import auto_batches, check_auto_batches

    def cfg(**target_train):
        return ExperimentConfig(sites=["a"], target="t", strategy="FedGP_Auto", target_train=target_train)

    assert auto_batches(cfg(labeled=50), _target_meta(260), 4) == (50, 4, 13)
    assert auto_batches(cfg(labeled=50, batch_size=25), _target_meta(260), 4) == (50, 25, 2)
    assert auto_batches(cfg(labeled=49, batch_size=8), _target_meta(260), 4) == (49, 8, 6)  # 6 full + one row skipped
    assert auto_batches(cfg(labeled=0.1, batch_size=4), _target_meta(30, 260), 4) == (26, 4, 7)
    assert auto_batches(cfg(labeled=50, batch_size=25, steps=12), _target_meta(260), 4) == (50, 25, 12)
    with caplog.at_level("WARNING"):
        check_auto_batches(cfg(labeled=50), _target_meta(260), 4)
        assert not caplog.records
        check_auto_batches(cfg(labeled=50, batch_size=25), _target_meta(260), 4)
    assert "B = 2 batch update(s) per round (50 labeled rows, batch size 25" in caplog.text
    assert "at least 9" in caplog.text and "batch_size to at most 5" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        check_auto_batches(cfg(labeled=12), _target_meta(260), 4)  # 3 batches, too few rows for smaller ones
    assert "B = 3" in caplog.text and "raise target_train.epochs to 3" in caplog.text
    with pytest.raises(UserError, match="B = 1 .* at least 2"):
        check_auto_batches(cfg(labeled=50, batch_size=50), _target_meta(260), 4)
