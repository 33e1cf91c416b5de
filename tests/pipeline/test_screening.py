"""Reply screening (fedcxr.pipeline.screening): hand-computed counts, step budgets and norm outliers."""

from __future__ import annotations

import pytest
import torch

from fedcxr.pipeline import screening as S


@pytest.mark.parametrize("value, fragment", [
    (10**400, "a 401-digit number, above any plausible count"),
    (10**12, "1000000000000, more than the 48 training rows"),
    (40.5, "40.5, not an integer count"),
    (float("inf"), "inf, not an integer count"),
    (-5, "-5, a negative count"),
    (True, "True, not an integer count"),
    ("48", "a str, not an integer count"),
])
def test_a_claimed_count_that_is_not_a_plausible_count_is_named_briefly(value, fragment):
    reason = S.count_problem(value, "n_samples", 48, "training rows the site reported")
    assert fragment in reason and len(reason) < 200


def test_counts_up_to_the_reported_one_pass():
    assert S.count_problem(48, "n_samples", 48) is None
    assert S.count_problem(0, "n_samples", 48) is None
    assert S.count_problem(2**53, "n_batches") is None and S.count_problem(2**53 + 1, "n_batches")


def test_planned_steps_is_the_step_budget_or_epochs_times_batches():
    assert S.planned_steps({"steps": 2, "batch_size": 16, "epochs": 5}, 48) == 2
    assert S.planned_steps({"steps": None, "batch_size": 16, "epochs": 2}, 33) == 6  # 2 × ⌈33/16⌉
    assert S.planned_steps({"lr": 1e-3}, 48) is None


def test_step_norm_divides_by_steps_and_learning_rate():
    assert S.step_norm(6.0, 1e-3, 3) == pytest.approx(2000.0)
    assert S.step_norm(6.0, 0.5, 0) == 12.0  # no step taken: counted as one


def test_norm_outliers_use_the_median_of_the_other_replies():
    stats = {"a": 1.0, "b": 1.2, "c": 0.9, "evil": 50.0}
    assert S.norm_outliers(stats, 10) == {"evil": (50.0, 1.0)}  # median of 1.0, 1.2, 0.9
    # two replies: nobody can tell which one is wrong — nothing refused (the absolute bound applies)
    assert S.norm_outliers({"a": 1.0, "evil": 1e30}, 10) == {}
    # a site that did not move cannot make the honest ones look huge (a zero median is no reference)
    assert S.norm_outliers({"a": 1.0, "z1": 0.0, "z2": 0.0}, 10) == {}
    # an even number of others: the mean of the middle two
    assert S.norm_outliers({"x": 31.0}, 10, others={"a": 1.0, "b": 5.0}) == {"x": (31.0, 3.0)}


def test_state_norm_counts_floating_entries_only():
    state = {"w": torch.tensor([3.0, 4.0]), "n": torch.tensor(100), "bn": torch.tensor([12.0])}
    assert S.state_norm(state) == 13.0
    assert S.state_norm(state, exclude=["bn"]) == 5.0


def test_a_negative_running_variance_is_named():
    state = {"bn.running_mean": torch.tensor([-3.0]), "bn.running_var": torch.tensor([1.0, -0.5, -1e-9])}
    assert S.negative_variance(state) == ("entry 'bn.running_var' has 2 negative value(s), and a variance "
                                          "cannot be negative")
    assert S.negative_variance({"bn.running_var": torch.tensor([0.0, 2.0]), "w": torch.tensor([-1.0])}) is None
