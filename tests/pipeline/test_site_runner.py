"""One site's side of every task (fedcxr.pipeline.site_runner) and the in-process transport."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.devices import resolve_device
from fedcxr.pipeline.keys import derive_seed
from fedcxr.pipeline.messages import EvaluateTask, Reply, TrainTask, ValidateTask
from fedcxr.pipeline.protocols.methods import site_tasks
from fedcxr.pipeline.site_runner import TASKS, SiteRunner, SiteTask
from fedcxr.pipeline.state import check_update

from ..conftest import tiny_config


@pytest.fixture(scope="module")
def runners(tiny_manifests, tmp_path_factory):
    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path_factory.mktemp("cache")))
    return cfg, build_runners(cfg, resolve_device("cpu"), progress=False)


def _train_config(runner: SiteRunner, **extra) -> TrainTask:
    classes = runner.class_set
    return TrainTask.build(**{"round": 0, "seed": 0, "role": "source", "head_classes": classes,
                              "param_classes": classes, "lr": 1e-3, "batch_size": 8, "steps": 2, **extra})


def test_metadata_reports_counts_classes_and_a_manifest_hash_only(runners):
    _, sites = runners
    reply = sites["nih_style"].handle("metadata", None, {})
    assert reply.class_set == sites["nih_style"].class_set and reply.params is None
    m = reply.metrics
    assert m["n_train"] + m["n_val"] + m["n_test"] == len(sites["nih_style"].sites[0].manifest)
    assert 0 < m["n_labeled_train"] <= m["n_train"]
    assert set(m["labeled_per_class"]) == set(reply.class_set)
    assert len(m["manifest_hash"]) == 64


def test_train_returns_a_checked_update_with_counts(runners):
    _, sites = runners
    runner = sites["chexpert_style"]
    model = runner.model(runner.class_set, [])
    theta0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reply = runner.handle("train", theta0, _train_config(runner))
    assert check_update(reply.params, theta0) is None
    assert reply.n_batches == 2 and reply.n_samples > 0 and reply.class_set == runner.class_set
    assert any(not torch.equal(reply.params[k], theta0[k]) for k in theta0)


def test_train_is_reproducible_from_the_seed_round_and_site(runners):
    _, sites = runners
    runner = sites["nih_style"]
    theta0 = {k: v.detach().clone() for k, v in runner.model(runner.class_set, []).state_dict().items()}
    a = runner.handle("train", theta0, _train_config(runner))
    b = runner.handle("train", theta0, _train_config(runner))
    c = runner.handle("train", theta0, _train_config(runner, round=1))
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert any(not torch.equal(a.params[k], c.params[k]) for k in a.params)
    assert derive_seed(0, "train", "x", 0) != derive_seed(0, "train", "x", 1)



def test_train_applies_the_tasks_aux_reduction(runners):
    """``aux_reduction`` travels in the train task to the site's loss: at chexpert_style (sex, age bin,
    race and view known) ``mean`` with α = 4 is ``sum`` with α = 1 (four tasks), ``mean`` with α = 1 is not."""
    _, sites = runners
    runner = sites["chexpert_style"]
    tasks = ["sex", "age_bin", "race", "view"]
    theta0 = {k: v.detach().clone() for k, v in runner.model(runner.class_set, tasks).state_dict().items()}
    run = lambda **kw: runner.handle("train", theta0, _train_config(runner, aux_tasks=tasks, use_aux=True, **kw))  # noqa: E731
    summed, mean4, mean1 = run(alpha=1.0), run(alpha=4.0, aux_reduction="mean"), run(alpha=1.0, aux_reduction="mean")
    assert summed.metrics["aux_loss"] > 0
    assert all(torch.allclose(summed.params[k], mean4.params[k], atol=1e-6) for k in theta0)
    assert any(not torch.allclose(summed.params[k], mean1.params[k], atol=1e-6) for k in theta0)

def test_received_head_rows_are_matched_by_class_name(runners):
    _, sites = runners
    runner = sites["dicom_style"]
    classes = runner.class_set
    model = runner.model(classes, [])
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reversed_classes = list(reversed(classes))
    sent = dict(state, **{"head.weight": state["head.weight"].flip(0), "head.bias": state["head.bias"].flip(0)})
    runner.load_params(model, sent, reversed_classes, [])
    assert torch.equal(model.head.weight.detach(), state["head.weight"])


def test_local_keys_stay_at_the_site(runners):
    _, sites = runners
    runner = sites["nih_style"]
    model = runner.model(runner.class_set, [])
    theta0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bn = [k for k in theta0 if "running_mean" in k][:1]
    runner.handle("train", theta0, _train_config(runner, local_keys=bn))
    kept = runner.get_local_state()[bn[0]].clone()
    poisoned = dict(theta0, **{bn[0]: torch.full_like(theta0[bn[0]], 99.0)})
    runner.load_params(model, poisoned, runner.class_set, bn)
    assert torch.equal(model.state_dict()[bn[0]], kept), "the site's own BN statistics, not the server's"
    runner.set_local_state({})


def test_evaluate_returns_per_class_auroc_of_the_split(runners):
    _, sites = runners
    runner = sites["dicom_style"]
    theta0 = {k: v.detach().clone() for k, v in runner.model(runner.class_set, []).state_dict().items()}
    classes = runner.class_set
    task = EvaluateTask.build(head_classes=classes, param_classes=classes, split="val")
    reply = runner.handle("evaluate", theta0, task)
    assert reply.metrics["split"] == "val" and reply.metrics["n"] == reply.n_samples > 0
    assert set(reply.metrics["auroc"]) == set(runner.class_set)



def test_evaluate_counts_each_class_s_positive_and_negative_patients_of_the_split(runners):
    """The counts the round line's small-sample rule reads (run_log.val_supported): patients, not images."""
    from fedcxr.vocab import label_column

    _, sites = runners
    runner = sites["dicom_style"]  # the site with a validation split
    classes = runner.class_set
    theta0 = {k: v.detach().clone() for k, v in runner.model(classes, []).state_dict().items()}
    reply = runner.handle("evaluate", theta0, EvaluateTask.build(head_classes=classes, param_classes=classes,
                                                                 split="val"))
    val = runner.sites[0].manifest.loc[runner.sites[0].manifest["split"] == "val"]
    expected = {c: [int(val.loc[val[label_column(c)] == 1, "patient_id"].nunique()),
                    int(val.loc[val[label_column(c)] == 0, "patient_id"].nunique())] for c in classes}
    assert reply.metrics["cases"] == expected
    assert any(pos + neg for pos, neg in expected.values())

def test_unknown_tasks_are_refused_and_the_registry_is_explicit(runners):
    """Every task a runner answers is in its module's registry (no import registers one); a transport
    adds its own when it builds the runner, and only tasks whose config is typed."""
    cfg, sites = runners
    with pytest.raises(ValueError, match="unknown task 'steal'"):
        sites["nih_style"].handle("steal", None, {})
    assert {"metadata", "train", "evaluate"} == set(TASKS)
    assert set(sites["nih_style"].tasks) == set(TASKS) | set(site_tasks())  # the methods' tasks, passed in

    def echo(runner, params, config):
        return Reply(site=runner.name, metrics={"owner": config.model_owner})

    added = build_runners(cfg, resolve_device("cpu"), False, tasks={"validate": SiteTask(echo, changes_state=False)})
    reply = added["nih_style"].handle("validate", None, {**ValidateTask.build(classes=["edema"]).to_dict(),
                                                          "model_owner": "SRV_server"})
    assert reply.metrics == {"owner": "SRV_server"}
    with pytest.raises(ValueError, match="no typed config"):
        build_runners(cfg, resolve_device("cpu"), False, tasks={"steal": SiteTask(echo, changes_state=False)})
    with pytest.raises(ValueError, match="one the runner answers by itself"):
        build_runners(cfg, resolve_device("cpu"), False, tasks={"train": SiteTask(echo, changes_state=True,
                                                                                   config=TrainTask)})


def test_a_task_config_is_parsed_once_and_refused_naming_the_key(runners):
    """A dict config (a test's, a recorded one) must hold exactly the task's keys, each of its type."""
    _, sites = runners
    runner = sites["nih_style"]
    theta0 = {k: v.detach().clone() for k, v in runner.model(runner.class_set, []).state_dict().items()}
    good = _train_config(runner).to_dict()
    assert runner.handle("train", theta0, good).n_batches == 2  # the wire form is accepted
    for bad, match in (({**good, "lr_scale": 2}, r"unknown key\(s\) \['lr_scale'\]"),
                       ({k: v for k, v in good.items() if k != "lr"}, r"missing key\(s\) \['lr'\]"),
                       ({**good, "batch_size": "8"}, "batch_size: '8' is not an integer")):
        with pytest.raises(ValueError, match=match):
            runner.handle("train", theta0, bad)


def test_in_process_transport_runs_each_site_with_its_own_payload_and_keeps_local_state(runners):
    _, sites = runners
    transport = InProcessTransport(sites)
    replies = transport.run("metadata", ["nih_style", "dicom_style"], None, {})
    assert set(replies) == {"nih_style", "dicom_style"}
    runner = sites["nih_style"]
    theta0 = {k: v.detach().clone() for k, v in runner.model(runner.class_set, []).state_dict().items()}
    classes = runner.class_set
    per_site = {"nih_style": (theta0, EvaluateTask.build(head_classes=classes, param_classes=classes, split="val"))}
    out = transport.run("evaluate", ["nih_style"], None, None, per_site=per_site)
    assert out["nih_style"].metrics["split"] == "val"
    transport.load_local_states({"nih_style": {"x": torch.ones(2)}, "unknown_site": {"y": torch.ones(1)}})
    states = transport.local_states()
    assert torch.equal(states["nih_style"]["x"], torch.ones(2)) and "unknown_site" not in states
    runner.set_local_state({})


def _every_site_evaluated(runners, theta0, task):
    """Each site's own ``evaluate`` (its FLARE path) and the in-process one that answers them together
    (compared by :func:`_assert_same_scores`)."""
    from fedcxr.pipeline.site_runner import handle_together

    alone = {name: runner.handle("evaluate", theta0, task) for name, runner in runners.items()}
    together = handle_together(list(runners.values()), "evaluate", theta0, task)
    return alone, together


def test_sites_evaluated_together_score_what_each_site_alone_does(runners):
    """Issue 31 item 4: a process's simulated sites validate the same model loaded once; every site's
    AUROCs (bit for bit), counts and cases are those of its own ``evaluate``."""
    cfg, sites = runners
    classes = cfg_classes = sorted({c for r in sites.values() for c in r.class_set})
    model = next(iter(sites.values())).model(cfg_classes, [])
    theta0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    task = EvaluateTask.build(head_classes=classes, param_classes=classes, split="train", batch_size=8)
    alone, together = _every_site_evaluated(sites, theta0, task)
    assert list(together) == list(sites) and sum(1 for r in alone.values() if r.metrics["n"]) >= 2
    _assert_same_scores(alone, together)


def _assert_same_scores(alone, together):
    import math

    assert list(together) == list(alone)
    for name, reply in alone.items():
        got = together[name]
        assert got.n_samples == reply.n_samples and got.class_set == reply.class_set
        for key in ("split", "n", "cases"):
            assert got.metrics.get(key) == reply.metrics.get(key), (name, key)
        assert set(got.metrics.get("auroc", {})) == set(reply.metrics.get("auroc", {}))
        for cls, value in reply.metrics.get("auroc", {}).items():
            other = got.metrics["auroc"][cls]
            assert (math.isnan(value) and math.isnan(other)) or value == other, (name, cls)


def test_a_site_with_its_own_batchnorm_statistics_is_evaluated_with_them_not_in_the_shared_pass(runners):
    """FedBN: a site that keeps its own BN entries loads them for its validation (alone)."""
    import dataclasses

    from fedcxr.pipeline.site_runner import handle_together

    _, sites = runners
    classes = sorted({c for r in sites.values() for c in r.class_set})
    first = next(iter(sites.values()))
    model = first.model(classes, [])
    theta0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bn = [k for k in theta0 if k.endswith(("running_mean", "running_var"))]
    first.set_local_state({k: theta0[k] * 3 + 1 for k in bn})
    try:
        task = EvaluateTask.build(head_classes=classes, param_classes=classes, split="train", batch_size=8,
                                  local_keys=bn)
        alone, together = _every_site_evaluated(sites, theta0, task)
        _assert_same_scores(alone, together)
        plain = EvaluateTask.build(head_classes=classes, param_classes=classes, split="train", batch_size=8)
        shared = handle_together(list(sites.values()), "evaluate", theta0, plain)
        assert shared[first.name].metrics["auroc"] != alone[first.name].metrics["auroc"]  # its own statistics count
    finally:
        first.set_local_state({})
