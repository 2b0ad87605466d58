"""Keep rules: the registry, each rule's decision, argument checks, and selection by config."""

from __future__ import annotations

import re

import numpy as np
import pytest
from verl.protocol import DataProto

from recipe_dapo.dynamic_sampling import (
    DATAPROTO_OPS,
    KEEP_RULES,
    DynamicSampler,
    DynamicSamplingConfig,
    DynamicSamplingConfigError,
    group_statistics,
    register_keep_rule,
    resolve_keep_rule,
)
from recipe_dapo.dynamic_sampling.keep_rules import keep_rule_problems


def groups_of(*groups):
    """(ids, values) of groups given as lists of metric values: group k is named gk."""
    ids = [f"g{k}" for k, values in enumerate(groups) for _ in values]
    return ids, [v for values in groups for v in values]


# Success rates 0, 1/4, 1/2, 3/4, 1 with four responses each.
RATES = ([0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1])


def test_the_three_rules_are_registered_and_spread_is_the_default():
    assert {"spread", "band", "min_std"} <= set(KEEP_RULES)
    config = DynamicSamplingConfig.from_config({"enable": True, "metric": "acc"}, {}, train_batch_size=2)
    assert config.keep_rule == "spread" and config.keep_rule_args == {}
    stats = group_statistics(*groups_of(*RATES), keep_rule=config.keep_decision())
    assert stats.keep.tolist() == [False, True, True, True, False]


def test_band_keeps_success_rates_inside_the_bounds_included():
    stats = group_statistics(*groups_of(*RATES), keep_rule=resolve_keep_rule("band", {"low": 0.25, "high": 0.5}))
    assert stats.success_rate.tolist() == [0, 0.25, 0.5, 0.75, 1]
    assert stats.keep.tolist() == [False, True, True, False, False]


def test_band_defaults_are_point_two_to_point_eight():
    # 16 responses: rates 3/16 = 0.1875 (out), 4/16 = 0.25 (in), 12/16 = 0.75 (in), 13/16 = 0.8125 (out)
    groups = [[1] * k + [0] * (16 - k) for k in (3, 4, 12, 13)]
    stats = group_statistics(*groups_of(*groups), keep_rule=resolve_keep_rule("band"))
    assert stats.keep.tolist() == [False, True, True, False]


def test_band_on_the_score_metric_counts_responses_above_zero_as_right():
    # DAPO's score: +1 right, -1 wrong (an overlong penalty may lower it); 2 of 4 right -> rate 0.5
    stats = group_statistics(*groups_of([1, -1, 1, -1.5], [1, -1, -1, -1]), keep_rule=resolve_keep_rule("band"))
    assert stats.success_rate.tolist() == [0.5, 0.25]
    assert stats.keep.tolist() == [True, True]


def test_a_band_that_includes_zero_still_drops_groups_without_spread():
    stats = group_statistics(*groups_of(*RATES), keep_rule=resolve_keep_rule("band", {"low": 0.0, "high": 1.0}))
    assert stats.keep.tolist() == [False, True, True, True, False]


def test_min_std_keeps_groups_whose_population_std_reaches_the_threshold():
    # one right of four: std sqrt(3/16) = 0.433; two of four: 0.5
    stats = group_statistics(*groups_of(*RATES), keep_rule=resolve_keep_rule("min_std", {"min_std": 0.45}))
    np.testing.assert_allclose(stats.std, [0, np.sqrt(3 / 16), 0.5, np.sqrt(3 / 16), 0])
    assert stats.keep.tolist() == [False, False, True, False, False]


def test_std_and_success_rate_match_numpy_on_shuffled_rows():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, size=600)
    values = rng.normal(size=600) * 5 + 1e6  # a large offset: no cancellation in the variance
    stats = group_statistics(ids, values)
    for g, gid in enumerate(stats.group_ids):
        assert stats.std[g] == pytest.approx(np.std(values[ids == gid]), rel=1e-9)
        assert stats.success_rate[g] == pytest.approx(np.mean(values[ids == gid] > 0))


def test_single_response_groups_are_kept_whatever_the_rule():
    # the pair (rate 0.5, std 0.5) fails both rules; the single response (rate 1, std 0) is kept anyway
    for rule in (resolve_keep_rule("band", {"low": 0.7, "high": 0.9}), resolve_keep_rule("min_std", {"min_std": 1})):
        stats = group_statistics(["solo", "pair", "pair"], [1.0, 1.0, 0.0], keep_rule=rule)
        assert stats.keep.tolist() == [True, False]


def test_a_new_rule_is_one_function_plus_its_registration_and_the_config_selects_it():
    @register_keep_rule("mostly_right_test")
    def mostly_right(groups, *, above: float = 0.5):
        return groups.varied & (groups.success_rate > above)

    try:
        config = DynamicSamplingConfig.from_config(
            {"enable": True, "metric": "acc"},
            {"keep_rule": "mostly_right_test", "keep_rule_args": {"above": 0.6}},
            train_batch_size=2,
        )
        sampler = DynamicSampler(config, DATAPROTO_OPS)
        sampler.begin_step(1)
        ids, acc = groups_of(*RATES)
        batch = DataProto.from_dict(non_tensors={"uid": np.array(ids, dtype=object)})
        stats = sampler.add_round(batch, group_ids=np.array(ids, dtype=object), metric_values=acc)
        assert stats.keep.tolist() == [False, False, False, True, False]  # only 3/4 is above 0.6
        assert sampler.pooled_groups == 1
    finally:
        KEEP_RULES.pop("mostly_right_test")


def test_registering_a_name_twice_or_positional_parameters_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_keep_rule("band")(lambda groups: groups.varied)
    with pytest.raises(TypeError, match="keyword-only"):
        register_keep_rule("positional_test")(lambda groups, low: groups.varied)
    assert "positional_test" not in KEEP_RULES


def test_a_rule_returning_the_wrong_shape_is_refused_naming_the_rule():
    with pytest.raises(TypeError, match="one bool per group"):
        group_statistics(*groups_of(*RATES), keep_rule=lambda groups: np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match="one bool per group"):
        group_statistics(*groups_of(*RATES), keep_rule=lambda groups: groups.mean)


@pytest.mark.parametrize(
    "name, args, message",
    [
        ("bnad", {}, r"'bnad' is not a registered keep rule; did you mean 'band'\? the rules are band, min_std, spread"),
        ("band", {"lwo": 0.1}, r"keep_rule_args.lwo is not a parameter of keep rule 'band'; did you mean 'low'"),
        ("min_std", {}, r"keep rule 'min_std' needs dapo.dynamic_sampling.keep_rule_args.min_std \(no default\)"),
        ("band", {"low": 0.8, "high": 0.2}, r"low=0.8 is above high=0.2: did you swap them"),
        ("band", {"low": -0.1}, r"low=-0.1 is outside \[0, 1\]"),
        ("band", {"high": 80}, r"high=80 is outside \[0, 1\]"),
        ("min_std", {"min_std": -1}, r"min_std=-1 must be >= 0"),
        ("band", {"low": "a lot"}, r"keep_rule_args.low must be a finite number"),
        ("spread", {"tolerance": 1}, r"not a parameter of keep rule 'spread'; its parameters: none"),
    ],
)
def test_bad_rule_names_and_arguments_are_refused_with_the_key_and_a_hint(name, args, message):
    problems = keep_rule_problems(name, args)
    assert len(problems) == 1 and re.search(message, problems[0]), problems
    with pytest.raises(DynamicSamplingConfigError, match=message):
        DynamicSamplingConfig.from_config(
            {"enable": True, "metric": "acc"}, {"keep_rule": name, "keep_rule_args": args}, train_batch_size=2
        )


def test_the_composed_config_selects_the_rule_and_passes_its_arguments():
    from conftest import compose_recipe_config

    config = compose_recipe_config(
        ["dapo.dynamic_sampling.keep_rule=band", "+dapo.dynamic_sampling.keep_rule_args.low=0.5"]
    )
    resolved = DynamicSamplingConfig.from_config(
        config.algorithm.filter_groups, config.dapo.dynamic_sampling, train_batch_size=2
    )
    assert (resolved.keep_rule, resolved.keep_rule_args) == ("band", {"low": 0.5})
    stats = group_statistics(*groups_of(*RATES), keep_rule=resolved.keep_decision())
    assert stats.keep.tolist() == [False, False, True, True, False]  # 0.5 <= rate <= 0.8 (the default high)
