"""The NIH-derived demographic effects: the committed tables re-derive from NIH's real metadata,
fit it, and the fitting recovers a known truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from fedcxr.synth import nih_fit
from fedcxr.synth.demographics import cell_logits, mix_prevalence, tables

HERE = Path(nih_fit.__file__).resolve().parent
NIH_CLASSES = ["atelectasis", "cardiomegaly", "consolidation", "edema", "pleural_effusion", "pneumonia",
               "pneumothorax", "infiltration", "mass", "nodule", "emphysema", "fibrosis", "pleural_thickening",
               "hernia"]


@pytest.fixture(scope="module")
def nih_dir(shared_data) -> Path:
    path = shared_data / "nih-chestxray14"
    if not (path / "Data_Entry_2017_v2020.csv.gz").is_file():
        pytest.skip("../shared/data/nih-chestxray14 has no Data_Entry_2017_v2020.csv.gz")
    return path


@pytest.fixture(scope="module")
def nih_cells(nih_dir):
    return nih_fit.nih_cells(nih_dir)


@pytest.mark.shared
def test_committed_tables_re_derive_from_nih(nih_dir, tmp_path):
    """A fresh derivation from the real 112,120 rows gives the committed numbers to their last decimal."""
    findings, mix = nih_fit.derive(nih_dir)
    committed = pd.read_csv(HERE / nih_fit.FINDINGS_CSV)
    assert list(findings["finding"]) == list(committed["finding"]) == NIH_CLASSES
    assert list(findings.columns) == list(committed.columns)
    assert (findings["positives"] == committed["positives"]).all()
    terms = list(nih_fit.TERMS) + ["prevalence"]
    # one unit of the last kept decimal: a value on a rounding edge may round either way
    np.testing.assert_allclose(findings[terms].to_numpy(float), committed[terms].to_numpy(float),
                               rtol=0, atol=1.01 * 10.0 ** -nih_fit.DECIMALS)
    pd.testing.assert_frame_equal(mix, pd.read_csv(HERE / nih_fit.MIX_CSV))
    assert int(mix["images"].sum()) == 112_120
    # and the files as written are the committed files, byte for byte, but for such an edge
    nih_fit.write(findings, mix, tmp_path)
    assert (tmp_path / nih_fit.MIX_CSV).read_bytes() == (HERE / nih_fit.MIX_CSV).read_bytes()


@pytest.mark.shared
def test_committed_model_fits_nih_by_sex_age_and_view(nih_cells):
    """The fitted cells reproduce NIH's prevalences: by sex, by age bin and by view within 0.1
    points (measured: at most 0.03, hernia over 80), in every cell of 1,000 images or more within
    2 points (measured: 1.8, pneumothorax), overall within 0.1."""
    cells, findings = nih_cells
    n = cells["images"].to_numpy(float)
    index = (cells["sex"].to_numpy(), cells["age_bin"].to_numpy(), cells["view"].to_numpy())
    worst_cell = 0.0
    for finding in findings:
        fitted = cell_logits(finding)[index]
        k = cells[finding].to_numpy(float)
        for column in ("sex", "age_bin", "view"):
            for value in np.unique(cells[column]):
                sel = cells[column].to_numpy() == value
                observed = k[sel].sum() / n[sel].sum()
                model = (n[sel] * expit(fitted[sel])).sum() / n[sel].sum()
                assert abs(model - observed) < 0.001, (finding, column, value, model, observed)
        big = n >= 1000
        worst_cell = max(worst_cell, float(np.max(np.abs(expit(fitted[big]) - k[big] / n[big]))))
        observed_all = k.sum() / n.sum()
        assert abs(mix_prevalence(cell_logits(finding)) - observed_all) < 0.001, finding
    assert worst_cell < 0.02


def test_fit_recovers_known_coefficients():
    """Cells drawn from known coefficients with huge counts: the fit returns them (the ridge is negligible)."""
    rng = np.random.default_rng(0)
    truth = np.r_[-3.0, rng.normal(0, 0.6, len(nih_fit.TERMS) - 1)]
    cells = nih_fit.cell_grid()
    x = nih_fit.design(cells["sex"], cells["age_bin"], cells["view"])
    cells["images"] = 10_000_000
    cells["f"] = np.round(cells["images"] * expit(x @ truth))
    np.testing.assert_allclose(nih_fit.fit_finding(cells, "f"), truth, atol=2e-3)


def test_design_names_every_coefficient_once():
    cells = nih_fit.cell_grid()
    x = nih_fit.design(cells["sex"], cells["age_bin"], cells["view"])
    assert x.shape == (20, len(nih_fit.TERMS)) == (20, 16)
    assert np.linalg.matrix_rank(x) == 16  # identifiable: no term is a sum of others
    reference = (cells["sex"] == 0) & (cells["age_bin"] == nih_fit.REFERENCE_AGE_BIN) & (cells["view"] == 0)
    assert x[reference.to_numpy()].tolist() == [[1.0] + [0.0] * 15]  # F, 40-59, PA: the intercept alone


def test_cells_are_read_through_the_nih_adapter(tmp_path):
    """NIH's names are mapped by fedcxr's adapter (Effusion → pleural_effusion), and counted per cell."""
    rows = [("1_000.png", "Effusion|Hernia", 1, "85", "M", "AP"), ("1_001.png", "No Finding", 1, "86", "M", "PA"),
            ("2_000.png", "Effusion", 2, "30", "F", "PA"), ("3_000.png", "Edema", 3, "30", "F", "PA"),
            ("4_000.png", "Mass", 4, "12", "M", "LL")]  # a lateral: not a frontal cell
    lines = ["Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position"]
    lines += [f"{i},{f},0,{p},{a},{s},{v}" for i, f, p, a, s, v in rows]
    (tmp_path / "Data_Entry_2017_v2020.csv").write_text("\n".join(lines) + "\n")
    cells, findings = nih_fit.nih_cells(tmp_path)
    assert findings == NIH_CLASSES
    assert len(cells) == 20 and int(cells["images"].sum()) == 4
    old_man_ap = cells.loc[(cells["sex"] == 1) & (cells["age_bin"] == 4) & (cells["view"] == 1)].iloc[0]
    assert (old_man_ap["images"], old_man_ap["pleural_effusion"], old_man_ap["hernia"]) == (1, 1, 1)
    young_woman_pa = cells.loc[(cells["sex"] == 0) & (cells["age_bin"] == 1) & (cells["view"] == 0)].iloc[0]
    assert (young_woman_pa["images"], young_woman_pa["pleural_effusion"], young_woman_pa["edema"]) == (2, 1, 1)


def test_cli_names_a_folder_without_nih_metadata(tmp_path, capsys):
    assert nih_fit.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert str(tmp_path) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_committed_tables_load():
    findings, mix = tables()
    assert list(findings.index) == NIH_CLASSES
    assert mix.shape == (2, 5, 2) and mix.sum() == 112_120
