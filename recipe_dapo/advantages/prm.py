"""A process reward model (PRM) as a step scorer: each step of a response scored by a model at a separator token
inserted after it. Pure: no verl, no Ray, no torch (the model is a backend, ``recipe_dapo.advantages.prm_backends``).

The response is cut into steps (:func:`split_steps`: the non-blank pieces between two ``step_delimiter``, the chain
scorer's lines by default); the model's input is the question and the steps, each followed by the separator
(:func:`build_input`), assembled token by token, so that the separator token stands exactly once after every step
and nowhere else (a separator in the question or a step is taken out of it first). The model scores each
separator position; a step's reward is the probability that the step is good, read from the model's row there
(:func:`step_probability`):

- ``form=classification`` (Qwen2.5-Math-PRM, a two-label token-classification head): the row is the labels'
  probabilities, the reward is ``row[good_label]``;
- ``form=token`` (Math-Shepherd, a language-model head): the row is the probabilities of ``good_token`` and
  ``bad_token`` (softmax over the two; vLLM's pooler with ``returned_token_ids=[good, bad]``), the reward is the
  good one's share; a full-vocabulary row is read at the two tokens' ids and renormalised, which is the same.

A backend takes a batch of token-id inputs and returns, per input, its rows as vLLM's ``/pooling`` endpoint returns
them for the ``token_classify`` task: one row per input token (the pooler's ``ALL``), or one row per separator
(the pooler's ``STEP`` with ``step_tag_id`` the separator's id, Qwen2.5-Math-PRM's default). Both are read.

A reward sits at the step's last character (``recipe_dapo.advantages.steps.StepScorer``); a response without a
step has none; a response cut by the length limit has its unfinished last step scored as it stands (as the chain
scorer does); an input longer than ``max_length`` is cut at its end and the steps whose separator was cut get none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from recipe_dapo.advantages.steps import Steps

FORMS = ("classification", "token")
"""``dapo.objective.prm.form``: what the model's row at a separator holds."""

KEY = "dapo.objective.prm"
"""Where the settings live (error messages name their keys)."""

Rows = Sequence[Sequence[float]]
Backend = Callable[[list[list[int]]], list[Rows]]
"""``backend(inputs) -> rows of each input``: token ids in, probability rows out (vLLM's ``token_classify``)."""


def unescape(text: str) -> str:
    """``"\\\\n\\\\n"`` (as written on a command line or in YAML) -> two line breaks; other characters as they are."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def split_steps(response: str, delimiter: str) -> list[tuple[int, int]]:
    """The steps of ``response`` as ``(start, end)`` character spans (end exclusive) of the non-blank pieces between
    two ``delimiter``, leading and trailing whitespace left out; a blank piece is no step."""
    if not delimiter:
        raise ValueError(f"{KEY}.step_delimiter is empty; set the text that ends a step (\\n: a line break)")
    spans: list[tuple[int, int]] = []
    start = 0
    while start <= len(response):
        cut = response.find(delimiter, start)
        end = len(response) if cut < 0 else cut
        piece = response[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + len(piece.rstrip())))
        if cut < 0:
            break
        start = cut + len(delimiter)
    return spans


def single_token(tokenizer: Any, text: str, key: str) -> int:
    """The id of ``text`` when the tokenizer encodes it as exactly one token; else ValueError naming ``key``."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"{key}={text!r} is {len(ids)} tokens of the process reward model's tokenizer ({ids}); the model scores "
            "a step at one token: use a token of its vocabulary (Qwen2.5-Math-PRM: <extra_0>; Math-Shepherd: ки), "
            "or add it to the tokenizer as a special token"
        )
    return int(ids[0])


@dataclass(frozen=True)
class PRMFormat:
    """The settings that shape a model input and read its rows (``dapo.objective.prm``, resolved against the
    model's tokenizer)."""

    form: str
    separator: str
    separator_id: int
    step_delimiter: str
    chat_template: bool = True
    system_prompt: Optional[str] = None
    good_label: int = 1
    good_token_id: Optional[int] = None
    bad_token_id: Optional[int] = None
    max_length: Optional[int] = None

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], tokenizer: Any) -> "PRMFormat":
        """From ``dapo.objective.prm`` (a mapping) and the model's tokenizer; ValueError naming the key when the
        settings and the tokenizer disagree."""
        form = str(settings.get("form", "classification"))
        if form not in FORMS:
            raise ValueError(f"{KEY}.form={form!r} is not one of {list(FORMS)}")
        good = bad = None
        if form == "token":
            good = single_token(tokenizer, str(settings.get("good_token")), f"{KEY}.good_token")
            bad = single_token(tokenizer, str(settings.get("bad_token")), f"{KEY}.bad_token")
            if good == bad:
                raise ValueError(f"{KEY}.good_token and {KEY}.bad_token are the same token ({good}); give two")
        max_length = settings.get("max_length")
        return cls(
            form=form,
            separator=str(settings.get("separator")),
            separator_id=single_token(tokenizer, str(settings.get("separator")), f"{KEY}.separator"),
            step_delimiter=unescape(str(settings.get("step_delimiter", "\\n"))),
            chat_template=bool(settings.get("chat_template", True)),
            system_prompt=settings.get("system_prompt"),
            good_label=int(settings.get("good_label", 1)),
            good_token_id=good,
            bad_token_id=bad,
            max_length=None if max_length is None else int(max_length),
        )


@dataclass(frozen=True)
class PRMInput:
    """One model input: its token ids, the position of each scored step's separator, and that step's last
    character in the response (the same order)."""

    ids: list[int]
    positions: list[int]
    step_ends: list[int]


_CONTENT = "\ue000"
"""A stand-in for the assistant's message while the chat template is rendered (a private-use character)."""


def build_input(tokenizer: Any, fmt: PRMFormat, question: str, response: str) -> PRMInput:
    """The model's input for one response: the question, then every step followed by the separator token."""
    spans = split_steps(response, fmt.step_delimiter)
    if not spans:
        return PRMInput([], [], [])

    def encode(text: str, special: bool = False) -> list[int]:
        ids = tokenizer.encode(text.replace(fmt.separator, " "), add_special_tokens=special) if text else []
        return [token for token in ids if token != fmt.separator_id]  # the separator stands after steps only

    if fmt.chat_template:
        messages = ([{"role": "system", "content": fmt.system_prompt}] if fmt.system_prompt else []) + [
            {"role": "user", "content": question.replace(fmt.separator, " ")},
            {"role": "assistant", "content": _CONTENT},
        ]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        if rendered.count(_CONTENT) != 1:
            raise ValueError(
                f"{KEY}.chat_template=true: the tokenizer's chat template does not keep the assistant's message as it "
                f"is, so the steps cannot be placed in it; set {KEY}.chat_template=false"
            )
        head, tail = rendered.split(_CONTENT)
        prefix, joiner, suffix = encode(head), [], encode(tail)
    else:
        prefix, joiner, suffix = encode(question + "\n", special=True), encode("\n"), []
    ids, positions = list(prefix), []
    for number, (start, end) in enumerate(spans):
        if number:
            ids.extend(joiner)
        ids.extend(encode(response[start:end]))
        positions.append(len(ids))
        ids.append(fmt.separator_id)
    ids.extend(suffix)
    step_ends = [end - 1 for _, end in spans]
    if fmt.max_length is not None and len(ids) > fmt.max_length:
        ids = ids[: fmt.max_length]
        kept = sum(position < fmt.max_length for position in positions)
        positions, step_ends = positions[:kept], step_ends[:kept]
    return PRMInput(ids, positions, step_ends)


def separator_rows(rows: Rows, item: PRMInput, separator_id: int) -> list[Sequence[float]]:
    """The rows at the separators: from one row per token (read at the positions), or one row per separator token
    of the input (vLLM's ``STEP`` pooling) of which the scored steps' are the first."""
    count = sum(token == separator_id for token in item.ids)
    if len(rows) == len(item.ids):
        return [rows[position] for position in item.positions]
    if len(rows) == count:
        return list(rows[: len(item.positions)])
    raise ValueError(
        f"the process reward model returned {len(rows)} rows for an input of {len(item.ids)} tokens with {count} "
        f"separators (id {separator_id}); expected one row per token (pooling ALL) or one per separator (pooling "
        f"STEP with step_tag_id={separator_id}): serve it with that step_tag_id "
        "(reward.reward_model.rollout.engine_kwargs.vllm.pooler_config)"
    )


def step_probability(row: Sequence[float], fmt: PRMFormat) -> float:
    """The probability that the step is good, from the model's row at its separator."""
    if fmt.form == "classification":
        if not 0 <= fmt.good_label < len(row):
            raise ValueError(f"{KEY}.good_label={fmt.good_label} is not a label of the model's {len(row)}")
        return float(row[fmt.good_label])
    if len(row) == 2:
        good, bad = float(row[0]), float(row[1])  # returned_token_ids=[good, bad]
    elif max(fmt.good_token_id, fmt.bad_token_id) < len(row):
        good, bad = float(row[fmt.good_token_id]), float(row[fmt.bad_token_id])
    else:
        raise ValueError(
            f"{KEY}.form=token: a row of {len(row)} values is neither the pair (good_token, bad_token) nor a row "
            "over the vocabulary; serve the model with pooler_config.returned_token_ids=[good id, bad id]"
        )
    return good / (good + bad) if good + bad > 0 else 0.5


class ProcessRewardModelScorer:
    """The ``prm`` step scorer: ``scorer(question, response) -> [(last character index, probability), ...]``
    (``recipe_dapo.advantages.steps.StepScorer``), and :meth:`score_batch` for many responses in few model calls."""

    right_above = 0.5
    """A step counts as right in the ``process/step_right_fraction`` metric when its probability is above this."""

    def __init__(self, tokenizer: Any, fmt: PRMFormat, backend: Backend, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"{KEY}.batch_size={batch_size} must be at least 1")
        self.tokenizer, self.fmt, self.backend, self.batch_size = tokenizer, fmt, backend, batch_size

    def __call__(self, question: str, response: str) -> Steps:
        return self.score_batch([question], [response])[0]

    def inputs(self, questions: Sequence[str], responses: Sequence[str]) -> list[PRMInput]:
        return [build_input(self.tokenizer, self.fmt, question, response)
                for question, response in zip(questions, responses, strict=True)]

    def score_batch(self, questions: Sequence[str], responses: Sequence[str]) -> list[Steps]:
        items = self.inputs(questions, responses)
        scored = [index for index, item in enumerate(items) if item.positions]
        out: list[Steps] = [[] for _ in items]
        for first in range(0, len(scored), self.batch_size):
            chunk = scored[first: first + self.batch_size]
            rows = self.backend([items[index].ids for index in chunk])
            if len(rows) != len(chunk):
                raise ValueError(f"the process reward model answered {len(rows)} of {len(chunk)} inputs")
            for index, item_rows in zip(chunk, rows):
                item = items[index]
                at_separators = separator_rows(item_rows, item, self.fmt.separator_id)
                out[index] = [(end, step_probability(row, self.fmt))
                              for end, row in zip(item.step_ends, at_separators, strict=True)]
        return out
