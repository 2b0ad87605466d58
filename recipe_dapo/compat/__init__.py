"""The recipe's one door to other packages' internals.

Every place where the recipe patches, wraps, copies or calls a private part of verl, Ray, vLLM, TransferQueue, torch
or the standard library lives in this package, one small module per target package (``compat.verl``,
``compat.ray``, ``compat.vllm``, ``compat.torch``, ``compat.transfer_queue``, ``compat.stdlib``). Each such function
says what it touches with :func:`touches`, and each private hook of verl's trainers that the recipe's trainers
override or call is listed with :func:`declare` (``compat.verl``). Both record a :class:`Site` in :data:`SITES`:

- ``tests/test_compat_on_cpu.py`` checks every site against the installed packages (the symbol exists, is callable,
  takes the parameters the recipe passes), so a verl, Ray or vLLM upgrade that moves one fails there first; CI runs it
  on verl 0.9.0 too (``tests/e2e/verl_compat_tests.txt``);
- ``python -m recipe_dapo.compat`` prints the list of sites, which is ``docs/compat.md`` (a test keeps them equal);
- ``tests/test_layout_on_cpu.py`` fails when a module outside this package reaches into another package's private
  names or assigns to another package's module attributes.

Importing this package and its modules is cheap (no verl, Ray, vLLM or torch import at module level): ``plugin`` and
``import_hooks`` run in every process at ``import verl``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

F = TypeVar("F", bound=Callable)

HOW = ("replaces", "wraps", "copies", "calls", "overrides", "reads")
"""What a site does to its symbol: replaces it (process-wide or on one object), wraps it (keeps calling the
original), copies its code, calls it, overrides it in a subclass, or reads it."""

MODULES = ("verl", "ray", "vllm", "torch", "transfer_queue", "stdlib")
"""The modules of this package, one per target package (``stdlib``: Python's standard library)."""


@dataclass(frozen=True)
class Site:
    """One place where the recipe depends on another package's internals or replaces part of it."""

    symbol: str
    """Dotted path of what is touched, importable module first (``verl.utils.tracking.FileLogger``)."""
    how: str
    """One of :data:`HOW`."""
    checked: tuple[str, ...]
    """The versions of the symbol's package the site was checked on (``("0.9.0", "0.9.1")`` for verl)."""
    why: str
    """One line: what the recipe needs that the public API does not give."""
    where: str
    """The recipe's function or class that does it."""
    params: Optional[tuple[str, ...]] = None
    """Parameter names the symbol must accept, in order from the first (``self`` excluded for methods); None: the
    symbol must only exist (a module attribute, a class, an instance attribute)."""
    optional: bool = False
    """The symbol may be absent on some checked version, and the recipe then does without it."""

    @property
    def package(self) -> str:
        """The distribution the symbol belongs to (``"Python"`` for the standard library)."""
        root = self.symbol.split(".", 1)[0]
        return "Python" if root in sys.stdlib_module_names else root


SITES: list[Site] = []
"""Every site, in the order the modules of this package declare them."""


def _add(site: Site) -> None:
    if site.how not in HOW:
        raise ValueError(f"{site.symbol}: how={site.how!r} is not one of {HOW}")
    if not site.checked:
        raise ValueError(f"{site.symbol}: say which versions the site was checked on")
    if all(existing != site for existing in SITES):
        SITES.append(site)


def touches(
    symbol: str,
    *,
    how: str,
    checked: tuple[str, ...],
    why: str,
    params: Optional[tuple[str, ...]] = None,
    optional: bool = False,
) -> Callable[[F], F]:
    """Record that the decorated function touches ``symbol`` (``how``, checked on ``checked``); the function is
    returned unchanged. Stack several for a function that touches several symbols."""

    def record(function: F) -> F:
        _add(Site(symbol, how, tuple(checked), why, f"{function.__module__}.{function.__qualname__}",
                  tuple(params) if params is not None else None, optional))
        return function

    return record


def declare(
    symbol: str,
    *,
    how: str,
    checked: tuple[str, ...],
    why: str,
    where: str,
    params: Optional[tuple[str, ...]] = None,
    optional: bool = False,
) -> None:
    """Record a site that lives in a recipe class rather than in a function of this package: a private hook of a
    verl class that a recipe subclass overrides or calls (``where`` names the recipe class)."""
    _add(Site(symbol, how, tuple(checked), why, where, tuple(params) if params is not None else None, optional))


def sites() -> list[Site]:
    """Every site, after importing each module of this package (cheap: they import their targets lazily)."""
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
    return list(SITES)


def render() -> str:
    """``docs/compat.md``: the sites by target package, as ``python -m recipe_dapo.compat`` prints them."""
    lines = [
        "# Where the recipe depends on other packages' internals",
        "",
        "Generated by `python -m recipe_dapo.compat` from the declarations in `recipe_dapo/compat/` (a test keeps this",
        "file equal to its output). Each row is a private symbol the recipe calls or overrides, or a public one it",
        "replaces or wraps; `tests/test_compat_on_cpu.py` checks each against the installed packages (it exists, is",
        "callable, takes the listed parameters), and CI runs those checks on verl 0.9.0 as well. This is the list to",
        "walk when moving the recipe to a new verl, Ray or vLLM release.",
        "",
    ]
    by_package: dict[str, list[Site]] = {}
    for site in sites():
        by_package.setdefault(site.package, []).append(site)
    for package in sorted(by_package):
        lines += [f"## {package}", "", "| symbol | how | checked on | why | where |", "|---|---|---|---|---|"]
        for site in by_package[package]:
            symbol = f"`{site.symbol}`" + (" (optional)" if site.optional else "")
            signature = f" `({', '.join(site.params)})`" if site.params else ""
            lines.append(f"| {symbol}{signature} | {site.how} | {', '.join(site.checked)} | {site.why} | "
                         f"`{site.where}` |")
        lines.append("")
    return "\n".join(lines)
