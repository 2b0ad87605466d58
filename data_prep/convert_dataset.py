"""Same as `python -m recipe_dapo.data convert ...` (see recipe_dapo/data/cli.py)."""

import sys

from recipe_dapo.data.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
