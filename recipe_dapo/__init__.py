"""recipe_dapo: DAPO for verl 0.9.x, as a pip-installable recipe.

Where things live: each package's docstring says what it holds, and ``docs/architecture.md`` (generated from those
docstrings by ``scripts/package_map.py``) maps them all, with the direction of their imports.
"""

import importlib

from recipe_dapo.import_hooks import when_imported

__version__ = "0.1.0"

# Every process that imports the recipe can resolve its config (the driver, the dry run, the Ray worker that runs
# the task runner, verl's own processes through the plugin), as soon as it imports omegaconf and not before: the
# vLLM plugin imports this package in processes that never load omegaconf.
when_imported("omegaconf", lambda: importlib.import_module("recipe_dapo.config.resolvers"))
