"""The methods as the papers' code runs them: defaults and protocol details (science issue)."""

from __future__ import annotations

import json

import pytest
import torch

from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.federation import run_experiment

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
    from fedcxr.pipeline.local import resolve_device

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", eval_every=0, **overrides))
    recorder = _Recorder(InProcessTransport(build_runners(cfg, resolve_device("cpu"), progress=False)))
    run_experiment(cfg, tmp_path / "run", progress=False, transport=recorder)
    return recorder.calls


def test_fedgp_auto_warms_up_two_fedavg_rounds_then_runs_at_a_tenth_of_the_lr(tiny_manifests, tmp_path):
    """AutoFedGP code: 2 FedAvg rounds, then hparams['lr'] *= 0.1 for sources and target."""
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="FedGP_Auto", rounds=3)
    by_round = {r: [(task, site, lr) for rr, task, site, lr in calls if rr == r] for r in range(3)}
    for r in (0, 1):  # plain FedAvg: sources only, full lr
        assert {t for t, _, _ in by_round[r]} == {"train"}
        assert {s for _, s, _ in by_round[r]} == {"nih_style", "chexpert_style"}
        assert all(lr == pytest.approx(2e-3) for _, _, lr in by_round[r])
    assert ("train_combine", "dicom_style", pytest.approx(1e-4)) in by_round[2]
    assert all(lr == pytest.approx(2e-4) for t, _, lr in by_round[2] if t == "train")


def test_gp_warms_up_five_rounds_projecting_from_the_sources_average(tiny_manifests, tmp_path):
    """AuxInfo+GP code: for i < 5 the global is the FedAvg of the sources, then GP on top; no lr change."""
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="FedAvg_Finetune_GP", rounds=1)
    assert ("train_combine", "dicom_style", 1e-3) in [(t, s, lr) for _, t, s, lr in calls]
    rows = _metrics(tmp_path / "run")
    assert rows[0]["warmup"] is True and set(rows[0]["betas"]) == {"nih_style", "chexpert_style"}


def test_warmup_and_lr_scale_defaults_can_be_overridden(tiny_manifests, tmp_path):
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="FedDA", rounds=1, warmup_rounds=0,
                          post_warmup_lr_scale=0.5)
    assert ("train_combine", "dicom_style", pytest.approx(5e-4)) in [(t, s, lr) for _, t, s, lr in calls]


def test_finetune_offline_fine_tunes_the_configured_number_of_passes_after_the_last_round(tiny_manifests, tmp_path):
    calls = _recorded_run(tiny_manifests, tmp_path, strategy="Finetune_Offline", rounds=2, finetune_offline_epochs=3)
    target = [(r, t) for r, t, s, _ in calls if s == "dicom_style"]
    assert target == [(1, "train")] * 3
    assert _metrics(tmp_path / "run")[-1]["target"]["passes"] == 3


def test_finetune_offline_defaults_to_fifty_passes_as_the_fedgp_paper():
    from fedcxr.pipeline.config import ExperimentConfig

    assert ExperimentConfig(sites=["a"]).finetune_offline_epochs == 50
