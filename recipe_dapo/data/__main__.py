import sys

from recipe_dapo.data.cli import main

sys.exit(main())
