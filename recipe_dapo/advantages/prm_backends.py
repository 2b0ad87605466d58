"""Where a process reward model's rows come from (``recipe_dapo.advantages.prm.Backend``): the model verl serves as
its reward model (:class:`ServedPRM`), or the model loaded with transformers in this process (:class:`LocalPRM`).

:class:`ServedPRM` is what training uses. verl 0.9.1 serves ``reward.reward_model`` with vLLM behind its reward
router (``verl.experimental.reward_loop.RewardLoopManager``), and verl's own reward-model query (``/classify``,
``RewardLoopWorker.compute_score_disrm``) returns one score per sequence. A step scorer needs the model's output at
every separator, so it asks the same router for vLLM's token-level pooling: ``POST /pooling`` with the token ids
and ``task=token_classify``, which returns one probability row per token, or one per separator when the served
pooler is vLLM's ``STEP`` with ``step_tag_id`` (Qwen2.5-Math-PRM's default).

:class:`LocalPRM` returns the same rows from a transformers model (``AutoModelForTokenClassification`` for
``form=classification``, ``AutoModelForCausalLM`` for ``form=token``): the reference the tests compare with, and a
way to score offline.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Optional, Sequence

from recipe_dapo.advantages.prm import PRMFormat, Rows


class ServedPRM:
    """Rows from the served reward model: ``POST http://{address}/pooling`` (vLLM's pooling API)."""

    def __init__(self, address: str, model: str, timeout_s: float = 300.0):
        self.address, self.model, self.timeout_s = address, model, timeout_s

    def __call__(self, inputs: list[list[int]]) -> list[Rows]:
        body = json.dumps({"model": self.model, "input": inputs, "task": "token_classify"}).encode()
        request = urllib.request.Request(
            f"http://{self.address}/pooling", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise RuntimeError(
                f"the process reward model served at {self.address} refused token-level scoring (HTTP {exc.code}: "
                f"{detail}); reward.reward_model.model_path must be a model vLLM serves for token_classify (a "
                "process reward model such as Qwen2.5-Math-PRM, or a *ForTokenClassification model)"
            ) from exc
        except (urllib.error.URLError, TimeoutError) as exc:
            raise RuntimeError(
                f"the process reward model served at {self.address} did not answer within "
                f"dapo.objective.prm.timeout_s={self.timeout_s}: {exc}"
            ) from exc
        return rows_of(answer, len(inputs))


def rows_of(answer: Any, expected: int) -> list[Rows]:
    """The rows of each input from vLLM's pooling response (``{"data": [{"index": i, "data": rows}, ...]}``)."""
    items = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(items, list) or len(items) != expected:
        raise RuntimeError(
            f"the process reward model's pooling response is not {expected} items of rows: {str(answer)[:300]}"
        )
    ordered = sorted(items, key=lambda item: item.get("index", 0))
    rows = [item.get("data") for item in ordered]
    if any(not isinstance(item_rows, list) or (item_rows and not isinstance(item_rows[0], list))
           for item_rows in rows):
        raise RuntimeError(
            "the process reward model's pooling response holds no per-token rows (one score per sequence?): serve "
            "a process reward model, whose pooler is token-wise"
        )
    return rows


class LocalPRM:
    """Rows from a transformers model in this process, as vLLM's pooler ``ALL`` returns them: per token, the labels'
    probabilities (``classification``) or the (good, bad) tokens' (``token``)."""

    def __init__(self, model: Any, fmt: PRMFormat, device: Optional[str] = None):
        self.model, self.fmt = model, fmt
        self.device = device or str(next(model.parameters()).device)

    @classmethod
    def load(cls, path: str, fmt: PRMFormat, device: str = "cpu", **kwargs: Any) -> "LocalPRM":
        import transformers

        auto = (transformers.AutoModelForTokenClassification if fmt.form == "classification"
                else transformers.AutoModelForCausalLM)
        return cls(auto.from_pretrained(path, **kwargs).to(device).eval(), fmt, device)

    def __call__(self, inputs: list[list[int]]) -> list[Rows]:
        import torch

        out: list[Rows] = []
        with torch.no_grad():
            for ids in inputs:  # one at a time: no padding to reason about
                logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0].float()
                out.append(self.probabilities(logits).tolist())
        return out

    def probabilities(self, logits: Sequence) -> Any:
        if self.fmt.form == "classification":
            return logits.softmax(-1)
        return logits[:, [self.fmt.good_token_id, self.fmt.bad_token_id]].softmax(-1)
