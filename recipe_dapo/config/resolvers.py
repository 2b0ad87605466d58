"""OmegaConf resolvers for the values the recipe's YAML derives from others (OmegaConf has no arithmetic).

    ${recipe_dapo.sum:${data.max_prompt_length},${data.max_response_length}}   # prompt + response tokens
    ${recipe_dapo.mul:3,${data.train_batch_size}}                              # 3 x the training batch

So ``data.train_batch_size=64`` on the command line also makes the generation round 192 prompts, and a longer
``data.max_response_length`` raises the token budgets that follow it.

Any process that resolves the config must have imported this module. ``recipe_dapo/__init__.py`` imports it as
soon as omegaconf is imported (a post-import hook), so any process that imports the recipe has the resolvers: the
driver and the dry run, the Ray worker where the task runner resolves the config, verl's processes through the
plugin. ``recipe_dapo/config/__init__.py`` imports it too, for a process that composes the config first.
"""

from __future__ import annotations

from numbers import Number

from omegaconf import OmegaConf

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


RESOLVERS = {"recipe_dapo.sum": _sum, "recipe_dapo.mul": _mul}


def register_resolvers() -> None:
    """Register every resolver above once per process (a second call is a no-op)."""
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


register_resolvers()
