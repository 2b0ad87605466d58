"""What every start-up rule shares: the refusal that lists every problem, the report of what could not be checked
here, and the rule's signature. Pure: OmegaConf only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from omegaconf import DictConfig

from recipe_dapo.config import select  # noqa: F401  (the rules' accessor)


class DAPOConfigError(ValueError):
    """A configuration the recipe refuses; the message lists every problem with its key and fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(
            "recipe_dapo refused the configuration:\n" + "\n".join(f"  - {problem}" for problem in self.problems)
        )


@dataclass
class CheckReport:
    """What the checks could not check on this machine, and the run's shape for the log."""

    absent_inputs_ok: bool = False
    """Dry run: an input absent here is listed in ``not_checked`` instead of being a problem."""
    dry_run: bool = False
    """Dry run: nothing is fetched (a tokenizer that is not a local folder is listed in ``not_checked``)."""
    not_checked: list[str] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)

    def summary_lines(self, per_line: int = 4) -> list[str]:
        """The run's shape in a few console lines: ``run: name: value | name: value | ...``."""
        items = [f"{name}: {value}" for name, value in self.summary.items()]
        return [("run: " if start == 0 else "     ") + " | ".join(items[start:start + per_line])
                for start in range(0, len(items), per_line)]


Rule = Callable[[DictConfig, CheckReport], Iterable[str]]


def paths(value) -> list[str]:
    """A file key's value as a list of paths (one path or a list)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]
