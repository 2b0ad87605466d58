"""``python -m recipe_dapo.data {prepare,convert,validate}``: the data-prep command line.

    prepare OUT_DIR [--local-dir DIR] [--only NAME ...]   every data set into OUT_DIR
    convert NAME OUT_DIR [--input FILE | --local-dir DIR] [--dedup MODE]
    validate FILE [FILE ...] [--tokenizer PATH [--max-prompt-length N]]
                                                          check verl RL parquet files (and prompt tokens)

``--local-dir`` defaults to ``$DAPO_DATA_LOCAL_DIR``; without either, the Hugging Face Hub is used (it is checked
first: without network the command says so in one line, with how to prepare from a local folder, and exits 2).
The local folder's layout is in ``prepare --help``; ``.parquet`` files in verl's RL layout or flat ``.parquet`` /
``.jsonl`` files (a ``problem`` or ``question`` column and an ``answer``) are read.
Bad input exits with status 2 and one line naming the file, the row and the field. With ``--tokenizer``
(the model's), ``validate`` also counts each prompt's tokens as verl's rollout does
(``recipe_dapo.data.prompt_length``) and refuses prompts over ``--max-prompt-length`` (the training key is
``data.max_prompt_length``); without a limit it prints the longest prompt.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from recipe_dapo.data.catalog import DATASETS, local_layout
from recipe_dapo.data.convert import DEDUP_MODES, LOCAL_DIR_ENV, convert_dataset, prepare_all
from recipe_dapo.data.validation import RLDataError, validate_rl_parquet

logger = logging.getLogger("recipe_dapo.data")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipe_dapo.data", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    prepare = commands.add_parser(
        "prepare", help="convert every data set into one folder", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"a local folder (--local-dir DIR, or ${LOCAL_DIR_ENV}=DIR) holds, under DIR:\n{local_layout()}",
    )
    prepare.add_argument("out_dir")
    prepare.add_argument(
        "--local-dir",
        default=os.environ.get(LOCAL_DIR_ENV) or None,
        help=f"local copies, laid out as listed below (default ${LOCAL_DIR_ENV}; unset: download from the Hub)",
    )
    prepare.add_argument("--only", nargs="+", choices=list(DATASETS), help="convert only these data sets")

    convert = commands.add_parser("convert", help="convert one data set")
    convert.add_argument("name", choices=list(DATASETS))
    convert.add_argument("out_dir")
    convert.add_argument("--input", help="a local .parquet/.jsonl file (overrides --local-dir)")
    convert.add_argument("--local-dir", default=os.environ.get(LOCAL_DIR_ENV) or None)
    convert.add_argument(
        "--dedup",
        choices=DEDUP_MODES,
        default="source_id",
        help="source_id: drop repeated copies of a problem (default); prompt: one row per prompt text",
    )

    validate = commands.add_parser("validate", help="check verl RL parquet files row by row")
    validate.add_argument("files", nargs="+")
    validate.add_argument("--tokenizer", help="the model's tokenizer folder: count prompt tokens with it")
    validate.add_argument(
        "--max-prompt-length", type=int, help="refuse prompts longer than this many tokens (needs --tokenizer)"
    )
    validate.add_argument("--prompt-key", default="prompt", help="the prompt column (data.prompt_key)")
    return parser


def validate_files(args: argparse.Namespace) -> None:
    """Row checks, then (with --tokenizer) prompt token counts; raises RLDataError on the first bad file."""
    from recipe_dapo.data.prompt_length import (
        load_tokenizer,
        overlong_error,
        render_prompts,
        scan_prompt_lengths,
        token_counts,
    )

    if args.max_prompt_length is not None and not args.tokenizer:
        raise ValueError("--max-prompt-length needs --tokenizer (the model's tokenizer folder) to count tokens")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    for path in args.files:
        rows = validate_rl_parquet(path, prompt_key=args.prompt_key)
        if tokenizer is None:
            print(f"{path}: {rows} rows, all valid")
        elif args.max_prompt_length is not None:
            lengths = scan_prompt_lengths(path, tokenizer, args.max_prompt_length, args.prompt_key)
            if lengths.num_overlong:
                fix = (
                    "raise --max-prompt-length (in training: data.max_prompt_length) to {longest}, or drop the row "
                    "(in training: data.filter_overlong_prompts=true)"
                )
                raise overlong_error(lengths, "--max-prompt-length", fix)
            print(f"{path}: {rows} rows, all valid, every prompt <= {args.max_prompt_length} tokens")
        else:
            import pandas as pd

            prompts = pd.read_parquet(path, columns=[args.prompt_key])[args.prompt_key].tolist()
            counts = token_counts(tokenizer, render_prompts(tokenizer, prompts))
            print(f"{path}: {rows} rows, all valid, prompts of {counts.min()}-{counts.max()} tokens "
                  f"(longest: row {int(counts.argmax())})")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "prepare":
            results = prepare_all(args.out_dir, local_dir=args.local_dir, names=args.only)
            for result in results:
                print(f"{result.name:>14}: {result.rows_written:>6} rows -> {result.output_path}")
        elif args.command == "convert":
            result = convert_dataset(
                args.name, args.out_dir, input_path=args.input, local_dir=args.local_dir, dedup=args.dedup
            )
            print(f"{result.name}: {result.rows_written} rows -> {result.output_path}")
        else:
            validate_files(args)
    except (RLDataError, FileNotFoundError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
