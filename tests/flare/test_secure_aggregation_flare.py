"""Secure aggregation on FLARE's simulator, end to end: the server sums what it cannot read, the sites open
it, and the encrypted run ends where the plain one does.

One simulator job (a job costs ~15-20 s whatever it runs) holds four tiny experiments: FedAvg_Finetune
plain, the same sealed, Ditto sealed (a personalised method: each site's whole model stays there) and
FedAvg + FedBN sealed (the plain twins of the last two run in-process: FLARE and in-process runs end on
the same weights, ``test_controller.py``). A test client wraps fedcxr's own to record, at
each site, the model it opened and the model it sealed, so each round's sealed sum is checked against
FedAvg of the very replies it summed (the simulator holds every key on one machine: POC mode keeps
the secret key out of the server's kit, ``test_secure_aggregation_poc.py``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fedcxr.pipeline import aggregate as agg

from ..conftest import tiny_config
from .test_secure_aggregation import BLIND, FINAL_TOLERANCE, ROUND_TOLERANCE, SGD, relative_gap

pytest.importorskip("nvflare")

HE_CLIENT = '''
"""fedcxr's FLARE client, recording at each site the models it opened and the models it sealed (test only)."""
import os
from pathlib import Path

import torch

from fedcxr.flare import client as flare_client

RECORD = Path(os.environ["FEDCXR_TEST_HE_RECORD"])
_handle, _seal = flare_client.FlareSite.handle, flare_client.FlareSite.seal_reply


def handle(self, task, params, config, settings, run):
    self._recording = (run[:8], config.get("round"), config.get("role"))
    if task == "train" and params is not None:
        torch.save(dict(params), RECORD / ("in-%s-%s-%s-%s.pt" % (run[:8], self.name, *self._recording[1:])))
    return _handle(self, task, params, config, settings, run)


def seal_reply(self, reply, task, config):
    if task == "train" and reply.params is not None:
        run, r, role = self._recording
        torch.save({"params": dict(reply.params), "n": reply.n_samples, "local": list(config.local_keys)},
                   RECORD / ("out-%s-%s-%s-%s.pt" % (run, self.name, r, role)))
    return _seal(self, reply, task, config)


flare_client.FlareSite.handle = handle
flare_client.FlareSite.seal_reply = seal_reply
flare_client.main()
'''


#: a personalised method whose server only sums: each site's personal model (the whole network) stays there
DITTO = {"strategy": "Ditto", "target": None, "eval_every": 0, "ditto": {"lam": 0.1}}


def _final(run_dir: Path) -> dict:
    return torch.load(Path(run_dir) / "final_model.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def he_job(tiny_manifests, tmp_path_factory):
    pytest.importorskip("tenseal", reason="TenSEAL (fedcxr[he]) cannot be imported on this platform")
    from fedcxr.flare.simulator import simulate_many
    from fedcxr.pipeline.config import config_fingerprint, load_config

    root = tmp_path_factory.mktemp("he_flare")
    base = tiny_config(tiny_manifests, root / "cache", defences=BLIND, **SGD)
    sealed = {"privacy": {"secure_aggregation": "he"}}
    fedbn = {"strategy": "FedAvg", "target": None, "backbone_aggregation": "fedbn", "eval_every": 0}
    cfgs = {"plain": load_config(data=base), "sealed": load_config(data={**base, **sealed}),
            "ditto": load_config(data={**base, **DITTO, **sealed}),
            "fedbn": load_config(data={**base, **fedbn, **sealed})}  # last: FLARE's persistor keeps its model
    script, record = root / "he_client.py", root / "record"
    script.write_text(HE_CLIENT)
    record.mkdir()
    dirs = {name: root / name for name in cfgs}
    payloads = simulate_many([(cfgs[n], dirs[n]) for n in cfgs], client_script=script, progress=False, timeout=600,
                             env={"FEDCXR_TEST_HE_RECORD": str(record)}, evaluation={"n_boot": 10})
    return SimpleNamespace(cfgs=cfgs, dirs=dirs, record=record, payloads=dict(zip(cfgs, payloads)), root=root,
                           runs={n: config_fingerprint(c)[:8] for n, c in cfgs.items()}, base=base)


def _recorded(job, kind: str, name: str) -> dict:
    """``{(site, round, role): record}`` of one experiment's opened (``in``) or sealed (``out``) models."""
    out = {}
    for path in job.record.glob(f"{kind}-{job.runs[name]}-*.pt"):
        _, _, site, r, role = path.stem.split("-")
        out[(site, int(r), role)] = torch.load(path, map_location="cpu", weights_only=True)
    return out


@pytest.mark.slow
def test_each_round_the_server_sums_exactly_fedavg_of_replies_it_never_read(he_job):
    sent, opened = _recorded(he_job, "out", "sealed"), _recorded(he_job, "in", "sealed")
    target = he_job.cfgs["sealed"].target
    gaps = []
    for r in range(he_job.cfgs["sealed"].rounds):
        sources = [v for (site, rr, role), v in sent.items() if rr == r and role == "source"]
        assert len(sources) == 2
        mean = agg.fedavg([s["params"] for s in sources], [float(s["n"]) for s in sources])
        gaps.append(relative_gap(opened[(target, r, "target")], mean))  # what the target opened: their sum
        if r:  # the sources open the target's sealed model of the round before
            gaps += [relative_gap(opened[(s, r, "source")], sent[(target, r - 1, "target")]["params"])
                     for s in he_job.cfgs["sealed"].source_sites()]
    assert max(gaps) < ROUND_TOLERANCE, gaps


@pytest.mark.slow
def test_the_encrypted_run_ends_where_the_plain_run_does_and_the_server_held_only_ciphertexts(he_job):
    from fedcxr.pipeline.checkpoints import load_tensors

    plain, sealed = _final(he_job.dirs["plain"]), _final(he_job.dirs["sealed"])
    assert not any(k.startswith("sealed.") for k in sealed["global"])  # opened with the rehearsal's site key
    assert relative_gap(sealed["global"], plain["global"]) < FINAL_TOLERANCE
    for path in sorted((he_job.dirs["sealed"] / "checkpoints").glob("round_*.pt")):
        state = load_tensors(path, "checkpoint")["state"]
        assert sorted(state["global"]) == ["sealed.model.data", "sealed.model.layout"]
    # FLARE's persistor got the job's last experiment (FedBN) as the server held it: sealed but θ0's BatchNorm
    persisted = torch.load(he_job.dirs["plain"] / "flare" / "FL_global_model.pt", weights_only=True)["model"]
    clear = {k for k in persisted if not k.startswith("sealed.")}
    assert "sealed.model.data" in persisted and clear == set(_final(he_job.dirs["fedbn"])["eval_local_keys"])
    keys = he_job.dirs["plain"] / "flare" / "he"
    assert stat.S_IMODE(os.stat(keys / "client_context.tenseal").st_mode) == 0o600
    rows = [json.loads(line) for line in (he_job.dirs["sealed"] / "metrics.jsonl").read_text().splitlines()]
    assert all(m["he_seconds"]["seal"] > 0 for row in rows for m in row["train"].values())
    assert all(row["val"][he_job.cfgs["sealed"].target]["mean_auroc"] is not None for row in rows)  # sites opened it
    report = json.loads((he_job.dirs["sealed"] / "report.json").read_text())
    assert not report.get("sites_without_predictions")


@pytest.mark.slow
def test_fedbn_keeps_batchnorm_at_the_sites_and_its_local_states_come_back_sealed(he_job, tmp_path):
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    cfg = he_job.cfgs["fedbn"]
    sealed_final = _final(he_job.dirs["fedbn"])
    plain_cfg = load_config(data={**he_job.base, "strategy": "FedAvg", "target": None,
                                  "backbone_aggregation": "fedbn", "eval_every": 0})
    run_experiment(plain_cfg, tmp_path / "plain", progress=False)
    plain_final = _final(tmp_path / "plain")
    assert relative_gap(sealed_final["global"], plain_final["global"]) < FINAL_TOLERANCE
    assert sorted(sealed_final["local_states"]) == sorted(cfg.site_name(s) for s in cfg.source_sites())
    for site, state in sealed_final["local_states"].items():
        assert set(state) == set(sealed_final["eval_local_keys"])
        assert relative_gap(state, {k: plain_final["local_states"][site][k] for k in state}) < FINAL_TOLERANCE
    sent = _recorded(he_job, "out", "fedbn")
    assert sent and all(set(v["local"]) == set(sealed_final["eval_local_keys"]) for v in sent.values())
    report = json.loads((he_job.dirs["fedbn"] / "report.json").read_text())
    assert not report.get("sites_without_predictions")


@pytest.mark.slow
def test_ditto_sums_the_global_models_and_each_sites_personal_model_comes_back_sealed(he_job, tmp_path):
    """Ditto's server averages the sites' global models only (``reads_each_update`` None): sealed, it ends
    where its in-process run does, the global model and every site's personal model alike."""
    from fedcxr.pipeline.config import load_config
    from fedcxr.pipeline.run_driver import run_experiment

    cfg = he_job.cfgs["ditto"]
    sealed_final = _final(he_job.dirs["ditto"])
    run_experiment(load_config(data={**he_job.base, **DITTO}), tmp_path / "plain", progress=False)
    plain_final = _final(tmp_path / "plain")
    assert relative_gap(sealed_final["global"], plain_final["global"]) < FINAL_TOLERANCE
    assert sorted(sealed_final["local_states"]) == sorted(cfg.site_name(s) for s in cfg.source_sites())
    assert set(sealed_final["eval_local_keys"]) == set(plain_final["eval_local_keys"])
    for site, state in sealed_final["local_states"].items():
        assert set(state) == set(sealed_final["eval_local_keys"])  # the personal model: every entry
        assert relative_gap(state, {k: plain_final["local_states"][site][k] for k in state}) < FINAL_TOLERANCE
    report = json.loads((he_job.dirs["ditto"] / "report.json").read_text())
    assert not report.get("sites_without_predictions")
