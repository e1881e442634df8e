"""Typed, bounded settings: every configuration dataclass refuses a wrong-typed value in every field when it
is made (the class-closer below finds the classes itself, so a new field or class without checks fails it),
and the checks of lensprobe.core.checks refuse what they say."""

import dataclasses
import importlib
import inspect
import json
import math
import pkgutil
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

import lensprobe
from lensprobe.core.checks import boolean, choice, count, finite_number, integer, typed
from lensprobe.core.errors import LensprobeError, SettingError
from lensprobe.core.prompts.fillers import MAX_FILLER_COUNT, Filler
from lensprobe.core.storage.jsonable import unique_keys
from lensprobe.evals.running.settings import EvalSettings
from lensprobe.interventions.arm_settings import ArmSettings

NOT_SETTINGS = {
    "lensprobe.core.hooks.capabilities.Capabilities": "what an intervention declares of itself, not a setting",
    "lensprobe.core.prompts.conditions.Condition": "a prompt recipe of objects and callables, checked by its own rules",
    "lensprobe.interventions.ablation.HeadAblation": "built by ablate_heads from checked head specs",
}
"""Frozen dataclasses with a __post_init__ that are not configurations, and why."""

REQUIRED = {"GenerationConfig": {"max_new_tokens": 4}, "Record": {"names": "blocks.0.hook_resid_post"}, "ARM": {"c": 0.1, "percentile": 90}, "Filler": {"kind": "text"}}
"""What a configuration cannot be made without."""


def configuration_classes() -> list[type]:
    """Every frozen dataclass of lensprobe checked when made (it has a __post_init__), and the classes of
    settings as given."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(lensprobe.__path__, "lensprobe."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                    and obj.__dataclass_params__.frozen and hasattr(obj, "__post_init__")):  # type: ignore[attr-defined]
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [cls for name, cls in sorted(found.items()) if name not in NOT_SETTINGS] + [EvalSettings, ArmSettings]


def wrong_values(annotation: Any) -> list[Any]:
    """Values of the wrong type for ``annotation``: a string for a bool, a bool and a float for an int, NaN, a
    bool and a string for a float, a bool for text; none for what is no simple type."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        kinds = [k for k in get_args(annotation) if k is not type(None)]
        return wrong_values(kinds[0]) if len(kinds) == 1 else []
    if annotation is bool:
        return ["false", 0, None]
    if annotation is int:
        return [True, 2.5, "3"]
    if annotation is float:
        return [math.nan, True, "0.5"]
    if annotation is str or (origin is Literal and all(isinstance(a, str) for a in get_args(annotation))):
        return [True, 3]
    return []


CASES = [(cls, f.name, bad) for cls in configuration_classes()
         for f in dataclasses.fields(cls) for bad in wrong_values(get_type_hints(cls)[f.name])
         if not (bad is None and type(None) in get_args(get_type_hints(cls)[f.name]))]


def test_the_closer_finds_the_configurations():
    names = {cls.__name__ for cls, _, _ in CASES}
    assert {"GenerationConfig", "EvalConfig", "EvalSettings", "ARM", "ArmSettings", "FindHeadsConfig",
            "AttributionConfig", "FillerSetup", "MechanismConfig", "TraceConfig", "ReproduceConfig",
            "LatentFusion", "Filler"} <= names
    assert len(CASES) > 100


@pytest.mark.unchecked
@pytest.mark.parametrize(("cls", "name", "bad"), CASES, ids=lambda v: getattr(v, "__name__", repr(v)))
def test_every_field_of_every_configuration_refuses_a_wrong_type(cls, name, bad):
    with pytest.raises(SettingError) as caught:
        cls(**{**REQUIRED.get(cls.__name__, {}), name: bad})
    assert caught.value.setting == name and name in str(caught.value)


@pytest.mark.parametrize(("check", "value", "message"), [
    (lambda v: boolean("do_sample", v), "false", r"do_sample: expected true or false \(a bool\), got 'false'"),
    (lambda v: boolean("stop_at_eos", v), 1, "stop_at_eos: expected true or false"),
    (lambda v: integer("seed", v), True, "seed: expected a whole number, got True"),
    (lambda v: count("count", v, 1), True, "count: expected a whole number >= 1, got True"),
    (lambda v: count("max_gen_toks", v, 1), 128.0, r"max_gen_toks: expected a whole number >= 1, got 128.0 \(float\)"),
    (lambda v: count("batch_size", v, 1, 8), 9, "batch_size: expected a whole number between 1 and 8, got 9"),
    (lambda v: finite_number("flag", v, 0), math.nan, "flag: expected a finite number >= 0, got nan"),
    (lambda v: finite_number("scale", v, 0, lo_open=True), 0, "scale: expected a finite number > 0, got 0"),
    (lambda v: finite_number("t", v), math.inf, "t: expected a finite number, got inf"),
    (lambda v: finite_number("flag", v, 0, allow_inf=True), math.nan, r"flag: expected a number \(inf allowed\)"),
    (lambda v: choice("unit", v, ("head", "kv")), "layer", "unit: expected one of head, kv, got 'layer'"),
    (lambda v: choice("x", v, (1, 2)), True, "x: expected one of 1, 2, got True"),
    (lambda v: typed("ids", v, tuple[int, ...]), (1, True), "ids: expected a whole number, got True"),
])
def test_each_check_refuses_with_the_field_and_the_value(check, value, message):
    with pytest.raises(SettingError, match=message):
        check(value)


def test_the_checks_take_what_they_should():
    import numpy as np

    assert boolean("b", np.bool_(True)) is True and count("n", np.int64(3), 1) == 3
    assert finite_number("f", 2) == 2.0 and finite_number("flag", math.inf, 0, allow_inf=True) == math.inf
    assert typed("min_p", None, float | None) is None and typed("ids", (1, 2), tuple[int, ...]) == (1, 2)


def test_a_filler_count_is_bounded_before_its_text_is_built():
    with pytest.raises(SettingError, match=f"count: expected a whole number between 1 and {MAX_FILLER_COUNT:,}"):
        Filler.meaningless(count=1_000_000_000)  # refused before a 2 GB string is joined
    with pytest.raises(SettingError, match="count: expected a whole number"):
        Filler.meaningful(count=True)
    assert Filler.meaningless(count=3).content == "/ / /"


def test_a_json_key_given_twice_is_refused():
    assert json.loads('{"a": 1, "b": {"a": 2}}', object_pairs_hook=unique_keys) == {"a": 1, "b": {"a": 2}}
    with pytest.raises(LensprobeError, match=r"the key 'a' is given twice in one JSON object \(1 and 2\): keep one"):
        json.loads('{"a": 1, "a": 2}', object_pairs_hook=unique_keys)


@pytest.mark.unchecked
def test_a_problem_file_with_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4", "answer": "5"}\n')
    with pytest.raises(LensprobeError, match=r"p.jsonl line 2: the key 'answer' is given twice"):
        lensprobe.evals.load_problems(path)
