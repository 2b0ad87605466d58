"""The examples in the recipe's docstrings (``>>>``) run and hold: the documentation cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import recipe_dapo


def modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(recipe_dapo.__path__, prefix="recipe_dapo."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as source:
                if ">>>" in source.read():
                    names.append(info.name)
    return sorted(names)


MODULES = modules_with_examples()


def test_the_recipe_has_docstring_examples_to_run():
    assert "recipe_dapo.overlong" in MODULES or any(name.startswith("recipe_dapo.overlong") for name in MODULES)


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_hold(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module_name} has '>>>' but doctest found no example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {module_name} failed"
