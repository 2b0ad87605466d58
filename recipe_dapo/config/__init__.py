"""The recipe's Hydra config: ``dapo_trainer.yaml`` and its groups ``size/``, ``ablation/``, ``sampling/``, ``platform/``.

Importing this package registers the resolvers the YAML uses (``recipe_dapo.config.resolvers``); Hydra imports it
whenever it composes the recipe's config.
"""

from recipe_dapo.config import resolvers  # noqa: F401  (registers ${recipe_dapo.sum:...} and ${recipe_dapo.mul:...})
