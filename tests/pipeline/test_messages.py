"""What travels between server and sites (fedcxr.pipeline.messages): the typed task configs on the wire
and back, the errors that name the task and key at fault, and a method's share of the envelope (a
subclass). The methods' own configs and payload layouts are tested with their modules
(tests/pipeline/protocols/test_target_combine.py, test_fedopt.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest

from fedcxr.pipeline.messages import (
    TASK_CONFIGS,
    EvaluateTask,
    NoConfig,
    TaskConfig,
    TaskConfigError,
    TrainTask,
    ValidateTask,
    parse_task_config,
)

TRAIN = dict(round=2, seed=7, role="target", head_classes=["edema", "hernia"], param_classes=["edema", "hernia"],
             lr=0.01, batch_size=8)


@dataclasses.dataclass(frozen=True)
class PassTask(TrainTask):
    """A method's share of the envelope, as a method module declares it (docs/methods.md)."""

    kind: ClassVar[str] = "pass task"
    passes: tuple[int, ...] = ()


def test_a_task_config_survives_the_wire_with_its_types():
    task = TrainTask.build(**TRAIN, labeled=0.5, dp={"noise_multiplier": 1.1})
    wire = json.loads(json.dumps(task.to_dict()))
    assert wire["head_classes"] == ["edema", "hernia"] and wire["dp"] == {"noise_multiplier": 1.1}
    back = parse_task_config("train", wire)
    assert back == task and back["head_classes"] == ("edema", "hernia")
    assert back["steps"] is None and back["epochs"] == 1  # the defaults travel too: every key, every time
    assert parse_task_config("train", task) is task, "a typed config passes as it is"
    assert parse_task_config("metadata", None) == NoConfig()


def test_a_methods_task_config_extends_the_envelope_and_is_parsed_with_its_own_type():
    task = PassTask.extend(TrainTask.build(**TRAIN), passes=[1, 2])
    assert task["lr"] == 0.01 and task["passes"] == (1, 2)
    wire = json.loads(json.dumps(task.to_dict()))
    assert parse_task_config("train_pass", wire, {"train_pass": PassTask}) == task
    with pytest.raises(TaskConfigError, match=r"task 'train': train task config: unknown key\(s\) \['passes'\]"):
        parse_task_config("train", wire)  # the common task never takes a method's field
    with pytest.raises(TaskConfigError, match=r"pass task config: missing key\(s\) \['passes'\]"):
        PassTask.from_dict(TrainTask.build(**TRAIN).to_dict())


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
    """The runner's own tasks are typed here; a method's tasks by its module (``SiteTask.config``)."""
    from fedcxr.pipeline.protocols.methods import RUNNER_TASKS, site_tasks

    assert set(TASK_CONFIGS) == set(RUNNER_TASKS) == {"metadata", "train", "evaluate", "validate", "local_state"}
    assert all(issubclass(kind, TaskConfig) for kind in TASK_CONFIGS.values())
    assert all(issubclass(task.config, TrainTask) for task in site_tasks().values())
    assert parse_task_config("validate", {**ValidateTask.build(classes=["edema"]).to_dict()})["n_boot"] == 1000
    assert parse_task_config("evaluate", EvaluateTask.build(head_classes=["a"], param_classes=["a"]).to_dict())[
        "split"] == "val"
