"""Settings of the dynamic sampler, read once at start-up and validated across fields.

Two places in the run config feed it:

- verl's own ``algorithm.filter_groups.{enable, metric, max_num_gen_batches}``, unchanged in meaning
  except that ``max_num_gen_batches`` is a per-step *budget* of ``max_num_gen_batches * gen_batch_size``
  prompts (with ``round_sizing=whole`` that is exactly the paper's count of rounds);
- the recipe's ``dapo.dynamic_sampling.*`` (the fields below from ``round_sizing`` on).

``data.train_batch_size`` and ``data.gen_batch_size`` (null: ``train_batch_size``) come in as arguments.
:func:`sampler_settings` reads all of them (and ``data.seed``) from a run config and :func:`sampler_config` builds
the config from them: the one place every user of the sampler (both trainers, the start-up rules) gets it.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional

from recipe_dapo.dynamic_sampling.group_stats import DEFAULT_TOLERANCE
from recipe_dapo.dynamic_sampling.keep_rules import DEFAULT_KEEP_RULE, KeepDecision, keep_rule_problems, resolve_keep_rule

ROUND_SIZINGS = ("deficit", "whole")
EXHAUSTION_POLICIES = ("train_partial", "raise")

AUTO_MIN_ROUND_FRACTION = 0.25
"""``min_round_prompts: null`` means this fraction of ``train_batch_size``: a top-up round is then still a
large batch for the rollout engine, and its surplus is carried over, not wasted (see
bench/dynamic_sampling_sim.py for rounds per step against staleness)."""

FILTER_GROUPS_KEYS = ("enable", "metric", "max_num_gen_batches")
NAMESPACE = "dapo.dynamic_sampling"
SKIP = NAMESPACE + ".skip"


class DynamicSamplingConfigError(ValueError):
    """Settings the sampler refuses; ``problems`` lists each with its key and fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(kw_only=True)
class SkipSettings:
    """``dapo.dynamic_sampling.skip``: skip prompts before generation when their recent groups predict that the
    next will not qualify (``skipping.PromptSkipper``, after GRESO, arXiv 2506.02177). A prompt whose predicted
    chance to qualify is below ``max_qualify_probability`` is skipped with probability ``1 - explore`` when it comes
    up, and generated in any case after ``max_consecutive_skips`` skips in a row. ``explore`` moves by
    ``explore_step`` after each step, down when fewer than ``target_keep_rate`` of the step's generated groups
    qualified, up otherwise, within [``explore_min``, 1]."""

    enable: bool = False
    """Off by default: see the README (in the simulation it saves generation late in a run, when many prompts are
    solved every time, and little while the policy is still learning fast; not yet measured in a real run)."""

    max_qualify_probability: float = 0.1
    """A prompt is a skip candidate when the predicted chance that its next group qualifies is below this (from its
    decayed right / total answers and the keep rule). It bounds the share of skipped prompts that would have
    qualified, as far as the prediction holds."""

    history_decay: float = 0.8
    """Weight of a prompt's earlier answers at each new group of it: 1 keeps all history, lower forgets faster (for
    a policy that changes fast between two visits of a prompt)."""

    target_keep_rate: float = 0.8
    """Fraction of generated groups that should qualify; the exploration probability adapts toward it (above it,
    skipping switches itself off)."""

    explore_init: float = 0.5
    """Exploration probability at the start of the run: a candidate is generated with this probability."""

    explore_min: float = 0.05
    """Smallest exploration probability: every candidate is still generated at least this often."""

    explore_step: float = 0.05
    """Change of the exploration probability after each training step that generated groups."""

    max_consecutive_skips: int = 8
    """A prompt skipped this many times in a row is generated the next time it comes up (the bound on how long any
    prompt is left out; a prompt comes up about once per epoch)."""

    seed: Optional[int] = None
    """Seed of the skip draws (null: ``data.seed``, or 0 when that is null too); the generator's state is saved with
    the sampler's, so a resumed run decides as the uninterrupted one."""


@dataclass(kw_only=True)
class DynamicSamplingSettings:
    """The recipe's ``dapo.dynamic_sampling`` config node: each field's default here is the only one (the Hydra
    config is built from this class, see ``recipe_dapo.config.settings``)."""

    round_sizing: str = "deficit"
    """``deficit``: each round asks for the prompts expected to fill what is missing, from the running
    keep-rate estimate; ``whole``: every round is ``gen_batch_size`` prompts (the paper)."""

    safety_margin: float = 0.1
    """Deficit rounds ask for ``(1 + safety_margin) * missing / keep_rate`` prompts; the expected surplus is
    carried to the next step, so a margin buys fewer top-up rounds for a little staleness."""

    min_round_prompts: Optional[int] = None
    """Smallest deficit round, in prompts (null: ``ceil(0.25 * train_batch_size)``), so that top-up rounds
    stay large enough for the rollout engine to be efficient."""

    max_round_prompts: Optional[int] = None
    """Largest deficit round, in prompts (null: ``gen_batch_size``)."""

    prompt_granularity: int = 1
    """Round sizes are rounded up to a multiple of this; choose it so that ``prompt_granularity *
    rollout.n`` divides evenly among the rollout (agent-loop) workers. ``gen_batch_size`` must be a
    multiple of it, and with ``max_staleness`` > 0 it must not exceed ``train_batch_size * max_staleness``."""

    keep_rate_prior: float = 0.5
    """Keep-rate estimate before the first round. A low prior overshoots (the surplus is carried over), a
    high one may need a second round, so err low."""

    keep_rate_decay: float = 0.5
    """Weight of the past in the keep-rate estimate, applied once per training step: the estimate is
    ``sum_s decay^(age_s) kept_s / sum_s decay^(age_s) generated_s`` over past steps s (rounds of one
    step share a policy and weigh the same). 0 uses only the current step."""

    max_staleness: int = 1
    """Surplus qualifying groups are trained at most this many steps after the step that generated them;
    older ones are dropped and counted. 0 discards the surplus (the paper's behaviour)."""

    on_exhausted: str = "train_partial"
    """When the ``max_num_gen_batches`` budget is spent before the batch is full: ``train_partial`` trains
    on the groups collected (warned once, counted in ``dynamic_sampling/partial_steps``); ``raise`` stops
    the run (the paper's behaviour)."""

    same_value_tolerance: float = DEFAULT_TOLERANCE
    """Metric values closer than this count as equal when deciding that a group has no spread."""

    max_empty_rounds: int = 20
    """A step stops with :class:`DynamicSamplingStalled` after this many rounds in a row that kept no group,
    whatever the ``max_num_gen_batches`` budget (with no budget such a step would otherwise never end): the
    filter metric does not vary within groups, or the data is far too easy or too hard for the model. On verl's
    v1 trainer (streaming, no rounds) the same limit counts groups: this many rounds' worth in a row, a round being
    what the classic trainer would send for a whole batch at the current keep-rate estimate."""

    poll_interval_s: float = 0.05
    """verl's v1 trainer (``trainer.use_v1=true``): seconds between two looks at TransferQueue for groups that
    finished while others still generate (verl's own replay buffer waits a fixed 2 s)."""

    keep_rule: str = DEFAULT_KEEP_RULE
    """Which groups qualify: a rule registered in ``keep_rules`` (the default ``spread`` is the paper's: responses
    do not all score the same; every rule is in [registries.md](registries.md#keep-rules)); a new rule is a function
    plus ``@register_keep_rule``."""

    keep_rule_args: Dict[str, Any] = field(default_factory=dict)
    """The rule's parameters, e.g. ``{low: 0.2, high: 0.8}`` for ``band`` (its defaults) or ``{min_std: 0.3}``."""

    one_round: bool = False
    """One generation round per step (verl's v1 trainer in ``colocate_async`` mode only:
    ``trainer.use_v1=true trainer.v1.trainer_mode=colocate_async``). A step submits, as it starts, enough prompts to
    fill its batch in one round (with probability ``one_round_confidence`` at the keep-rate estimate, the prompts
    carried in flight from the last step counted), judges groups as they finish, and once the batch is full aborts
    what is still generating: the aborted responses keep their tokens and finish in the next step's round under the
    new weights (the behaviour-policy correction weights their older tokens). A prompt that could not be trained within
    ``max_staleness`` steps if it were aborted again is finished before the step ends, never dropped for its age. A
    checkpoint keeps the responses still generating (tokens, log-probs, versions) and a resumed run continues them
    from their prefix; one older than ``max_staleness`` at the resume is dropped, counted and regenerated.
    Refused on the classic trainer (verl's generation call there returns only when every response of the batch has
    finished: an abort would lose the partial responses) and on v1 ``sync`` (it drains every prompt in flight)."""

    one_round_confidence: float = 0.9
    """``one_round``: the probability, at the keep-rate estimate (a binomial draw per prompt), that the prompts a step
    submits plus those in flight fill its batch without a second submission. Higher submits more prompts (those
    unfinished at the step's end carry over); lower risks a refill, which waits for its own longest response."""

    one_round_overprovision: float = 1.5
    """``one_round``: the prompts a step keeps in flight, as a multiple of those that fill its batch at
    ``one_round_confidence``. Above 1 the batch fills from the groups that finish first while the replicas stay full,
    and the rest, aborted, finish first in the next step (so nothing is generated twice and the trained lengths keep
    their distribution; more of the trained tokens come from the previous policy, which the behaviour-policy correction
    weighs). Not applied to a run's first submission (its keep rate is only the prior) nor in a step that began with
    nothing in flight (a source that finishes a step's prompts in one wave, as vLLM-CPU does, aborts nothing). 1.5 from
    the GPU step model (docs/design.md): generation 0.79x the deficit rounds' at keep rates 0.3-0.6, against 0.87x at
    1.0; nothing gained above it, and at 2.0 groups are dropped as stale."""

    allow_shaped_filter_metric: bool = False
    """Allow ``algorithm.filter_groups.metric`` to be a shaped score (``reward``, ``seq_reward``, ``seq_final_reward``,
    ``overlong_reward``) while the overlong punishment is on. Refused by default: on the shaped score a group whose
    answers are all right but differ in length has a spread and is trained on length alone (DAPO filters on ``acc``)."""

    skip: SkipSettings = field(default_factory=SkipSettings)
    """Pre-rollout skipping of prompts whose recent groups predict that the next will not qualify (off by default)."""


@dataclass(kw_only=True)
class DynamicSamplingConfig(DynamicSamplingSettings):
    """Resolved settings of :class:`~recipe_dapo.dynamic_sampling.sampler.DynamicSampler`: verl's
    ``algorithm.filter_groups`` and the batch sizes, plus :class:`DynamicSamplingSettings`."""


    train_batch_size: int
    """``data.train_batch_size``: groups (prompts) per training step."""

    gen_batch_size: int
    """``data.gen_batch_size`` (null: ``train_batch_size``): prompts per round with ``round_sizing=whole``,
    upper bound of a round otherwise, and the unit of the ``max_num_gen_batches`` budget."""

    enable: bool = False
    """``algorithm.filter_groups.enable`` (verl's default: off; the recipe's config turns it on): drop groups whose responses all score the same. When False every
    group is kept and one round of ``train_batch_size`` prompts fills each step."""

    metric: str = ""
    """``algorithm.filter_groups.metric`` (verl's default: none; the recipe's config says ``acc``): ``acc``, ``score``, ``seq_reward``, ``seq_final_reward``,
    ``reward`` or any reward_extra_info key."""

    max_num_gen_batches: int = 0
    """``algorithm.filter_groups.max_num_gen_batches``: at most this many ``gen_batch_size`` worth of
    prompts are generated per step (<= 0: no limit); then ``on_exhausted`` applies."""

    seed: int = 0
    """``data.seed`` (null: 0): the skip draws' seed when ``skip.seed`` is null."""

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_config(
        cls,
        filter_groups: Any,
        dynamic_sampling: Optional[Mapping[str, Any]],
        *,
        train_batch_size: int,
        gen_batch_size: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> "DynamicSamplingConfig":
        """Build and validate from ``algorithm.filter_groups`` and ``dapo.dynamic_sampling``.

        Both may be plain dicts, OmegaConf ``DictConfig``s or verl's ``FilterGroupsConfig``; either may be
        None. Missing ``filter_groups`` keys take verl's defaults (``enable`` False, no metric, no budget);
        missing ``dapo.dynamic_sampling`` keys take the defaults above. Unknown keys under
        ``dapo.dynamic_sampling`` are refused (likely typos).
        """
        # verl's meaning: filtering is off unless enabled, and an enabled filter needs a metric.
        filter_groups = filter_groups if filter_groups is not None else {}
        values: dict[str, Any] = {
            "enable": filter_groups.get("enable", False),
            "metric": filter_groups.get("metric", None) or "",
            "max_num_gen_batches": filter_groups.get("max_num_gen_batches", None) or 0,
        }
        own_fields = [f.name for f in fields(DynamicSamplingSettings)]
        for key, value in (dynamic_sampling or {}).items():
            if key == "_target_":
                continue
            if key not in own_fields:
                raise ValueError(
                    f"unknown setting {NAMESPACE}.{key}; the known keys are {', '.join(own_fields)}"
                )
            values[key] = value
        if "skip" in values:
            values["skip"] = _skip_settings(values["skip"])
        if "keep_rule_args" in values:
            values["keep_rule_args"] = dict(values["keep_rule_args"] or {})
        config = cls(
            train_batch_size=train_batch_size,
            gen_batch_size=gen_batch_size if gen_batch_size is not None else train_batch_size,
            seed=int(seed) if seed is not None else 0,
            **values,
        )
        config.validate()
        return config

    # ---------------------------------------------------------------- resolved values

    @property
    def min_round(self) -> int:
        """Smallest deficit round in prompts (``min_round_prompts`` resolved)."""
        if self.min_round_prompts is not None:
            return int(self.min_round_prompts)
        auto = math.ceil(AUTO_MIN_ROUND_FRACTION * self.train_batch_size)
        return min(_round_up(auto, self.prompt_granularity), self.max_round)

    @property
    def max_round(self) -> int:
        """Largest deficit round in prompts (``max_round_prompts`` resolved)."""
        return int(self.max_round_prompts) if self.max_round_prompts is not None else self.gen_batch_size

    @property
    def skip_seed(self) -> int:
        """Seed of the skip draws: ``skip.seed``, else ``data.seed``."""
        return int(self.skip.seed) if self.skip.seed is not None else int(self.seed)

    def keep_decision(self) -> KeepDecision:
        """The configured keep rule with its arguments bound."""
        return resolve_keep_rule(self.keep_rule, self.keep_rule_args)

    @property
    def prompt_budget(self) -> Optional[int]:
        """Prompts that may be generated per step, or None for no limit."""
        if self.max_num_gen_batches <= 0:
            return None
        return self.max_num_gen_batches * self.gen_batch_size

    # ---------------------------------------------------------------- validation

    def validate(self) -> None:
        """Raise ValueError naming the first bad key and how to fix it."""
        _check_int("data.train_batch_size", self.train_batch_size, minimum=1)
        _check_int("data.gen_batch_size", self.gen_batch_size, minimum=1)
        _check_int("algorithm.filter_groups.max_num_gen_batches", self.max_num_gen_batches)
        if not isinstance(self.enable, bool):
            raise ValueError(f"algorithm.filter_groups.enable must be true or false, got {self.enable!r}")
        if self.enable and (not isinstance(self.metric, str) or not self.metric):
            raise ValueError(
                "algorithm.filter_groups.metric must name the filter metric when filtering is enabled "
                "(DAPO uses acc; also score, seq_reward, seq_final_reward or a reward_extra_info key)"
            )
        if self.round_sizing not in ROUND_SIZINGS:
            raise ValueError(
                f"{NAMESPACE}.round_sizing={self.round_sizing!r} is not one of {ROUND_SIZINGS}; use deficit "
                "(rounds sized to what is missing) or whole (gen_batch_size prompts per round, the paper)"
            )
        if self.on_exhausted not in EXHAUSTION_POLICIES:
            raise ValueError(
                f"{NAMESPACE}.on_exhausted={self.on_exhausted!r} is not one of {EXHAUSTION_POLICIES}"
            )
        _check_number(f"{NAMESPACE}.safety_margin", self.safety_margin, low=0.0, high=10.0)
        _check_number(f"{NAMESPACE}.keep_rate_prior", self.keep_rate_prior, low=0.0, high=1.0, low_open=True)
        _check_number(f"{NAMESPACE}.keep_rate_decay", self.keep_rate_decay, low=0.0, high=1.0)
        _check_number(f"{NAMESPACE}.same_value_tolerance", self.same_value_tolerance, low=0.0, high=math.inf)
        _check_int(f"{NAMESPACE}.max_staleness", self.max_staleness, minimum=0)
        _check_int(f"{NAMESPACE}.max_empty_rounds", self.max_empty_rounds, minimum=1)
        _check_number(f"{NAMESPACE}.poll_interval_s", self.poll_interval_s, low=0.0, high=60.0, low_open=True)
        _check_int(f"{NAMESPACE}.prompt_granularity", self.prompt_granularity, minimum=1)
        if self.gen_batch_size % self.prompt_granularity:
            raise ValueError(
                f"data.gen_batch_size={self.gen_batch_size} is not a multiple of "
                f"{NAMESPACE}.prompt_granularity={self.prompt_granularity}; change one of them"
            )
        if not isinstance(self.one_round, bool):
            raise ValueError(f"{NAMESPACE}.one_round must be true or false, got {self.one_round!r}")
        if not 0.0 < float(self.one_round_confidence) < 1.0:
            raise ValueError(
                f"{NAMESPACE}.one_round_confidence={self.one_round_confidence!r} must be in (0, 1): the probability "
                "that one submission fills the batch (0.9 is the default)"
            )
        if not 1.0 <= float(self.one_round_overprovision) <= 4.0:
            raise ValueError(
                f"{NAMESPACE}.one_round_overprovision={self.one_round_overprovision!r} must be in [1, 4]: the prompts "
                "kept in flight as a multiple of those that fill the batch (1.5 is the default, 1 submits only what "
                "fills it)"
            )
        if self.one_round and self.max_staleness < 1:
            raise ValueError(
                f"{NAMESPACE}.one_round=true with max_staleness=0: a response aborted when the batch is full finishes "
                "in the next step, one policy update later, so max_staleness=0 would refuse every one of them; set "
                f"{NAMESPACE}.max_staleness=1 (or more), or one_round=false"
            )
        if self.max_staleness and self.prompt_granularity > self.train_batch_size * self.max_staleness:
            raise ValueError(
                f"{NAMESPACE}.prompt_granularity={self.prompt_granularity} is above data.train_batch_size x "
                f"{NAMESPACE}.max_staleness = {self.train_batch_size * self.max_staleness}: one granule could leave more "
                f"qualifying groups than the next max_staleness steps train, and those would be dropped as stale; "
                f"lower prompt_granularity, or raise max_staleness (0 discards the surplus by design)"
            )
        for key in ("min_round_prompts", "max_round_prompts"):
            value = getattr(self, key)
            if value is None:
                continue
            _check_int(f"{NAMESPACE}.{key}", value, minimum=1)
            if value % self.prompt_granularity:
                raise ValueError(
                    f"{NAMESPACE}.{key}={value} is not a multiple of {NAMESPACE}.prompt_granularity="
                    f"{self.prompt_granularity}; round it or set it to null"
                )
        if self.min_round > self.max_round:
            raise ValueError(
                f"{NAMESPACE}.min_round_prompts ({self.min_round}) exceeds the largest round "
                f"({self.max_round}, {NAMESPACE}.max_round_prompts or data.gen_batch_size); lower the first "
                "or raise the second"
            )
        problems = keep_rule_problems(self.keep_rule, self.keep_rule_args) + self._skip_problems()
        if problems:
            raise DynamicSamplingConfigError(problems)

    def _skip_problems(self) -> list[str]:
        skip = self.skip
        problems = []
        if not isinstance(skip.enable, bool):
            problems.append(f"{SKIP}.enable must be true or false, got {skip.enable!r}")
        for key, low, high, low_open in (
            ("max_qualify_probability", 0.0, 1.0, True),
            ("history_decay", 0.0, 1.0, True),
            ("target_keep_rate", 0.0, 1.0, True),
            ("explore_min", 0.0, 1.0, True),
            ("explore_init", 0.0, 1.0, True),
            ("explore_step", 0.0, 1.0, True),
        ):
            try:
                _check_number(f"{SKIP}.{key}", getattr(skip, key), low=low, high=high, low_open=low_open)
            except ValueError as exc:
                problems.append(str(exc))
        try:
            _check_int(f"{SKIP}.max_consecutive_skips", skip.max_consecutive_skips, minimum=1)
        except ValueError as exc:
            problems.append(str(exc))
        if skip.seed is not None and (isinstance(skip.seed, bool) or not isinstance(skip.seed, int)):
            problems.append(f"{SKIP}.seed must be an integer or null (data.seed), got {skip.seed!r}")
        if not problems and skip.explore_init < skip.explore_min:
            problems.append(
                f"{SKIP}.explore_init={skip.explore_init} is below explore_min={skip.explore_min}; raise it or "
                "lower explore_min"
            )
        if skip.enable is True and not self.enable:
            problems.append(
                f"{SKIP}.enable=true needs algorithm.filter_groups.enable=true: prompts are skipped for groups that "
                "did not qualify, and with the filter off every group qualifies"
            )
        return problems


SAMPLER_SETTINGS = ("filter_groups", "dynamic_sampling", "train_batch_size", "gen_batch_size", "seed",
                    "ppo_mini_batch_size")
"""The keys of :func:`sampler_settings` and of ``trainer.v1.sampler.sampler_kwargs`` (a test keeps them equal)."""


def sampler_settings(run_config: Mapping[str, Any]) -> Dict[str, Any]:
    """What the dynamic sampler is built from, read from a run config (the v1 trainer gets the same through verl's
    ``sampler_kwargs``): the filter, the recipe's sampling section, the batch sizes, the seed of the prompt-skip draws
    (``data.seed``, unless ``dapo.dynamic_sampling.skip.seed`` is set) and the mini-batch a partial batch must fill.
    A missing level reads as None (the start-up rules read configs that may lack a section)."""

    def at(path: str) -> Any:
        value: Any = run_config
        for key in path.split("."):
            value = value.get(key) if value is not None else None
        return value

    return {
        "filter_groups": at("algorithm.filter_groups"),
        "dynamic_sampling": at("dapo.dynamic_sampling"),
        "train_batch_size": at("data.train_batch_size"),
        "gen_batch_size": at("data.gen_batch_size"),
        "seed": at("data.seed"),
        "ppo_mini_batch_size": at("actor_rollout_ref.actor.ppo_mini_batch_size"),
    }


def sampler_config(settings: Mapping[str, Any]) -> DynamicSamplingConfig:
    """The sampler's config from :func:`sampler_settings` (or the v1 trainer's ``sampler_kwargs``, the same keys):
    the one builder of the classic trainer, the v1 trainer and the start-up rules."""
    train_batch_size = int(settings["train_batch_size"])
    return DynamicSamplingConfig.from_config(
        settings.get("filter_groups"),
        settings.get("dynamic_sampling"),
        train_batch_size=train_batch_size,
        gen_batch_size=int(settings.get("gen_batch_size") or train_batch_size),
        seed=settings.get("seed"),
    )


def _skip_settings(value: Any) -> SkipSettings:
    """``dapo.dynamic_sampling.skip`` (a dict, a DictConfig or SkipSettings) as SkipSettings; unknown keys refused."""
    if isinstance(value, SkipSettings):
        return value
    known = [f.name for f in fields(SkipSettings)]
    given = {key: item for key, item in (value or {}).items() if key != "_target_"}
    unknown = [key for key in given if key not in known]
    if unknown:
        raise DynamicSamplingConfigError([
            f"unknown setting {SKIP}.{key}"
            + "".join(f"; did you mean {close}?" for close in difflib.get_close_matches(key, known, n=1))
            + f" (the keys: {', '.join(known)})"
            for key in unknown
        ])
    return SkipSettings(**given)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _check_int(key: str, value: Any, minimum: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value}")


def _check_number(key: str, value: Any, *, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{key} must be a number, got {value!r}")
    too_low = value <= low if low_open else value < low
    if too_low or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise ValueError(f"{key} must lie in {interval}, got {value}")
