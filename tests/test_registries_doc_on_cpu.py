"""The registries render their own prose: ``docs/registries.md`` is generated from the keep rules, the overlong
shapings, the trainers' table and the metric catalogue, each entry with the one line of meaning it carries where it
is registered; nothing else keeps a list of them by hand."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "registries.md"


def _script():
    spec = importlib.util.spec_from_file_location("registries", REPO_ROOT / "scripts" / "registries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def registered() -> dict[str, list[tuple[str, str]]]:
    """(name, meaning) of every registered entry, per registry."""
    from recipe_dapo.dynamic_sampling.keep_rules import KEEP_RULES
    from recipe_dapo.overlong.shaping import SHAPING_DOCS, SHAPINGS
    from recipe_dapo.tracking.metric_names import CATALOGUE
    from recipe_dapo.trainers.table import TRAINERS

    return {
        "Keep rules": [(name, rule.doc) for name, rule in KEEP_RULES.items()],
        "Overlong shapings": [(name, SHAPING_DOCS.get(name, "")) for name in SHAPINGS],
        "Trainers": [(entry.key, entry.how) for entry in TRAINERS],
        "Metrics": [(metric.name, metric.meaning) for metric in CATALOGUE],
    }


def doc_problems(text: str) -> list[str]:
    """Why ``text`` is not the registries' doc as generated now (empty: it is)."""
    problems = [] if text == _script().render() else [
        "docs/registries.md is stale: python scripts/registries.py > docs/registries.md"]
    for section, entries in registered().items():
        body = text.split(f"## {section}\n", 1)[-1].split("\n## ", 1)[0] if f"## {section}\n" in text else ""
        for name, _ in entries:
            if not re.search(rf"^\| `{re.escape(name)}`", body, re.M):
                problems.append(f"{section}: {name!r} is registered but not in docs/registries.md")
    return problems


def test_docs_registries_md_is_generated_from_the_registries_and_names_every_entry():
    assert doc_problems(DOC.read_text()) == []
    for section, entries in registered().items():
        assert entries, section
        for name, meaning in entries:  # each entry carries its meaning where it is registered
            assert len(meaning.split()) >= 4 and "\n" not in meaning, (section, name, meaning)
    assert "](docs/registries.md#keep-rules)" in (REPO_ROOT / "README.md").read_text()


def test_a_newly_registered_keep_rule_or_shaping_makes_the_check_fail(monkeypatch):
    """Positive control: one more rule (and one more shaping) registered, the doc on disk no longer passes."""
    import recipe_dapo.overlong.shaping as shaping
    from recipe_dapo.dynamic_sampling import keep_rules

    text = DOC.read_text()
    monkeypatch.setattr(keep_rules, "KEEP_RULES", dict(keep_rules.KEEP_RULES))

    @keep_rules.register_keep_rule("top_heavy_test", doc="groups with spread whose success rate is at least above")
    def top_heavy(groups, *, above: float = 0.5) -> np.ndarray:
        return groups.varied & (groups.success_rate >= above)

    problems = doc_problems(text)
    assert any("stale" in p for p in problems), problems
    assert "Keep rules: 'top_heavy_test' is registered but not in docs/registries.md" in problems
    assert "| `top_heavy_test` | `above=0.5` | groups with spread whose success rate is at least above |" in (
        _script().render())

    monkeypatch.setattr(keep_rules, "KEEP_RULES", {k: v for k, v in keep_rules.KEEP_RULES.items() if k != "top_heavy_test"})
    assert doc_problems(text) == []  # back to the registry as shipped, the doc passes again
    monkeypatch.setattr(shaping, "SHAPINGS", dict(shaping.SHAPINGS))
    monkeypatch.setattr(shaping, "SHAPING_DOCS", dict(shaping.SHAPING_DOCS))
    shaping.register_shaping("hard_cutoff_test", doc="-penalty_factor anywhere in the buffer")(lambda *args: 0.0)
    assert "Overlong shapings: 'hard_cutoff_test' is registered but not in docs/registries.md" in doc_problems(text)


def test_a_rule_or_shaping_takes_its_meaning_from_its_docstring_when_not_given():
    from recipe_dapo.dynamic_sampling import keep_rules
    from recipe_dapo.overlong import shaping

    assert keep_rules.KEEP_RULES["min_std"].doc == " ".join(keep_rules.min_std.__doc__.split())
    assert shaping.SHAPING_DOCS["soft"].startswith("The paper's soft overlong punishment (eq. 13)")


def _metric_constants() -> dict[str, str]:
    """Metric names defined as constants in the name modules: value -> identifier."""
    from recipe_dapo.dynamic_sampling import selection
    from recipe_dapo.policy_lag import names
    from recipe_dapo.tracking import metric_names

    constants = {}
    for module in (metric_names, names, selection):
        for identifier, value in vars(module).items():
            if identifier.isupper() and isinstance(value, str) and "/" in value and not value.endswith("/"):
                constants[value] = identifier
    constants.update({f"{names.LAG_PREFIX}<k>/{name}": name for name in names.PER_LAG})
    return constants


def test_every_metric_name_is_in_the_catalogue_and_its_producer_computes_it():
    from recipe_dapo.tracking.metric_names import CATALOGUE

    constants = _metric_constants()
    catalogued = [metric.name for metric in CATALOGUE]
    assert len(catalogued) == len(set(catalogued))
    assert set(constants) <= set(catalogued), f"metric names without a catalogue entry: {set(constants) - set(catalogued)}"
    for metric in CATALOGUE:
        for module in metric.producer.split(", "):
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin, f"{metric.name}: producer {module} is not a module"
            if module.startswith("recipe_dapo."):  # the recipe's producer names what it computes
                source = Path(spec.origin).read_text()
                identifier = constants.get(metric.name, "")
                assert (identifier and re.search(rf"\b{identifier}\b", source)) or f'"{metric.name}"' in source or (
                    "<k>" in metric.name and f'"{metric.name.rsplit("/", 1)[1]}"' in source), (metric.name, module)


def _paragraphs(path: Path) -> list[str]:
    text = path.read_text()
    return [block for block in re.split(r"\n\s*\n|\n(?=\|)", text) if block.strip()]


def test_no_hand_kept_list_of_the_keep_rules_or_shapings_outside_the_generated_doc():
    """A paragraph (or table row) that names every registered keep rule is a hand-kept list: the doc links instead."""
    from recipe_dapo.dynamic_sampling.keep_rules import KEEP_RULES

    files = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
             *sorted((REPO_ROOT / "recipe_dapo").rglob("*.py"))]
    lists = []
    for path in files:
        if path == DOC:
            continue
        for block in _paragraphs(path):
            if all(re.search(rf"`{re.escape(name)}`", block) for name in KEEP_RULES):
                lists.append(f"{path.relative_to(REPO_ROOT)}: {block.strip()[:120]}")
    assert lists == []


@pytest.mark.parametrize("suffix", ["yaml", "py"])
def test_every_test_file_the_package_names_exists(suffix):
    named = {}
    for path in (REPO_ROOT / "recipe_dapo").rglob(f"*.{suffix}"):
        for test in re.findall(r"\btests/[\w/]+\.py\b", path.read_text()):
            named.setdefault(test, []).append(str(path.relative_to(REPO_ROOT)))
    missing = {test: where for test, where in named.items() if not (REPO_ROOT / test).exists()}
    assert named and not missing, missing
