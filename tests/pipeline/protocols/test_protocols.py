"""Every method runs by its paper name through the in-process federation and gets evaluated."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from fedcxr.workflows.evaluate import evaluate_run
from fedcxr.evaluation.report import build_report
from fedcxr.evaluation.runs import load_predictions, load_run_info
from fedcxr.pipeline.config import load_config
from fedcxr.pipeline.predictions import write_predictions
from fedcxr.pipeline.run_driver import run_experiment
from fedcxr.pipeline.protocols import CENTRAL_SITE, REGISTRY, get_protocol

from ...conftest import tiny_config

ALL_METHODS = sorted(REGISTRY)

#: methods whose run is evaluated by the whole of ``fedcxr evaluate`` (report files and figures too):
#: one of each way a run's predictions are made (a global model, per-site heads, a pooled site).
#: The others build the same report from their own predictions without drawing the figures again
#: (the figures depend on the predictions, not on the method: ~0.7 s each, x27, in the fast tier)
FULL_EVALUATION = {"FedAvg_Finetune", "FL_Surgical", "PFL", "Central"}


def test_capabilities_are_declared_by_the_protocols():
    """What the driver, the in-process transport and the FLARE job need to know about a method is a
    property of its protocol: a pooled site (Central only) and per-site heads (FL_Surgical, PFL, and
    the personalised methods that keep their heads: FedPer, FedRep)."""
    assert {m: get_protocol(m).pooled_site for m in REGISTRY if get_protocol(m).pooled_site} == {
        "Central": CENTRAL_SITE}
    assert sorted(m for m in REGISTRY if get_protocol(m).per_site_heads) == ["FL_Surgical", "FedPer", "FedRep", "PFL"]


def test_no_module_outside_protocols_tests_a_method_name():
    """DESIGN §1: method names live in ``pipeline/protocols/`` only; a comparison with a method's name,
    or a collection of method names, anywhere else is a capability that belongs on the protocol.
    ``advice/`` is exempt: it reads the benchmarks' regime map, whose columns are method names (data)."""
    package = Path(__file__).resolve().parents[3] / "fedcxr"
    found = []
    for path in package.rglob("*.py"):
        if {"protocols", "advice"} & set(path.relative_to(package).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)
                         and c.value in REGISTRY]
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
                    isinstance(e, ast.Constant) and e.value in REGISTRY for e in node.elts):
                names = [e.value for e in node.elts]
            else:
                continue
            if names:
                found.append(f"{path.relative_to(package)}:{node.lineno} {names}")
    assert found == []


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_trains_and_evaluates(method, tiny_manifests, tmp_path):
    extra = {}
    if method in {"FedGP_Auto", "FedDA_Auto", "FedDA", "FedGP", "FedAvg_Finetune_GP", "FedAvg_Finetune_AuxInfo_GP"}:
        extra["warmup_rounds"] = 1  # one FedAvg warm-up round, then the projection round
    if method == "Finetune_Offline":
        extra["finetune_offline_epochs"] = 2  # the default 50 passes is the paper's, too slow here
    if method.startswith("FL") or method in {"PFL", "Individual", "Central"}:
        extra["backbone_aggregation"] = "fedbn" if method == "FL_Surgical" else "fedavg"
        extra["class_source"] = "union"
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy=method, rounds=2, **extra)
    run = run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    assert run["status"] == "finished"
    assert run["refused"] == []  # the default reply checks refuse nothing of honest sites (SECURITY S6)
    final = torch.load(tmp_path / "run" / "final_model.pt", map_location="cpu", weights_only=True)
    for tensor in final["global"].values():
        assert torch.isfinite(tensor.float()).all()
    if method in FULL_EVALUATION:
        report = evaluate_run(tmp_path / "run", split="test", n_boot=20)
    else:
        info = load_run_info(tmp_path / "run")
        write_predictions(tmp_path / "run", "test", device="cpu")
        report = build_report(load_predictions(tmp_path / "run", "test", info["classes"]), info,
                              split="test", n_boot=20, seed=0)
    assert set(report["sites"]) == set(run["eval_sites"])
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2


def test_auto_weighting_reports_betas_in_unit_interval(tiny_manifests, tmp_path):
    data = tiny_config(tiny_manifests, tmp_path / "cache", strategy="FedGP_Auto", rounds=1, warmup_rounds=0)
    run_experiment(load_config(data=data), tmp_path / "run", progress=False)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert set(row["betas"]) == {"nih_style", "chexpert_style"}
    assert all(0.0 <= b <= 1.0 for b in row["betas"].values())


class _PoisonTransport:
    """Wraps the in-process transport and puts NaN into one site's trained parameters."""

    def __init__(self, inner, poisoned: str):
        self.inner, self.poisoned = inner, poisoned
        self.site_names = inner.site_names

    def run(self, task, targets, params, config, *, per_site=None):
        replies = self.inner.run(task, targets, params, config, per_site=per_site)
        reply = replies.get(self.poisoned)
        if task == "train" and reply is not None and reply.params is not None:
            key = next(k for k, v in reply.params.items() if v.is_floating_point())
            reply.params[key] = torch.full_like(reply.params[key], float("nan"))
        return replies

    def local_states(self):
        return self.inner.local_states()


def _poisoned_run(tiny_manifests, tmp_path, poisoned, **overrides):
    from fedcxr.pipeline.inprocess import InProcessTransport, build_runners
    from fedcxr.pipeline.devices import resolve_device

    cfg = load_config(data=tiny_config(tiny_manifests, tmp_path / "cache", rounds=1, **overrides))
    runners = build_runners(cfg, resolve_device("cpu"), progress=False)
    transport = _PoisonTransport(InProcessTransport(runners), poisoned)
    return run_experiment(cfg, tmp_path / "run", progress=False, transport=transport)


def test_a_source_update_with_nan_is_rejected_and_recorded(tiny_manifests, tmp_path):
    run = _poisoned_run(tiny_manifests, tmp_path, "nih_style", strategy="FedAvg_Finetune_GP")
    assert any(m["site"] == "nih_style" and "rejected" in m.get("reason", "") for m in run["missed"])
    final = torch.load(tmp_path / "run" / "final_model.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(t.float()).all() for t in final["global"].values())


def test_a_target_update_with_nan_fails_the_round(tiny_manifests, tmp_path):
    from fedcxr.pipeline.protocols import RoundFailed

    with pytest.raises(RoundFailed, match="dicom_style"):
        _poisoned_run(tiny_manifests, tmp_path, "dicom_style", strategy="FedAvg_Finetune")


def test_every_protocol_module_has_a_test_module_named_after_it():
    """Tests mirror the package layout: ``protocols/<module>.py`` is tested in ``test_<module>.py`` here
    (a new method's module comes with its own tests)."""
    package = Path(__file__).resolve().parents[3] / "fedcxr" / "pipeline" / "protocols"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    tested = {p.stem[len("test_"):] for p in Path(__file__).parent.glob("test_*.py")}
    assert sorted(modules - tested) == []
