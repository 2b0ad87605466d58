"""Same as `python -m recipe_dapo.data prepare ...` (see recipe_dapo/data/cli.py)."""

import sys

from recipe_dapo.data.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare", *sys.argv[1:]]))
