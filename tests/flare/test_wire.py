"""The FLARE wire format: what a site may send back, and why a reply is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedcxr.flare.wire import (
    META_KEY,
    WireError,
    decode_reply,
    decode_task,
    encode_error,
    encode_reply,
    encode_task,
)
from fedcxr.pipeline.messages import DELTAS, WEIGHTS, NoConfig, Reply, TrainTask
from fedcxr.pipeline.protocols.target_combine import CombineSpec, CombineTask


def _task(**extra) -> TrainTask:
    return TrainTask.build(**{"round": 3, "seed": 0, "role": "source", "head_classes": ["edema", "pneumonia"],
                              "param_classes": ["edema", "pneumonia"], "lr": 1e-3, "batch_size": 8, **extra})


def _state() -> dict:
    return {"conv.weight": torch.randn(4, 1, 3, 3), "bn.num_batches_tracked": torch.tensor(7),
            "head.bias": torch.tensor([0.5, -1.0])}


def test_task_round_trip_keeps_every_tensor_and_the_config():
    state = _state()
    config = _task(labeled=0.25, dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-5})
    params, meta = encode_task("train", state, config, runner={"image_size": 32}, run="abc")
    assert all(isinstance(v, np.ndarray) for v in params.values())
    task = decode_task(params, meta)
    assert task["task"] == "train" and task["config"] == config and task["run"] == "abc"
    assert isinstance(task["config"].labeled, float)
    assert task["runner"] == {"image_size": 32}
    for key, value in state.items():
        assert torch.equal(task["params"][key], value) and task["params"][key].dtype == value.dtype


def test_a_method_tasks_config_travels_as_its_module_types_it_and_is_parsed_by_that_type():
    """A method's own task (GP's train_combine) carries its share of the envelope; the wire keeps it a
    mapping of JSON values, and the site runner parses it with the type the method declares."""
    spec = CombineSpec.build(rule="fedgp", auto=True, beta=0.5, n_sources=[40, 12], n_batches=[5, 2], bs_source=8,
                             bs_target=4, lr_source=1e-3, lr_target=2e-4, epochs_source=1, epochs_target=1)
    config = CombineTask.extend(_task(labeled=0.25), combine=spec)
    params, meta = encode_task("train_combine", _state(), config, runner={}, run="abc")
    task = decode_task(params, meta)
    assert task["config"] == config.to_dict()
    parsed = CombineTask.from_dict(task["config"])
    assert parsed == config and parsed.combine.n_sources == (40, 12)
    meta[META_KEY]["config"] = "not a mapping"
    with pytest.raises(WireError, match="expected a mapping"):
        decode_task(params, meta)


def test_task_without_params_decodes_to_none():
    params, meta = encode_task("metadata", None, {}, runner={}, run="r")
    assert params == {} and decode_task(params, meta)["params"] is None


def test_task_from_another_fedcxr_version_is_refused_with_a_hint():
    params, meta = encode_task("metadata", None, None, runner={}, run="r")
    meta[META_KEY]["version"] = 99
    with pytest.raises(WireError, match="same fedcxr version"):
        decode_task(params, meta)


def test_reply_round_trip():
    reply = Reply(site="a", params=_state(), n_samples=40, n_batches=3, class_set=["edema"],
                  metrics={"loss": 0.25, "auroc": {"edema": float("nan")}, "n": np.int64(3)},
                  extra={"batch_updates": torch.ones(3, 5)})
    params, meta = encode_reply(reply)
    back = decode_reply("a", params, meta)
    assert back.n_samples == 40 and back.n_batches == 3 and back.class_set == ["edema"]
    assert back.metrics["loss"] == 0.25 and math.isnan(back.metrics["auroc"]["edema"]) and back.metrics["n"] == 3
    assert torch.equal(back.extra["batch_updates"], torch.ones(3, 5))
    assert all(torch.equal(back.params[k], v) for k, v in reply.params.items())


def test_metadata_reply_without_params():
    params, meta = encode_reply(Reply(site="a", n_samples=5, class_set=["edema"], metrics={"n_train": 5}))
    assert decode_reply("a", params, meta).params is None


@pytest.mark.parametrize("bad, reason", [(float("nan"), "NaN"), (float("inf"), "infinite")])
def test_non_finite_parameters_are_refused_with_the_entry_named(bad, reason):
    state = _state()
    state["conv.weight"][0, 0, 0, 0] = bad
    params, meta = encode_reply(Reply(site="a", params=state, n_samples=1))
    with pytest.raises(WireError, match=rf"conv\.weight.*{reason}"):
        decode_reply("a", params, meta)


def test_non_finite_extra_tensors_are_refused():
    params, meta = encode_reply(Reply(site="a", params=_state(), extra={"batch_updates": torch.full((2, 2), float("nan"))}))
    with pytest.raises(WireError, match="extra tensors"):
        decode_reply("a", params, meta)


@pytest.mark.parametrize("field, value, match", [
    ("n_samples", -1, "n_samples"),
    ("n_batches", 2.5, "n_batches"),
    ("class_set", "edema", "class_set"),
    ("metrics", {"loss": np.zeros(3)}, "metrics"),
    ("patient_ids", ["p1"], "unexpected reply fields"),
])
def test_malformed_reply_fields_are_refused(field, value, match):
    params, meta = encode_reply(Reply(site="a", params=_state(), n_samples=1))
    meta[META_KEY][field] = value
    with pytest.raises(WireError, match=match):
        decode_reply("a", params, meta)


def test_stray_or_non_numeric_arrays_are_refused():
    params, meta = encode_reply(Reply(site="a", params=_state(), n_samples=1))
    with pytest.raises(WireError, match="unexpected parameter entries"):
        decode_reply("a", {**params, "images": np.zeros((2, 8, 8))}, meta)
    with pytest.raises(WireError, match="not a number array"):
        decode_reply("a", {**params, "p/names": np.array(["p00001"])}, meta)


def test_error_reply_carries_only_the_exception_type():
    params, meta = encode_error(FileNotFoundError("/data/patient00042/study1/view1.jpg missing"))
    assert params == {} and "patient00042" not in repr(meta)
    with pytest.raises(WireError, match="FileNotFoundError"):
        decode_reply("a", params, meta)


def test_bfloat16_is_refused_before_sending():
    with pytest.raises(WireError, match="bfloat16"):
        encode_reply(Reply(site="a", params={"w": torch.zeros(2, dtype=torch.bfloat16)}))


# --------------------------------------------------------------------------- replies of differences (privacy.filters)


def _sent_and_trained():
    sent = {"conv.weight": torch.randn(4, 1, 3, 3), "bn.num_batches_tracked": torch.tensor(7),
            "head.weight": torch.randn(2, 4), "head.bias": torch.tensor([0.5, -1.0])}
    trained = {k: (v + 0.25 if v.is_floating_point() else v + 1) for k, v in sent.items()}
    trained["head.weight"] = torch.randn(1, 4)  # a head of another shape goes whole
    return sent, trained


def test_a_reply_of_differences_carries_updates_and_decodes_to_the_trained_values():
    sent, trained = _sent_and_trained()
    params, meta = encode_reply(Reply(site="a", params=trained, n_samples=3, n_batches=2), reference=sent)
    assert sorted(params) == ["d/conv.weight", "d/head.bias", "p/bn.num_batches_tracked", "p/head.weight"]
    assert np.allclose(params["d/conv.weight"], 0.25)
    reply = decode_reply("a", params, meta, reference=sent)
    assert reply.params.keys() == trained.keys() and "excluded" not in reply.metrics
    for key, value in trained.items():
        assert torch.allclose(reply.params[key].double(), value.double(), atol=1e-6)
        assert reply.params[key].dtype == value.dtype


def test_an_entry_removed_by_a_filter_keeps_the_sent_value_and_is_named():
    sent, trained = _sent_and_trained()
    params, meta = encode_reply(Reply(site="a", params=trained, n_samples=3, n_batches=2), reference=sent)
    del params["d/conv.weight"]  # what NVFLARE's ExcludeVars does to the reply
    reply = decode_reply("a", params, meta, reference=sent)
    assert torch.equal(reply.params["conv.weight"], sent["conv.weight"])
    assert reply.metrics["excluded"] == ["conv.weight"]


def test_a_reply_of_differences_is_refused_without_keys_or_with_unlisted_entries():
    sent, trained = _sent_and_trained()
    params, meta = encode_reply(Reply(site="a", params=trained), reference=sent)
    with pytest.raises(WireError, match="sent no parameters"):
        decode_reply("a", params, meta, reference=None)
    stray = dict(params, **{"d/other.weight": np.zeros(2, np.float32)})
    with pytest.raises(WireError, match="not among the reply's keys"):
        decode_reply("a", stray, meta, reference=sent)
    del meta[META_KEY]["keys"]
    with pytest.raises(WireError, match="needs 'keys'"):
        decode_reply("a", params, meta, reference=sent)


def test_a_task_says_whether_it_wants_differences():
    wanted = encode_task("train", _state(), _task(), runner={}, run="r", reply_weight_type=DELTAS)
    assert decode_task(*wanted)["reply_weight_type"] == DELTAS
    assert decode_task(*encode_task("train", _state(), _task(), runner={}, run="r"))["reply_weight_type"] == WEIGHTS


def test_a_reply_says_whether_it_carries_weights_or_differences():
    sent, trained = _sent_and_trained()
    assert encode_reply(Reply(site="a", params=trained))[1][META_KEY]["weight_type"] == WEIGHTS
    params, meta = encode_reply(Reply(site="a", params=trained), reference=sent)
    assert meta[META_KEY]["weight_type"] == DELTAS
    assert decode_reply("a", params, meta, reference=sent).weight_type == WEIGHTS  # turned back into weights
    meta[META_KEY]["weight_type"] = WEIGHTS  # differences passed off as weights would be a model near zero
    with pytest.raises(WireError, match="weights carries difference entries"):
        decode_reply("a", params, meta, reference=sent)


@pytest.mark.parametrize("change, match", [
    (lambda c: {**c, "lr_boost": 10}, r"unknown key\(s\) \['lr_boost'\]"),
    (lambda c: {k: v for k, v in c.items() if k != "batch_size"}, r"missing key\(s\) \['batch_size'\]"),
    (lambda c: {**c, "optimizer": "lbfgs"}, r"optimizer: 'lbfgs' is not one of"),
    (lambda c: {**c, "lr": "1e-3"}, r"lr: '1e-3' is not a finite number"),
    (lambda c: {**c, "head_classes": "edema"}, r"head_classes: expected a list"),
])
def test_a_task_with_an_unknown_or_missing_key_or_a_wrong_value_is_refused_at_the_site(change, match):
    params, meta = encode_task("train", _state(), _task(), runner={}, run="r")
    meta[META_KEY]["config"] = change(meta[META_KEY]["config"])
    with pytest.raises(WireError, match=match):
        decode_task(params, meta)


def test_the_server_never_sends_a_config_of_another_task():
    with pytest.raises(ValueError, match="task 'train'"):
        encode_task("train", _state(), NoConfig(), runner={}, run="r")


def test_an_integer_entry_a_filter_turned_into_a_float_comes_back_as_sent():
    sent, trained = _sent_and_trained()
    params, meta = encode_reply(Reply(site="a", params=trained), reference=sent)
    params["p/bn.num_batches_tracked"] = np.float64(8.0)  # NVFLARE's PercentilePrivacy on a 0-dim int
    reply = decode_reply("a", params, meta, reference=sent)
    assert reply.params["bn.num_batches_tracked"].dtype == torch.int64
    assert int(reply.params["bn.num_batches_tracked"]) == 8


# --------------------------------------------------------------------------- cross-site evaluation summaries


def _summary() -> dict:
    row = {"class": "edema", "auroc": 0.71, "ci_low": 0.6, "ci_high": 0.8, "n": 40, "n_pos": 9,
           "prevalence": 0.225, "reason": None, "ci_skipped": 0}
    return {"split": "test", "model_owner": "SRV_server", "n": 40,
            "summary": {"n_rows": 40, "n_patients": 31, "per_class": [row], "mean_auroc": 0.71,
                        "subgroups": {"sex": {"groups": {"F": {"n_rows": 21, "per_class": [row]}},
                                              "skipped": [{"value": "80+", "n_rows": 3,
                                                           "reason": "fewer than 20 rows"}]}}}}


def _validate_reply(metrics: dict) -> tuple[dict, dict]:
    return encode_reply(Reply(site="a", params=None, n_samples=40, class_set=["edema"], metrics=metrics))


def test_a_cross_site_summary_passes_the_payload_scan():
    params, meta = _validate_reply(_summary())
    assert decode_reply("a", params, meta, task="validate").metrics["summary"]["n_rows"] == 40


@pytest.mark.parametrize("leak, what", [
    (lambda s: s["summary"].update(row_key=["3f2a"]), "key 'row_key'"),
    (lambda s: s["summary"].update(patient_key="x"), "key 'patient_key'"),
    (lambda s: s["summary"].update(prob__edema=[0.1, 0.9]), "key 'prob__edema'"),
    (lambda s: s["summary"].update(probs=[0.2]), "key 'probs'"),
    (lambda s: s["summary"]["per_class"][0].update(reason="/data/site_a/images/p0001.png"), "looks like a path"),
    (lambda s: s["summary"]["per_class"][0].update(reason=r"C:\scans\1.dcm"), "looks like a path"),
    (lambda s: s["summary"].update(worst=["patient 9f86d081884c7d65"]), "long hex string"),
    (lambda s: s["summary"].update(scores=[0.5] * 65), "a list of 65 values"),
])
def test_the_payload_scan_refuses_predictions_ids_and_paths(leak, what):
    summary = _summary()
    leak(summary)
    params, meta = _validate_reply(summary)
    with pytest.raises(WireError, match=what.replace("(", r"\(")):
        decode_reply("a", params, meta, task="validate")
    decode_reply("a", params, meta)  # other tasks' metrics are not summaries: not scanned this way


def test_a_validate_reply_carrying_tensors_is_refused():
    params, meta = encode_reply(Reply(site="a", params={"w": torch.zeros(3)}, n_samples=1, metrics=_summary()))
    with pytest.raises(WireError, match="summaries only"):
        decode_reply("a", params, meta, task="validate")


# --------------------------------------------------------------------------- sealed replies (privacy.secure_aggregation)

SEALED = {"sealed.model.data": torch.arange(12, dtype=torch.uint8), "sealed.model.layout": torch.tensor([123],
                                                                                                     dtype=torch.uint8)}


def test_a_train_task_of_the_former_envelope_is_refused_as_another_version():
    """Version 4: the methods' fields left ``train`` for their own tasks; a version-3 server's FedProx task
    (``train`` carrying ``prox_mu``) is refused with the version hint, never trained as plain FedAvg."""
    params, meta = encode_task("train", _state(), _task(), runner={}, run="r")
    assert meta[META_KEY]["version"] == 4
    meta[META_KEY].update(version=3, config={**meta[META_KEY]["config"], "prox_mu": 0.01})
    with pytest.raises(WireError, match=r"task format version 3 \(this site speaks 4\).*same fedcxr version"):
        decode_task(params, meta)


def test_a_task_says_whether_it_wants_sealed_replies_and_a_site_of_another_version_refuses_it():
    params, meta = encode_task("train", _state(), _task(), runner={}, run="r", seal="he")
    assert decode_task(params, meta)["seal"] == "he" and meta[META_KEY]["version"] >= 3  # seal: since version 3
    assert decode_task(*encode_task("train", _state(), _task(), runner={}, run="r"))["seal"] is None
    meta[META_KEY]["seal"] = "rot13"
    with pytest.raises(WireError, match="seal 'rot13' is not one of"):
        decode_task(params, meta)
    with pytest.raises(ValueError, match="seal must be one of"):
        encode_task("train", _state(), _task(), runner={}, run="r", seal="rot13")
    meta[META_KEY].update(seal="he", reply_weight_type=DELTAS)
    with pytest.raises(WireError, match="asking for a sealed reply asks for differences too"):
        decode_task(params, meta)


def test_a_reply_to_a_sealed_task_holds_sealed_entries_only():
    reply = Reply(site="a", params=dict(SEALED), n_samples=8, n_batches=2)
    params, meta = encode_reply(reply)
    decoded = decode_reply("a", params, meta, task="train", sealed=True)
    assert torch.equal(decoded.params["sealed.model.data"], SEALED["sealed.model.data"])
    clear, meta_clear = encode_reply(Reply(site="a", params={**SEALED, "head.bias": torch.zeros(2)}, n_samples=8))
    with pytest.raises(WireError, match=r"sent \['head.bias'\] in the clear in reply to a task asking for sealed"):
        decode_reply("a", clear, meta_clear, task="train", sealed=True)
    extra, meta_extra = encode_reply(Reply(site="a", params=dict(SEALED), extra={"scaffold_dc.w": torch.zeros(2)}))
    with pytest.raises(WireError, match=r"sent \['x/scaffold_dc.w'\] in the clear"):
        decode_reply("a", extra, meta_extra, task="train", sealed=True)
    with pytest.raises(WireError, match="a sealed reply to a task that asked for a plain one"):
        decode_reply("a", params, meta, task="train")
    summary, meta_summary = encode_reply(Reply(site="a", metrics={"mean_auroc": 0.7}))
    assert decode_reply("a", summary, meta_summary, task="evaluate", sealed=True).params is None
