"""A discrete-event model of GPU generation time per DAPO step, for four ways of filling a batch of qualifying groups.

On GPUs a generation round lasts as long as its longest response, and DAPO's responses run to 20,480 tokens. This
bench simulates the rollout replicas of one training run, step by step, and drives them with the recipe's real
sampler (``recipe_dapo.dynamic_sampling``: ``DynamicSampler`` with ``collect_step`` for the round modes and
``collect_streaming_step`` over a simulated ``GroupStream`` for the streaming modes), so sizing, keep-rate estimate,
pool, carry-over and staleness are the recipe's own code. The stream's ``wait()`` advances the simulated clock by one
poll interval; nothing sleeps.

Modes, all at ``train_batch_size`` = 512 trained groups per step:

- ``deficit``    the classic trainer: blocking rounds sized to the deficit (``round_sizing=deficit``, the recipe's
                 defaults: safety_margin 0.1, max_staleness 1, rounds of at most gen_batch_size); each round is a
                 barrier that waits for its longest response.
- ``whole``      the paper: blocking rounds of gen_batch_size = 3 x 512 = 1536 prompts (verl's DAPO script,
                 ``gen_prompt_bsz = train_prompt_bsz * 3``), surplus discarded (max_staleness 0): the synchronous
                 reference whose trained groups are an unbiased sample of the qualifying ones.
- ``v1``         verl's v1 trainer in sync mode (``drain=True``): refills stream in as groups finish; once the batch is
                 full the step waits for every prompt in flight and pools their qualifying groups (recipe defaults,
                 including the dispatch cap pooled + in flight <= 512 x (1 + max_staleness)).
- ``one_round``  the recipe's one-round mode (``dapo.dynamic_sampling.one_round=true``, ``one_round_confidence`` 0.9
                 or ``--confidence``, the default ``one_round_overprovision`` 1.5 and ``max_staleness`` 1): at the
                 step's start the responses aborted at the end of the last step resume first (re-prefilling prompt
                 plus partial tokens), and ``prompts_to_dispatch(in_flight)`` brings the prompts in flight to 1.5x
                 what fills the batch with probability ``one_round_confidence`` at the keep-rate estimate
                 (``sizing.one_round_prompts``; no dispatch room); another submission only when the prompts in flight
                 are no longer expected to fill the batch. Groups are judged as they finish; once the batch is full
                 (``drain=False``) the step ends and every response still generating (or queued) is aborted and keeps
                 its tokens, except while the stream's ``overdue()`` counts prompts in flight that, aborted now and
                 resumed next step, would train more than ``max_staleness`` steps after their submission (with
                 max_staleness 1: every prompt resumed from the last step): the step waits for those. A group is born
                 in the step it was submitted in (``born_steps``), so the sampler's staleness rules see its age.

Engine model (per rollout replica, continuous batching, all constants assumed, not measured):

- 128 GPUs (the verl reproduction of the paper's run: 16 nodes x 8 H800, ``gen_tp=4``) -> 32 replicas of TP 4.
- At most ``CONCURRENCY`` = 256 sequences running per replica (vLLM's default ``max_num_seqs``); KV-cache capacity and
  preemption are not modelled beyond this limit. Sequences wait FIFO; a new sequence goes to the replica with the
  fewest running plus queued sequences. The ``n`` = 16 responses of a prompt are 16 independent sequences.
- One decode iteration gives every running sequence one token and lasts ``DECODE_FIXED_S + DECODE_PER_SEQ_S *
  running`` seconds: 10 ms (reading 16 GB of bf16 weights per GPU at 3.35 TB/s, 4.8 ms, plus TP all-reduces, sampling
  and scheduling) + 0.1 ms per sequence (reading ~4,000 tokens of Qwen2.5-32B KV cache, 256 KiB per token, split over
  4 GPUs, plus 16 GFLOP per token per GPU at half of 989 TFLOP/s). About 7,200 tokens/s per replica at 256 running.
  Context length does not change the per-sequence cost (a stated simplification).
- Admitting a sequence stalls its replica for ``PREFILL_S_PER_TOKEN`` = 50 us per prompt token (64 GFLOP per token
  over 4 GPUs at 40% of peak), ``PROMPT_TOKENS`` = 250 tokens per prompt (assumed; DAPO-Math-17k prompts with the
  instruction template); no prefix caching. A resumed response re-prefills its prompt plus its partial tokens.
- Training, old log-probs and the weight update take ``TRAIN_S`` = 250 s per step in every mode (assumed: 8192
  responses of ~4,250 tokens, 8 x 32e9 FLOP per token for forward, backward and the log-prob pass, on 128 GPUs at 30%
  of peak, plus the weight sync); colocated, so the replicas generate nothing meanwhile. Generation time is reported
  separately.

Workload (assumptions):

- Each prompt has a solve rate q ~ Beta(c * SOLVE_MEAN, c * (1 - SOLVE_MEAN)), SOLVE_MEAN = 0.4, the concentration c
  solved so that the expected keep rate 1 - E[q^16] - E[(1-q)^16] (DAPO's rule: a group is kept unless its 16
  responses are all right or all wrong) is the setting's keep rate (0.1 to 0.9). Each response is right with
  probability q.
- Response lengths: lognormal, sigma ``LENGTH_SIGMA`` = 0.8, median ``L0 * exp(-0.25 * logit(q))`` (harder prompts
  answer longer: x1.28 per logit of difficulty, q clipped to [0.02, 0.98]) times 1.4 for a wrong answer (the same
  length model as bench/dynamic_sampling_sim.py), truncated at 20,480 tokens (the paper's 16,384 + 4,096 overlong
  buffer). L0 is calibrated per setting so that the mean length of qualifying groups' responses (what a synchronous run
  trains, verl's ``response_length/mean``) is the setting's mean: ``paper`` 4,000 tokens (the top of the DAPO paper's
  Figure 7a, mean response length over training, axis to 4,000; Figure 4b shows lengths to 5,000 without token-level
  loss), ``early`` 1,500 (the first part of that curve). The public verl DAPO reproduction logs (W&B, linked from
  verl's recipe/dapo README) could not be read here, so their ``response_length/mean``, ``max`` and ``clip_ratio`` are
  not used; the model's clip ratio is printed for comparison.
- Prompt i of the stream is the same prompt (same q, answers and lengths) in every mode (common random numbers).

Measures, per mode and setting, over the steps after ``WARMUP`` steps (the pool, the keep-rate estimate and the
carried responses reach steady state):

- ``gen s``        generation seconds per step (mean); ``step s`` adds TRAIN_S.
- ``gen/ideal``    generated tokens / ideal tokens, the ideal being the tokens a generator must spend to obtain the
                   trained groups and nothing else: trained groups / keep rate x the mean tokens of a generated group
                   (workload expectation). 1.0: no waste; the paper's discarded surplus and anything lost show above it.
                   ``gen/trained`` is the raw ratio of generated to trained-response tokens.
- ``shift``        trained mean response length relative to the synchronous whole-round reference, the expected mean
                   length of qualifying groups' responses (signed; ``whole``'s own measured shift is its noise).
- ``KS fin``       KS distance between trained response lengths and all lengths that finished in the window;
                   ``KS sync`` between trained lengths and a large sample of qualifying groups' lengths.
- ``q tr / q sub`` mean solve rate of trained prompts / of submitted prompts (reference: E[q | kept]).
- ``resumed``      responses resumed after an abort that trained, per step; ``age`` mean age in steps of trained groups,
                   ``max age`` the oldest's (steps since its submission); ``dropped`` qualifying groups dropped as
                   stale.
- ``wait s``       the one-round mode: generation seconds per step after the batch was full (waiting for the overdue
                   prompts).
- ``prompts``      prompts submitted per step; ``step 1`` those submitted in the first step. Under each setting's table
                   the one-round mode's first steps, which the averages leave out: prompts submitted, the oldest trained
                   group's age, generation seconds, seconds after full and groups dropped, per step.

What the model shows (figures: the default run, see docs/design.md):

- Generation is throughput-bound: over a run every submitted prompt is generated once (aborted work resumes, it is
  not lost), so a step costs at least its generated tokens over the replicas' peak rate (32 x 256 / 35.6 ms = 230k
  tokens/s: 416 s at keep 0.45 for the trained groups' ideal tokens, printed under the headline). Deficit rounds are
  1.44x that floor at keep 0.45 (mostly one round per step already, thanks to the margin and the carry-over), the
  one-round mode 1.23x. Sized only to fill the batch at confidence 0.9 (``one_round_overprovision`` 1), a submission
  is ~5% above the expected need and a group is judged only when the slowest of its 16 responses ends, so the batch
  needs nearly all of the round's groups, hence nearly all of their responses: the queues empty and the last ~40% of
  the step runs at about a third of the 256 sequences per replica (1.34x the floor); a higher confidence adds too few
  prompts to change that (``--confidences``). Kept 1.5x in flight (the default), the batch fills from the groups that
  finish first while the replicas are full, and the rest finish first in the next step (``--overprovisions``). The
  overdue wait is a few seconds a step with the paper's lengths (the resumed responses run first and finish before the
  batch is full).
- Cold start: in the first step the groups that finish first are short, easy ones, all right, and the keep-rate
  estimate (a prior worth one group) falls on a handful of them (0.25 after one finished group, 0.04 after twelve, at
  keep 0.45); each fall is a further submission sized at the estimate, and with no dispatch room the first step
  submits 14,071-15,360 prompts at keep rates 0.3-0.6 (15,360 is the step's ``max_num_gen_batches`` budget). With
  max_staleness 1 all of them are overdue in step 2, which submits nothing, waits 2,300-2,700 s after its batch is
  full to finish them, and drops the 3,500-8,000 qualifying groups beyond its batch as stale; no trained group is ever
  older than one step. From step 3 the run is at steady state; ``WARMUP`` leaves steps 1-8 out of the averages.

The last line: ``RESULT one_round_over_rounds=<gen time one_round / deficit> one_round_over_v1=<gen time one_round /
v1> gen_over_ideal=<one_round's> trained_length_shift=<one_round's>``, averaged over the settings with keep rate
0.3-0.6 and the paper's lengths.

After the headline, the throughput floor of each headline keep rate: the trained groups' ideal tokens at the
replicas' peak rate (every replica decoding ``CONCURRENCY`` sequences, no prefill), against which the one-round mode's
time and the step-time targets are given as multiples. ``--staleness 1,2,3`` runs the deficit, v1 and one-round modes
again with each ``max_staleness`` (whether the bound is what holds the one-round mode back).

The last RESULT field ``one_round_over_floor``: the one-round mode's generation time over the floor, averaged over the
headline keep rates.

Run: python bench/gpu_step_model.py [--quick] [--confidence 0.9] [--steps 18] [--confidences 0.5,0.75,0.9,0.97] [--staleness 1,2,3]
    [--overprovisions 1,1.25,1.5,1.75,2]
(about 2 minutes on one core by default, 3 with ``--keeps 0.3,0.45,0.6`` and the four confidences; ``--quick``: a scaled-down system for tests, whose figures are mostly noise.)
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from recipe_dapo.dynamic_sampling import (
    DynamicSampler,
    DynamicSamplingConfig,
    PromptStream,
    ScoredRound,
    collect_step,
    collect_streaming_step,
)

RESPONSES = 16
MAX_LENGTH = 20480
TRAIN_PROMPTS = 512
GEN_PROMPTS = 3 * TRAIN_PROMPTS
MAX_NUM_GEN_BATCHES = 10
REPLICAS = 32  # 128 GPUs / TP 4
CONCURRENCY = 256
DECODE_FIXED_S = 0.010
DECODE_PER_SEQ_S = 1e-4
PREFILL_S_PER_TOKEN = 5e-5
PROMPT_TOKENS = 250
TRAIN_S = 250.0
POLL_S = 2.0  # simulated seconds between two polls of a streaming step (verl's own replay buffer; the recipe polls every 0.05 s, which against steps of hundreds of seconds changes nothing but the bench's run time)
SOLVE_MEAN = 0.4
LENGTH_SIGMA = 0.8
LENGTH_PER_LOGIT = 0.25
WRONG_LENGTH_FACTOR = 1.4
LENGTH_SETTINGS = {"paper": 4000.0, "early": 1500.0}
KEEP_RATES = (0.1, 0.3, 0.45, 0.6, 0.9)
HEADLINE_KEEPS = (0.3, 0.45, 0.6)
DEFAULT_CONFIDENCE = 0.9  # the recipe's dapo.dynamic_sampling.one_round_confidence default
CONFIDENCES = (0.5, 0.75, 0.9, 0.97)
WARMUP = 8  # steps not counted: the pool, the keep-rate estimate and the carried responses settle
MODES = ("deficit", "whole", "v1", "one_round")
CHUNK = 4096
ROW = np.dtype([("uid", np.int64), ("prompt", np.int64), ("length", np.int64), ("resumed", np.int8),
                ("born", np.int64)])


@dataclass(frozen=True)
class System:
    """The rollout system and batch sizes (``quick``: a scaled-down copy with the same per-replica load)."""

    replicas: int = REPLICAS
    concurrency: int = CONCURRENCY
    train_prompts: int = TRAIN_PROMPTS
    gen_prompts: int = GEN_PROMPTS
    decode_fixed_s: float = DECODE_FIXED_S
    decode_per_seq_s: float = DECODE_PER_SEQ_S
    prefill_s_per_token: float = PREFILL_S_PER_TOKEN
    prompt_tokens: int = PROMPT_TOKENS
    poll_s: float = POLL_S


QUICK = System(replicas=4, train_prompts=64, gen_prompts=192)  # the per-replica load of the full system


# --------------------------------------------------------------------------------------------------------- workload


def _betaln(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def expected_keep_rate(concentration: float, mean: float = SOLVE_MEAN, n: int = RESPONSES) -> float:
    """1 - E[q^n] - E[(1-q)^n] for q ~ Beta(c * mean, c * (1 - mean))."""
    a, b = concentration * mean, concentration * (1.0 - mean)
    return 1.0 - math.exp(_betaln(a + n, b) - _betaln(a, b)) - math.exp(_betaln(a, b + n) - _betaln(a, b))


def concentration_for(keep_rate: float) -> float:
    """The Beta concentration whose expected keep rate is ``keep_rate`` (bisection on log c)."""
    low, high = math.log(1e-4), math.log(1e5)
    for _ in range(100):
        mid = 0.5 * (low + high)
        if expected_keep_rate(math.exp(mid)) < keep_rate:
            low = mid
        else:
            high = mid
    return math.exp(0.5 * (low + high))


class World:
    """Prompt ``i`` of the stream: its solve rate, its 16 answers (right or wrong) and their lengths, drawn from a
    generator seeded by (seed, i // CHUNK), so every mode sees the same prompts. ``lengths`` overrides the length
    model with one constant (tests)."""

    def __init__(self, keep_rate: float, mean_length: float, seed: int, constant_length: Optional[int] = None,
                 correct_pattern=None):
        self.keep_rate, self.seed = keep_rate, seed
        self.concentration = concentration_for(keep_rate)
        self.constant_length = constant_length
        self.correct_pattern = correct_pattern  # tests: prompt index -> number of right answers
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.l0 = 1.0
        if constant_length is None:
            for _ in range(6):  # fixed point: the kept responses' mean length is mean_length (truncation bends it)
                self.l0 *= mean_length / self.reference()["kept_mean_length"]
        self._chunks.clear()

    def _draw(self, rng: np.random.Generator, count: int):
        c = self.concentration
        q = rng.beta(c * SOLVE_MEAN, c * (1.0 - SOLVE_MEAN), size=count)
        correct = rng.random((count, RESPONSES)) < q[:, None]
        logit = np.log(np.clip(q, 0.02, 0.98) / (1.0 - np.clip(q, 0.02, 0.98)))
        median = self.l0 * np.exp(-LENGTH_PER_LOGIT * logit)[:, None] * np.where(correct, 1.0, WRONG_LENGTH_FACTOR)
        lengths = np.exp(np.log(median) + LENGTH_SIGMA * rng.standard_normal(correct.shape))
        lengths = np.clip(np.ceil(lengths), 1, MAX_LENGTH).astype(np.int64)
        return q, correct, lengths

    def _chunk(self, index: int):
        if index not in self._chunks:
            q, correct, lengths = self._draw(np.random.default_rng([self.seed, 7, index]), CHUNK)
            base = index * CHUNK
            if self.correct_pattern is not None:
                right = np.array([self.correct_pattern(base + i) for i in range(CHUNK)])
                correct = np.arange(RESPONSES)[None, :] < right[:, None]
                q = right / RESPONSES
            if self.constant_length is not None:
                lengths = np.full(lengths.shape, self.constant_length, dtype=np.int64)
            self._chunks[index] = (q, correct, lengths)
        return self._chunks[index]

    def prompts(self, first: int, count: int):
        """(q [count], correct [count, n], lengths [count, n]) of prompts first .. first + count - 1."""
        index = np.arange(first, first + count)
        parts = [self._chunk(c) for c in range(first // CHUNK, (first + count - 1) // CHUNK + 1)]
        offset = index - (first // CHUNK) * CHUNK
        return tuple(np.concatenate([p[k] for p in parts])[offset] for k in range(3))

    def prompt(self, i: int):
        q, correct, lengths = self._chunk(i // CHUNK)
        return q[i % CHUNK], correct[i % CHUNK], lengths[i % CHUNK]

    def reference(self, prompts: int = 40000) -> dict:
        """Expectations of the workload from a large sample: what a synchronous run trains and spends."""
        q, correct, lengths = self._draw(np.random.default_rng([self.seed, 99]), prompts)
        right = correct.sum(axis=1)
        kept = (right > 0) & (right < RESPONSES)
        return {
            "keep_rate": float(kept.mean()),
            "kept_mean_length": float(lengths[kept].mean()),
            "group_tokens": float(lengths.sum(axis=1).mean()),
            "kept_solve_rate": float(q[kept].mean()),
            "solve_rate": float(q.mean()),
            "clip_ratio": float((lengths[kept] >= MAX_LENGTH).mean()),
            "kept_lengths": np.sort(lengths[kept].reshape(-1)),
        }


# --------------------------------------------------------------------------------------------------------- engine


@dataclass(slots=True)
class Sequence:
    """One response: its target length, the tokens it has (kept across an abort), where it runs."""

    sid: int
    uid: int
    target: int
    index: int = 0  # which of its prompt's responses
    done: int = 0
    admitted_at: float = 0.0  # the replica's iteration counter at admission
    replica: int = -1
    resumed: bool = False
    finished: bool = False
    start_done: int = 0  # tokens it had when last submitted (what it decodes from there is counted once)


class Replica:
    """Continuous batching: up to ``concurrency`` sequences decode together, one token each per iteration of
    ``decode_fixed_s + decode_per_seq_s * running`` seconds; admitting a sequence stalls the replica for its prefill."""

    def __init__(self, system: System, on_finish):
        self.system, self.on_finish = system, on_finish
        self.t = 0.0
        self.iteration = 0.0
        self.heap: list[tuple[float, int]] = []
        self.running: dict[int, Sequence] = {}
        self.queue: deque[Sequence] = deque()

    @property
    def load(self) -> int:
        return len(self.running) + len(self.queue)

    def _admit(self) -> None:
        system = self.system
        while self.queue and len(self.running) < system.concurrency:
            seq = self.queue.popleft()
            self.t += system.prefill_s_per_token * (system.prompt_tokens + seq.done)
            seq.admitted_at = self.iteration - seq.done  # tokens so far = iteration - admitted_at
            self.running[seq.sid] = seq
            heapq.heappush(self.heap, (seq.admitted_at + seq.target, seq.sid))

    def advance_to(self, until: float) -> None:
        system = self.system
        while True:
            self._admit()
            if not self.heap:
                if until != math.inf:
                    self.t = max(self.t, until)
                return
            step_s = system.decode_fixed_s + system.decode_per_seq_s * len(self.running)
            finish_iteration, sid = self.heap[0]
            at = self.t + (finish_iteration - self.iteration) * step_s
            if at > until:
                if until > self.t:
                    self.iteration += (until - self.t) / step_s
                    self.t = until
                return
            heapq.heappop(self.heap)
            self.iteration, self.t = finish_iteration, at
            seq = self.running.pop(sid)
            seq.done, seq.finished = seq.target, True
            self.on_finish(seq, at)

    def abort(self) -> list[Sequence]:
        """Stop everything: running sequences keep the tokens they have, queued ones what they had."""
        aborted = []
        for seq in self.running.values():
            seq.done = min(int(self.iteration - seq.admitted_at), seq.target - 1)
            aborted.append(seq)
        aborted += list(self.queue)
        self.running.clear()
        self.queue.clear()
        self.heap.clear()
        return aborted


class Engine:
    """The replicas, a clock, and the token accounts: every decoded token is in a finished response or a carried one."""

    def __init__(self, system: System):
        self.system = system
        self.replicas = [Replica(system, self._finished) for _ in range(system.replicas)]
        self.now = 0.0
        self.decoded = 0  # tokens decoded (generated) so far
        self.finished_tokens = 0  # final lengths of finished responses
        self.just_finished: list[Sequence] = []

    def _finished(self, seq: Sequence, at: float) -> None:
        self.decoded += seq.target - seq.start_done
        self.finished_tokens += seq.target
        self.just_finished.append(seq)

    def submit(self, seqs) -> None:
        """Each sequence to the replica with the fewest running plus queued sequences."""
        loads = [(replica.load, r) for r, replica in enumerate(self.replicas)]
        heapq.heapify(loads)
        for replica in self.replicas:
            if not replica.load:
                replica.t = max(replica.t, self.now)  # an idle replica starts at the present
        for seq in seqs:
            seq.start_done = seq.done
            load, r = heapq.heappop(loads)
            seq.replica = r
            self.replicas[r].queue.append(seq)
            heapq.heappush(loads, (load + 1, r))

    def advance_to(self, until: float) -> None:
        for replica in self.replicas:
            replica.advance_to(until)
        self.now = until

    def run_until_idle(self) -> float:
        """Blocking round: run until every sequence finished; the time the last replica finished."""
        end = self.now
        for replica in self.replicas:
            replica.advance_to(math.inf)
            end = max(end, replica.t)
        return end

    def abort(self) -> list[Sequence]:
        aborted = []
        for replica in self.replicas:
            for seq in replica.abort():
                self.decoded += seq.done - seq.start_done
                seq.start_done = seq.done
                aborted.append(seq)
            replica.t = self.now
        return aborted


def blocking_round_seconds(targets: np.ndarray, system: System) -> float:
    """One replica's blocking round: FIFO admission up to ``concurrency``, decode until the last response ends (the
    same model as :class:`Replica`, without the bookkeeping a streaming source needs)."""
    fixed, per_seq, prefill = system.decode_fixed_s, system.decode_per_seq_s, system.prefill_s_per_token * system.prompt_tokens
    t = iteration = 0.0
    heap: list[float] = []
    pending = iter(targets.tolist())
    for target in itertools.islice(pending, system.concurrency):
        t += prefill
        heap.append(float(target))
    heapq.heapify(heap)
    while heap:
        finish = heapq.heappop(heap)
        t += (finish - iteration) * (fixed + per_seq * (len(heap) + 1))
        iteration = finish
        target = next(pending, None)
        if target is not None:
            t += prefill
            heapq.heappush(heap, iteration + target)
    return t


class BlockingRounds:
    """Round source for ``collect_step``: every prompt's 16 responses generate, spread evenly over the replicas (each
    response to the replica with the fewest, in order: round robin); the round ends with its last response."""

    def __init__(self, world: World, system: System, recorder: "Recorder"):
        self.world, self.system, self.recorder = world, system, recorder
        self.uids = itertools.count()
        self.seconds = 0.0
        self.decoded = 0
        self.step = 0  # the step being collected (set by run_mode): the born step of its rounds' groups

    def __call__(self, prompts: np.ndarray) -> ScoredRound:
        prompts = np.asarray(prompts)
        q, correct, lengths = self.world.prompts(int(prompts[0]), len(prompts))
        assert np.array_equal(prompts, np.arange(prompts[0], prompts[0] + len(prompts)))  # the stream is serial
        flat = lengths.reshape(-1)
        replicas = self.system.replicas
        self.seconds += max(blocking_round_seconds(flat[r::replicas], self.system) for r in range(replicas))
        self.decoded += int(flat.sum())
        self.recorder.submitted_q.extend(q.tolist())
        self.recorder.finished_lengths.extend(flat.tolist())
        table = np.zeros(flat.shape[0], dtype=ROW)
        table["uid"] = np.repeat(np.array([next(self.uids) for _ in prompts]), RESPONSES)
        table["prompt"] = np.repeat(prompts, RESPONSES)
        table["length"] = flat
        table["born"] = self.step
        return ScoredRound(table, group_ids=table["uid"], metric_values=correct.reshape(-1).astype(float),
                           generated_tokens=int(flat.sum()))


class SimulatedStream:
    """A ``GroupStream`` over the engine: submit draws the next prompts of the world; poll returns the groups whose 16
    responses have all finished; wait advances the clock by one poll interval. In the one-round mode ``abort()`` stops
    the responses still generating, ``begin_step`` resumes them first, and ``overdue()`` counts the prompts in flight
    that the step must finish (``max_staleness``)."""

    def __init__(self, world: World, system: System, recorder: "Recorder", drop_aborted: bool = False,
                 max_staleness: int = 1, report_overdue: bool = True):
        self.world, self.system, self.recorder = world, system, recorder
        self.engine = Engine(system)
        self.drop_aborted = drop_aborted  # a deliberately broken variant: aborted groups are thrown away (tests)
        self.max_staleness = max_staleness
        self.report_overdue = report_overdue  # False: a broken variant whose overdue() is always 0 (tests)
        self.next_prompt = 0
        self.sids = itertools.count()
        self.groups: dict[int, dict] = {}  # uid -> prompt, step, responses left, sequences
        self.carried: list[Sequence] = []
        self.step = 0
        self.full_at: Optional[float] = None  # simulated time of the step's first overdue() call: the batch was full
        self.late_groups = 0  # groups that finished more than max_staleness steps after their submission step

    def begin_step(self, step: int) -> None:
        self.step = step
        self.full_at = None
        if self.carried:
            for seq in self.carried:
                seq.resumed = True
            self.engine.submit(self.carried)
            self.carried = []

    def submit(self, prompts: int) -> None:
        first = self.next_prompt
        self.next_prompt += prompts
        q, correct, lengths = self.world.prompts(first, prompts)
        self.recorder.submitted_q.extend(q.tolist())
        seqs = []
        for k in range(prompts):
            prompt = first + k
            self.groups[prompt] = {"prompt": prompt, "born": self.step, "left": RESPONSES, "correct": correct[k],
                                   "lengths": lengths[k], "resumed": np.zeros(RESPONSES, np.int8)}
            seqs += [Sequence(next(self.sids), prompt, target, j) for j, target in enumerate(lengths[k].tolist())]
        self.engine.submit(seqs)

    def poll(self) -> Optional[ScoredRound]:
        done = []
        for seq in self.engine.just_finished:
            group = self.groups[seq.uid]
            group["left"] -= 1
            if seq.resumed:
                group["resumed"][seq.index] = 1
            if group["left"] == 0:
                done.append(self.groups.pop(seq.uid))
        self.recorder.finished_lengths.extend(seq.target for seq in self.engine.just_finished)
        self.engine.just_finished = []
        if not done:
            return None
        self.late_groups += sum(1 for group in done if self.step - group["born"] > self.max_staleness)
        table = np.zeros(len(done) * RESPONSES, dtype=ROW)
        table["uid"] = table["prompt"] = np.repeat([group["prompt"] for group in done], RESPONSES)
        table["length"] = np.concatenate([group["lengths"] for group in done])
        table["resumed"] = np.concatenate([group["resumed"] for group in done])
        metric = np.concatenate([group["correct"] for group in done]).astype(float)
        table["born"] = np.repeat([group["born"] for group in done], RESPONSES)
        return ScoredRound(table, group_ids=table["uid"], metric_values=metric, born_steps=table["born"].copy())

    def release(self, group_ids) -> None:
        pass

    def in_flight(self) -> int:
        return len(self.groups)

    def overdue(self) -> int:
        """Prompts in flight (running, queued, or aborted and resumed) submitted in a step ``s`` with ``step + 1 - s >
        max_staleness``: aborted now and finished in the next step, they would train too late, so the step waits for
        them. ``collect_streaming_step`` asks only once the batch is full and prompts are in flight, so the first call
        of a step marks the simulated time the batch filled (``full_at``)."""
        if self.full_at is None:
            self.full_at = self.engine.now
        if not self.report_overdue:
            return 0
        limit = self.step + 1 - self.max_staleness
        return sum(1 for group in self.groups.values() if group["born"] < limit)

    def wait(self) -> None:
        self.engine.advance_to(self.engine.now + self.system.poll_s)

    def abort(self) -> None:
        self.carried = self.engine.abort()
        if self.drop_aborted:
            for seq in self.carried:
                self.groups.pop(seq.uid, None)
            self.carried = []

    def carried_tokens(self) -> int:
        return sum(seq.done for seq in self.carried)


# --------------------------------------------------------------------------------------------------------- runs


@dataclass
class Recorder:
    """What a run generated, finished and trained, per step."""

    submitted_q: list = field(default_factory=list)
    finished_lengths: list = field(default_factory=list)
    steps: list = field(default_factory=list)

    def submitted(self, q: float) -> None:
        self.submitted_q.append(float(q))

    def finished(self, lengths) -> None:
        self.finished_lengths.extend(int(x) for x in lengths)


def sampler_for(mode: str, system: System, confidence: float = DEFAULT_CONFIDENCE,
                max_staleness: int | None = None, overprovision: float | None = None) -> DynamicSampler:
    own = {
        "deficit": {},
        "whole": {"round_sizing": "whole", "max_staleness": 0},
        "v1": {},
        "one_round": {"one_round": True, "one_round_confidence": confidence},  # the default max_staleness, 1
    }[mode]
    if max_staleness is not None and mode != "whole":
        own = {**own, "max_staleness": max_staleness}
    if overprovision is not None and mode == "one_round":
        own = {**own, "one_round_overprovision": overprovision}
    config = DynamicSamplingConfig.from_config(
        {"enable": True, "metric": "acc", "max_num_gen_batches": MAX_NUM_GEN_BATCHES},
        own,
        train_batch_size=system.train_prompts,
        gen_batch_size=system.gen_prompts,
    )
    return DynamicSampler(config)


@dataclass
class StepRecord:
    step: int
    gen_s: float
    after_full_s: float  # the one-round mode: generation seconds after the batch was full (the overdue wait)
    generated_tokens: int
    trained_lengths: np.ndarray
    trained_prompts: np.ndarray
    trained_groups: int
    resumed: int
    mean_age: float
    oldest_age: int  # steps since submission of the oldest trained group
    dropped_stale: int
    submitted_from: int
    submitted_to: int
    finished_from: int
    finished_to: int


def run_mode(mode: str, world: World, system: System, steps: int, confidence: float = DEFAULT_CONFIDENCE,
             drop_aborted: bool = False, report_overdue: bool = True,
             max_staleness: int | None = None, overprovision: float | None = None) -> tuple[list[StepRecord], dict]:
    """One training run of ``steps`` steps through the recipe's sampler; per-step records and the run's accounts.
    ``drop_aborted`` and ``report_overdue=False`` are broken variants of the one-round mode (tests);
    ``max_staleness``: the sampler's bound (default: the recipe's, 1); ``overprovision``: the one-round mode's
    ``one_round_overprovision`` (default: the recipe's)."""
    sampler = sampler_for(mode, system, confidence, max_staleness, overprovision)
    recorder = Recorder()
    records = []
    accounts: dict = {"recorder": recorder, "sampler": sampler}
    if mode in ("deficit", "whole"):
        source = BlockingRounds(world, system, recorder)
        prompts = PromptStream(lambda epoch: (np.arange(i, i + CHUNK) for i in itertools.count(0, CHUNK)))
        for step in range(1, steps + 1):
            marks = len(recorder.submitted_q), len(recorder.finished_lengths), source.seconds, source.decoded
            source.step = step
            collected = collect_step(sampler, prompts, source, step)
            records.append(_record(step, collected, source.seconds - marks[2], 0.0, source.decoded - marks[3],
                                   recorder, marks))
        accounts.update(decoded=source.decoded, finished=source.decoded, carried=0)
        return records, accounts
    stream = SimulatedStream(world, system, recorder, drop_aborted, sampler.config.max_staleness, report_overdue)
    engine = stream.engine
    for step in range(1, steps + 1):
        marks = len(recorder.submitted_q), len(recorder.finished_lengths), engine.now, engine.decoded
        stream.begin_step(step)
        collected = collect_streaming_step(sampler, stream, step, drain=(mode == "v1"))
        after_full = engine.now - stream.full_at if mode == "one_round" and stream.full_at is not None else 0.0
        if mode == "one_round":
            stream.abort()
        records.append(_record(step, collected, engine.now - marks[2], after_full, engine.decoded - marks[3],
                               recorder, marks))
    accounts.update(decoded=engine.decoded, finished=engine.finished_tokens, carried=stream.carried_tokens(),
                    in_flight_groups=stream.in_flight(), late_groups=stream.late_groups, stream=stream)
    return records, accounts


def _record(step: int, collected, gen_s: float, after_full_s: float, generated: int, recorder: Recorder,
            marks) -> StepRecord:
    batch, metrics = collected.batch, collected.metrics
    empty = np.empty(0, np.int64)
    return StepRecord(
        step=step,
        gen_s=gen_s,
        after_full_s=after_full_s,
        generated_tokens=generated,
        trained_lengths=batch["length"].copy() if batch is not None else empty,
        trained_prompts=batch["prompt"][::RESPONSES].copy() if batch is not None else empty,
        trained_groups=0 if batch is None else len(batch) // RESPONSES,
        resumed=int(batch["resumed"].sum()) if batch is not None else 0,
        mean_age=float(metrics["dynamic_sampling/mean_staleness"]),
        oldest_age=int(step - batch["born"].min()) if batch is not None and len(batch) else 0,
        dropped_stale=int(metrics["dynamic_sampling/dropped_stale_groups"]),
        submitted_from=marks[0], submitted_to=len(recorder.submitted_q),
        finished_from=marks[1], finished_to=len(recorder.finished_lengths),
    )


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = np.sort(np.asarray(a)), np.sort(np.asarray(b))
    if not len(a) or not len(b):
        return float("nan")
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a)
                               - np.searchsorted(b, grid, side="right") / len(b))))


@dataclass
class Summary:
    mode: str
    lengths: str
    keep: float
    gen_s: float
    gen_over_ideal: float
    gen_over_trained: float
    shift: float
    ks_finished: float
    ks_sync: float
    q_trained: float
    q_submitted: float
    resumed_per_step: float
    mean_age: float
    max_age: int
    after_full_s: float
    dropped: int
    trained_per_step: float
    prompts_per_step: float
    first_step_prompts: int
    floor_s: float  # the step's generated tokens at the replicas' peak rate
    ideal_floor_s: float  # the tokens the trained groups needed and nothing else, at that rate


def peak_tokens_per_s(system: System) -> float:
    """Every replica decoding ``concurrency`` sequences at once, nothing else (no prefill, no idle slot)."""
    return system.replicas * system.concurrency / (system.decode_fixed_s + system.decode_per_seq_s * system.concurrency)


def summarize(mode: str, lengths: str, world: World, reference: dict, records: list[StepRecord],
              recorder: Recorder, warmup: int, system: System) -> Summary:
    window = records[warmup:]
    trained = np.concatenate([r.trained_lengths for r in window])
    prompts = np.concatenate([r.trained_prompts for r in window])
    groups = sum(r.trained_groups for r in window)
    generated = sum(r.generated_tokens for r in window)
    finished = np.array(recorder.finished_lengths[window[0].finished_from:window[-1].finished_to])
    submitted_q = np.array(recorder.submitted_q[window[0].submitted_from:window[-1].submitted_to])
    ideal = groups / reference["keep_rate"] * reference["group_tokens"]
    return Summary(
        mode=mode, lengths=lengths, keep=world.keep_rate,
        gen_s=float(np.mean([r.gen_s for r in window])),
        gen_over_ideal=generated / ideal,
        gen_over_trained=generated / trained.sum(),
        shift=float(trained.mean() / reference["kept_mean_length"] - 1.0),
        ks_finished=ks_distance(trained, finished),
        ks_sync=ks_distance(trained, reference["kept_lengths"]),
        q_trained=float(np.mean([world.prompt(int(p))[0] for p in prompts])),
        q_submitted=float(submitted_q.mean()) if submitted_q.size else float("nan"),
        resumed_per_step=float(np.mean([r.resumed for r in window])),
        mean_age=float(np.mean([r.mean_age for r in window])),
        max_age=max(r.oldest_age for r in window),
        after_full_s=float(np.mean([r.after_full_s for r in window])),
        dropped=sum(r.dropped_stale for r in window),
        trained_per_step=groups / len(window),
        prompts_per_step=float(np.mean([r.submitted_to - r.submitted_from for r in window])),
        first_step_prompts=records[0].submitted_to - records[0].submitted_from,
        floor_s=generated / len(window) / peak_tokens_per_s(system),
        ideal_floor_s=ideal / len(window) / peak_tokens_per_s(system),
    )


def headline_runs(keeps, modes, system: System, steps: int, warmup: int, seed: int, **options) -> list[dict]:
    """Per keep rate (the paper's lengths), each mode's ``Summary`` of a run with ``options`` (``run_mode``'s)."""
    rows = []
    for keep in keeps:
        world = World(keep, LENGTH_SETTINGS["paper"], seed)
        reference = world.reference()
        row = {}
        for mode in modes:
            records, accounts = run_mode(mode, world, system, steps, **options)
            row[mode] = summarize(mode, "paper", world, reference, records, accounts["recorder"], warmup, system)
        rows.append(row)
    return rows


SWEEP_NOTE = ("the one-round mode's means; floor: the trained groups' ideal tokens at peak rate; age: its trained "
              "groups' mean age in steps; wait s: seconds after the batch was full, waiting for overdue prompts")
SWEEP_HEADER = (f"{'gen s':>7} {'/deficit':>8} {'/v1':>6} {'/floor':>6} {'gen/ideal':>9} {'shift':>7} {'resumed':>7} "
                f"{'age':>5} {'wait s':>6} {'prompts':>7} {'step 1':>6} {'max age':>7} {'dropped':>7}")


def sweep_line(one: list[Summary], deficit_s: list[float], v1_s: list[float]) -> str:
    """A sweep's row (``SWEEP_HEADER``): the one-round runs' means over the headline keep rates, its generation seconds
    against the deficit rounds' and v1's at the same keep rates."""
    def mean(attribute: str) -> float:
        return float(np.mean([getattr(s, attribute) for s in one]))

    return (f"{mean('gen_s'):7.0f} {np.mean([s.gen_s / d for s, d in zip(one, deficit_s)]):8.3f} "
            f"{np.mean([s.gen_s / v for s, v in zip(one, v1_s)]):6.3f} "
            f"{np.mean([s.gen_s / s.ideal_floor_s for s in one]):6.2f} {mean('gen_over_ideal'):9.3f} "
            f"{mean('shift'):+7.3f} {mean('resumed_per_step'):7.1f} {mean('mean_age'):5.2f} {mean('after_full_s'):6.1f} "
            f"{mean('prompts_per_step'):7.0f} {mean('first_step_prompts'):6.0f} {max(s.max_age for s in one):7d} "
            f"{sum(s.dropped for s in one):7d}")


def first_steps_line(records: list[StepRecord], count: int) -> str:
    """The one-round mode's first steps (the averages leave them out): prompts submitted, the oldest trained group's
    age, generation seconds and the seconds of them after the batch was full."""
    shown = records[:count]

    def join(values) -> str:
        return " ".join(values)

    return (f"  one_round steps 1-{len(shown)}: prompts {join(str(r.submitted_to - r.submitted_from) for r in shown)}"
            f" | oldest age {join(str(r.oldest_age) for r in shown)} | gen s {join(f'{r.gen_s:.0f}' for r in shown)}"
            f" | after full s {join(f'{r.after_full_s:.0f}' for r in shown)}"
            f" | dropped {join(str(r.dropped_stale) for r in shown)}")


def _main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a scaled-down system and fewer settings (tests)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 18; quick 8), the first "
                        f"{WARMUP} (quick 3) not counted")
    parser.add_argument("--keeps", default=",".join(map(str, KEEP_RATES)), help="keep rates (paper lengths)")
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE,
                        help="the one-round mode's dapo.dynamic_sampling.one_round_confidence")
    parser.add_argument("--confidences", default="", help="one_round_confidence values to sweep for the one-round "
                        f"mode at the headline keep rates, e.g. {','.join(map(str, CONFIDENCES))}")
    parser.add_argument("--overprovisions", default="", help="one_round_overprovision values to sweep for the "
                        "one-round mode at the headline keep rates, e.g. 1,1.25,1.5,1.75,2")
    parser.add_argument("--staleness", default="", help="dapo.dynamic_sampling.max_staleness values to sweep for "
                        "the one-round mode (and deficit rounds and v1, its references) at the headline keep rates, "
                        "e.g. 1,2,3")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    system = QUICK if args.quick else System()
    steps = args.steps or (8 if args.quick else 18)
    warmup = min(3 if args.quick else WARMUP, steps - 1)
    settings = [("paper", float(k)) for k in args.keeps.split(",")] + [("early", 0.45)]
    if args.quick:
        settings = [("paper", 0.3), ("paper", 0.6)]
    started = time.monotonic()
    print(f"system: {system.replicas} replicas x {system.concurrency} sequences, batch {system.train_prompts} "
          f"prompts x {RESPONSES}, gen_batch_size {system.gen_prompts}; decode {system.decode_fixed_s * 1e3:.0f} ms + "
          f"{system.decode_per_seq_s * 1e3:.2f} ms x running; prefill {system.prefill_s_per_token * 1e6:.0f} us/token; "
          f"training {TRAIN_S:.0f} s/step; one-round confidence {args.confidence}, max_staleness 1; {steps} steps, "
          f"first {warmup} not counted")
    header = (f"{'lengths':7} {'keep':>4} {'mode':10} {'gen s':>7} {'step s':>7} {'gen/ideal':>9} {'gen/trn':>7} "
              f"{'shift':>7} {'KS fin':>6} {'KS sync':>7} {'q tr':>5} {'q sub':>5} {'resumed':>7} {'age':>5} "
              f"{'max age':>7} {'wait s':>6} {'dropped':>7} {'prompts':>7} {'step 1':>6}")
    summaries: dict[tuple[str, float, str], Summary] = {}
    for lengths, keep in settings:
        world = World(keep, LENGTH_SETTINGS[lengths], args.seed)
        reference = world.reference()
        print(f"\n{lengths} lengths, keep rate {keep} (sampled {reference['keep_rate']:.3f}): kept mean length "
              f"{reference['kept_mean_length']:.0f}, clip ratio {reference['clip_ratio']:.3f}, E[q | kept] "
              f"{reference['kept_solve_rate']:.3f}, E[q] {reference['solve_rate']:.3f}")
        print(header)
        first_steps = ""
        for mode in MODES:
            records, accounts = run_mode(mode, world, system, steps, confidence=args.confidence)
            s = summarize(mode, lengths, world, reference, records, accounts["recorder"], warmup, system)
            summaries[(lengths, keep, mode)] = s
            print(f"{lengths:7} {keep:4.2f} {mode:10} {s.gen_s:7.0f} {s.gen_s + TRAIN_S:7.0f} {s.gen_over_ideal:9.3f} "
                  f"{s.gen_over_trained:7.2f} {s.shift:+7.3f} {s.ks_finished:6.3f} {s.ks_sync:7.3f} {s.q_trained:5.3f} "
                  f"{s.q_submitted:5.3f} {s.resumed_per_step:7.1f} {s.mean_age:5.2f} {s.max_age:7d} "
                  f"{s.after_full_s:6.1f} {s.dropped:7d} {s.prompts_per_step:7.0f} {s.first_step_prompts:6d}")
            if mode == "one_round":
                first_steps = first_steps_line(records, warmup)
        print(first_steps)
    headline = [k for (lengths, k, mode) in summaries if lengths == "paper" and mode == "one_round"
                and 0.3 <= k <= 0.6]
    if not headline:
        headline = sorted({k for (_, k, _) in summaries})

    def mean_of(mode: str, attribute: str) -> float:
        return float(np.mean([getattr(summaries[("paper", k, mode)], attribute) for k in headline]))

    def ratio(mode: str, other: str) -> float:
        return float(np.mean([summaries[("paper", k, mode)].gen_s / summaries[("paper", k, other)].gen_s
                              for k in headline]))

    print(f"\nkeep rates {headline}, paper lengths: generation time one_round / deficit {ratio('one_round', 'deficit'):.3f}"
          f" (target <= 0.75), / v1 {ratio('one_round', 'v1'):.3f} (target <= 0.8), / whole "
          f"{ratio('one_round', 'whole'):.3f}; whole step (with {TRAIN_S:.0f} s training) / deficit "
          f"{np.mean([(summaries[('paper', k, 'one_round')].gen_s + TRAIN_S) / (summaries[('paper', k, 'deficit')].gen_s + TRAIN_S) for k in headline]):.3f}")
    print("throughput floor (the trained groups' ideal tokens at the replicas' peak rate, "
          f"{peak_tokens_per_s(system) / 1e3:.0f}k tokens/s) against the step-time targets:")
    for k in headline:
        row = {mode: summaries[("paper", k, mode)] for mode in MODES}
        floor = row["one_round"].ideal_floor_s
        print(f"  keep {k:4.2f}: floor {floor:5.0f} s | one_round {row['one_round'].gen_s:5.0f} s "
              f"({row['one_round'].gen_s / floor:.2f}x the floor) | 0.75 x deficit {0.75 * row['deficit'].gen_s:5.0f} s "
              f"({0.75 * row['deficit'].gen_s / floor:.2f}x) | 0.8 x v1 {0.8 * row['v1'].gen_s:5.0f} s "
              f"({0.8 * row['v1'].gen_s / floor:.2f}x)")
    def references(mode: str) -> list[float]:
        return [summaries[("paper", k, mode)].gen_s for k in headline]

    def one_round_sweep(setting: str, column: str, values: str, options) -> None:
        """The one-round mode at each of ``values`` (comma-separated) of ``setting``, run with ``options(value)``."""
        swept = [float(value) for value in values.split(",") if value.strip()]
        if not swept:
            return
        print(f"\none-round mode, paper lengths, {setting} (keep rates {headline}; {SWEEP_NOTE}):")
        width = max(5, len(column))
        print(f"{column:>{width}} {SWEEP_HEADER}")
        for value in swept:
            one = [row["one_round"] for row in headline_runs(headline, ("one_round",), system, steps, warmup,
                                                             args.seed, **options(value))]
            print(f"{value:{width}.2f} {sweep_line(one, references('deficit'), references('v1'))}")

    one_round_sweep("one_round_confidence", "conf", args.confidences, lambda value: dict(confidence=value))
    one_round_sweep("one_round_overprovision", "factor", args.overprovisions,
                    lambda value: dict(confidence=args.confidence, overprovision=value))
    bounds = [int(b) for b in args.staleness.split(",") if b.strip()]
    if bounds:
        print(f"\nmax_staleness, paper lengths (keep rates {headline}; every mode with that bound; {SWEEP_NOTE}):")
        print(f"{'bound':>5} {'deficit s':>9} {'v1 s':>6} {SWEEP_HEADER}")
        for bound in bounds:
            rows = headline_runs(headline, ("deficit", "v1", "one_round"), system, steps, warmup, args.seed,
                                 confidence=args.confidence, max_staleness=bound)
            deficit, v1 = [r["deficit"].gen_s for r in rows], [r["v1"].gen_s for r in rows]
            print(f"{bound:5d} {np.mean(deficit):9.0f} {np.mean(v1):6.0f} "
                  f"{sweep_line([r['one_round'] for r in rows], deficit, v1)}")
    print(f"\n({time.monotonic() - started:.0f} s)")
    print(f"RESULT one_round_over_rounds={ratio('one_round', 'deficit'):.3f} one_round_over_v1={ratio('one_round', 'v1'):.3f} "
          f"gen_over_ideal={mean_of('one_round', 'gen_over_ideal'):.3f} "
          f"trained_length_shift={mean_of('one_round', 'shift'):+.3f} "
          f"one_round_over_floor={np.mean([summaries[('paper', k, 'one_round')].gen_s / summaries[('paper', k, 'one_round')].ideal_floor_s for k in headline]):.3f}")


def main(argv=None):
    """The command line (``_main``), with the recipe's warnings quiet while it runs: the paper's discard warns once per
    run, as expected here. The logger's level is put back after (a test calls this in its own process)."""
    recipe = logging.getLogger("recipe_dapo")
    level = recipe.level
    recipe.setLevel(logging.ERROR)
    try:
        return _main(argv)
    finally:
        recipe.setLevel(level)


if __name__ == "__main__":
    main()
