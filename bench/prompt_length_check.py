"""Cost of the start-up prompt-length check on DAPO-Math-17k (17,917 prompts) with the Qwen2.5 tokenizer.

Rows, each on the whole file (read, render the chat template, count), best of ``--repeats``:

- recipe, byte bound:    ``scan_prompt_lengths`` as the start-up check runs it (only prompts over the limit
                         in normalized bytes are tokenized; see recipe_dapo/data/prompt_length.py)
- recipe, full count:    every prompt rendered in one batch and tokenized in batches (no byte bound)
- per row, as verl does: ``apply_chat_template(..., tokenize=True)`` one row at a time (verl's
                         ``data.filter_overlong_prompts`` and the agent loop), on ``--per-row-sample`` rows,
                         scaled to the file

All rows must find the same overlong prompts; the benchmark checks that before printing.
The machine's load average is printed with the result: the figures are wall-clock seconds.

Run: python bench/prompt_length_check.py [--limit 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from recipe_dapo.data.prompt_length import load_tokenizer, render_prompts, scan_prompt_lengths, token_counts

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def best_of(repeats: int, run):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(SHARED / "dapo-math-17k" / "dapo-math-17k.parquet"))
    parser.add_argument("--tokenizer", default=str(SHARED / "qwen2.5-tokenizer"))
    parser.add_argument("--limit", type=int, default=2048, help="data.max_prompt_length (the paper: 2048)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-row-sample", type=int, default=2000)
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.tokenizer)
    rows = pq.ParquetFile(args.data).metadata.num_rows

    bound_s, lengths = best_of(args.repeats, lambda: scan_prompt_lengths(args.data, tokenizer, args.limit))

    def full_count():
        prompts = pq.read_table(args.data, columns=["prompt"]).column("prompt").to_pylist()
        return token_counts(tokenizer, render_prompts(tokenizer, prompts))

    full_s, counts = best_of(args.repeats, full_count)
    assert np.array_equal(np.flatnonzero(counts > args.limit), lengths.overlong_rows), "byte bound changed the result"

    prompts = pq.read_table(args.data, columns=["prompt"]).column("prompt").to_pylist()[: args.per_row_sample]

    def per_row():
        return [
            len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False))
            for p in prompts
        ]

    sample_s, sample_counts = best_of(1, per_row)
    assert sample_counts == counts[: len(prompts)].tolist(), "per-row counts differ from the batched counts"
    per_row_s = sample_s * rows / len(prompts)

    print(f"{rows} prompts, limit {args.limit} tokens: {lengths.num_overlong} over, {lengths.tokenized} tokenized "
          f"under the byte bound; longest {counts.max()} tokens")
    print(f"  recipe, byte bound   {bound_s:7.2f} s")
    print(f"  recipe, full count   {full_s:7.2f} s")
    print(f"  per row, as verl     {per_row_s:7.2f} s  (scaled from {len(prompts)} rows)")
    print(f"RESULT prompt_length_check rows={rows} limit={args.limit} overlong={lengths.num_overlong} "
          f"byte_bound_s={bound_s:.2f} full_count_s={full_s:.2f} per_row_s={per_row_s:.2f} "
          f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
