"""OmegaConf resolvers the recipe's config uses: arithmetic for derived values (OmegaConf has none), and the
folder of verl's own configs.

    ${recipe_dapo.sum:${data.max_prompt_length},${data.max_response_length}}   # prompt + response tokens
    ${recipe_dapo.mul:3,${data.train_batch_size}}                              # 3 x the training batch

So ``data.train_batch_size=64`` on the command line also makes the generation round 192 prompts, and a longer
``data.max_response_length`` raises the token budgets that follow it.

    ${recipe_dapo.div:16,2}                                                    # 8: exact division or an error
    ${recipe_dapo.local_ray:16}                                                # 16, or null when joining a cluster

``local_ray`` holds a value of ``ray_kwargs.ray_init`` that only a Ray started by the run may take (``num_cpus``,
``num_gpus``): when the run joins a running cluster (``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS`` set),
``ray.init`` refuses them ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided"):
there the nodes declared their resources at ``ray start``.

``${recipe_dapo_verl_config_dir:}`` is the folder of verl's trainer configs in the installed verl package, found
without importing verl: ``dapo_trainer.yaml``'s search path uses it, since a ``pkg://verl.trainer.config`` search
path would import verl (and torch, and the plugins) just to read YAML, and every configuration mistake took tens
of seconds to report.

Any process that resolves the config must have imported this module. ``recipe_dapo/__init__.py`` imports it as
soon as omegaconf is imported (a post-import hook), so any process that imports the recipe has the resolvers: the
driver and the dry run, the Ray worker where the task runner resolves the config, verl's processes through the
plugin. It needs only omegaconf (``recipe_dapo.config``, which Hydra imports, also registers the ``dapo:`` schema).
"""

from __future__ import annotations

import importlib.util
import os
from numbers import Number

from omegaconf import OmegaConf

VERL_CONFIG_RESOLVER = "recipe_dapo_verl_config_dir"


def verl_config_dir() -> str:
    """The folder of verl's trainer configs in the installed verl package (verl is not imported)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed in this Python environment; install the recipe with its extras")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")
    if not os.path.isfile(os.path.join(folder, "ppo_trainer.yaml")):
        raise RuntimeError(f"verl's ppo_trainer.yaml is not in {folder}; is verl 0.9.1 installed?")
    return folder


def _numbers(name: str, values: tuple) -> tuple:
    bad = [value for value in values if isinstance(value, bool) or not isinstance(value, Number)]
    if bad or not values:
        raise ValueError(
            f"${{recipe_dapo.{name}:...}} takes numbers, got {list(values)!r}: the keys it refers to must hold "
            "numbers (override them with a number, e.g. data.train_batch_size=64)"
        )
    return values


def _sum(*values):
    """The sum of the arguments: ``${recipe_dapo.sum:2048,20480}`` is 22528."""
    return sum(_numbers("sum", values))


def _mul(*values):
    """The product of the arguments: ``${recipe_dapo.mul:3,512}`` is 1536."""
    product = 1
    for value in _numbers("mul", values):
        product *= value
    return product


def _div(dividend, divisor):
    """``dividend / divisor`` when it divides exactly: ``${recipe_dapo.div:16,2}`` is 8; anything else is an error.

    Used for per-rank sizes (a batch over the data-parallel ranks): a rounded one would hide the shape mistake
    that the start-up shape rules name with their fix.
    """
    dividend, divisor = _numbers("div", (dividend, divisor))
    if divisor == 0 or dividend % divisor != 0:
        raise ValueError(
            f"${{recipe_dapo.div:{dividend},{divisor}}}: {dividend} is not a whole multiple of {divisor}; a per-rank "
            "size must divide evenly over the ranks (trainer.nnodes x trainer.n_gpus_per_node): choose a GPU count "
            "that divides it, or set the key this interpolation fills explicitly"
        )
    return dividend // divisor


def joins_running_cluster(address) -> bool:
    """True when ``ray.init`` will connect to a running Ray cluster instead of starting one (``address`` or
    ``RAY_ADDRESS`` set; ``local`` always starts one)."""
    address = address if address not in (None, "") else os.environ.get("RAY_ADDRESS") or None
    return address is not None and str(address) != "local"


def _local_ray(value, *, _parent_):
    """``value`` when this run starts its own Ray, None when it joins a running cluster (see the module doc)."""
    return None if joins_running_cluster(_parent_.get("address")) else value


def _behaviour_is(mode, max_staleness, use_v1, v1_mode):
    """``algorithm.rollout_correction.rollout_is`` as ``dapo.behaviour_correction`` sets it: ``token`` where rows of
    an older policy can be trained, else null (``recipe_dapo.policy_lag.correction``)."""
    from recipe_dapo.policy_lag.correction import default_rollout_is

    return default_rollout_is(str(mode), int(max_staleness), bool(use_v1), None if v1_mode is None else str(v1_mode))


RESOLVERS = {
    "recipe_dapo.behaviour_is": _behaviour_is,
    "recipe_dapo.sum": _sum,
    "recipe_dapo.mul": _mul,
    "recipe_dapo.div": _div,
    "recipe_dapo.local_ray": _local_ray,
    VERL_CONFIG_RESOLVER: verl_config_dir,
}


def register_resolvers() -> None:
    """Register every resolver above once per process (a second call is a no-op)."""
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


register_resolvers()
