"""What travels between server and sites (fedcxr.pipeline.messages): the typed task configs on the wire
and back, the errors that name the task and key at fault, and the payload layouts."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fedcxr.pipeline.messages import (
    TASK_CONFIGS,
    CombineSpec,
    EvaluateTask,
    NoConfig,
    TaskConfig,
    TaskConfigError,
    TrainTask,
    ValidateTask,
    pack_combine,
    pack_control,
    pack_control_delta,
    parse_task_config,
    unpack_combine,
    unpack_control,
    unpack_control_delta,
)

TRAIN = dict(round=2, seed=7, role="target", head_classes=["edema", "hernia"], param_classes=["edema", "hernia"],
             lr=0.01, batch_size=8)


def combine_spec(**changes):
    values = dict(rule="fedgp", auto=True, beta=0.5, n_sources=[30, 50], n_batches=[4, 7], bs_source=8,
                  bs_target=4, lr_source=1e-3, lr_target=2e-4, epochs_source=1, epochs_target=1)
    return CombineSpec.build(**{**values, **changes})


def test_a_task_config_survives_the_wire_with_its_types():
    task = TrainTask.build(**TRAIN, labeled=0.5, dp={"noise_multiplier": 1.1}, combine=combine_spec())
    wire = json.loads(json.dumps(task.to_dict()))
    assert wire["head_classes"] == ["edema", "hernia"] and wire["combine"]["n_sources"] == [30, 50]
    back = parse_task_config("train_combine", wire)
    assert back == task and back["head_classes"] == ("edema", "hernia") and back["combine"]["n_batches"] == (4, 7)
    assert back["steps"] is None and back["epochs"] == 1  # the defaults travel too: every key, every time
    assert parse_task_config("train", task) is task, "a typed config passes as it is"
    assert parse_task_config("metadata", None) == NoConfig()


@pytest.mark.parametrize("change, message", [
    ({"lr_scale": 2}, r"task 'train': train task config: unknown key\(s\) \['lr_scale'\]"),
    ({"lr": None}, "train task config: lr: None is not a finite number"),
    ({"lr": float("nan")}, "lr: nan is not a finite number"),
    ({"batch_size": "8"}, "batch_size: '8' is not an integer"),
    ({"batch_size": True}, "batch_size: True is not an integer"),
    ({"role": "server"}, r"role: 'server' is not one of \['source', 'target'\]"),
    ({"head_classes": "edema"}, "head_classes: expected a list, got str"),
    ({"head_classes": ["edema", 3]}, r"head_classes\[1\]: 3 is not a string"),
    ({"labeled": "half"}, "labeled: 'half' is not an integer or a finite number or null"),
    ({"dp": {1: 2}}, "dp: expected a mapping with string keys"),
    ({"combine": {"rule": "gp"}}, r"combine config: missing key\(s\)"),
])
def test_a_bad_config_is_refused_naming_the_task_and_the_key(change, message):
    wire = {**TrainTask.build(**TRAIN).to_dict(), **change}
    with pytest.raises(TaskConfigError, match=message):
        parse_task_config("train", wire)


def test_a_missing_key_an_unknown_task_or_a_non_mapping_is_refused():
    wire = TrainTask.build(**TRAIN).to_dict()
    del wire["lr"]
    with pytest.raises(TaskConfigError, match=r"missing key\(s\) \['lr'\] \(server and site must run the same"):
        parse_task_config("train", wire)
    with pytest.raises(TaskConfigError, match="unknown task 'steal'"):
        parse_task_config("steal", {})
    with pytest.raises(TaskConfigError, match="evaluate task config: expected a mapping of keys, got list"):
        parse_task_config("evaluate", [1, 2])
    with pytest.raises(TaskConfigError, match=r"missing key\(s\)"):
        parse_task_config("train", None)


def test_a_config_is_a_frozen_read_only_mapping_and_replace_checks_again():
    task = TrainTask.build(**TRAIN)
    assert task["lr"] == 0.01 and len(task) == len(dataclasses.fields(TrainTask)) and "lr" in dict(task)
    with pytest.raises(KeyError):
        task["lr_scale"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.lr = 1.0
    assert task.replace(trainable="head")["trainable"] == "head" and task["trainable"] == "all"
    with pytest.raises(TaskConfigError, match="trainable"):
        task.replace(trainable="everything")


def test_every_task_takes_a_typed_config():
    assert set(TASK_CONFIGS) == {"metadata", "train", "evaluate", "warmup_head", "train_combine", "fact_target",
                                 "train_scaffold", "validate", "local_state"}
    assert all(issubclass(kind, TaskConfig) for kind in TASK_CONFIGS.values())
    assert parse_task_config("validate", {**ValidateTask.build(classes=["edema"]).to_dict()})["n_boot"] == 1000
    assert parse_task_config("evaluate", EvaluateTask.build(head_classes=["a"], param_classes=["a"]).to_dict())[
        "split"] == "val"


def test_the_payload_layouts_pack_and_unpack_exactly():
    theta = {"w": torch.tensor([1.0]), "b": torch.tensor([2.0])}
    deltas = [{"w": torch.tensor([0.1]), "b": torch.tensor([0.2])}, {"w": torch.tensor([0.3]), "b": torch.tensor([0.4])}]
    payload = pack_combine(theta, deltas)
    assert sorted(payload) == ["b", "source0.b", "source0.w", "source1.b", "source1.w", "w"]
    back, back_deltas = unpack_combine(payload, 2)
    assert back == theta and back_deltas == deltas
    control = {"w": torch.tensor([5.0])}
    model, c = unpack_control(pack_control(theta, control))
    assert model == theta and c == control
    extra = {**pack_control_delta({"w": torch.tensor([0.5])}), "other": torch.tensor([9.0])}
    assert list(extra)[0] == "scaffold_dc.w" and unpack_control_delta(extra) == {"w": extra["scaffold_dc.w"]}
