"""The prediction-table contract: site, row_key, patient_key, label__/prob__ columns, no identifiers."""

from __future__ import annotations

import numpy as np
import pytest

from fedcxr.errors import UserError
from fedcxr.evaluation import runs


def test_id_columns_are_pseudonymous_keys():
    assert runs.ID_COLUMNS == ("site", "row_key", "patient_key")


def test_table_of_the_old_contract_is_a_user_error_that_says_what_changed(make_predictions):
    old = make_predictions(sites=("site-a",)).rename(columns={"row_key": "image_path", "patient_key": "patient_id"})
    with pytest.raises(UserError) as err:
        runs.check_predictions(old, ["edema"], "predictions/test.parquet")
    message = str(err.value)
    assert message.startswith("predictions/test.parquet: missing column(s) row_key, patient_key")
    assert "image_path/patient_id columns of the old contract" in message
    # the message names columns, never values
    assert "PX0" not in message and "img" not in message


def test_missing_keys_without_old_columns_get_no_hint(make_predictions):
    frame = make_predictions(sites=("site-a",)).drop(columns=["row_key"])
    with pytest.raises(UserError, match=r"missing column\(s\) row_key$"):
        runs.check_predictions(frame, ["edema"], "t.parquet")


@pytest.mark.parametrize("column,needs", [("patient_key", "patient-clustered DeLong"), ("row_key", "pair rows")])
def test_empty_keys_are_user_errors(make_predictions, column, needs):
    frame = make_predictions(sites=("site-a",))
    frame.loc[[3, 7], column] = None
    with pytest.raises(UserError, match=f"column {column} is empty on 2 row\\(s\\).*{needs}"):
        runs.check_predictions(frame, ["edema"], "t.parquet")


def test_valid_table_passes_with_float_columns(make_predictions):
    frame = make_predictions(sites=("site-a",))
    frame["label__edema"] = frame["label__edema"].astype("Float64")
    checked = runs.check_predictions(frame, ["edema"], "t.parquet")
    assert checked["label__edema"].dtype == np.float64 and len(checked) == len(frame)
