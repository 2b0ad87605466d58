"""The process reward model as the step scorer of ``grpo_process`` (``dapo.objective.step_scorer=prm``): tiny
randomly initialised models built here (a two-label token classifier, Qwen2.5-Math-PRM's form, and a language model
read at "+"/"-", Math-Shepherd's), the Qwen2.5 tokenizer from the shared data; each step's reward is the model's own
probability at the separator after it, computed here from the model directly, and lands on the step's last token;
the served path speaks vLLM's pooling API to a stand-in server that answers with the same model; the Hydra switch
composes with the real config and each contradiction is refused at start-up naming its key."""

from __future__ import annotations

import http.server
import json
import threading

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, compose_recipe_config, small_run
from recipe_dapo.advantages.prm import PRMFormat, ProcessRewardModelScorer, build_input, split_steps
from recipe_dapo.advantages.prm_backends import LocalPRM, ServedPRM
from recipe_dapo.preflight import CheckReport, DAPOConfigError, check_config, check_rules

TOKENIZER = REPO_ROOT.parent / "shared" / "data" / "qwen2.5-tokenizer"
SEP = "<extra_0>"
QUESTION = "Compute 4+5-2."
RESPONSE = "4+5-2\n=9-2\n\n=7\nAnswer: 7"
STEPS = ["4+5-2", "=9-2", "=7", "Answer: 7"]


def tiny_config(vocab_size: int, **extra):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                       tie_word_embeddings=True, **extra)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A Qwen2.5-Math-PRM-shaped model folder: the tokenizer with <extra_0> added, a two-label token classifier."""
    from transformers import AutoTokenizer, Qwen2ForTokenClassification

    folder = tmp_path_factory.mktemp("prm_classifier")
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    tokenizer.add_special_tokens({"additional_special_tokens": [SEP]})
    torch.manual_seed(0)
    model = Qwen2ForTokenClassification(tiny_config(len(tokenizer), num_labels=2)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    fmt = PRMFormat.from_settings({"form": "classification", "separator": SEP, "step_delimiter": "\\n"}, tokenizer)
    return folder, tokenizer, model, fmt


@pytest.fixture(scope="module")
def token_model(tmp_path_factory):
    """A Math-Shepherd-shaped model: a language model read at "+"/"-", the separator "ки" (one ordinary token)."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(tiny_config(len(tokenizer))).eval()
    fmt = PRMFormat.from_settings({"form": "token", "separator": "ки", "step_delimiter": "\\n",
                                   "chat_template": False, "good_token": "+", "bad_token": "-"}, tokenizer)
    return tokenizer, model, fmt


def reference_probabilities(model, ids: list[int], positions: list[int], columns=None) -> list[float]:
    """The model's probability of the good label (column 1) / good token at ``positions``, computed directly."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    if columns is not None:  # token form: softmax over (good, bad), the good one's share
        return logits[positions][:, columns].softmax(-1)[:, 0].tolist()
    return logits[positions].softmax(-1)[:, 1].tolist()


def same_steps(got, expected, tolerance=1e-6) -> bool:
    """The same step ends, and rewards equal within ``tolerance``."""
    return [end for end, _ in got] == [end for end, _ in expected] and all(
        abs(a - b) <= tolerance for (_, a), (_, b) in zip(got, expected))


# ------------------------------------------------------------------------------------------------ the steps


def test_a_response_is_cut_into_its_non_blank_pieces():
    assert [RESPONSE[a:b] for a, b in split_steps(RESPONSE, "\n")] == STEPS
    assert [RESPONSE[a:b] for a, b in split_steps(RESPONSE, "\n\n")] == ["4+5-2\n=9-2", "=7\nAnswer: 7"]
    assert [("  a \n b")[a:b] for a, b in split_steps("  a \n b", "\n")] == ["a", "b"]
    assert split_steps("", "\n") == [] and split_steps(" \n\n \n", "\n") == []


# ------------------------------------------------------------------------------------------------ the scores


def test_each_step_gets_the_classifiers_good_probability_at_its_separator(classifier):
    _, tokenizer, model, fmt = classifier
    scorer = ProcessRewardModelScorer(tokenizer, fmt, LocalPRM(model, fmt))
    steps = scorer(QUESTION, RESPONSE)

    # Reference: Qwen2.5-Math-PRM's own recipe, the whole chat rendered and tokenized at once, the separator's
    # positions found in it.
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": SEP.join(STEPS) + SEP}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(chat, tokenize=False), add_special_tokens=False)
    positions = [index for index, token in enumerate(ids) if token == fmt.separator_id]
    expected = reference_probabilities(model, ids, positions)

    assert len(steps) == len(STEPS) == len(positions)
    assert [end for end, _ in steps] == [RESPONSE.index(step) + len(step) - 1 for step in STEPS]
    assert [reward for _, reward in steps] == pytest.approx(expected, abs=1e-5)
    # positive control: one token off, the model says something else
    shifted = reference_probabilities(model, ids, [position - 1 for position in positions])
    assert max(abs(a - b) for a, b in zip(expected, shifted)) > 1e-3


def test_the_token_form_reads_good_against_bad_at_an_ordinary_separator_token(token_model):
    tokenizer, model, fmt = token_model
    steps = ProcessRewardModelScorer(tokenizer, fmt, LocalPRM(model, fmt))(QUESTION, RESPONSE)

    # Reference: Math-Shepherd's layout, "question\nstep ки\nstep ки...", tokenized at once.
    text = QUESTION + "\n" + "\n".join(f"{step}ки" for step in STEPS)
    ids = tokenizer.encode(text, add_special_tokens=True)
    positions = [index for index, token in enumerate(ids) if token == fmt.separator_id]
    columns = [fmt.good_token_id, fmt.bad_token_id]
    expected = reference_probabilities(model, ids, positions, columns)

    assert len(steps) == len(positions) == 4
    assert [reward for _, reward in steps] == pytest.approx(expected, abs=1e-5)
    shifted = reference_probabilities(model, ids, [position + 1 for position in positions[:-1]], columns)
    assert max(abs(a - b) for a, b in zip(expected, shifted)) > 1e-3


def test_a_separator_in_the_text_is_taken_out_so_that_it_stands_after_steps_only(classifier):
    _, tokenizer, model, fmt = classifier
    item = build_input(tokenizer, fmt, f"Q {SEP}", f"a{SEP}b\nc")
    assert [token == fmt.separator_id for token in item.ids].count(True) == 2 == len(item.positions)
    assert all(item.ids[position] == fmt.separator_id for position in item.positions)


def test_no_step_no_query_and_an_input_cut_at_max_length_scores_the_steps_it_kept(classifier):
    _, tokenizer, model, fmt = classifier
    calls = []

    def backend(inputs):
        calls.append(inputs)
        return LocalPRM(model, fmt)(inputs)

    scorer = ProcessRewardModelScorer(tokenizer, fmt, backend, batch_size=2)
    assert scorer.score_batch([QUESTION] * 2, ["", " \n "]) == [[], []]
    assert calls == []

    full = build_input(tokenizer, fmt, QUESTION, RESPONSE)
    from dataclasses import replace

    cut = replace(fmt, max_length=full.positions[1] + 1)  # the second separator is the last token kept
    steps = ProcessRewardModelScorer(tokenizer, cut, backend)(QUESTION, RESPONSE)
    whole = scorer(QUESTION, RESPONSE)
    assert len(steps) == 2 and same_steps(steps, whole[:2])  # causal: the cut changes nothing before it


def test_a_separator_of_several_tokens_is_refused_naming_the_key():
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(TOKENIZER))  # Qwen2.5 without <extra_0>
    with pytest.raises(ValueError, match="dapo.objective.prm.separator='<extra_0>' is 5 tokens"):
        PRMFormat.from_settings({"form": "classification", "separator": SEP}, plain)


# ------------------------------------------------------------------------------------------------ in the trainer


def process_batch(tokenizer, responses: list[str], eos: list[bool]):
    """A batch as the trainer holds it at the advantage step: left-padded prompts, right-padded responses."""
    from verl import DataProto

    from recipe_dapo.data.template import apply_dapo_template

    chat = [{"role": "user", "content": apply_dapo_template(QUESTION)}]
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    encoded = [tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if end else [])
               for text, end in zip(responses, eos)]
    width = max(len(ids) for ids in encoded)
    rows = len(responses)
    response_ids = torch.full((rows, width), tokenizer.pad_token_id)
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    for row, ids in enumerate(encoded):
        response_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[row, : len(ids)] = 1
    prompts = torch.tensor([prompt_ids] * rows)
    raw_prompt = np.empty(rows, dtype=object)
    for row in range(rows):
        raw_prompt[row] = chat
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": response_ids, "response_mask": response_mask,
                 "attention_mask": torch.cat([torch.ones_like(prompts), response_mask], -1),
                 "token_level_rewards": torch.zeros(rows, width)},
        non_tensors={"uid": np.array(["g"] * rows, dtype=object), "raw_prompt": raw_prompt},
    )


def test_the_hook_puts_each_steps_probability_on_its_last_token(classifier):
    from transformers import AutoTokenizer

    from recipe_dapo.trainers.process_steps import write_step_rewards

    _, prm_tokenizer, model, fmt = classifier
    actor_tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    truncated = RESPONSE[: RESPONSE.index("=7") + 1]  # cut by the length limit inside the third step: no EOS
    responses = [RESPONSE, "   ", truncated]
    batch = process_batch(actor_tokenizer, responses, eos=[True, True, False])
    scorer = ProcessRewardModelScorer(prm_tokenizer, fmt, LocalPRM(model, fmt))
    metrics = write_step_rewards(batch, actor_tokenizer, scorer)

    rewards = batch.batch["token_level_rewards"]
    for row, text in enumerate(responses):
        expected = scorer(QUESTION, text)  # the bare problem: raw_prompt's user message, its template taken off
        ends = rewards[row].nonzero().flatten().tolist()
        assert len(ends) == len(expected), row
        decoded = [actor_tokenizer.decode(batch.batch["responses"][row, : token + 1].tolist()) for token in ends]
        assert [len(prefix) - 1 for prefix in decoded] == [end for end, _ in expected], row
        assert rewards[row, ends].tolist() == pytest.approx([reward for _, reward in expected])
    assert rewards[1].abs().sum() == 0  # no step: no reward
    assert [RESPONSE[a:b] for a, b in split_steps(truncated, "\n")][-1] == "="  # the unfinished step, scored
    assert rewards[2].nonzero().flatten().tolist()[-1] == int(batch.batch["response_mask"][2].sum()) - 1
    assert metrics["process/steps_per_response_mean"] == pytest.approx((4 + 0 + 3) / 3)
    assert metrics["process/responses_without_step"] == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------------------------ served by verl


class PoolingServer:
    """A stand-in for vLLM's ``POST /pooling`` (task ``token_classify``) behind verl's reward router: it answers
    with the tiny model's rows, one per token (pooler ``ALL``) or one per separator (``STEP`` with step_tag_id)."""

    def __init__(self, backend, step_tag_id=None, fail: int | None = None):
        server = self
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, body))
                if fail:
                    self.send_response(fail)
                    self.end_headers()
                    self.wfile.write(b'{"error": "Task token_classify is not supported"}')
                    return
                data = []
                for index, (ids, rows) in enumerate(zip(body["input"], backend(body["input"]))):
                    if step_tag_id is not None:
                        rows = [row for token, row in zip(ids, rows) if token == step_tag_id]
                    data.append({"index": index, "object": "pooling", "data": rows})
                answer = json.dumps({"object": "list", "data": data[::-1]}).encode()  # order by index, not place
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("step_pooling", [False, True])
def test_the_served_model_scores_like_the_model_itself(classifier, step_pooling):
    folder, tokenizer, model, fmt = classifier
    local = LocalPRM(model, fmt)
    server = PoolingServer(local, step_tag_id=fmt.separator_id if step_pooling else None)
    try:
        served = ProcessRewardModelScorer(tokenizer, fmt, ServedPRM(server.address, str(folder)), batch_size=2)
        responses = [RESPONSE, "", "=9-2\nAnswer: 7", "x"]
        got = served.score_batch([QUESTION] * 4, responses)
    finally:
        server.close()
    expected = ProcessRewardModelScorer(tokenizer, fmt, local).score_batch([QUESTION] * 4, responses)
    assert [len(steps) for steps in got] == [4, 0, 2, 1]
    for steps, reference in zip(got, expected):
        assert same_steps(steps, reference)
    assert [len(body["input"]) for _, body in server.requests] == [2, 1]  # 3 responses with steps, 2 per request
    path, body = server.requests[0]
    assert path == "/pooling" and body["task"] == "token_classify" and body["model"] == str(folder)


def test_a_served_model_that_refuses_token_scoring_fails_naming_the_model_key(classifier):
    folder, tokenizer, model, fmt = classifier
    server = PoolingServer(None, fail=400)
    try:
        scorer = ProcessRewardModelScorer(tokenizer, fmt, ServedPRM(server.address, str(folder)))
        with pytest.raises(RuntimeError, match="reward.reward_model.model_path") as failed:
            scorer(QUESTION, RESPONSE)
    finally:
        server.close()
    assert "token_classify is not supported" in str(failed.value)


def test_the_trainer_builds_the_prm_scorer_on_verls_router_and_wakes_the_served_model(classifier):
    from types import SimpleNamespace

    from recipe_dapo.trainers.process_steps import build_step_scorer, served_model_awake

    folder, tokenizer, model, fmt = classifier
    config = compose_recipe_config(prm_overrides(folder))
    server = PoolingServer(LocalPRM(model, fmt), step_tag_id=fmt.separator_id)
    events = []
    manager = SimpleNamespace(wake_up=lambda: events.append("wake"), sleep=lambda: events.append("sleep"))
    loop = SimpleNamespace(reward_router_address=server.address, reward_model_manager=manager)
    try:
        scorer = build_step_scorer(config, loop)
        with served_model_awake(loop):
            events.append("score")
            steps = scorer(QUESTION, RESPONSE)
    finally:
        server.close()
    assert events == ["wake", "score", "sleep"]
    assert same_steps(steps, ProcessRewardModelScorer(tokenizer, fmt, LocalPRM(model, fmt))(QUESTION, RESPONSE))
    with pytest.raises(RuntimeError, match="reward.reward_model.enable=true"):
        build_step_scorer(config, SimpleNamespace(reward_router_address=None))


# ------------------------------------------------------------------------------------------------ configuration

DATA = ["data.train_files=/absent/train.parquet", "data.val_files=/absent/val.parquet",
        "actor_rollout_ref.model.path=/absent/model"]


def prm_overrides(model_path, *extra) -> list[str]:
    return small_run(DATA, "objective=grpo_process", "dapo.objective.step_scorer=prm",
                     "reward.reward_model.enable=true", f"reward.reward_model.model_path={model_path}",
                     "reward.reward_model.rollout.name=vllm",
                     "reward.custom_reward_function.path=pkg://recipe_dapo.reward",
                     "reward.custom_reward_function.name=compute_score", *extra)


def dry_run() -> CheckReport:
    return CheckReport(absent_inputs_ok=True, dry_run=True)


def test_the_switch_composes_and_passes_every_start_up_check(classifier):
    folder = classifier[0]
    config = compose_recipe_config(prm_overrides(folder, "dapo.objective.prm.step_delimiter='\\n\\n'"))
    assert config.dapo.objective.step_scorer == "prm"
    assert config.dapo.objective.prm.separator == SEP and config.dapo.objective.prm.form == "classification"
    assert config.algorithm.adv_estimator == "grpo_process"
    assert PRMFormat.from_settings(config.dapo.objective.prm, classifier[1]).step_delimiter == "\n\n"
    report = check_config(config, absent_inputs_ok=True, dry_run=True)  # both tiers, the tokenizer loaded
    assert not any("reward.reward_model.model_path" in line for line in report.not_checked)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["reward.reward_model.model_path=null"], "reward.reward_model.model_path"),
        (["reward.reward_model.enable=false"], "reward.reward_model.enable=true"),
        (["objective=grpo"], "algorithm.adv_estimator=grpo"),
        (["trainer.device=cpu"], "trainer.device=cpu"),
        (["reward.reward_model.rollout.name=sglang"], "reward.reward_model.rollout.name=vllm"),
        (["reward.custom_reward_function.path=null"], "reward.custom_reward_function.path=pkg://recipe_dapo.reward"),
        (["dapo.objective.prm.form=regression"], "dapo.objective.prm.form"),
        (["dapo.objective.prm.form=token", "dapo.objective.prm.bad_token=+"], "dapo.objective.prm.bad_token"),
        (["dapo.objective.prm.batch_size=0"], "dapo.objective.prm.batch_size"),
        (["dapo.objective.prm.separator=''"], "dapo.objective.prm.separator"),
    ],
)
def test_a_contradiction_is_refused_before_workers_launch_naming_the_key(overrides, named):
    config = compose_recipe_config(prm_overrides("/absent/prm", *overrides))
    with pytest.raises(DAPOConfigError) as refused:
        check_rules(config, dry_run())
    assert named in str(refused.value)


def test_platform_cpu_is_refused():
    config = compose_recipe_config(prm_overrides("/absent/prm", "platform=cpu"))
    with pytest.raises(DAPOConfigError, match=r"dapo.objective.step_scorer=prm on CPU \(trainer.device=cpu"):
        check_rules(config, dry_run())


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["dapo.objective.prm.separator='<extra_9>'"], "dapo.objective.prm.separator='<extra_9>' is"),
        (["dapo.objective.prm.form=token", "dapo.objective.prm.good_token=plus minus"],
         "dapo.objective.prm.good_token"),
        (["dapo.objective.prm.good_label=2"], "dapo.objective.prm.good_label=2"),
    ],
)
def test_what_the_models_tokenizer_cannot_do_is_refused_at_start_up(classifier, overrides, named):
    config = compose_recipe_config(prm_overrides(classifier[0], *overrides))
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config, absent_inputs_ok=True, dry_run=True)
    assert named in str(refused.value)
