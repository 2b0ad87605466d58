"""Per-group statistics of the filter metric and the keep decision (paper eq. 11 by default), vectorised.

A *group* is the set of responses to one prompt instance (verl's ``uid``). DAPO trains only on groups
whose responses do not all score the same, because GRPO gives such groups a zero advantage:

    keep(g) = (max_i m_i - min_i m_i > tolerance)  or  |g| == 1

where m_i is the filter metric of response i. Single-response groups are kept, as in the reference
implementation (their spread is undefined, not zero). ``tolerance`` absorbs float noise, e.g. a score
summed from float32 token rewards: 0.1 + 0.2 and 0.3 are the same value. That is the ``spread`` keep rule;
``keep_rules`` holds the registry of rules (``docs/registries.md`` lists them).

A group of two or more responses whose spread is within ``tolerance`` is *uniform*; with common value v
(the group mean) it is

    solve_all   if v >  SOLVED_ABOVE (= 0)
    solve_none  if v <= SOLVED_ABOVE

so for ``acc`` (False/True read as 0/1) all-True groups are solve_all and all-False are solve_none, and
for DAPO's ``score`` (+1 correct, -1 wrong) all +1 is solve_all and all -1 is solve_none. A uniform group
of score 0 counts as solve_none. Groups that are kept are neither.

Everything is computed with array operations (``argsort``, ``bincount``, ``reduceat``): no Python loop
over trajectories or membership tests on lists. Rows laid out as verl does (each group one run of
adjacent rows) cost one sort of one id per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from recipe_dapo.dynamic_sampling.keep_rules import GroupView, KeepDecision, spread

SOLVED_ABOVE = 0.0
"""A uniform group whose common metric value is above this counts as solved by all responses."""

DEFAULT_TOLERANCE = 1e-6
"""Two metric values closer than this are the same value (float noise, not a learning signal)."""


@dataclass(frozen=True)
class GroupStats:
    """One round's groups, in order of first appearance, with their statistics and keep decision.

    Group g's trajectories are rows ``order[offsets[g]:offsets[g + 1]]`` of the round, in their original
    order, so selecting ``order`` makes every group contiguous.
    """

    group_ids: np.ndarray  # [G] the group id (uid) of each group
    order: np.ndarray  # [T] row indices, grouped
    offsets: np.ndarray  # [G + 1] group boundaries inside ``order``
    sizes: np.ndarray  # [G] responses per group
    minimum: np.ndarray  # [G] smallest metric value
    maximum: np.ndarray  # [G] largest metric value
    mean: np.ndarray  # [G] mean metric value
    std: np.ndarray  # [G] standard deviation of the metric (ddof=0)
    success_rate: np.ndarray  # [G] fraction of responses whose metric is above SOLVED_ABOVE
    keep: np.ndarray  # [G] bool: the keep rule says the group carries a learning signal (or it has one response)
    solve_all: np.ndarray  # [G] bool: uniform and solved (see module docstring)
    solve_none: np.ndarray  # [G] bool: uniform and unsolved
    metric_sum: float  # sum of the metric over all trajectories (for the mean before filtering)

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.shape[0])

    @property
    def num_trajectories(self) -> int:
        return int(self.order.shape[0])

    @property
    def num_kept(self) -> int:
        return int(np.count_nonzero(self.keep))

    def rows_of(self, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row indices of the groups where the boolean mask ``selected`` [G] is True, groups contiguous.

        Returns ``(rows, offsets)``: the k-th selected group is ``rows[offsets[k]:offsets[k + 1]]``.
        """
        selected = np.asarray(selected, dtype=bool)
        rows = self.order[np.repeat(selected, self.sizes)]
        offsets = np.zeros(int(np.count_nonzero(selected)) + 1, dtype=np.int64)
        np.cumsum(self.sizes[selected], out=offsets[1:])
        return rows, offsets


def group_statistics(
    group_ids: Any,
    metric_values: Any,
    *,
    filter_enabled: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
    metric_name: str = "metric",
    keep_rule: KeepDecision = spread,
) -> GroupStats:
    """Group the trajectories of one round by ``group_ids`` and decide which groups to keep.

    ``group_ids`` and ``metric_values`` are per-trajectory 1-D sequences of equal length (ids of any
    hashable, sortable kind: verl's uid strings, ints). Booleans in ``metric_values`` read as 0/1. With
    ``filter_enabled=False`` every group is kept (statistics are still computed); otherwise ``keep_rule``
    (a rule of ``keep_rules`` with its arguments bound) decides, and single-response groups are kept.
    """
    ids = np.asarray(group_ids)
    values = _as_float_vector(metric_values, metric_name)
    if ids.ndim != 1:
        raise ValueError(f"group ids must be 1-D (one uid per trajectory), got shape {ids.shape}")
    if ids.shape[0] != values.shape[0]:
        raise ValueError(
            f"got {ids.shape[0]} group ids but {values.shape[0]} values of {metric_name!r}; pass one uid "
            "and one metric value per trajectory of the round"
        )
    if ids.shape[0] == 0:
        raise ValueError("a round must contain at least one trajectory")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")

    try:
        group_order_ids, group_of_row, order = _index_groups(ids)
    except TypeError as err:  # unhashable ids, or ids of mixed types that cannot be sorted
        raise ValueError(f"group ids must be hashable and of one comparable type (e.g. all str): {err}") from err
    num_groups = group_order_ids.shape[0]

    sizes = np.bincount(group_of_row, minlength=num_groups)
    offsets = np.zeros(num_groups + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    grouped_values = values[order]
    maximum = np.maximum.reduceat(grouped_values, offsets[:-1])
    minimum = np.minimum.reduceat(grouped_values, offsets[:-1])
    mean = np.bincount(group_of_row, weights=values, minlength=num_groups) / sizes
    # Deviations from the group mean (not E[x^2] - E[x]^2, which cancels badly for large scores).
    deviation = values - mean[group_of_row]
    std = np.sqrt(np.bincount(group_of_row, weights=deviation * deviation, minlength=num_groups) / sizes)
    successes = np.bincount(group_of_row, weights=values > SOLVED_ABOVE, minlength=num_groups)

    varied = (maximum - minimum) > tolerance
    uniform = ~varied & (sizes > 1)
    view = GroupView(sizes=sizes, mean=mean, std=std, spread=maximum - minimum, success_rate=successes / sizes,
                     varied=varied)
    keep = _apply_rule(keep_rule, view) | (sizes == 1) if filter_enabled else np.ones(num_groups, dtype=bool)
    return GroupStats(
        group_ids=group_order_ids,
        order=order,
        offsets=offsets,
        sizes=sizes,
        minimum=minimum,
        maximum=maximum,
        mean=mean,
        std=std,
        success_rate=view.success_rate,
        keep=keep,
        solve_all=uniform & (mean > SOLVED_ABOVE),
        solve_none=uniform & (mean <= SOLVED_ABOVE),
        metric_sum=float(values.sum()),
    )


def _apply_rule(keep_rule: KeepDecision, view: GroupView) -> np.ndarray:
    keep = np.asarray(keep_rule(view))
    if keep.shape != view.sizes.shape or keep.dtype != bool:
        raise TypeError(
            f"keep rule {getattr(keep_rule, 'func', keep_rule)!r} returned {keep.dtype} of shape {keep.shape}; a keep "
            f"rule must return one bool per group, shape {view.sizes.shape}"
        )
    return keep


def _index_groups(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Number groups by first appearance: (ids of the groups, group index of each row, grouped row order).

    Works on runs of equal adjacent ids, so verl's layout (responses repeated with interleave=True, every
    group one run) sorts only one id per group; shuffled rows fall back to sorting every row.
    """
    run_start = np.ones(ids.shape[0], dtype=bool)
    run_start[1:] = ids[1:] != ids[:-1]
    group_ids, group_of_run = _factorize_by_appearance(ids[run_start])
    group_of_row = group_of_run[np.cumsum(run_start) - 1]
    if group_ids.shape[0] == group_of_run.shape[0]:  # one run per group: rows are already grouped
        return group_ids, group_of_row, np.arange(ids.shape[0])
    return group_ids, group_of_row, np.argsort(group_of_row, kind="stable")


def _factorize_by_appearance(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values in order of first appearance, index of each element's value in that list)."""
    by_value = _sort_equal_values_together(values)
    sorted_values = values[by_value]
    new_value = np.ones(values.shape[0], dtype=bool)
    new_value[1:] = sorted_values[1:] != sorted_values[:-1]
    value_starts = np.flatnonzero(new_value)
    first_position = np.minimum.reduceat(by_value, value_starts)
    by_appearance = np.argsort(first_position)
    rank = np.empty_like(by_appearance)
    rank[by_appearance] = np.arange(by_appearance.shape[0])
    codes = np.empty(values.shape[0], dtype=np.int64)
    codes[by_value] = rank[np.cumsum(new_value) - 1]
    return sorted_values[value_starts][by_appearance], codes


def _sort_equal_values_together(values: np.ndarray) -> np.ndarray:
    """A permutation that puts equal values next to each other (the order among groups is irrelevant)."""
    if values.dtype != object:
        return np.argsort(values)
    # Python objects (verl's uid strings) compare slowly; sort their hashes instead, and fall back to
    # sorting the objects if two different ids share a hash, which would interleave their rows.
    hashes = np.fromiter(map(hash, values), dtype=np.int64, count=values.shape[0])
    by_hash = np.argsort(hashes)
    sorted_hashes, sorted_values = hashes[by_hash], values[by_hash]
    collision = (sorted_hashes[1:] == sorted_hashes[:-1]) & (sorted_values[1:] != sorted_values[:-1])
    return np.argsort(values) if collision.any() else by_hash


def _as_float_vector(metric_values: Any, metric_name: str) -> np.ndarray:
    if hasattr(metric_values, "detach"):  # a torch tensor, without importing torch
        metric_values = metric_values.detach().cpu().numpy()
    try:
        values = np.asarray(metric_values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"filter metric {metric_name!r} must be numeric per trajectory: {err}") from err
    if values.ndim != 1:
        raise ValueError(
            f"filter metric {metric_name!r} must be one number per trajectory (1-D), got shape {values.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"filter metric {metric_name!r} is not finite at trajectory rows {bad[:5].tolist()} "
            f"(values {values[bad[:5]].tolist()}); fix the reward function or choose another "
            "algorithm.filter_groups.metric"
        )
    return values


SEQUENCE_METRICS = {
    "seq_reward": ("token_level_scores", "rm_scores"),
    "reward": ("rm_scores", "token_level_scores"),
    "seq_final_reward": ("token_level_rewards",),
}
"""Filter metrics that are a tensor summed over the response tokens, with the tensors that may hold it, first
found wins. verl 0.9.1's reward loop returns ``rm_scores``, which the trainer copies to
``token_level_scores`` (the pre-KL reward, verl's ``reward`` metric); ``token_level_rewards`` is the reward
after any in-reward KL penalty."""


def trajectory_metric(metric: str, tensors: Mapping[str, Any], non_tensors: Mapping[str, Any]) -> np.ndarray:
    """The per-trajectory filter metric of a round, as verl defines ``algorithm.filter_groups.metric``.

    ``seq_reward`` / ``reward``: the pre-KL reward summed over tokens (``token_level_scores`` or
    ``rm_scores``); ``seq_final_reward``: ``token_level_rewards.sum(-1)``; any other name (``acc``,
    ``score``, or a key the reward function returns) is read from the non-tensor fields
    (``reward_extra_info``). With a ``DataProto`` pass ``(batch.batch, batch.non_tensor_batch)``.
    """
    candidates = SEQUENCE_METRICS.get(metric)
    if candidates is not None:
        present = [key for key in candidates if key in tensors.keys()]
        if not present:
            raise KeyError(
                f"algorithm.filter_groups.metric={metric!r} needs one of the tensors {list(candidates)}, which "
                f"the batch does not have (tensors: {sorted(tensors.keys())}); compute rewards before filtering"
            )
        return _as_float_vector(tensors[present[0]].sum(-1), metric)
    if metric not in non_tensors:
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r} is not a field of the batch; choose one of "
            f"{sorted(SEQUENCE_METRICS)} or a reward_extra_info key the reward function returns "
            f"(non-tensor fields: {sorted(non_tensors.keys())})"
        )
    return _as_float_vector(non_tensors[metric], metric)
