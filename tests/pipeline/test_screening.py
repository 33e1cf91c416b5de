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


def test_planned_steps_count_only_the_rows_a_task_lets_the_site_train_on():
    assert S.planned_steps({"steps": None, "batch_size": 16, "epochs": 1, "max_rows": 20}, 48_000) == 2


def test_bn_shift_is_measured_in_the_statistics_own_units():
    """Mean shift in standard deviations, variance change as a log-ratio, RMS over the channels."""
    ref = {"bn.running_mean": torch.tensor([0.0, 1.0]), "bn.running_var": torch.tensor([4.0, 1.0]),
           "bn.num_batches_tracked": torch.tensor(3), "w": torch.ones(2)}
    moved = {**ref, "bn.running_mean": torch.tensor([6.0, 1.0]), "bn.running_var": torch.tensor([4.0, 1.0])}
    keys = S.bn_stat_keys(ref)
    assert keys == ["bn.running_mean", "bn.running_var"]
    assert S.bn_shift(ref, moved, keys) == pytest.approx(((6 / 2) ** 2 / 2) ** 0.5, rel=1e-5)  # 3 σ in one of two
    e = torch.e
    grown = {**ref, "bn.running_var": torch.tensor([4.0 * e, 1.0])}  # a variance grown by e: log-ratio 1
    assert S.bn_shift(ref, grown, keys) == pytest.approx((1 / 2) ** 0.5, rel=1e-4)
    # hiding a mean shift behind a larger variance costs its log-ratio
    hidden = {**ref, "bn.running_mean": torch.tensor([600.0, 1.0]), "bn.running_var": torch.tensor([4e4, 1.0])}
    assert S.bn_shift(ref, hidden, keys) > 3
    assert S.bn_shift(ref, ref, keys) == 0.0 and S.bn_shift(ref, ref, S.bn_stat_keys(ref, exclude=keys)) is None


def test_a_size_must_be_plausible_and_within_the_declared_one():
    assert S.size_problem(10**8) is None and S.size_problem(48, declared=48) is None
    assert S.size_problem(10**8 + 1).endswith("more than any one site plausibly holds (100,000,000)")
    assert "more than the 48 the consortium declared" in S.size_problem(49, declared=48)
    assert "not an integer count" in S.size_problem(40.5)


def test_a_site_is_credited_at_most_its_share_of_the_consortiums_rows():
    sizes = {"a": 48_000, "b": 40, "c": 50, "d": 60}
    assert S.credited_rows(sizes, "a", 0.5) == 150  # all the others together
    assert S.credited_rows(sizes, "a", 0.25) == 50  # a quarter: a third of the others
    assert S.credited_rows(sizes, "b", 0.5) == 40 and S.credited_rows(sizes, "a", None) == 48_000
    assert S.credited_rows({"a": 48_000, "b": 40}, "a", 0.5) == 48_000  # two sites: no majority to protect


def test_capped_counts_lower_only_the_counts_above_their_share():
    honest = [40, 50, 60]
    assert S.capped_counts(honest, 0.5) is honest  # nothing above half: the very list
    assert S.capped_counts([48_000, 40, 50, 60], 0.5) == [150, 40, 50, 60]  # 150 / 300 = 0.5
    # water-filling: both large counts over 0.3, c = 0.3·30 / (1 − 2·0.3) = 22.5 (22.5 / 75 = 0.3), a count: 22
    assert S.capped_counts([1000, 900, 10, 10, 10], 0.3) == [22, 22, 10, 10, 10]
    assert S.capped_counts([100, 1, 1, 1], 0.2) == [1, 1, 1, 1]  # 0.2 × 4 < 1: equal weights, the closest
    assert S.capped_counts([48_000, 40], 0.5) == [48_000, 40] and S.capped_counts([9, 1, 1], None) == [9, 1, 1]


def test_a_refusal_pattern_needs_two_rounds_and_both_kinds_of_site():
    refused = [{"site": "evil", "round": 0}, {"site": "evil", "round": 1}, {"site": "odd", "round": 1}]
    assert S.refusal_pattern(refused, ["a", "evil", "odd"], range(2)) == {
        "rounds": 2, "always_refused": ["evil"], "never_refused": ["a"]}
    assert S.refusal_pattern(refused, ["a", "evil"], range(1)) is None  # one round says nothing
    assert S.refusal_pattern(refused, ["evil", "odd"], range(2)) is None  # nobody never refused
    assert S.refusal_pattern(refused, ["a", "evil"], range(3)) is None  # evil passed round 2


class _CountCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch functions and tensor methods called inside it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _network_states(seed: int):
    from fedcxr.models.network import network_from_config
    from fedcxr.vocab import CLASSES

    torch.manual_seed(seed)
    ref = network_from_config(list(CLASSES)[:2], {"backbone": "resnet_tiny", "hidden": 64}, {}).state_dict()
    g = torch.Generator().manual_seed(seed)
    moved = {k: (v + torch.randn(v.shape, generator=g) * 10.0 ** -(seed % 6)).to(v.dtype) if v.is_floating_point()
             else v.clone() for k, v in ref.items()}
    for k in moved:
        if k.endswith("running_var") and seed % 3 == 0:
            moved[k] = moved[k].abs()
    return ref, moved


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_a_replys_squared_entry_norms_from_one_whole_model_pass_are_the_per_entry_floats(seed):
    """Issue 31 item 4: :class:`UpdateNorms` computes every entry's ‖Δ_k‖² from one concatenated
    float64 vector; each is the float the per-entry arithmetic gives, bit for bit."""
    ref, moved = _network_states(seed)
    got = S.UpdateNorms().squares(ref, moved)
    want = {k: float(torch.sub(moved[k].to(torch.float64), v.to(torch.float64)).square().sum())
            for k, v in ref.items() if v.is_floating_point()}
    assert got == want and len(got) > 50


def test_a_replys_norms_and_bn_shift_take_a_few_whole_model_operations():
    """The point of the whole-model pass: per entry only views and its slice's sum (~4 torch calls:
    275 for resnet_tiny's 67 entries) instead of detach, convert, subtract, square, sum and float
    (402); per BatchNorm layer ~8 (101 for its 12) instead of ~23 (276)."""
    ref, moved = _network_states(1)
    norms, shifts, keys = S.UpdateNorms(), S.BnShifts(), S.bn_stat_keys(ref)
    norms.squares(ref, ref)  # the reference prepared once per round
    shifts.shift(ref, ref, keys)
    with _CountCalls() as counter:
        norms.squares(ref, moved)
    floating = sum(1 for v in ref.values() if v.is_floating_point())
    assert counter.calls < 5 * floating
    with _CountCalls() as counter:
        shifts.shift(ref, moved, keys)
    assert counter.calls < 12 * len(keys) / 2


def test_a_reply_with_an_entry_of_another_size_is_measured_entry_by_entry():
    ref = {"a": torch.zeros(3), "b": torch.zeros(2)}
    odd = {"a": torch.ones(3), "b": torch.ones(1)}  # broadcasts against the reference, as before
    assert S.UpdateNorms().squares(ref, odd) == {"a": 3.0, "b": 2.0}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bn_shifts_against_one_reference_are_bn_shifts_floats(seed):
    """:class:`BnShifts` (the reference's statistics prepared once, every channel at once) gives
    :func:`bn_shift`'s float for whole networks, a subset of layers, NaN (→ inf) and no layer at all."""
    ref, moved = _network_states(seed)
    keys = S.bn_stat_keys(ref)
    shifts = S.BnShifts()
    for subset in (keys, keys[3:], keys[:1], []):
        assert shifts.shift(ref, moved, subset) == S.bn_shift(ref, moved, subset)
    broken = {**moved, keys[0]: torch.full_like(moved[keys[0]], float("nan"))}
    assert shifts.shift(ref, broken, keys) == S.bn_shift(ref, broken, keys) == float("inf")


def test_a_running_mean_without_its_variance_is_measured_by_bn_shift_itself():
    ref = {"bn.running_mean": torch.tensor([0.0, 1.0]), "c.running_mean": torch.tensor([1.0]),
           "c.running_var": torch.tensor([2.0])}
    moved = {"bn.running_mean": torch.tensor([3.0, 1.0]), "c.running_mean": torch.tensor([2.0]),
             "c.running_var": torch.tensor([2.0])}
    keys = S.bn_stat_keys(ref)
    assert S.BnShifts().shift(ref, moved, keys) == S.bn_shift(ref, moved, keys)
