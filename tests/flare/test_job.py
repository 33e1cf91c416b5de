"""privacy.filters in the exported FLARE job: NVFLARE's own ExcludeVars / PercentilePrivacy on the sites' replies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("nvflare")

from fedcxr.errors import UserError  # noqa: E402
from fedcxr.flare.client import reply_model  # noqa: E402
from fedcxr.flare.job import export_job, filtered_tasks, result_filters  # noqa: E402
from fedcxr.flare.wire import decode_reply, encode_reply  # noqa: E402
from fedcxr.pipeline.config import load_config  # noqa: E402
from fedcxr.pipeline.messages import Reply  # noqa: E402

from ..conftest import tiny_config  # noqa: E402

FILTERS = [{"exclude_vars": "^head\\."}, {"percentile_privacy": {"percentile": 50, "gamma": 0.05}}]


def _cfg(manifests, tmp_path, **overrides):
    return load_config(data=tiny_config(manifests, tmp_path / "cache", **overrides))


def test_exported_job_puts_nvflare_filters_on_every_sites_update_replies(tiny_manifests, tmp_path):
    cfg = _cfg(tiny_manifests, tmp_path, privacy={"filters": FILTERS})
    job = export_job([(cfg, "", False)], tmp_path / "job")
    for site in ("nih_style", "chexpert_style", "dicom_style"):
        client = json.loads((job / f"app_{site}" / "config" / "config_fed_client.json").read_text())
        [block] = client["task_result_filters"]
        assert sorted(block["tasks"]) == filtered_tasks([cfg])
        assert {"train", "train_gp", "train_combine", "fact_target"} <= set(block["tasks"])  # every model update
        assert "train_scaffold" not in block["tasks"] and "warmup_head" not in block["tasks"]
        paths = [f["path"].rsplit(".", 1)[-1] for f in block["filters"]]
        assert paths == ["ExcludeVars", "PercentilePrivacy"]
        assert block["filters"][0]["args"]["exclude_vars"] == "^(?:d/|p/)(?:head\\.)"
        assert block["filters"][1]["args"] == {"percentile": 50.0, "gamma": 0.05, "data_kinds": ["WEIGHT_DIFF"]}
    plain = export_job([(_cfg(tiny_manifests, tmp_path), "", False)], tmp_path / "plain")
    client = json.loads((plain / "app_nih_style" / "config" / "config_fed_client.json").read_text())
    assert not client.get("task_result_filters")


def _site_filters(filters: list[dict], tiny_manifests, tmp_path) -> list:
    """The filters as a site builds them: from its app's exported config (path + args)."""
    import importlib

    job = export_job([(_cfg(tiny_manifests, tmp_path, privacy={"filters": filters}), "", False)], tmp_path / "job")
    client = json.loads((job / "app_nih_style" / "config" / "config_fed_client.json").read_text())
    out = []
    for spec in client["task_result_filters"][0]["filters"]:
        module, name = spec["path"].rsplit(".", 1)
        out.append(getattr(importlib.import_module(module), name)(**spec["args"]))
    return out


def _filtered(reply: Reply, sent: dict, filters: list) -> Reply:
    """What the server decodes after the site's NVFLARE result filters ran on the reply."""
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_common.utils.fl_model_utils import FLModelUtils

    params, meta = encode_reply(reply, reference=sent)
    shareable = FLModelUtils.to_shareable(reply_model(params, meta, diff=True, steps=reply.n_batches))
    for item in filters:
        shareable = item.process(shareable, FLContext())
    model = FLModelUtils.from_shareable(shareable)
    return decode_reply(reply.site, model.params, model.meta, reference=sent)


def test_the_exported_filters_act_on_updates_as_nvflare_defines_them(tiny_manifests, tmp_path):
    torch.manual_seed(0)
    sent = {"body.weight": torch.randn(50), "head.weight": torch.randn(2, 3), "head.bias": torch.zeros(2)}
    step = torch.linspace(-0.2, 0.2, 50)
    trained = {"body.weight": sent["body.weight"] + 2 * step, "head.weight": sent["head.weight"] + 1.0,
               "head.bias": torch.ones(2)}
    filters = _site_filters(FILTERS, tiny_manifests, tmp_path)
    out = _filtered(Reply(site="a", params=trained, n_samples=8, n_batches=2), sent, filters)
    # exclude_vars: the head never left the site; the server keeps the value it sent
    assert torch.equal(out.params["head.weight"], sent["head.weight"])
    assert sorted(out.metrics["excluded"]) == ["head.bias", "head.weight"]
    # percentile_privacy, per step (2 steps): the smaller half of |Δ| is dropped, the rest clipped at γ
    per_step = (out.params["body.weight"] - sent["body.weight"]) / 2
    small = step.abs() < float(np.percentile(step.abs().numpy(), 50))
    assert torch.all(per_step[small] == 0)
    assert torch.allclose(per_step[~small].abs(), torch.full_like(per_step[~small], 0.05), atol=1e-6)


def test_exclude_vars_by_name_list():  # the objects fedcxr builds, before export
    sent = {"a.weight": torch.zeros(3), "b.weight": torch.zeros(3)}
    trained = {"a.weight": torch.ones(3), "b.weight": torch.ones(3)}
    out = _filtered(Reply(site="a", params=trained, n_batches=1), sent,
                    result_filters([{"exclude_vars": ["b.weight"]}]))
    assert torch.equal(out.params["a.weight"], torch.ones(3)) and torch.equal(out.params["b.weight"], torch.zeros(3))


@pytest.mark.parametrize("filters,match", [
    ([{"clip": 1}], "filters.0"),
    ([{"exclude_vars": "head("}], "not a regular expression"),
    ([{"percentile_privacy": {"percentile": 120}}], "percentile in 0..100"),
    ([{"percentile_privacy": {"pct": 10}}], "percentile and gamma"),
])
def test_bad_filters_are_refused_naming_the_key(filters, match, tiny_manifests, tmp_path):
    with pytest.raises(UserError, match=match):
        _cfg(tiny_manifests, tmp_path, privacy={"filters": filters})


def test_jobs_refuse_filters_they_cannot_honour(tiny_manifests, tmp_path):
    a = _cfg(tiny_manifests, tmp_path, privacy={"filters": FILTERS})
    b = _cfg(tiny_manifests, tmp_path)
    with pytest.raises(UserError, match="differ between the experiments"):
        export_job([(a, "", False), (b, "", False)], tmp_path / "job")
    surgical = _cfg(tiny_manifests, tmp_path, strategy="FL_Surgical", privacy={"filters": FILTERS})
    with pytest.raises(UserError, match="heads of their own classes"):
        export_job([(surgical, "", False)], tmp_path / "job2")


@pytest.mark.slow  # one FLARE simulator job (~30-40 s)
def test_simulator_run_with_filters_keeps_excluded_entries_at_the_global_value(tiny_manifests, tmp_path):
    """One source and the target (two FLARE clients: each client process costs seconds to start)."""
    from fedcxr.flare.simulator import simulate
    from fedcxr.pipeline.run_driver import run_experiment

    cfg = _cfg(tiny_manifests, tmp_path, strategy="FedGP", sites=["nih_style"], rounds=1, eval_every=0,
               warmup_rounds=0, privacy={"filters": FILTERS})
    run_experiment(_cfg(tiny_manifests, tmp_path, strategy="FedGP", sites=["nih_style"], rounds=0), tmp_path / "init",
                   progress=False)
    simulate(cfg, tmp_path / "run", progress=False, timeout=600)
    init = torch.load(tmp_path / "init" / "final_model.pt", map_location="cpu", weights_only=True)["global"]
    final = torch.load(tmp_path / "run" / "final_model.pt", map_location="cpu", weights_only=True)["global"]
    for key in ("head.weight", "head.bias"):  # float sums of zero updates: equal up to rounding
        assert torch.allclose(final[key], init[key], rtol=0, atol=1e-6)
    moved = [k for k in final if final[k].is_floating_point() and not torch.allclose(final[k], init[k], atol=1e-6)]
    assert moved and not any(k.startswith("head.") for k in moved)
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert list(row["train"]) == ["nih_style"]
    for metrics in [*row["train"].values(), row["target"]]:  # the source's reply and the target's
        assert sorted(metrics["excluded"]) == ["head.bias", "head.weight"]
