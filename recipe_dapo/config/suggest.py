"""'Did you mean' for mistyped keys and names: the closest known names first."""

from __future__ import annotations

import difflib
from typing import Sequence

from omegaconf import DictConfig, OmegaConf


def closest_first(name, choices) -> list[str]:
    """``choices`` sorted, the (at most three) closest to ``name`` first."""
    choices = sorted(str(c) for c in choices)
    close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.6)
    return close + [c for c in choices if c not in close]


def config_keys(config: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of a config (leaves and sections), interpolations unresolved."""
    return _tree_keys(OmegaConf.to_container(config, resolve=False), prefix)


def _tree_keys(tree: dict, prefix: str) -> list[str]:
    keys = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, dict):  # a section (a missing or None section is a leaf: "???" or None)
            keys.extend(_tree_keys(value, dotted + "."))
    return keys


def unknown_override_keys(overrides: Sequence[str], config: DictConfig, groups: Sequence[str] = ()) -> list[str]:
    """For each ``key=value`` override whose key is not in ``config`` (nor a config group), a 'did you mean' line."""
    known = [k for k in config_keys(config) if not k.rsplit(".", 1)[-1].startswith("_")]
    known_set = set(known) | set(groups)
    lines = []
    for override in overrides:
        if "=" not in override or override.startswith(("+", "~", "hydra.", "hydra/")):
            continue
        key = override.split("=", 1)[0].strip()
        if key in known_set or key.split("@")[0] in known_set:
            continue
        parent, _, leaf = key.rpartition(".")
        if parent in known_set or not parent:  # a mistyped leaf: compare it with its siblings
            siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
            guesses = [f"{parent}.{g}" if parent else g for g in difflib.get_close_matches(leaf, siblings, n=2, cutoff=0.75)]
        else:  # a mistyped section: compare the whole key
            guesses = difflib.get_close_matches(key, known, n=2, cutoff=0.8)
        hint = f"did you mean {' or '.join(guesses)}?" if guesses else "no similar key exists"
        lines.append(f"{key} is not a key of the recipe's config: {hint} (a new key needs a leading '+')")
    return lines


def suggest_for_overrides(overrides: Sequence[str]) -> list[str]:
    """'Did you mean' lines for the command-line overrides whose keys the recipe's config does not have."""
    from recipe_dapo.config import config_groups
    from recipe_dapo.config.compose import compose

    try:
        base = compose()
    except Exception:  # the base config itself does not compose: Hydra's own message says why
        return []
    return unknown_override_keys([o for o in overrides if "/" not in o.split("=", 1)[0]], base, config_groups())
