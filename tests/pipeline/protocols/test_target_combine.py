"""Where GP / FedDA / FedGP combine (privacy.combine_at, privacy.auto_weights_at): same weights, less exposure.

Server-side combination must give the weights of target-side combination (up to float
reductions) for every fixed-β and auto-weighted rule, in-process and through the FLARE wire
format; and in server mode no site may ever receive another site's update.
"""

from __future__ import annotations

import json

import pytest
import torch

from fedcxr.flare.wire import decode_reply, decode_task, encode_reply, encode_task
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
from fedcxr.pipeline.protocols.target_combine import SOURCE_PREFIX

from ...conftest import tiny_config

FIXED = ["FedAvg_Finetune_GP", "FedDA", "FedGP"]
AUTO = ["FedDA_Auto", "FedGP_Auto"]


class RecordingTransport(InProcessTransport):
    """The in-process transport, optionally through the FLARE wire format, recording what each site receives."""

    def __init__(self, runners, *, wire: bool):
        super().__init__(runners)
        self.wire = wire
        self.received: list[tuple[str, str, list[str]]] = []  # (site, task, param keys)

    def run(self, task, targets, params, config, *, per_site=None):
        replies = {}
        for site in targets:
            site_params, site_config = (per_site or {}).get(site, (params, config))
            self.received.append((site, task, sorted(site_params or {})))
            if not self.wire:
                replies[site] = self.runners[site].handle(task, site_params, dict(site_config))
                continue
            arrays, meta = encode_task(task, site_params, site_config, runner={}, run="test")
            got = decode_task(arrays, json.loads(json.dumps(meta)))
            reply = self.runners[site].handle(got["task"], got["params"], got["config"])
            arrays, meta = encode_reply(reply)
            replies[site] = decode_reply(site, arrays, json.loads(json.dumps(meta)))
        return replies


_RUNS: dict = {}  # (strategy, where, wire) → result: the tests share runs (a run costs seconds on 2 cores)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("combine")


def _run(manifests, root, strategy, *, where, wire=False, auto=False):
    key = (strategy, where, wire)
    if key not in _RUNS:
        _RUNS[key] = _fresh_run(manifests, root, strategy, where=where, wire=wire, auto=auto)
    return _RUNS[key]


def _fresh_run(manifests, root, strategy, *, where, wire, auto):
    key = "auto_weights_at" if auto else "combine_at"
    # FedDA/FedGP(_Auto) warm up with plain FedAvg rounds: skip them so round 0 combines; GP keeps
    # its warm-up (the projection from the sources' average, the target after the sources)
    warmup = {} if strategy.startswith("FedAvg_Finetune") else {"warmup_rounds": 0}
    cfg = load_config(data=tiny_config(manifests, root / "cache", strategy=strategy, rounds=1, eval_every=0, **warmup,
                                       target_train={"lr": 1e-3, "batch_size": 8, "steps": 3, "labeled": 0.5},
                                       privacy={key: where}))
    transport = RecordingTransport(build_runners(cfg, torch.device("cpu"), False), wire=wire)
    out = root / f"{strategy}-{where}-{'wire' if wire else 'local'}"
    run_experiment(cfg, out, progress=False, transport=transport)
    final = torch.load(out / "final_model.pt", map_location="cpu", weights_only=True)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return final["global"], metrics, transport.received


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel())


def _betas(metrics):
    return [m["betas"] for m in metrics]


@pytest.mark.parametrize("strategy", FIXED)
def test_server_side_combine_gives_the_target_side_weights(strategy, tiny_manifests, root):
    server, m_server, seen = _run(tiny_manifests, root, strategy, where="server")
    target, m_target, seen_target = _run(tiny_manifests, root, strategy, where="target")
    assert _max_diff(server, target) <= 1e-6
    assert _betas(m_server) == _betas(m_target)
    # server mode: every site receives θ0 only; target mode: the target receives the sources' updates
    assert not any(k.startswith(SOURCE_PREFIX) for _, _, keys in seen for k in keys)
    assert {task for _, task, _ in seen} <= {"metadata", "train", "train_gp"}  # no train_combine
    assert any(task == "train_combine" and any(k.startswith(SOURCE_PREFIX) for k in keys)
               for _, task, keys in seen_target)


@pytest.mark.parametrize("strategy", AUTO)
def test_auto_weights_at_server_and_at_target_agree(strategy, tiny_manifests, root):
    server, m_server, seen = _run(tiny_manifests, root, strategy, where="server", auto=True)
    target, m_target, _ = _run(tiny_manifests, root, strategy, where="target", auto=True)
    assert _max_diff(server, target) <= 1e-6
    for a, b in zip(_betas(m_server), _betas(m_target)):
        assert a.keys() == b.keys() and all(abs(a[s] - b[s]) <= 1e-6 for s in a)
        assert all(0.0 <= v <= 1.0 for v in a.values())
    assert not any(k.startswith(SOURCE_PREFIX) for _, _, keys in seen for k in keys)


@pytest.mark.parametrize("strategy,auto", [("FedGP", False), ("FedGP_Auto", True)])
def test_both_modes_agree_through_the_flare_wire_format(strategy, auto, tiny_manifests, root):
    local, _, _ = _run(tiny_manifests, root, strategy, where="server", auto=auto)
    server, _, _ = _run(tiny_manifests, root, strategy, where="server", auto=auto, wire=True)
    target, _, _ = _run(tiny_manifests, root, strategy, where="target", auto=auto, wire=True)
    assert _max_diff(server, local) <= 1e-6
    assert _max_diff(server, target) <= 1e-6


def test_a_missing_target_fails_the_round_in_server_mode(tiny_manifests, root, tmp_path):
    from fedcxr.pipeline.protocols import RoundFailed

    cfg = load_config(data=tiny_config(tiny_manifests, root / "cache", strategy="FedGP", rounds=1,
                                       eval_every=0, warmup_rounds=0))
    transport = RecordingTransport(build_runners(cfg, torch.device("cpu"), False), wire=False)
    inner = transport.run

    def without_target(task, targets, params, config, *, per_site=None):
        replies = inner(task, targets, params, config, per_site=per_site)
        if task == "train_gp":
            replies.pop("dicom_style", None)
        return replies

    transport.run = without_target
    with pytest.raises(RoundFailed, match="target dicom_style did not answer"):
        run_experiment(cfg, tmp_path / "run", progress=False, transport=transport)


def test_target_side_combination_fine_tunes_once_beside_the_sources(tiny_manifests, root, tmp_path):
    """combine_at: target — the target trains in the sources' request and train_combine reuses it."""
    cfg = load_config(data=tiny_config(tiny_manifests, root / "cache", strategy="FedGP", rounds=1, eval_every=0,
                                       target_train={"lr": 1e-3, "batch_size": 8, "steps": 3, "labeled": 0.5},
                                       privacy={"combine_at": "target"}, warmup_rounds=0))
    transport = RecordingTransport(build_runners(cfg, torch.device("cpu"), False), wire=True)
    target = transport.runners["dicom_style"]
    trained, handle = [], target.handle

    def counting(task, params, config):
        if task in ("train", "train_gp"):
            trained.append(bool(config.get("hold_for_combine")))
        return handle(task, params, config)

    target.handle = counting
    run_experiment(cfg, tmp_path / "run", progress=False, transport=transport)
    assert trained == [True]  # held in the sources' request, never trained again by train_combine
    assert [(s, t) for s, t, _ in transport.received if t != "metadata"] == [
        ("nih_style", "train_gp"), ("chexpert_style", "train_gp"), ("dicom_style", "train_gp"),
        ("dicom_style", "train_combine")]
    final = torch.load(tmp_path / "run" / "final_model.pt", map_location="cpu", weights_only=True)["global"]
    assert _max_diff(final, _run(tiny_manifests, root, "FedGP", where="server")[0]) <= 1e-6


def test_held_fine_tuning_equals_the_sequential_one(tiny_manifests, root):
    """train_combine without a held model (a restarted site, the old sequential order) trains itself: same result."""
    from fedcxr.pipeline.run_driver import build_context, initial_model
    from fedcxr.pipeline.protocols.target_combine import HELD, CombineTask, GPTask, pack_combine
    from fedcxr.pipeline.protocols import get_protocol, task_config

    cfg = load_config(data=tiny_config(tiny_manifests, root / "cache", strategy="FedGP_Auto", rounds=1,
                                       target_train={"lr": 1e-3, "batch_size": 8, "steps": 3, "labeled": 0.5},
                                       warmup_rounds=0))
    protocol = get_protocol(cfg.strategy)
    runners = build_runners(cfg, torch.device("cpu"), False)
    ctx = build_context(cfg, protocol, InProcessTransport(runners))
    theta0 = initial_model(cfg, ctx)
    source = runners["nih_style"].handle("train", theta0, task_config(ctx, 0, "source"))
    spec = protocol.combine_spec(ctx, {"nih_style": source})
    payload = pack_combine(theta0, [{k: source.params[k] - theta0[k] for k in theta0}])
    combine_cfg = CombineTask.extend(task_config(ctx, 0, "target"), combine=spec)
    target = runners["dicom_style"]
    sequential = target.handle("train_combine", payload, combine_cfg)
    held = target.handle("train_gp", theta0, GPTask.extend(task_config(ctx, 0, "target"), record_batch_updates=True,
                                                           hold_for_combine=True))
    assert held.params is None and held.n_batches == 3  # only counts and metrics leave the site now
    parallel = target.handle("train_combine", payload, combine_cfg)
    assert HELD not in target.memory  # used once
    assert _max_diff(sequential.params, parallel.params) == 0.0
    assert sequential.metrics["betas"] == parallel.metrics["betas"]


@pytest.mark.parametrize("strategy,auto", [("FedGP", False), ("FedGP_Auto", True)])
def test_the_round_records_the_numbers_behind_the_rule_in_both_modes(strategy, auto, tiny_manifests, root):
    """metrics.jsonl: s_i, kept share, mean c_i (GP rules) and σ², d², τ²d², B (auto) per source, the same
    wherever the rule ran; the tracker turns them into combine/... scalars."""
    from fedcxr.tracking import round_scalars

    _, server, _ = _run(tiny_manifests, root, strategy, where="server", auto=auto)
    _, target, _ = _run(tiny_manifests, root, strategy, where="target", auto=auto)
    got = server[0]["combine"]
    keys = {"scales", "kept", "cos"} | ({"sigma2", "d2", "tau2d2", "target_batches"} if auto else set())
    assert set(got) == keys
    assert set(got["scales"]) == {"nih_style", "chexpert_style"} and all(0 <= v <= 1 for v in got["kept"].values())
    if auto:
        assert got["target_batches"] == 3 and got["sigma2"] > 0
    for key, value in got.items():
        other = target[0]["combine"][key]
        if isinstance(value, dict):
            assert value == pytest.approx(other, rel=1e-5, abs=1e-12), key
        else:
            assert value == pytest.approx(other, rel=1e-5), key
    tags = dict(round_scalars(server[0]))
    assert "combine/scales/nih_style" in tags and ("combine/sigma2" in tags) == auto


# --------------------------------------------------------------------------- the GP family's share of the envelope


def _combine_task(**spec_changes):
    from fedcxr.pipeline.messages import TrainTask
    from fedcxr.pipeline.protocols.target_combine import CombineSpec, CombineTask

    values = dict(rule="fedgp", auto=True, beta=0.5, n_sources=[30, 50], n_batches=[4, 7], bs_source=8,
                  bs_target=4, lr_source=1e-3, lr_target=2e-4, epochs_source=1, epochs_target=1)
    base = TrainTask.build(round=2, seed=7, role="target", head_classes=["edema"], param_classes=["edema"], lr=0.01,
                           batch_size=8, labeled=0.5)
    return CombineTask.extend(base, combine=CombineSpec.build(**{**values, **spec_changes}))


def test_the_combine_task_survives_the_wire_with_its_types():
    from fedcxr.pipeline.messages import parse_task_config
    from fedcxr.pipeline.protocols.target_combine import CombineTask

    task = _combine_task()
    wire = json.loads(json.dumps(task.to_dict()))
    assert wire["combine"]["n_sources"] == [30, 50] and wire["labeled"] == 0.5
    back = parse_task_config("train_combine", wire, {"train_combine": CombineTask})
    assert back == task and back["combine"]["n_batches"] == (4, 7) and back.combine.n_sources == (30, 50)


def test_a_bad_combine_config_is_refused_naming_the_key():
    from fedcxr.pipeline.messages import TaskConfigError, parse_task_config
    from fedcxr.pipeline.protocols.target_combine import CombineTask

    wire = {**_combine_task().to_dict(), "combine": {"rule": "gp"}}
    with pytest.raises(TaskConfigError, match=r"task 'train_combine': .*combine config: missing key\(s\)"):
        parse_task_config("train_combine", wire, {"train_combine": CombineTask})


def test_the_combine_payload_packs_and_unpacks_exactly():
    from fedcxr.pipeline.protocols.target_combine import pack_combine, unpack_combine

    theta = {"w": torch.tensor([1.0]), "b": torch.tensor([2.0])}
    deltas = [{"w": torch.tensor([0.1]), "b": torch.tensor([0.2])}, {"w": torch.tensor([0.3]), "b": torch.tensor([0.4])}]
    payload = pack_combine(theta, deltas)
    assert sorted(payload) == ["b", f"{SOURCE_PREFIX}0.b", f"{SOURCE_PREFIX}0.w", f"{SOURCE_PREFIX}1.b",
                               f"{SOURCE_PREFIX}1.w", "w"]
    back, back_deltas = unpack_combine(payload, 2)
    assert back == theta and back_deltas == deltas
