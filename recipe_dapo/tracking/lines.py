"""The recipe's own console lines: how a line the recipe prints for the user is marked, so that the driver's console
router (``tracking.noise``) shows it whatever it filters. The bottom of ``tracking``: it imports nothing of the recipe,
so the console, the router and the metrics file all build on it without importing one another in a circle."""

from __future__ import annotations

import logging
import os

TAG_ENV = "DAPO_CONSOLE_TAG"
"""Set by ``noise.install_console_filter`` in the driver (Ray workers inherit it): recipe lines carry :data:`TAG`."""
TAG = "[dapo] "
"""The mark of a recipe line on its way to the driver; the router removes it from the console (the log file and
Ray's own log files keep it: ``grep -F '[dapo]'`` lists the recipe's lines)."""


def recipe_line(text: str) -> str:
    """``text`` marked as a line of the recipe for the console (each of its lines), when a router is active."""
    if not os.environ.get(TAG_ENV):
        return text
    return "\n".join(TAG + line for line in text.split("\n"))


class RecipeLineFormatter(logging.Formatter):
    """The message alone, marked as a recipe line (:func:`recipe_line`): the console logger's formatter."""

    def __init__(self):
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return recipe_line(super().format(record))
