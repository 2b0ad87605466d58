"""Same as `python -m recipe_dapo.data validate ...` (see recipe_dapo/data/cli.py)."""

import sys

from recipe_dapo.data.cli import main

if __name__ == "__main__":
    sys.exit(main(["validate", *sys.argv[1:]]))
