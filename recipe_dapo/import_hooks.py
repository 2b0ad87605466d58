"""Run a registration when a module finishes importing, without importing it first (post-import hooks).

The ``verl.plugins`` entry point runs in every process at ``import verl``; importing the recipe's loss or
reward manager there would pull verl's ``core_algos`` (and transformers), the reward loop and their
dependencies into every Ray worker, most of which never use them. Instead the plugin asks to be called when
verl itself imports the registry a component belongs in::

    when_imported("verl.trainer.ppo.core_algos", register_loss)

The callback runs right after the module's own code, before anyone can look the name up in it; if the module
is already imported it runs at once. A callback that fails is logged and remembered (``failed_hooks``) rather
than breaking verl's import: the start-up check then reports the component as missing, with that error.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from typing import Callable

from recipe_dapo.compat.stdlib import add_meta_path_finder

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_pending: dict[str, list[Callable[[], None]]] = {}
failed_hooks: dict[str, BaseException] = {}
"""module name -> the exception its callback raised."""


def when_imported(module_name: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once ``module_name`` has been imported (now, if it already has)."""
    with _lock:
        if module_name not in sys.modules:
            _install_finder()
            _pending.setdefault(module_name, []).append(callback)
            return
    _run(module_name, callback)


def _run(module_name: str, callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception as error:  # never break the import of a verl module
        failed_hooks[module_name] = error
        logger.warning("recipe_dapo: registration after importing %s failed", module_name, exc_info=True)


class _RunAfterExec(importlib.abc.Loader):
    """Delegates to the module's real loader, then runs the callbacks and puts the real loader back."""

    def __init__(self, loader, callbacks: list[Callable[[], None]]):
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        for callback in self._callbacks:
            _run(module.__name__, callback)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        with _lock:
            if fullname not in _pending:
                return None
            callbacks = _pending.pop(fullname)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            with _lock:  # not found by the path finder: leave the hooks for a later import
                _pending.setdefault(fullname, []).extend(callbacks)
            return None
        spec.loader = _RunAfterExec(spec.loader, callbacks)
        return spec


_finder = _PostImportFinder()


def _install_finder() -> None:
    add_meta_path_finder(_finder)
