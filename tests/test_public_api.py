"""The public API a newcomer can hold in their head: a narrow top level (what the README's examples use),
namespaces by role, one public name per concept (no near-collisions, no name bound to two objects), and
an API reference that opens on the curated list of those names."""

import importlib
import re
import sys
from pathlib import Path

import lensprobe as lp

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = ("models", "prompts", "interventions", "metrics", "generation", "experiments", "studies", "evals", "viz")


def public() -> dict[str, object]:
    """Every public name: ``lp.X`` and ``lp.<namespace>.X``, to its object."""
    names = {f"lp.{n}": getattr(lp, n) for n in lp.__all__}
    for ns in NAMESPACES:
        module = importlib.import_module(f"lensprobe.{ns}")
        names.update({f"lp.{ns}.{n}": getattr(module, n) for n in module.__all__})
    return names


def test_the_top_level_is_what_the_readme_uses_and_namespaces():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    used = set(re.findall(r"\blp\.([A-Za-z_]\w*)", readme))
    assert used <= set(lp.__all__), f"the README uses names the top level lacks: {sorted(used - set(lp.__all__))}"
    functions = [n for n in lp.__all__ if n not in NAMESPACES]
    assert len(functions) <= 32, f"the top level holds {len(functions)} names: move the rest to a namespace"
    assert set(NAMESPACES) <= set(lp.__all__)


def test_every_listed_name_exists_and_one_concept_has_one_name():
    names = public()
    by_object: dict[int, set[str]] = {}
    for qualified, obj in names.items():
        if not isinstance(obj, (str, int, float, tuple, dict, frozenset)) and type(obj).__name__ != "module":
            by_object.setdefault(id(obj), set()).add(qualified.rsplit(".", 1)[1])
    aliases = {next(iter(ns)) if len(ns) == 1 else tuple(sorted(ns)) for ns in by_object.values() if len(ns) > 1}
    assert not aliases, f"objects under two names: {aliases}"
    short = {q.rsplit(".", 1)[1] for q in names}
    folded: dict[str, set[str]] = {}
    for name in short:
        folded.setdefault(name.lower(), set()).add(name)
    assert [v for v in folded.values() if len(v) > 1] == [], "names that differ only by case"
    for gone in ("StepInfo", "current_step", "Entropy", "attention_received", "token_class_attention"):
        assert gone not in short, f"{gone} was renamed: see the changelog"


def test_a_name_in_two_places_is_the_same_object():
    names = public()
    by_short: dict[str, set[int]] = {}
    for qualified, obj in names.items():
        by_short.setdefault(qualified.rsplit(".", 1)[1], set()).add(id(obj))
    assert {n: ids for n, ids in by_short.items() if len(ids) > 1} == {}


def _namespace_paths() -> dict[int, list[str]]:
    """Each object public in a namespace (scalars aside: equal small values may be one object), to its paths."""
    paths: dict[int, list[str]] = {}
    for ns in NAMESPACES:
        module = importlib.import_module(f"lensprobe.{ns}")
        for name in module.__all__:
            obj = getattr(module, name)
            if not isinstance(obj, (str, int, float, bool)):
                paths.setdefault(id(obj), []).append(f"lp.{ns}.{name}")
    return paths


def test_every_object_has_one_namespace_path_and_a_shortcut_is_that_object():
    paths = _namespace_paths()
    twice = sorted(tuple(p) for p in paths.values() if len(p) > 1)
    assert twice == [], f"objects public in two namespaces (keep one path, see lensprobe's docstring): {twice}"
    for name in lp.__all__:
        obj = getattr(lp, name)
        if name in NAMESPACES or isinstance(obj, (str, int, float, bool)):
            continue
        home = paths.get(id(obj), [])
        assert len(home) <= 1, (name, home)
        assert not home or home[0].rsplit(".", 1)[1] == name, f"lp.{name} is {home[0]}: a shortcut keeps its name"
    assert lp.Condition is lp.prompts.Condition and "Condition" not in lp.evals.__all__
    assert lp.interventions.HookSite and not {"HookSite", "StepContext"} & set(lp.generation.__all__)


def test_the_walk_catches_an_object_made_public_twice(monkeypatch):
    monkeypatch.setattr(lp.evals, "__all__", [*lp.evals.__all__, "Condition"])
    monkeypatch.setattr(lp.evals, "Condition", lp.prompts.Condition, raising=False)
    assert ["lp.prompts.Condition", "lp.evals.Condition"] in _namespace_paths().values()


def test_dir_lists_only_the_public_names():
    import lensprobe.app  # noqa: F401  (imported packages become attributes of lensprobe, yet stay unlisted)

    assert dir(lp) == sorted([*lp.__all__, "__version__"])
    assert not {"importlib", "app", "core"} & set(dir(lp))
    assert lp.viz is importlib.import_module("lensprobe.viz")


def _reference_index() -> str:
    sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
    try:
        import api_pages
    finally:
        sys.path.pop(0)
    return api_pages._index(api_pages.public_modules())


def test_the_reference_opens_on_the_curated_list_each_object_once():
    index = _reference_index()
    entries = re.findall(r"^- \[`(lp(?:\.\w+)+)`\]", index, re.M)
    assert len(entries) == len(set(entries)), [e for e in entries if entries.count(e) > 1]
    shortcuts = re.findall(r"\(top level: `(lp\.\w+)`\)$", index, re.M)
    assert set(entries) | set(shortcuts) == set(public()), sorted((set(entries) | set(shortcuts)) ^ set(public()))
    names = public()
    assert not set(entries) & set(shortcuts)
    by_object: dict[int, list[str]] = {}
    for entry in entries:
        if not isinstance(names[entry], (str, int, float, bool)):
            by_object.setdefault(id(names[entry]), []).append(entry)
    assert [e for e in by_object.values() if len(e) > 1] == []
    assert "- [`lp.prompts.Condition`]" in index and "(top level: `lp.Condition`)" in index
    assert "lensprobe.core.storage.store" not in index  # internals are in the navigation, not listed as public
