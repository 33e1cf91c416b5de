"""The hospital side of a FLARE run without FLARE: its own configuration, and local state across restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedcxr.flare.client import FlareSite, SiteConfig, find_site_config, load_site_config

SETTINGS = {"model": {"backbone": "resnet_tiny", "hidden": 16, "weights": None, "classes": None},
            "image_size": 32, "augment": False, "num_workers": 0, "device": "cpu"}


# --------------------------------------------------------------------------- site configuration


def test_site_config_order_explicit_env_script_dir_workspace(tmp_path, monkeypatch):
    for name in ("explicit", "env", "script", "ws/local"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "fedcxr_site.json").write_text(json.dumps({"manifest_dir": name}))
    explicit = tmp_path / "explicit" / "fedcxr_site.json"
    monkeypatch.setenv("FEDCXR_SITE_CONFIG", str(tmp_path / "env" / "fedcxr_site.json"))
    args = dict(script_dir=tmp_path / "script", workspace=tmp_path / "ws")
    assert find_site_config(str(explicit), **args) == explicit
    assert find_site_config(None, **args) == tmp_path / "env" / "fedcxr_site.json"
    monkeypatch.delenv("FEDCXR_SITE_CONFIG")
    assert find_site_config(None, **args) == tmp_path / "script" / "fedcxr_site.json"
    assert find_site_config(None, script_dir=tmp_path / "none", workspace=tmp_path / "ws") == \
        tmp_path / "ws" / "local" / "fedcxr_site.json"


def test_missing_site_config_says_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDCXR_SITE_CONFIG", raising=False)
    with pytest.raises(FileNotFoundError, match=r"local/fedcxr_site\.json"):
        find_site_config(None, script_dir=None, workspace=tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_site_config(str(tmp_path / "nope.json"), script_dir=None, workspace=tmp_path)


def test_site_config_resolves_relative_paths_and_picks_this_sites_block(tmp_path):
    path = tmp_path / "sites.json"
    path.write_text(json.dumps({"sites": {"hospital_a": {"manifest_dir": "a", "cache_dir": "~/c", "device": "cpu"},
                                          "hospital_b": {"manifest_dir": "/data/b"}}}))
    cfg = load_site_config(path, "hospital_a")
    assert cfg.manifest_dir == tmp_path / "a" and cfg.device == "cpu" and cfg.cache_dir == Path.home() / "c"
    assert load_site_config(path, "hospital_b").manifest_dir == Path("/data/b")
    with pytest.raises(ValueError, match="no entry for site 'hospital_c'"):
        load_site_config(path, "hospital_c")


def test_site_config_refuses_unknown_keys_and_needs_a_manifest(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"manifest_dir": "a", "manifest": "typo"}))
    with pytest.raises(ValueError, match="unknown key"):
        load_site_config(path, "x")
    path.write_text(json.dumps({"cache_dir": "c"}))
    with pytest.raises(ValueError, match="manifest_dir"):
        load_site_config(path, "x")


# --------------------------------------------------------------------------- local state across restarts


def _theta0_and_bn_keys(classes):
    from fedcxr.models.network import CXRNet, bn_keys

    torch.manual_seed(0)
    model = CXRNet(classes, backbone="resnet_tiny", hidden=16, aux_tasks={})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, list(bn_keys(model))


def _train_config(r, classes, local_keys):
    from fedcxr.pipeline.messages import TrainTask

    return TrainTask.build(round=r, seed=0, role="source", head_classes=classes, param_classes=classes, lr=1e-2,
                           batch_size=8, epochs=1, steps=2, local_keys=local_keys)


def test_restarted_site_restores_local_state_of_the_right_round(tiny_manifests, tmp_path):
    """FedBN: a site killed after round 1 (before the server checkpointed it) resumes round 1 from round 0."""
    from fedcxr.flare.client import SiteConfig

    site_cfg = SiteConfig(manifest_dir=tiny_manifests / "nih_style", cache_dir=tmp_path / "cache",
                          state_dir=tmp_path / "state")
    first = FlareSite("nih_style", site_cfg, tmp_path)
    classes = first.runner_for(SETTINGS, "run1").class_set
    theta0, bn = _theta0_and_bn_keys(classes)
    first.handle("train", theta0, _train_config(0, classes, bn), SETTINGS, "run1")
    after_round0 = first.runner_for(SETTINGS, "run1").get_local_state()
    first.handle("train", theta0, _train_config(1, classes, bn), SETTINGS, "run1")
    after_round1 = first.runner_for(SETTINGS, "run1").get_local_state()
    assert set(after_round0) == set(bn) and not torch.equal(after_round0[bn[0]], after_round1[bn[0]])
    assert sorted(p.name for p in (tmp_path / "state" / "run1").iterdir()) == ["round_0000.pt", "round_0001.pt"]

    again = FlareSite("nih_style", site_cfg, tmp_path)  # a new client process (server resumed at round 1)
    again.handle("metadata", None, {}, SETTINGS, "run1")  # a resumed server asks for metadata first
    seen = {}
    runner = again.runner_for(SETTINGS, "run1")
    original = runner.handle

    def spy(task, params, config):
        seen["state"] = runner.get_local_state()
        return original(task, params, config)

    runner.handle = spy
    again.handle("train", theta0, _train_config(1, classes, bn), SETTINGS, "run1")
    assert all(torch.equal(seen["state"][k], after_round0[k]) for k in bn)
    after_again = again.runner_for(SETTINGS, "run1").get_local_state()
    assert all(torch.equal(after_again[k], after_round1[k]) for k in bn), "the repeated round must match"

    evaluating = FlareSite("nih_style", site_cfg, tmp_path)  # evaluation after round 1 wants round 1's state
    reply = evaluating.handle("local_state", None, {}, SETTINGS, "run1")
    assert all(torch.equal(reply.params[k], after_round1[k]) for k in bn)
    other = FlareSite("nih_style", site_cfg, tmp_path).handle("local_state", None, {}, SETTINGS, "other-run")
    assert other.params == {}, "state is kept per experiment"


def test_every_task_that_trains_saves_the_site_state(tiny_manifests, tmp_path):
    """The methods' tasks that train (GP's train_gp/train_combine, FACT's, the surgical warm-up, SCAFFOLD's,
    ...) must survive a restart: each method's module declares it per task, and the site's runner
    answers exactly those tasks; the client saves after them."""
    from fedcxr.flare.client import CLIENT_TASKS, changes_state
    from fedcxr.pipeline.protocols.methods import site_tasks

    site_cfg = SiteConfig(manifest_dir=tiny_manifests / "nih_style", cache_dir=tmp_path / "cache", device="cpu")
    runner = FlareSite("nih_style", site_cfg, tmp_path).runner_for(SETTINGS, "run1")
    assert set(runner.tasks) == {"metadata", "train", "evaluate", *site_tasks(), *CLIENT_TASKS}
    changing = {t for t in runner.tasks if changes_state(runner, t)}
    assert {"train", "train_gp", "train_combine", "fact_head", "fact_target", "warmup_head", "train_from_warm",
            "train_scaffold", "train_prox", "finetune_pass", "train_ditto", "train_fedrep", "train_apfl",
            "finetune_babu"} == changing
    assert set(runner.tasks) - changing == {"metadata", "evaluate", "validate"}
    assert not changes_state(runner, "local_state")


def test_a_site_runs_a_method_of_ones_own_only_from_the_jobs_custom_code_or_its_allow_list(tmp_path, monkeypatch):
    """SECURITY.md, "Methods from files": the server's config may name a method; a site loads it only
    from its app's custom folder (code FLARE deployed because the site's policy allowed the job's custom
    code) or as a module its own configuration allows — never a path, never a module found elsewhere."""
    from fedcxr.flare.client import site_method

    example = Path(__file__).resolve().parents[2] / "examples" / "methods" / "feddyn.py"
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "feddyn.py").write_text(example.read_text())
    assert site_method(None, custom) is None and site_method("FedAvg", custom) is None  # fedcxr's own
    spec = site_method("feddyn:FedDyn", custom)
    assert spec.protocol.__name__ == "FedDynProtocol" and "train_feddyn" in spec.protocol.site_tasks
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "evil.py").write_text("raise SystemExit('ran code the site never allowed')\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    for reference in (f"{elsewhere / 'evil.py'}:X", "evil:X", "os.path:join", "../evil:X"):
        with pytest.raises(PermissionError, match="this site runs fedcxr's methods, methods shipped in the job"):
            site_method(reference, custom)
    with pytest.raises(PermissionError):
        site_method("feddyn:FedDyn", None)  # no custom folder known: nothing of the user's own runs
    (elsewhere / "allowed_method.py").write_text(example.read_text())
    assert site_method("allowed_method:FedDyn", custom, ("allowed_method",)).protocol.__name__ == "FedDynProtocol"


def test_allow_methods_in_a_site_config_is_a_list_of_module_names(tmp_path):
    path = tmp_path / "fedcxr_site.json"
    path.write_text(json.dumps({"manifest_dir": "m", "allow_methods": ["lab.methods.feddyn"]}))
    assert load_site_config(path, "a").allow_methods == ("lab.methods.feddyn",)
    path.write_text(json.dumps({"manifest_dir": "m", "allow_methods": ["/opt/methods/x.py"]}))
    with pytest.raises(ValueError, match="allow_methods"):
        load_site_config(path, "a")


# --------------------------------------------------------------------------- sealed models (privacy.secure_aggregation)


def _sealing_site(tmp_path, he_contexts, **site) -> FlareSite:
    from fedcxr.flare.client import SiteConfig

    out = FlareSite("a", SiteConfig(manifest_dir=tmp_path, source="site.json", **site), tmp_path)
    out._he_context = he_contexts.client  # what site_context() loads from the site's FLARE startup kit
    return out


def test_a_site_seals_what_it_sends_keeps_its_local_entries_and_opens_what_it_gets(tmp_path, he_contexts):
    from fedcxr.flare.client import seal_if_asked
    from fedcxr.flare.sealing import is_sealed, open_sealed, plain_part
    from fedcxr.pipeline.messages import NoConfig, Reply

    site = _sealing_site(tmp_path, he_contexts)
    theta, bn = _theta0_and_bn_keys(["edema"])
    reply = Reply(site="a", params=dict(theta), n_samples=4, n_batches=2)
    task = {"seal": "he", "config": _train_config(0, ["edema"], bn)}
    assert seal_if_asked(site, reply, "train", task) > 0
    assert is_sealed(reply.params) and not plain_part(reply.params)
    assert set(open_sealed(reply.params, he_contexts.client)) == set(theta) - set(bn)  # BN never left the site
    local = Reply(site="a", params={k: theta[k] for k in bn})
    seal_if_asked(site, local, "local_state", {"seal": "he", "config": NoConfig()})
    assert sorted(local.params) == ["sealed.local.data", "sealed.local.layout"]
    opened, seconds = site.open_params(reply.params)
    assert seconds > 0 and set(opened) == set(theta) - set(bn)
    assert site.open_params(theta) == (theta, 0.0)
    with pytest.raises(ValueError, match="extra tensors .* cannot travel sealed"):
        seal_if_asked(site, Reply(site="a", params=dict(theta), extra={"scaffold_dc.w": torch.zeros(1)}), "train",
                      task)


def test_a_site_that_requires_secure_aggregation_never_sends_a_model_in_the_clear(tmp_path, he_contexts):
    from fedcxr.flare.client import seal_if_asked
    from fedcxr.pipeline.messages import Reply

    theta, bn = _theta0_and_bn_keys(["edema"])
    plain_task = {"seal": None, "config": _train_config(0, ["edema"], bn)}
    strict = _sealing_site(tmp_path, he_contexts, secure_aggregation="he")
    with pytest.raises(ValueError, match="asks for a model in the clear, but this site's configuration"):
        seal_if_asked(strict, Reply(site="a", params=dict(theta)), "train", plain_task)
    assert seal_if_asked(strict, Reply(site="a", metrics={"mean_auroc": 0.5}), "evaluate", plain_task) == 0.0
    relaxed = _sealing_site(tmp_path, he_contexts)
    kept = Reply(site="a", params=dict(theta))
    assert seal_if_asked(relaxed, kept, "train", plain_task) == 0.0 and kept.params.keys() == theta.keys()
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"manifest_dir": "m", "secure_aggregation": "he"}))
    assert load_site_config(path, "a").secure_aggregation == "he"
    path.write_text(json.dumps({"manifest_dir": "m", "secure_aggregation": "yes"}))
    with pytest.raises(ValueError, match="'secure_aggregation' is \"he\" or absent"):
        load_site_config(path, "a")


def test_a_site_without_a_startup_kit_says_where_its_key_comes_from():
    from fedcxr.flare.he_keys import site_context
    from fedcxr.flare.sealing import SealError

    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    with pytest.raises(SealError, match="client_context.tenseal of its FLARE startup kit"):
        site_context()
